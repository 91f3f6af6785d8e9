//! One fetch, hop by hop: each URL (the first and every redirect's) is checked against the
//! allow-list (host, scheme, port), its host resolved once, every address checked
//! ([`crate::address`]), and the connection made to those checked addresses only: the HTTP
//! client's one resolver answers from the addresses pinned for this hop on this thread, so no
//! second lookup can swing a name to an internal address between the check and the connect.
//! Redirects are followed here, never by the client, at most `max_redirects`. Limits: one
//! deadline for the whole fetch (every lookup, connect, hop and byte: a slow drip ends there),
//! the response body read up to `max_bytes` and never further, the response head bounded.
//! `Set-Cookie` is dropped; the body becomes readable text ([`crate::text`]).

use std::cell::RefCell;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bxcore::runbook::Anchored;
use bxcore::{ErrorCode, FetchReply, FetchRequest, Header};
use ureq::http::{HeaderName, HeaderValue, Method, Uri};
use ureq::tls::{RootCerts, TlsConfig};
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use crate::address::{self, Range};
use crate::config::{HostEntry, Limits};
use crate::dns::{self, LookupError};
use crate::hosts;
use crate::secrets::{self, Secret};
use crate::text;

pub const HOST_ANCHOR: &str = "gateway-host-refused";
pub const ADDRESS_ANCHOR: &str = "gateway-address-refused";
pub const SECRET_ANCHOR: &str = "gateway-secret-refused";
pub const REDIRECT_ANCHOR: &str = "gateway-redirect-refused";
pub const LIMIT_ANCHOR: &str = "gateway-limit-reached";
pub const UNREACHABLE_ANCHOR: &str = "gateway-unreachable";
pub const REQUEST_ANCHOR: &str = "gateway-request-refused";

/// The longest part of a URL quoted in a refusal.
const QUOTE: usize = 200;

/// A URL (or a part of one) as a refusal quotes it: on one line, escaped, bounded.
pub fn quote(s: &str) -> String {
    let cut: String = s.chars().take(QUOTE).collect();
    let more = if cut.len() < s.len() { "..." } else { "" };
    format!(
        "{}{more}",
        bxcore::visible::escape(&cut, bxcore::visible::Mode::Line)
    )
}

