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
pub const UNREADABLE_ANCHOR: &str = "gateway-page-unreadable";

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
/// first connection; the text never holds a secret, and never a word the web sent (a redirect's
/// `Location`, a certificate's names, a server's bytes): what a redirect led to is named by
/// category only ([`Redirected`]).
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
    /// The range alone, never the address: for a name, the address is the name server's
    /// choice, and its bytes would be words a zone's operator put into the model's context.
    #[error("{host} resolves to {range}, which no host entry allows")]
    AddressRefused { host: String, range: Range },
    #[error("the request carries the credential of {host} ({form}, in {place}); it was not sent")]
    SecretInRequest {
        host: String,
        place: String,
        form: &'static str,
    },
    /// A redirect was not followed; what it led to is the answering server's choice, so it is
    /// named by category only.
    #[error("a redirect was not followed: {0}")]
    Redirected(Redirected),
    #[error("the fetch took longer than its limit of {ms} ms ({during})")]
    Timeout { ms: u64, during: &'static str },
    #[error("the response's head is over the limit of {limit} bytes")]
    HeadTooLarge { limit: usize },
    #[error("{0}")]
    Lookup(#[from] LookupError),
    #[error("{url}: {why}")]
    Unreachable { url: String, why: &'static str },
    /// The page is HTML the converter could not reduce to text (nesting too deep for its
    /// layout): it is never passed on raw, with its scripts, comments and hidden text.
    #[error(
        "the page is HTML that could not be reduced to readable text ({why}); it is not passed \
         on as it is"
    )]
    Unreadable { why: &'static str },
    /// The CA bundle, read at start, no longer reads at the first fetch that needs it.
    #[error("{0}")]
    Trust(#[from] bxtls::CaError),
}

/// How a refusal names a hop whose URL a redirect chose: its path and query are the server's
/// words, so they are never quoted back to the caller.
const REDIRECTED_URL: &str = "the URL a redirect led to";

/// What a redirect led to, by category: the refusal of a redirect never quotes its `Location`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Redirected {
    #[error("its Location is not an absolute http or https URL without user info")]
    NotAUrl,
    #[error("it led to a host that is not on the gateway's allow-list")]
    HostNotAllowed,
    #[error("it led to plain HTTP on a host whose entry does not allow it")]
    PlainHttp,
    #[error("it led to port {0}, which its host's entry does not allow")]
    PortNotAllowed(u16),
    #[error("it led to a host that resolves to {range}, which no host entry allows")]
    AddressRefused { range: Range },
    #[error("it led to a host whose name could not be looked up")]
    Lookup,
    #[error(
        "it led from another host to a host the gateway adds a credential to; a credential goes \
         only to the host of the URL the call named, and to that host's own redirects"
    )]
    IntoCredential,
    #[error("more than {0} redirects")]
    TooMany(u8),
}

impl Redirected {
    fn anchor(self) -> &'static str {
        match self {
            Redirected::NotAUrl | Redirected::IntoCredential | Redirected::TooMany(_) => {
                REDIRECT_ANCHOR
            }
            Redirected::HostNotAllowed | Redirected::PlainHttp | Redirected::PortNotAllowed(_) => {
                HOST_ANCHOR
            }
            Redirected::AddressRefused { .. } => ADDRESS_ANCHOR,
            Redirected::Lookup => UNREACHABLE_ANCHOR,
        }
    }

    /// The refusal of a hop a redirect led to, by category: `e` as the hop's checks made it.
    fn of(e: FetchError) -> FetchError {
        let why = match e {
            FetchError::BadUrl { .. } => Redirected::NotAUrl,
            FetchError::HostNotAllowed { .. } => Redirected::HostNotAllowed,
            FetchError::PlainHttp { .. } => Redirected::PlainHttp,
            FetchError::PortNotAllowed { port, .. } => Redirected::PortNotAllowed(port),
            FetchError::AddressRefused { range, .. } => Redirected::AddressRefused { range },
            FetchError::Lookup(_) => Redirected::Lookup,
            other => return other,
        };
        FetchError::Redirected(why)
    }
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
            FetchError::Redirected(r) => r.anchor(),
            FetchError::Timeout { .. } | FetchError::HeadTooLarge { .. } => LIMIT_ANCHOR,
            FetchError::Lookup(_) | FetchError::Unreachable { .. } => UNREACHABLE_ANCHOR,
            FetchError::Unreadable { .. } => UNREADABLE_ANCHOR,
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
            | FetchError::Redirected(Redirected::Lookup)
            | FetchError::Trust(_) => ErrorCode::Unavailable,
            _ => ErrorCode::Forbidden,
        }
    }
}

