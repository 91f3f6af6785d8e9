//! What gatewayd's table (`main.rs`) is made of: what its configuration names, read (the
//! secrets, the CA bundle, the name servers), what it says it serves, its sandbox, and the
//! handler of its one socket.

use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bxcore::layout::GatewayRequest;
use bxcore::runbook::Anchored;
use bxcore::{Envelope, Message};
use bxharden::daemon::StartError;
use bxharden::{Profile, SeccompProfile, serve};

use crate::config::{CONFIG_ANCHOR, Config};
use crate::fetch::{Gateway, Refused, Trust, quote};
use crate::secrets::Secret;

/// The system's resolver configuration, whose name servers are asked when `[dns] servers` is
/// empty.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Everything the configuration names, read while the whole filesystem is there.
#[derive(Debug)]
pub struct Prepared {
    pub gateway: Gateway,
    pub dns: Vec<SocketAddr>,
    /// Where the trusted certificates come from, as the notice says it.
    pub ca: String,
    /// The CA file the sandbox must keep readable, if one is used.
    pub ca_file: Option<PathBuf>,
}

fn own(e: impl std::fmt::Display) -> StartError {
    StartError::own(CONFIG_ANCHOR, e)
}

/// The certificates a fetch trusts, as the notice says it: `ca_file`'s, else the first system
/// bundle that exists (`bxtls`), else (a machine with none) the Mozilla roots built into the
/// client. A bundle is read whole here, so a broken one refuses the start; the fetches read it
/// again when they first need it ([`Trust`]).
pub fn load_roots(ca_file: Option<&Path>) -> Result<(String, Trust), bxtls::CaError> {
    Ok(match bxtls::load(ca_file)? {
        Some(b) => (b.path.display().to_string(), Trust::Bundle(b.path)),
        None => ("the built-in Mozilla roots".into(), Trust::BuiltIn),
    })
}

/// Read the secrets, the CA bundle and the name servers `cfg` names, and build the gateway.
pub fn prepare(cfg: &Config) -> Result<Prepared, StartError> {
    let mut secrets = Vec::new();
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    for h in &cfg.hosts {
        let file = match (&h.secret_file, &h.credential, &creds) {
            (Some(p), _, _) => Some(p.clone()),
            (None, Some(name), Some(dir)) => Some(dir.join(name)),
            (None, Some(name), None) => {
                return Err(own(format!(
                    "[[hosts]] {}: the credential {name:?} needs $CREDENTIALS_DIRECTORY \
                     (systemd's LoadCredential=); outside systemd use secret_file",
                    h.name
                )));
            }
            (None, None, _) => None,
        };
        secrets.push(match file {
            Some(p) => Some(Secret::read(&h.name.to_string(), &p).map_err(own)?),
            None => None,
        });
    }
    let (ca, roots) = load_roots(cfg.tls.ca_file.as_deref()).map_err(own)?;
    let dns = if cfg.dns.servers.is_empty() {
        let text = std::fs::read_to_string(RESOLV_CONF).unwrap_or_default();
        crate::dns::system_servers(&text)
    } else {
        cfg.dns.servers.clone()
    };
    if dns.is_empty() {
        // Not a refusal: a host written as an address can still be fetched, and every lookup
        // fails with its pointer (gateway-unreachable).
        bxharden::log::notice(&format!(
            "no name server: [dns] servers is empty and {RESOLV_CONF} names none; only hosts \
             written as addresses can be fetched"
        ));
    }
    let ca_file = match &roots {
        Trust::Bundle(path) => Some(path.clone()),
        Trust::BuiltIn => None,
    };
    let gateway = Gateway::new(
        cfg.hosts.clone(),
        secrets,
        dns.clone(),
        Duration::from_millis(cfg.dns.timeout_ms),
        cfg.limits.clone(),
        roots,
    );
    Ok(Prepared {
        gateway,
        dns,
        ca,
        ca_file,
    })
}