/// Why a fetch was refused or failed. Nothing has left the box for a refusal made before the
/// first connection; the text never holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("the request is refused: {0}")]
    BadRequest(String),
    #[error("{url}: {why}")]
    BadUrl { url: String, why: String },
    #[error("{host} is not on the gateway's allow-list ([[hosts]] in gatewayd.toml)")]
    HostNotAllowed { host: String },
    #[error("http://{host}/ is plain HTTP, which the host's entry does not allow (http = true)")]
    PlainHttp { host: String },
    #[error("{host}: port {port} is not allowed for this host (its entry's ports)")]
    PortNotAllowed { host: String, port: u16 },
    #[error("{host} resolves to {addr}, {range}, which no host entry allows")]
    AddressRefused {
        host: String,
        addr: IpAddr,
        range: Range,
    },
    #[error("the request carries the credential of {host} ({form}, in {place}); it was not sent")]
    SecretInRequest {
        host: String,
        place: String,
        form: &'static str,
    },
    #[error("more than {max} redirects; the last one led to {url}")]
    TooManyRedirects { max: u8, url: String },
    #[error("the fetch took longer than its limit of {ms} ms ({during})")]
    Timeout { ms: u64, during: &'static str },
    #[error("the response's head is over the limit of {limit} bytes")]
    HeadTooLarge { limit: usize },
    #[error("{0}")]
    Lookup(#[from] LookupError),
    #[error("{url}: {why}")]
    Unreachable { url: String, why: String },
    /// The CA bundle, read at start, no longer reads at the first fetch that needs it.
    #[error("{0}")]
    Trust(#[from] bxtls::CaError),
}

impl Anchored for FetchError {
    fn anchor(&self) -> &'static str {
        match self {
            FetchError::BadRequest(_) | FetchError::BadUrl { .. } => REQUEST_ANCHOR,
            FetchError::HostNotAllowed { .. }
            | FetchError::PlainHttp { .. }
            | FetchError::PortNotAllowed { .. } => HOST_ANCHOR,
            FetchError::AddressRefused { .. } => ADDRESS_ANCHOR,
            FetchError::SecretInRequest { .. } => SECRET_ANCHOR,
            FetchError::TooManyRedirects { .. } => REDIRECT_ANCHOR,
            FetchError::Timeout { .. } | FetchError::HeadTooLarge { .. } => LIMIT_ANCHOR,
            FetchError::Lookup(_) | FetchError::Unreachable { .. } => UNREACHABLE_ANCHOR,
            FetchError::Trust(_) => crate::config::CONFIG_ANCHOR,
        }
    }

    fn code(&self) -> ErrorCode {
        match self {
            FetchError::BadRequest(_) | FetchError::BadUrl { .. } => ErrorCode::BadMessage,
            FetchError::Timeout { .. }
            | FetchError::HeadTooLarge { .. }
            | FetchError::Lookup(_)
            | FetchError::Unreachable { .. }
            | FetchError::Trust(_) => ErrorCode::Unavailable,
            _ => ErrorCode::Forbidden,
        }
    }
}

/// A URL a hop goes to, parsed and normalized.
#[derive(Debug, Clone)]
pub struct Target {
    uri: Uri,
    pub tls: bool,
    /// Lowercase, no final dot, an IPv6 address without brackets.
    pub host: String,
    pub port: u16,
}

impl Target {
    /// Parse an absolute `http` or `https` URL (a fragment is dropped: it never leaves).
    pub fn parse(url: &str) -> Result<Target, FetchError> {
        let bad = |why: &str| FetchError::BadUrl {
            url: quote(url),
            why: why.to_string(),
        };
        let s = url.split('#').next().unwrap_or("");
        let uri: Uri = s
            .parse()
            .map_err(|_| bad("not a URL (an absolute http or https URL, in ASCII)"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("only http and https URLs are fetched")),
        };
        let Some(authority) = uri.authority() else {
            return Err(bad("the URL names no host"));
        };
        if authority.as_str().contains('@') {
            return Err(bad("a URL with user info is refused"));
        }
        let host = hosts::normalize(uri.host().unwrap_or(""));
        if host.is_empty() {
            return Err(bad("the URL names no host"));
        }
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Target {
            uri,
            tls,
            host,
            port,
        })
    }

    /// The URL `location` (a redirect's) leads to from here.
    pub fn join(&self, location: &str) -> Result<Target, FetchError> {
        let loc = location.trim();
        let scheme = if self.tls { "https" } else { "http" };
        let authority = self.uri.authority().map(|a| a.as_str()).unwrap_or("");
        let path = self.uri.path();
        let has_scheme = loc.split_once(':').is_some_and(|(s, _)| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        });
        let absolute = if has_scheme {
            loc.to_string()
        } else if loc.starts_with("//") {
            format!("{scheme}:{loc}")
        } else if loc.starts_with('/') {
            format!("{scheme}://{authority}{loc}")
        } else if loc.starts_with('?') {
            format!("{scheme}://{authority}{path}{loc}")
        } else {
            let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            let dir = if dir.is_empty() { "/" } else { dir };
            format!("{scheme}://{authority}{dir}{loc}")
        };
        Target::parse(&absolute)
    }

    /// The URL as it is requested.
    pub fn as_str(&self) -> String {
        self.uri.to_string()
    }
}

thread_local! {
    /// The addresses checked for this thread's hop: (host, port, addresses).
    static PIN: RefCell<Option<(String, u16, Vec<SocketAddr>)>> = const { RefCell::new(None) };
}