/// A fetch that did not give a page: why, and whether the web had answered by then (a
/// response, a redirect, a certificate), which makes what the caller learns third-party
/// content even though no page came back.
#[derive(Debug)]
pub struct Refused {
    pub error: FetchError,
    pub reached: bool,
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

    /// The URL `location` (a redirect's) leads to from here, joined as a browser joins it
    /// (WHATWG URL: dot segments, scheme-relative and query-only references, percent-encoding
    /// of what a `Location` may not hold as it is), then parsed and checked as a URL the call
    /// named would be.
    pub fn join(&self, location: &str) -> Result<Target, FetchError> {
        let bad = |why: &str| FetchError::BadUrl {
            url: String::new(),
            why: why.to_string(),
        };
        let base = url::Url::parse(&self.as_str()).map_err(|_| bad("not a URL"))?;
        let next = base
            .join(location.trim())
            .map_err(|_| bad("not a URL reference"))?;
        Target::parse(next.as_str())
    }

    /// Scheme, host and port: what a credential is bound to.
    fn origin(&self) -> (bool, &str, u16) {
        (self.tls, &self.host, self.port)
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
    /// allowed, bounded in time and size when it is. A refusal says whether the web had
    /// answered by then ([`Refused::reached`]).
    pub fn fetch(&self, req: &FetchRequest) -> Result<Fetched, Refused> {
        let mut reached = false;
        self.hops(req, &mut reached)
            .map_err(|error| Refused { error, reached })
    }

    fn hops(&self, req: &FetchRequest, reached: &mut bool) -> Result<Fetched, FetchError> {
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
        // The origin of the URL the call named, and whether any hop so far left it: `None`
        // while the hop is the URL the call named.
        let named = (target.tls, target.host.clone(), target.port);
        let mut from: Option<bool> = None;
        let mut body = req.body.clone().into_bytes();
        let mut hops = 0u8;
        loop {
            // A hop a redirect led to is checked as the first is, and refused by category.
            let named_hop = from.is_none();
            let redirected = |e: FetchError| if named_hop { e } else { Redirected::of(e) };
            let i = self.allowed(&target).map_err(redirected)?;
            let entry = &self.hosts[i];
            let credential = match (&entry.header, &self.secrets[i]) {
                (Some(name), Some(secret)) => Some((name, secret)),
                _ => None,
            };
            // A credential goes to the URL the call named and to the redirects of that same
            // origin (scheme, host and port) while the chain never left it: never to a hop
            // whose path and query another origin's redirect chose.
            let (tls, host, port) = target.origin();
            let home = (tls, host, port) == (named.0, named.1.as_str(), named.2);
            if let Some(left) = from.as_mut() {
                *left |= !home;
                if credential.is_some() && *left {
                    return Err(FetchError::Redirected(Redirected::IntoCredential));
                }
            }
            let addrs = self.resolve(&target, entry, until).map_err(redirected)?;
            // How a failure names this hop: the URL the call named is the caller's own; one a
            // redirect chose is the server's text, and a refusal never carries it back.
            let said = if named_hop {
                quote(&target.as_str())
            } else {
                REDIRECTED_URL.to_string()
            };
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
            if let Some((name, secret)) = credential {
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
            let response = agent.run(request).map_err(|e| {
                *reached |= !before_contact(&e);
                self.transport(e, &said, until)
            })?;
            *reached = true;

            let status = response.status().as_u16();
            let location = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if let (300..=399, Some(loc)) = (status, &location) {
                if status != 304 {
                    hops += 1;
                    let next = target.join(loc).map_err(Redirected::of)?;
                    if hops > self.limits.max_redirects {
                        return Err(FetchError::Redirected(Redirected::TooMany(
                            self.limits.max_redirects,
                        )));
                    }
                    if matches!(status, 301..=303)
                        && method != Method::GET
                        && method != Method::HEAD
                    {
                        method = Method::GET;
                        body.clear();
                    }
                    target = next;
                    from.get_or_insert(false);
                    continue;
                }
            }
            return self.read(response, &target, &said, max, until, method == Method::HEAD);
        }
    }

    fn timeout(&self, during: &'static str) -> FetchError {
        FetchError::Timeout {
            ms: self.limits.timeout_ms,
            during,
        }
    }

    /// A failure of the client, by category: its own text may carry what the server sent (a
    /// certificate's names, the bytes of a broken answer), which never reaches the caller.
    /// `said` names the hop as a refusal may (see `fetch`).
    fn transport(&self, e: ureq::Error, said: &str, until: Instant) -> FetchError {
        let unreachable = |why: &'static str| FetchError::Unreachable {
            url: said.to_string(),
            why,
        };
        match e {
            ureq::Error::Timeout(_) => self.timeout("waiting for the answer"),
            _ if Instant::now() >= until => self.timeout("waiting for the answer"),
            ureq::Error::LargeResponseHeader(_, limit) => FetchError::HeadTooLarge { limit },
            ureq::Error::Io(io) => unreachable(io_category(io.kind())),
            ureq::Error::Tls(_) | ureq::Error::Rustls(_) => {
                unreachable("TLS: the server's certificate or handshake was refused")
            }
            ureq::Error::HostNotFound => unreachable("its address could not be used"),
            ureq::Error::ConnectionFailed => unreachable("the connection failed"),
            ureq::Error::Protocol(_) | ureq::Error::Http(_) => {
                unreachable("the server's answer is not HTTP the gateway reads")
            }
            _ => unreachable("the HTTP client failed"),
        }
    }

    /// The response's body, read up to `max` bytes and never further, before `until`.
    fn read(
        &self,
        response: ureq::http::Response<ureq::Body>,
        t: &Target,
        said: &str,
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
                    Err(_) => {
                        return Err(FetchError::Unreachable {
                            url: said.to_string(),
                            why: "the body broke off",
                        });
                    }
                }
            }
        }
        let truncated = bytes.len() as u64 > max;
        bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        let body = text::readable(content_type.as_deref(), &bytes)
            .map_err(|why| FetchError::Unreadable { why })?;
        let body = self.redact(body);
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

    /// `text` with every form of every credential replaced by its name: a host that echoes the
    /// credential it was sent (or any other host's), plain or encoded, cannot hand it to the
    /// model.
    pub fn redact(&self, text: String) -> String {
        self.secrets.iter().flatten().fold(text, |t, s| s.redact(t))
    }
}

