//! The Matrix client-server API (v3), as much of it as the channel speaks, over one blocking
//! HTTP client: `/sync` long polls, messages sent with transaction ids (so a retry is never a
//! second message), edits, typing notices, joining and leaving rooms.
//!
//! The client reaches the configured homeserver and nothing else: its resolver answers for that
//! host and port alone, with the addresses looked up once at start, before the sandbox closes
//! ([`Pinned`]); no proxy, no redirect; the token only in the `Authorization` header. Every
//! response is read to a bound (`[limits] max_response_bytes`), every request has a deadline.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;
use ureq::http::Uri;
use ureq::tls::{Certificate, RootCerts, TlsConfig};
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

use crate::config::Homeserver;
use crate::token::Token;

/// The runbook anchor of a homeserver that cannot be reached or answers with a fault.
pub const UNREACHABLE_ANCHOR: &str = "matrix-unreachable";
/// The runbook anchor of a token the homeserver refuses.
pub const AUTH_ANCHOR: &str = "matrix-auth-refused";

/// The most addresses kept for the homeserver.
const MOST: usize = 16;

/// What may stand unescaped in a path segment (RFC 3986's unreserved characters).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// No answer: the homeserver is down, unreachable or too slow.
    #[error("the homeserver {base} cannot be reached: {why}")]
    Unreachable { base: String, why: String },
    /// The token is refused (401, `M_UNKNOWN_TOKEN`).
    #[error("the homeserver {base} refuses the access token: {why}")]
    Auth { base: String, why: String },
    /// A 5xx, a 429, or an answer that is not what the API says.
    #[error("the homeserver {base} answered {what}: {why}")]
    Fault {
        base: String,
        what: String,
        why: String,
    },
    /// A 4xx for this one request (a room the bot is not in, say): retrying does not help.
    #[error("the homeserver {base} refused {what}: {why}")]
    Refused {
        base: String,
        what: String,
        why: String,
    },
}

impl MatrixError {
    /// Whether trying the same request again later may work.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            MatrixError::Unreachable { .. } | MatrixError::Fault { .. }
        )
    }

    /// Its runbook entry.
    pub fn anchor(&self) -> &'static str {
        match self {
            MatrixError::Auth { .. } => AUTH_ANCHOR,
            _ => UNREACHABLE_ANCHOR,
        }
    }
}

/// Resolves the homeserver's host, and only it, to the addresses found at start.
#[derive(Debug, Clone)]
pub struct Pinned {
    host: String,
    port: u16,
    addresses: Vec<SocketAddr>,
}

impl Pinned {
    /// Look `host` up now: call it before the sandbox closes. No address is not an error here:
    /// every request then fails as unreachable, with its pointer.
    pub fn new(host: &str, port: u16) -> Pinned {
        let addresses = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => (host, port)
                .to_socket_addrs()
                .map(|a| a.take(MOST).collect())
                .unwrap_or_default(),
        };
        Pinned {
            host: host.to_string(),
            port,
            addresses,
        }
    }

    /// The addresses found at start.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }
}

impl Resolver for Pinned {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let host = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'));
        let port = uri.port_u16().or(match uri.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        });
        if host != Some(self.host.as_str()) || port != Some(self.port) {
            return Err(ureq::Error::HostNotFound);
        }
        let mut out = self.empty();
        for a in &self.addresses {
            out.push(*a);
        }
        if out.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(out)
    }
}

/// The client of one homeserver, as one account.
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: Token,
    max_bytes: u64,
    request: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// `s` as one path segment.
pub fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