/// The HTTP client's only resolver: the addresses pinned for the hop being made on this thread,
/// for its host and port alone; anything else is "not found".
#[derive(Debug)]
struct Pinned;

impl Resolver for Pinned {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let host = hosts::normalize(uri.host().unwrap_or(""));
        let port = uri.port_u16().or(match uri.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        });
        let mut out = self.empty();
        PIN.with(|pin| {
            if let Some((h, p, addrs)) = pin.borrow().as_ref() {
                if *h == host && Some(*p) == port {
                    for a in addrs.iter().take(dns::MOST) {
                        out.push(*a);
                    }
                }
            }
        });
        if out.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(out)
    }
}

/// Pins `addrs` for this thread while it lives.
struct PinGuard;

impl PinGuard {
    fn set(host: &str, port: u16, addrs: Vec<SocketAddr>) -> PinGuard {
        PIN.with(|p| *p.borrow_mut() = Some((host.to_string(), port, addrs)));
        PinGuard
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        PIN.with(|p| *p.borrow_mut() = None);
    }
}

/// What a fetch gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The URL of the last hop.
    pub url: String,
    pub status: u16,
    /// The response's headers but `Set-Cookie`.
    pub headers: Vec<Header>,
    /// The body as readable text.
    pub body: String,
    /// The body was longer than the limit and was cut there.
    pub truncated: bool,
}

impl Fetched {
    pub fn reply(self) -> FetchReply {
        FetchReply {
            url: self.url,
            status: self.status,
            headers: self.headers,
            body: self.body,
            truncated: self.truncated,
        }
    }
}

/// Request headers a caller may not set: the client sets them, or they would let a request
/// escape its checks.
const CALLER_MAY_NOT_SET: [&str; 9] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-authorization",
    "cookie",
    "expect",
];

/// Where the certificates a fetch trusts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// A PEM bundle: read (and refused if broken) at start, then again when the first fetch
    /// needs the client, so an idle gatewayd holds none of its certificates (about 160 kB of
    /// heap for a system bundle: docs/performance.md). The sandbox keeps it readable.
    Bundle(PathBuf),
    /// The Mozilla roots built into the client (a machine with no system bundle).
    BuiltIn,
}

/// The gateway: the allow-list, the secrets, the name servers, the limits and the client.
pub struct Gateway {
    hosts: Vec<HostEntry>,
    /// `secrets[i]` is the credential of `hosts[i]`, if it has one.
    secrets: Vec<Option<Secret>>,
    dns: Vec<SocketAddr>,
    dns_timeout: Duration,
    limits: Limits,
    trust: Trust,
    /// The client, made by the first fetch ([`Gateway::agent`]).
    agent: Mutex<Option<ureq::Agent>>,
}

