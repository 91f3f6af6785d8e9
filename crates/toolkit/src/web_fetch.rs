//! `web_fetch {url}`: a page from the web, through gatewayd, the tools' only door to the network.
//! Declared egress with `egress_max = private` (the owner's words may shape a query to the web,
//! nothing secret may) and public, untrusted output. It is offered only while a gateway is
//! configured ([`crate::Tool::available`]); gatewayd's refusals reach the model as `failed`,
//! with the gateway's reason and runbook pointer, and a refusal made after the web answered
//! (`fetch_failed`) raises the session as a page would: the gateway names it by category, but
//! what the call learns still came from the web.

use std::time::Duration;

use bxcore::client::ClientError;
use bxcore::{DataClass, FetchReply, FetchRequest, Label, Message};
use serde_json::Value;

use crate::args::FetchArgs;
use crate::{ApprovalRule, Declared, Effect, Env, Output, Plan, Reads, Tool, ToolError};

/// The runbook entry of a gateway that cannot be asked.
pub const GATEWAY_ANCHOR: &str = "gateway-unavailable";
/// What `web_fetch` answers while `[gateway] socket` is not set (it is then not offered either).
pub const NO_GATEWAY: &str = "no gateway is configured";
/// The most of a page's body a fetch returns.
pub const MAX_BODY: u64 = 256 * 1024;
/// How long a fetch may take, the gateway's own limits included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
pub struct WebFetch;

impl Tool for WebFetch {
    type Args = FetchArgs;
    fn name(&self) -> &'static str {
        "web_fetch"
    }
    fn description(&self) -> &'static str {
        "Fetch a web page over HTTPS and return its text."
    }
    fn parameters(&self) -> Value {
        FetchArgs::schema()
    }
    fn declared(&self) -> Declared {
        Declared {
            reads: Reads::Fixed(DataClass::Public),
            untrusted_output: true,
            effect: Effect::Egress {
                max: DataClass::Private,
            },
            approval: ApprovalRule::Never,
        }
    }
    fn available(&self, env: &Env) -> bool {
        env.gateway.is_some()
    }
    fn place(&self, args: &FetchArgs, _env: &Env) -> Option<String> {
        host_of(&args.url).map(|h| format!("host {h}"))
    }
    fn plan(&self, _args: &FetchArgs, _env: &Env) -> Result<Plan, ToolError> {
        Ok(Plan {
            carries: Label::new(DataClass::Public, true),
            effect: self.declared().effect,
            writes_into: None,
        })
    }
    fn leak_view(&self, args: &FetchArgs) -> Option<Value> {
        Some(serde_json::json!({ "url": without_fixed_host(args.url.as_str()) }))
    }
    fn run(&self, args: &FetchArgs, _plan: &Plan, env: &Env) -> Result<Output, ToolError> {
        let url = args.url.as_str();
        let Some(socket) = &env.gateway else {
            return Err(ToolError::Failed(NO_GATEWAY.to_string()));
        };
        let request = Message::FetchRequest(FetchRequest {
            url: url.to_string(),
            method: "GET".to_string(),
            headers: Vec::new(),
            body: String::new(),
            max_bytes: MAX_BODY,
        });
        // What the web said, or may have said: the session is raised as a page would raise it.
        let from_web = |why: String| {
            ToolError::Touched(
                crate::Reached {
                    label: Label::new(DataClass::Public, true),
                    read_only: None,
                },
                why,
            )
        };
        let reply = bxcore::client::call(socket, FETCH_TIMEOUT, 1, request, |_| {}).map_err(
            |e| match e {
                // The gateway's refusal before anything left the box: its text says why and
                // ends with its pointer, and names nothing the web sent.
                ClientError::Remote(w) => {
                    ToolError::Failed(format!("the web gateway refused it: {}", w.detail))
                }
                // The request never reached the gateway: nothing reached the web either.
                ClientError::Connect { .. }
                | ClientError::TimeoutTooLarge
                | ClientError::SetTimeout(_)
                | ClientError::Send(_) => unavailable(socket, &e.to_string()),
                // The gateway had the request and gave no answer this side can trust: it may
                // have reached the web, so what the call learns counts as the web's.
                other => from_web(unreachable(socket, &other.to_string())),
            },
        )?;
        match reply {
            Message::FetchReply(r) => Ok(Output::text(render(&r))),
            // The web answered and the gateway refused what came after: what the call learns
            // (that a redirect went somewhere, that a page broke off) came from the web, so it
            // raises the session as the page would have.
            Message::FetchFailed(w) => Err(from_web(format!(
                "the web gateway refused it: {}",
                w.detail
            ))),
            other => Err(from_web(unreachable(
                socket,
                &format!("it answered {}", other.kind()),
            ))),
        }
    }
}

