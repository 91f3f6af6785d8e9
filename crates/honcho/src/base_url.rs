//! The server's base URL, checked once: the scheme, the host and the port the client will ever
//! connect to (memoryd's sandbox allows TCP connect to that port alone), and nothing else. A
//! path is refused rather than guessed at: the client adds `/v3` itself, so a base that already
//! names it would be a base that is wrong.

use std::fmt;

use crate::error::Error;

/// `http://host[:port]` or `https://host[:port]`, with an optional trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    tls: bool,
    host: String,
    port: u16,
}

impl BaseUrl {
    /// Parse and check `text`.
    pub fn parse(text: &str) -> Result<BaseUrl, Error> {
        let bad = |why: &str| Error::BadUrl {
            url: bxcore::visible::escape(text, bxcore::visible::Mode::Quoted).into_owned(),
            why: why.to_string(),
        };
        let (tls, rest) = if let Some(r) = text.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = text.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(bad("it must start with http:// or https://"));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('/') {
            return Err(bad(
                "give the server's base only (http://host:port): the client adds /v3 itself",
            ));
        }
        if authority.contains(['?', '#']) {
            return Err(bad("a query or fragment has no place in the base URL"));
        }
        if authority.contains('@') {
            return Err(bad(
                "credentials in the URL are refused: give the token as a key file",
            ));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let Some((addr, after)) = v6.split_once(']') else {
                return Err(bad("an IPv6 address needs its closing ]"));
            };
            if addr.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(bad("the address between [ ] is not IPv6"));
            }
            let port = match after {
                "" => default_port,
                p => match p.strip_prefix(':') {
                    Some(p) => parse_port(p).ok_or_else(|| bad("the port is not 1 to 65535"))?,
                    None => return Err(bad("after ] only :port may follow")),
                },
            };
            (format!("[{addr}]"), port)
        } else {
            let (host, port) = match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h,
                    parse_port(p).ok_or_else(|| bad("the port is not 1 to 65535"))?,
                ),
                None => (authority, default_port),
            };
            if host.is_empty() {
                return Err(bad("it names no host"));
            }
            if !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                return Err(bad(
                    "the host holds a character no host name or IPv4 address has",
                ));
            }
            (host.to_ascii_lowercase(), port)
        };
        Ok(BaseUrl { tls, host, port })
    }

    /// Whether it is `https`.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The host, as given (an IPv6 address keeps its brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Whether a request travels in the clear beyond this machine: `http` to a host that is not
    /// loopback. A bearer token is never sent so (`Client::new` refuses).
    pub fn plain_beyond_loopback(&self) -> bool {
        if self.tls {
            return false;
        }
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        !loopback
    }

    /// The TCP port every request goes to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `path` under the API's version: `{base}/v3{path}`.
    pub(crate) fn v3(&self, path: &str) -> String {
        format!("{self}/v3{path}")
    }

    /// The URL of `path` outside the versioned API (`/health`).
    pub(crate) fn unversioned(&self, path: &str) -> String {
        format!("{self}{path}")
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse::<u16>().ok().filter(|p| *p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_with_host_and_port_is_taken_as_it_is() {
        let b = BaseUrl::parse("http://127.0.0.1:8765").unwrap();
        assert_eq!((b.tls(), b.host(), b.port()), (false, "127.0.0.1", 8765));
        assert_eq!(b.v3("/workspaces"), "http://127.0.0.1:8765/v3/workspaces");
        assert_eq!(b.unversioned("/health"), "http://127.0.0.1:8765/health");
    }

    #[test]
    fn a_trailing_slash_is_dropped_and_the_default_ports_are_filled_in() {
        assert_eq!(
            BaseUrl::parse("https://Honcho.example/")
                .unwrap()
                .to_string(),
            "https://honcho.example:443"
        );
        assert_eq!(BaseUrl::parse("http://h").unwrap().port(), 80);
        assert_eq!(
            BaseUrl::parse("http://[::1]:9000").unwrap().to_string(),
            "http://[::1]:9000"
        );
    }

    #[test]
    fn a_base_that_already_names_v3_is_refused_saying_the_client_adds_it() {
        let e = BaseUrl::parse("http://127.0.0.1:8765/v3").unwrap_err();
        assert!(e.to_string().contains("the client adds /v3 itself"), "{e}");
        assert_eq!(bxcore::runbook::Anchored::anchor(&e), "honcho-config");
    }

    #[test]
    fn each_malformed_base_is_refused_with_its_reason() {
        for (url, why) in [
            ("127.0.0.1:8765", "must start with http://"),
            ("ftp://h", "must start with http://"),
            ("http://", "names no host"),
            ("http://h:0", "not 1 to 65535"),
            ("http://h:99999", "not 1 to 65535"),
            ("http://h:8a", "not 1 to 65535"),
            ("http://u:p@h:1", "credentials"),
            ("http://h:1?x=1", "query"),
            ("http://h_1:1", "no host name"),
            ("http://[::1", "closing ]"),
            ("http://[zz]:1", "not IPv6"),
        ] {
            let e = BaseUrl::parse(url).unwrap_err();
            assert!(e.to_string().contains(why), "{url}: {e}");
        }
    }
}