impl Gateway {
    /// The allow-list's names, as written (`example.org`, `*.example.org`): what `hosts_list`
    /// answers. Nothing else of an entry is told.
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.name.to_string()).collect()
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("hosts", &self.hosts.len())
            .field("dns", &self.dns)
            .field("limits", &self.limits)
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway for `hosts` (with `secrets` aligned to them), asking `dns`, trusting `trust`.
    pub fn new(
        hosts: Vec<HostEntry>,
        secrets: Vec<Option<Secret>>,
        dns: Vec<SocketAddr>,
        dns_timeout: Duration,
        limits: Limits,
        trust: Trust,
    ) -> Gateway {
        Gateway {
            hosts,
            secrets,
            dns,
            dns_timeout,
            limits,
            trust,
            agent: Mutex::new(None),
        }
    }

    /// The client, made the first time it is needed with the certificates of [`Trust`]. A
    /// bundle that no longer reads fails this fetch (and the next one tries again).
    fn agent(&self) -> Result<ureq::Agent, FetchError> {
        let mut slot = self.agent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(agent) = slot.as_ref() {
            return Ok(agent.clone());
        }
        let roots = match &self.trust {
            Trust::Bundle(path) => RootCerts::Specific(Arc::new(bxtls::read(path)?.certs)),
            Trust::BuiltIn => RootCerts::WebPki,
        };
        let cfg = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .save_redirect_history(false)
            // Every connection is closed after its one request: no pooled connection to an
            // address checked for an earlier hop, and nothing held while idle.
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .max_response_header_size(self.limits.max_header_bytes)
            .user_agent(concat!("boxmaker-gatewayd/", env!("CARGO_PKG_VERSION")))
            .tls_config(TlsConfig::builder().root_certs(roots).build())
            .build();
        let agent = ureq::Agent::with_parts(cfg, DefaultConnector::default(), Pinned);
        *slot = Some(agent.clone());
        Ok(agent)
    }

    /// The entry (and its index) that lets `t` through: host on the list, scheme and port
    /// allowed.
    fn allowed(&self, t: &Target) -> Result<usize, FetchError> {
        let i = hosts::entry_for(self.hosts.iter().map(|h| &h.name), &t.host).ok_or_else(|| {
            FetchError::HostNotAllowed {
                host: quote(&t.host),
            }
        })?;
        let e = &self.hosts[i];
        if !t.tls && !e.http {
            return Err(FetchError::PlainHttp {
                host: quote(&t.host),
            });
        }
        if !e.allows_port(t.port, t.tls) {
            return Err(FetchError::PortNotAllowed {
                host: quote(&t.host),
                port: t.port,
            });
        }
        Ok(i)
    }

    /// The addresses of `t`'s host, every one checked against the entry.
    fn resolve(
        &self,
        t: &Target,
        e: &HostEntry,
        until: Instant,
    ) -> Result<Vec<SocketAddr>, FetchError> {
        let ips = match t.host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => dns::lookup(&self.dns, &t.host, self.dns_timeout, until)?,
        };
        for ip in &ips {
            if let Some(range) = address::forbidden(*ip) {
                if !e.addresses.iter().any(|b| b.contains(*ip)) {
                    return Err(FetchError::AddressRefused {
                        host: quote(&t.host),
                        addr: *ip,
                        range,
                    });
                }
            }
        }
        Ok(ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, t.port))
            .collect())
    }

    /// The caller's own headers, checked: names a caller may not set, or a credential header of
    /// any host entry, are refused.
    fn caller_headers(
        &self,
        req: &FetchRequest,
    ) -> Result<Vec<(HeaderName, HeaderValue)>, FetchError> {
        let mut out = Vec::new();
        for h in &req.headers {
            let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
                FetchError::BadRequest(format!("{} is not a header name", quote(&h.name)))
            })?;
            let credential = self
                .hosts
                .iter()
                .filter_map(|e| e.header.as_deref())
                .any(|c| c.eq_ignore_ascii_case(name.as_str()));
            if CALLER_MAY_NOT_SET.contains(&name.as_str()) || credential {
                return Err(FetchError::BadRequest(format!(
                    "the header {} is set by the gateway alone",
                    name.as_str()
                )));
            }
            let value = HeaderValue::from_str(&h.value).map_err(|_| {
                FetchError::BadRequest(format!(
                    "the value of the header {} cannot be sent",
                    name.as_str()
                ))
            })?;
            out.push((name, value));
        }
        Ok(out)
    }

    /// Make the request: refused before anything leaves when it carries a secret or is not
    /// allowed, bounded in time and size when it is.
    pub fn fetch(&self, req: &FetchRequest) -> Result<Fetched, FetchError> {
        let until = Instant::now() + Duration::from_millis(self.limits.timeout_ms);
        let mut method = match req.method.as_str() {
            "GET" => Method::GET,
            "HEAD" => Method::HEAD,
            "POST" => Method::POST,
            "PUT" => Method::PUT,
            "PATCH" => Method::PATCH,
            "DELETE" => Method::DELETE,
            other => {
                return Err(FetchError::BadRequest(format!(
                    "the method {} is not one the gateway makes",
                    quote(other)
                )));
            }
        };
        if req.body.len() > self.limits.max_request_bytes {
            return Err(FetchError::BadRequest(format!(
                "the body is {} bytes, over the limit of {}",
                req.body.len(),
                self.limits.max_request_bytes
            )));
        }
        // The leak check, over everything the caller sent, before anything else.
        let mut parts: Vec<(String, &[u8])> = vec![
            ("the URL".into(), req.url.as_bytes()),
            ("the body".into(), req.body.as_bytes()),
        ];
        for h in &req.headers {
            let place = format!("the header {}", quote(&h.name));
            parts.push((place.clone(), h.name.as_bytes()));
            parts.push((place, h.value.as_bytes()));
        }
        let configured: Vec<&Secret> = self.secrets.iter().flatten().collect();
        if let Some(f) = secrets::find(&configured, &parts) {
            return Err(FetchError::SecretInRequest {
                host: f.host,
                place: f.place,
                form: f.form,
            });
        }
        let headers = self.caller_headers(req)?;
        let max = match req.max_bytes {
            0 => self.limits.max_bytes,
            n => n.min(self.limits.max_bytes),
        };

        let mut target = Target::parse(&req.url)?;
        let agent = self.agent()?;
        let first_host = target.host.clone();
        let mut body = req.body.clone().into_bytes();
        let mut hops = 0u8;
        loop {
            let i = self.allowed(&target)?;
            let entry = &self.hosts[i];
            let addrs = self.resolve(&target, entry, until)?;
            let _pin = PinGuard::set(&target.host, target.port, addrs);

            let mut rb = ureq::http::Request::builder()
                .method(method.clone())
                .uri(target.uri.clone());
            // The caller's headers go to the host it named, not to where a redirect leads.
            if target.host == first_host {
                for (n, v) in &headers {
                    rb = rb.header(n, v);
                }
            }
            if let (Some(name), Some(secret)) = (&entry.header, &self.secrets[i]) {
                let mut value = entry.prefix.clone().unwrap_or_default().into_bytes();
                value.extend(secret.value());
                let mut v = HeaderValue::from_bytes(&value).map_err(|_| {
                    FetchError::BadRequest("the host's credential cannot be a header value".into())
                })?;
                v.set_sensitive(true);
                rb = rb.header(name.as_str(), v);
            }
            let request = rb
                .body(body.clone())
                .map_err(|e| FetchError::BadRequest(e.to_string()))?;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timeout("before a request was sent"));
            }
            let request = agent
                .configure_request(request)
                .timeout_global(Some(left))
                .build();
            let response = agent
                .run(request)
                .map_err(|e| self.transport(e, &target, until))?;

            let status = response.status().as_u16();
            let location = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if let (300..=399, Some(loc)) = (status, &location) {
                if status != 304 {
                    hops += 1;
                    let next = target.join(loc)?;
                    if hops > self.limits.max_redirects {
                        return Err(FetchError::TooManyRedirects {
                            max: self.limits.max_redirects,
                            url: quote(&next.as_str()),
                        });
                    }
                    if matches!(status, 301..=303)
                        && method != Method::GET
                        && method != Method::HEAD
                    {
                        method = Method::GET;
                        body.clear();
                    }
                    target = next;
                    continue;
                }
            }
            return self.read(response, &target, max, until, method == Method::HEAD);
        }
    }

    fn timeout(&self, during: &'static str) -> FetchError {
        FetchError::Timeout {
            ms: self.limits.timeout_ms,
            during,
        }
    }

    fn transport(&self, e: ureq::Error, t: &Target, until: Instant) -> FetchError {
        let unreachable = |why: String| FetchError::Unreachable {
            url: quote(&t.as_str()),
            why,
        };
        match e {
            ureq::Error::Timeout(_) => self.timeout("waiting for the answer"),
            _ if Instant::now() >= until => self.timeout("waiting for the answer"),
            ureq::Error::LargeResponseHeader(_, limit) => FetchError::HeadTooLarge { limit },
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
                unreachable(format!("TLS: {io}"))
            }
            other => unreachable(other.to_string()),
        }
    }

    /// The response's body, read up to `max` bytes and never further, before `until`.
    fn read(
        &self,
        response: ureq::http::Response<ureq::Body>,
        t: &Target,
        max: u64,
        until: Instant,
        head: bool,
    ) -> Result<Fetched, FetchError> {
        let (parts, body) = response.into_parts();
        let content_type = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let headers: Vec<Header> = parts
            .headers
            .iter()
            .filter(|(n, _)| !matches!(n.as_str(), "set-cookie" | "set-cookie2"))
            .map(|(n, v)| Header {
                name: n.as_str().to_string(),
                value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
            })
            .collect();
        let mut bytes = Vec::new();
        if !head {
            let reader = body.into_with_config().limit(u64::MAX).reader();
            let mut r = Deadline {
                inner: reader,
                until,
            }
            .take(max + 1);
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match r.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if Instant::now() >= until || bxcore::deadline::is_timeout(&e) => {
                        return Err(self.timeout("reading the body"));
                    }
                    Err(e) => {
                        return Err(FetchError::Unreachable {
                            url: quote(&t.as_str()),
                            why: format!("the body broke off: {e}"),
                        });
                    }
                }
            }
        }
        let truncated = bytes.len() as u64 > max;
        bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        let body = self.redact(text::readable(content_type.as_deref(), &bytes));
        let headers = headers
            .into_iter()
            .map(|h| Header {
                name: h.name,
                value: self.redact(h.value),
            })
            .collect();
        Ok(Fetched {
            url: t.as_str(),
            status: parts.status.as_u16(),
            headers,
            body,
            truncated,
        })
    }

    /// `text` with every credential's value replaced by its name: a host that echoes the
    /// credential it was sent (or any other host's) cannot hand it to the model.
    pub fn redact(&self, mut text: String) -> String {
        for s in self.secrets.iter().flatten() {
            if let Ok(v) = std::str::from_utf8(s.value()) {
                if text.contains(v) {
                    text = text.replace(v, &format!("[the credential of {}]", s.host));
                }
            }
        }
        text
    }
}