/// Whether a client error came before the server could say anything: no connection made (a
/// refused or unreachable address, no route, a connect deadline). Anything else may have
/// carried the server's words, so it counts as the web having answered.
fn before_contact(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionRefused
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::AddrNotAvailable
        ),
        ureq::Error::Timeout(t) => matches!(t, ureq::Timeout::Resolve | ureq::Timeout::Connect),
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => true,
        _ => false,
    }
}

/// An I/O failure as the caller is told it: its kind only.
fn io_category(kind: std::io::ErrorKind) -> &'static str {
    use std::io::ErrorKind;
    match kind {
        ErrorKind::ConnectionRefused => "the connection was refused",
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => "the connection was reset",
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => "no route to the host",
        ErrorKind::InvalidData => "TLS: the server's certificate or handshake was refused",
        ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe => "the connection closed early",
        _ => "the connection failed",
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
        assert_eq!(j("../up/./x"), "https://a.example.org:8443/up/x");
        assert_eq!(j("/a b"), "https://a.example.org:8443/a%20b");
        assert_eq!(j("http://[::ffff:127.0.0.1]/"), "http://[::ffff:7f00:1]/");
        assert_eq!(
            base.join("http://[::ffff:127.0.0.1]/").unwrap().host,
            "::ffff:127.0.0.1"
        );
        assert!(base.join("ftp://x.example/").is_err());
        assert!(base.join("https://u:p@x.example/").is_err());
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
