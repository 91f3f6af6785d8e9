//! The provider's addresses, and no other: where inferproxy's TCP connections may go.
//!
//! The sandbox lets inferproxy make stream sockets only (seccomp) and connect to the provider's
//! port only (Landlock, which cannot tell hosts apart). What narrows the port to the provider's
//! hosts is this resolver, the HTTP client's only one: it answers for the configured host alone
//! (any other name is "not found"), with the addresses the system gives for it now, or, when it
//! cannot give any, those it gave at start. The lookup at start runs before the sandbox closes,
//! through the system's resolver as configured (`/etc/resolv.conf`: its datagrams go to the
//! configured name servers only); after that, no datagram socket can be made, so a lookup works
//! only where it needs none (`/etc/hosts`, or nscd or systemd-resolved over their Unix sockets)
//! and otherwise falls back to the start's addresses. docs/hardening.md says what remains.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// The most addresses kept for the host.
const MOST: usize = 16;

/// Resolves the provider's host, and only it.
#[derive(Debug, Clone)]
pub struct Pinned {
    host: String,
    port: u16,
    at_start: Vec<SocketAddr>,
}

impl Pinned {
    /// Look `host` up now (call it before the sandbox closes). A lookup that fails is not an
    /// error here: the request that needs the address fails instead, as unreachable.
    pub fn new(host: &str, port: u16) -> Pinned {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let at_start = lookup(&host, port);
        if at_start.is_empty() {
            tracing::warn!(
                "inferproxy: the provider's host {host:?} does not resolve at start; \
                 it is looked up again at each request"
            );
        }
        Pinned {
            host,
            port,
            at_start,
        }
    }

    /// The addresses found at start.
    pub fn at_start(&self) -> &[SocketAddr] {
        &self.at_start
    }

    /// The addresses to connect to now: a fresh lookup, or those of the start.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        let now = lookup(&self.host, self.port);
        if now.is_empty() {
            self.at_start.clone()
        } else {
            now
        }
    }
}

/// `host`'s addresses with `port`, at most [`MOST`]; none when it does not resolve.
fn lookup(host: &str, port: u16) -> Vec<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return vec![SocketAddr::new(ip, port)];
    }
    (host, port)
        .to_socket_addrs()
        .map(|a| a.take(MOST).collect())
        .unwrap_or_default()
}

impl Resolver for Pinned {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &Config,
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
        for a in self.addresses() {
            out.push(a);
        }
        if out.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_host_or_port_is_not_found() {
        let p = Pinned::new("127.0.0.1", 8443);
        let cfg = Config::default();
        let t = || NextTimeout::default();
        for uri in [
            "https://127.0.0.2:8443/v1",
            "https://127.0.0.1:8444/v1",
            "https://127.0.0.1/v1",
            "http://localhost:8443/v1",
        ] {
            let uri: Uri = uri.parse().unwrap();
            assert!(
                matches!(p.resolve(&uri, &cfg, t()), Err(ureq::Error::HostNotFound)),
                "{uri}"
            );
        }
        let uri: Uri = "https://127.0.0.1:8443/v1/messages".parse().unwrap();
        let got = p.resolve(&uri, &cfg, t()).unwrap();
        assert_eq!(&got[..], ["127.0.0.1:8443".parse::<SocketAddr>().unwrap()]);
    }

    #[test]
    fn an_ipv6_literal_is_its_own_address() {
        let p = Pinned::new("[::1]", 443);
        assert_eq!(p.at_start(), ["[::1]:443".parse::<SocketAddr>().unwrap()]);
        let uri: Uri = "https://[::1]/v1".parse().unwrap();
        assert!(
            p.resolve(&uri, &Config::default(), NextTimeout::default())
                .is_ok()
        );
    }

    #[test]
    fn a_name_that_does_not_resolve_has_no_addresses() {
        let p = Pinned::new("no-such-host.invalid", 443);
        assert!(p.at_start().is_empty());
        assert!(p.addresses().is_empty());
    }
}