/// A reader that fails once `until` has passed, checked before every read: a server that
/// sends one byte at a time cannot stretch a fetch past its deadline.
struct Deadline<R> {
    inner: R,
    until: Instant,
}

impl<R: Read> Read for Deadline<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() >= self.until {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the fetch's deadline passed",
            ));
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_location_is_resolved_against_the_url_it_came_from() {
        let base = Target::parse("https://a.example.org:8443/dir/page?x=1#frag").unwrap();
        let j = |l: &str| base.join(l).unwrap().as_str();
        assert_eq!(j("https://b.example.org/x"), "https://b.example.org/x");
        assert_eq!(j("//c.example.org/y"), "https://c.example.org/y");
        assert_eq!(j("/root"), "https://a.example.org:8443/root");
        assert_eq!(j("?q=2"), "https://a.example.org:8443/dir/page?q=2");
        assert_eq!(j("other"), "https://a.example.org:8443/dir/other");
        assert_eq!(
            j("http://[::ffff:127.0.0.1]/"),
            "http://[::ffff:127.0.0.1]/"
        );
        assert_eq!(
            base.join("http://[::ffff:127.0.0.1]/").unwrap().host,
            "::ffff:127.0.0.1"
        );
    }

    #[test]
    fn only_http_and_https_urls_with_a_host_and_no_user_info_parse() {
        for bad in [
            "ftp://example.org/",
            "file:///etc/passwd",
            "https://user:pw@example.org/",
            "https:///path",
            "example.org/path",
            "https://exa mple.org/",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
        let t = Target::parse("HTTPS://Example.ORG./a").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.tls), ("example.org", 443, true));
    }
}