/// What the daemon serves, for `check` and the startup notice. Never a secret.
pub fn describe(cfg: &Config, p: &Prepared) -> String {
    let hosts: Vec<String> = cfg
        .hosts
        .iter()
        .map(|h| {
            let mut s = h.name.to_string();
            if h.http {
                s.push_str(" (http too)");
            }
            if !h.ports.is_empty() {
                s.push_str(&format!(" (ports {:?})", h.ports));
            }
            if !h.addresses.is_empty() {
                let a: Vec<String> = h.addresses.iter().map(ToString::to_string).collect();
                s.push_str(&format!(" (internal addresses {})", a.join(", ")));
            }
            if let Some(header) = &h.header {
                s.push_str(&format!(" (credential in {header})"));
            }
            s
        })
        .collect();
    let dns: Vec<String> = p.dns.iter().map(ToString::to_string).collect();
    format!(
        "fetches on {} for {}; names by {} over TCP; trusting {}; {} ms, {} bytes, {} redirects at most",
        cfg.gateway_socket().display(),
        if hosts.is_empty() {
            "no host (the allow-list is empty)".to_string()
        } else {
            hosts.join(", ")
        },
        if dns.is_empty() {
            "no name server".to_string()
        } else {
            dns.join(", ")
        },
        p.ca,
        cfg.limits.timeout_ms,
        cfg.limits.max_bytes,
        cfg.limits.max_redirects
    )
}

/// What gatewayd may touch: its own directory, its configuration and the CA bundle, the
/// resolver's files; TCP connect to the ports its hosts and name servers use.
pub fn profile(cfg: &Config, p: &Prepared, config: &Path) -> Profile {
    let mut profile = Profile::new(SeccompProfile::Gatewayd)
        .read_write(cfg.own_dir())
        .read_only(config)
        .resolver_and_ca();
    if let Some(ca) = &p.ca_file {
        profile = profile.read_only(ca);
    }
    for port in cfg.ports(&p.dns) {
        profile = profile.connect_tcp(port);
    }
    profile
}

/// One gateway.sock request: a fetch, answered `fetch_reply`; or an `error` whose detail says why
/// and ends with the runbook pointer, logged the same way (`fetch_failed` when the web had
/// answered by then); or the allow-list's names.
pub fn handle(mut stream: UnixStream, id: u64, request: GatewayRequest, gateway: &Gateway) {
    let req = match request {
        GatewayRequest::FetchRequest(req) => req,
        GatewayRequest::HostsList => {
            let hosts = Message::Hosts(bxcore::Hosts {
                hosts: gateway.host_names(),
            });
            let _ = serve::send(&mut stream, id, true, hosts);
            return;
        }
    };
    let answer = match gateway.fetch(&req) {
        Ok(f) => {
            tracing::info!(
                "gatewayd: {} {}: HTTP {}{}",
                quote(&req.method),
                quote(&f.url),
                f.status,
                if f.truncated {
                    ", cut at the size limit"
                } else {
                    ""
                }
            );
            Envelope::new(id, true, Message::FetchReply(f.reply()))
        }
        Err(Refused { error: e, reached }) => {
            // A refused request may carry a credential: neither the log nor the answer shows it.
            let pointer = bxcore::runbook::pointer(e.anchor());
            let url = gateway.redact(quote(&req.url));
            let why = gateway.redact(e.to_string());
            let after = if reached {
                " (after the web answered)"
            } else {
                ""
            };
            bxharden::log::line(
                e.anchor(),
                &format!(
                    "gatewayd: {} {url}{after}: {why}; {pointer}",
                    quote(&req.method)
                ),
            );
            let detail = format!("{why}; {pointer}");
            if reached {
                // The web answered: the caller treats what it learns as third-party content.
                Envelope::new(
                    id,
                    true,
                    Message::FetchFailed(bxcore::WireError {
                        code: e.code(),
                        detail,
                    }),
                )
            } else {
                Envelope::error(id, e.code(), detail)
            }
        }
    };
    if let Err(bxcore::FrameError::TooLarge(_)) = bxcore::write_frame(&mut stream, &answer) {
        // The web answered (a page of control characters, each six bytes escaped): a
        // `fetch_failed`, so the caller treats the session as having read it, and no count the
        // server's bytes chose.
        let _ = bxcore::write_frame(
            &mut stream,
            &Envelope::new(
                id,
                true,
                Message::FetchFailed(bxcore::WireError {
                    code: bxcore::ErrorCode::Unavailable,
                    detail: format!(
                        "the page, as text, is over the frame limit of {} bytes; {}",
                        bxcore::MAX_FRAME,
                        bxcore::runbook::pointer(crate::fetch::LIMIT_ANCHOR)
                    ),
                }),
            ),
        );
    }
    // What a large page took is given back, so the idle daemon stays small.
    bxharden::heap::give_back();
}