impl Client {
    /// The client of `hs` with `token`: TLS with `roots` for https, the pinned resolver, no
    /// proxy, no redirect; `request` the deadline of every request but a sync.
    pub fn new(
        hs: &Homeserver,
        pinned: Pinned,
        token: Token,
        roots: Vec<Certificate<'static>>,
        max_bytes: u64,
        request: Duration,
    ) -> Client {
        let mut cfg = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .https_only(hs.tls)
            .user_agent(concat!("channeld/", env!("CARGO_PKG_VERSION")))
            .max_response_header_size(64 * 1024)
            .max_idle_connections(2)
            .max_idle_connections_per_host(2);
        if hs.tls {
            cfg = cfg.tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::Specific(Arc::new(roots)))
                    .build(),
            );
        }
        let agent = ureq::Agent::with_parts(
            cfg.build(),
            ureq::unversioned::transport::DefaultConnector::default(),
            pinned,
        );
        Client {
            agent,
            base: hs.base.clone(),
            token,
            max_bytes,
            request,
        }
    }

    /// The homeserver's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}/_matrix/client/v3{path}", self.base)
    }

    /// One request: `method` on `path` (under `/_matrix/client/v3`) with a JSON `body`, within
    /// `timeout`; the JSON answer of a 2xx.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
        what: &str,
    ) -> Result<Value, MatrixError> {
        let url = self.url(path);
        let unreachable = |e: ureq::Error| MatrixError::Unreachable {
            base: self.base.clone(),
            why: describe(&e),
        };
        let auth = self.token.header();
        let sent = match (method, body) {
            ("GET", _) => self
                .agent
                .get(&url)
                .header("authorization", &auth)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call(),
            (m, b) => {
                let bytes = serde_json::to_vec(b.unwrap_or(&Value::Object(Default::default())))
                    .unwrap_or_default();
                let req = match m {
                    "PUT" => self.agent.put(&url),
                    _ => self.agent.post(&url),
                };
                req.header("authorization", &auth)
                    .header("content-type", "application/json")
                    .config()
                    .timeout_global(Some(timeout))
                    .build()
                    .send(&bytes[..])
            }
        };
        let mut resp = sent.map_err(unreachable)?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(self.max_bytes)
            .read_to_string()
            .map_err(|e| MatrixError::Fault {
                base: self.base.clone(),
                what: format!("{what} with HTTP {status}"),
                why: format!(
                    "its body could not be read within {} bytes: {}",
                    self.max_bytes,
                    describe(&e)
                ),
            })?;
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let why = || {
            let code = json["errcode"].as_str().unwrap_or("no errcode");
            let error = json["error"].as_str().unwrap_or("");
            let shown = bxcore::visible::escape(error, bxcore::visible::Mode::Line);
            let mut s = format!("HTTP {status} {code} {}", cut(&shown, 200));
            // Nothing the server says is trusted not to echo the token back.
            if let Ok(t) = std::str::from_utf8(self.token.bytes()) {
                s = s.replace(t, "<token>");
            }
            s
        };
        match status {
            200..=299 => Ok(json),
            401 => Err(MatrixError::Auth {
                base: self.base.clone(),
                why: why(),
            }),
            429 | 500..=599 => Err(MatrixError::Fault {
                base: self.base.clone(),
                what: what.to_string(),
                why: why(),
            }),
            _ => Err(MatrixError::Refused {
                base: self.base.clone(),
                what: what.to_string(),
                why: why(),
            }),
        }
    }

    /// `GET /account/whoami`: the user the token belongs to.
    pub fn whoami(&self) -> Result<String, MatrixError> {
        let v = self.call("GET", "/account/whoami", None, self.request, "whoami")?;
        v["user_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| MatrixError::Fault {
                base: self.base.clone(),
                what: "whoami".into(),
                why: "no user_id in the answer".into(),
            })
    }

    /// `GET /sync`: from `since` (none: the first, which only takes the position), waiting up
    /// to `wait` on the server for something new.
    pub fn sync(&self, since: Option<&str>, wait: Duration) -> Result<Value, MatrixError> {
        let filter = serde_json::json!({
            "presence": {"types": []},
            "account_data": {"types": []},
            "room": {
                "timeline": {"limit": 50, "types": ["m.room.message", "m.reaction"]},
                "state": {"types": ["m.room.member"], "lazy_load_members": true},
                "ephemeral": {"types": []},
                "account_data": {"types": []},
            },
        });
        let filter = utf8_percent_encode(&filter.to_string(), SEGMENT).to_string();
        let mut path = format!(
            "/sync?timeout={}&filter={filter}&set_presence=offline",
            if since.is_some() { wait.as_millis() } else { 0 }
        );
        if let Some(s) = since {
            path.push_str("&since=");
            path.push_str(&segment(s));
        }
        // The server holds the poll for `wait`; the request has that much more than any other.
        self.call("GET", &path, None, wait + self.request, "/sync")
    }

    /// `PUT /rooms/{room}/send/{type}/{txn}`: the event's id. The same `txn` again is the same
    /// event, not a second one.
    pub fn send(
        &self,
        room: &str,
        event_type: &str,
        txn: &str,
        content: &Value,
    ) -> Result<String, MatrixError> {
        let path = format!(
            "/rooms/{}/send/{}/{}",
            segment(room),
            segment(event_type),
            segment(txn)
        );
        let v = self.call("PUT", &path, Some(content), self.request, "a message")?;
        v["event_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| MatrixError::Fault {
                base: self.base.clone(),
                what: "a message".into(),
                why: "no event_id in the answer".into(),
            })
    }

    /// `PUT /rooms/{room}/typing/{user}`.
    pub fn typing(&self, room: &str, user: &str, on: bool) -> Result<(), MatrixError> {
        let path = format!("/rooms/{}/typing/{}", segment(room), segment(user));
        let body = if on {
            serde_json::json!({"typing": true, "timeout": 30_000})
        } else {
            serde_json::json!({"typing": false})
        };
        self.call("PUT", &path, Some(&body), self.request, "a typing notice")
            .map(drop)
    }

    /// `POST /join/{room}`.
    pub fn join(&self, room: &str) -> Result<(), MatrixError> {
        let path = format!("/join/{}", segment(room));
        self.call("POST", &path, None, self.request, "a join")
            .map(drop)
    }

    /// `POST /rooms/{room}/leave`: an invite refused, or a room left.
    pub fn leave(&self, room: &str) -> Result<(), MatrixError> {
        let path = format!("/rooms/{}/leave", segment(room));
        self.call("POST", &path, None, self.request, "a leave")
            .map(drop)
    }
}

/// A transport error in words, without the URL's query (which holds the sync position).
fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "no answer in time".to_string(),
        ureq::Error::HostNotFound => "its address is not known (looked up at start)".to_string(),
        ureq::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// `s` cut to at most `n` bytes at a character boundary.
pub fn cut(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut i = n;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_host_or_port_is_not_found() {
        let p = Pinned::new("127.0.0.1", 8008);
        let cfg = ureq::config::Config::default();
        for uri in [
            "http://127.0.0.2:8008/",
            "http://127.0.0.1:8009/",
            "http://localhost:8008/",
        ] {
            let uri: Uri = uri.parse().unwrap();
            assert!(
                matches!(
                    p.resolve(&uri, &cfg, NextTimeout::default()),
                    Err(ureq::Error::HostNotFound)
                ),
                "{uri}"
            );
        }
        let uri: Uri = "http://127.0.0.1:8008/_matrix".parse().unwrap();
        assert!(p.resolve(&uri, &cfg, NextTimeout::default()).is_ok());
    }

    #[test]
    fn ids_are_one_path_segment_each() {
        assert_eq!(segment("!abc:localhost"), "%21abc%3Alocalhost");
        assert_eq!(segment("a/b?c"), "a%2Fb%3Fc");
    }
}