/// How long `tools_list` waits for gatewayd's allow-list.
pub const HOSTS_TIMEOUT: Duration = Duration::from_secs(2);

/// The hosts gatewayd at `socket` may fetch from, as its allow-list writes them; `Err` says why
/// it could not be asked.
pub fn allowed_hosts(socket: &std::path::Path) -> Result<Vec<String>, String> {
    match bxcore::client::call(socket, HOSTS_TIMEOUT, 1, Message::HostsList {}, |_| {}) {
        Ok(Message::Hosts(h)) => Ok(h.hosts),
        Ok(other) => Err(format!("it answered {}", other.kind())),
        Err(e) => Err(e.to_string()),
    }
}

/// `web_fetch`'s description when gatewayd allows `hosts`: the model is told where it may go.
pub fn description_for(hosts: &[String]) -> String {
    format!(
        "Fetch a web page over HTTPS and return its text. Only these hosts are allowed (the \
         owner's list; `*.x` is any host under x): {}.",
        hosts.join(", ")
    )
}

/// `url` without the last two labels of its host: those are a name on the owner's allow-list
/// (`example.org`, or the `x` of `*.x`), which the model cannot carry anything in, and which a
/// secret file holding a host name would otherwise refuse every fetch to. The labels left of
/// them stay (`*.example.org` lets the caller choose them, so they can carry text), and so do
/// user info, port, path and query.
pub fn without_fixed_host(url: &str) -> String {
    let Some(at) = url.find("://") else {
        return url.to_string();
    };
    let start = at + 3;
    let rest = &url[start..];
    let end = start + rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    let authority = &url[start..end];
    let host_at = start + authority.rfind('@').map_or(0, |i| i + 1);
    let host = &url[host_at..end];
    if host.starts_with('[') {
        return url.to_string();
    }
    let name_end = host_at + host.find(':').unwrap_or(host.len());
    let name = url[host_at..name_end].trim_end_matches('.');
    let labels: Vec<&str> = name.split('.').collect();
    let kept = labels.len().saturating_sub(2);
    let chosen = labels[..kept].join(".");
    format!("{}{chosen}{}", &url[..host_at], &url[name_end..])
}

/// The host an `https://` URL names (lowercase, without user info or port), for a lease.
pub fn host_of(url: &str) -> Option<String> {
    let rest = url
        .get(..8)?
        .eq_ignore_ascii_case("https://")
        .then(|| &url[8..])?;
    let authority = &rest[..rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host.split(':').next().unwrap_or(host),
    };
    (!host.is_empty()).then(|| host.trim_end_matches('.').to_ascii_lowercase())
}

fn unavailable(socket: &std::path::Path, why: &str) -> ToolError {
    ToolError::Failed(unreachable(socket, why))
}

/// Why the gateway at `socket` could not be asked, with its pointer.
fn unreachable(socket: &std::path::Path, why: &str) -> String {
    format!(
        "the web gateway at {} could not be asked: {why}; {}",
        socket.display(),
        bxcore::runbook::pointer(GATEWAY_ANCHOR)
    )
}

/// What the model is shown: where the fetch ended, its status and type, whether the body was
/// cut, then the body as text.
pub fn render(r: &FetchReply) -> String {
    let content_type = r
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-type"))
        .map_or("no content type", |h| h.value.as_str());
    let mut out = format!("{}\nHTTP {}, {content_type}\n", r.url, r.status);
    if r.truncated {
        out.push_str(
            "(the body was longer than the size limit: only its beginning was read and is shown)\n",
        );
    }
    out.push('\n');
    out.push_str(&r.body);
    out
}

#[cfg(test)]
mod tests {
    use super::without_fixed_host;

    #[test]
    fn the_leak_check_reads_a_url_without_the_allow_listed_part_of_its_host() {
        assert_eq!(
            without_fixed_host("https://en.wikipedia.org/wiki/X?q=1"),
            "https://en/wiki/X?q=1"
        );
        assert_eq!(
            without_fixed_host("https://example.org:8443/a"),
            "https://:8443/a"
        );
        // Labels a wildcard lets the caller choose, user info, path and query stay.
        assert_eq!(
            without_fixed_host("https://u:p@c2VjcmV0.example.org/s?x=y"),
            "https://u:p@c2VjcmV0/s?x=y"
        );
        assert_eq!(without_fixed_host("not a url"), "not a url");
    }
}
