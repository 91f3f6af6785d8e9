//! The allow-list: which hosts a fetch may go to, and the entry (ports, plain HTTP, internal
//! addresses, credential) that applies to each. A name matches an entry written exactly as it
//! is, or one written `*.suffix` when the name lies below the suffix (`a.example.org` and
//! `b.a.example.org` match `*.example.org`; `example.org` does not). An exact entry wins over a
//! suffix, a longer suffix over a shorter one, so an owner can give one subdomain its own
//! credential. Names compare without case and without a final dot.

use std::fmt;
use std::str::FromStr;

/// A `[[hosts]] name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// This name (or address) only.
    Exact(String),
    /// Every name below this suffix (stored without the `*.`).
    Below(String),
}

/// A host as a URL names it, in the form the allow-list compares: lowercase, no final dot, an
/// IPv6 address without brackets.
pub fn normalize(host: &str) -> String {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    // An address in one spelling: `::ffff:7f00:1` (as a joined URL writes it) is
    // `::ffff:127.0.0.1` (as an entry does).
    if let Ok(ip) = h.parse::<std::net::IpAddr>() {
        return ip.to_string();
    }
    h.trim_end_matches('.').to_ascii_lowercase()
}

fn valid_name(s: &str) -> bool {
    if s.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Pattern, String> {
        let (below, rest) = match s.strip_prefix("*.") {
            Some(r) => (true, r),
            None => (false, s),
        };
        let n = normalize(rest);
        if !valid_name(&n) || (below && n.parse::<std::net::IpAddr>().is_ok()) {
            return Err(format!(
                "{s:?} is not a host name, an address, or *. and a domain (names in ASCII: \
                 punycode for others)"
            ));
        }
        // The leak check reads a host's last two labels as the owner's (the allow-listed name)
        // and every label left of them as the caller's choice; below a single label, the
        // caller would choose the second to last unread (`<secret>.io`).
        if below && !n.contains('.') {
            return Err(format!(
                "{s:?} allows every name in a top-level domain: name a domain of at least two \
                 labels (*.example.org), which the leak check can tell from the labels a \
                 caller chooses"
            ));
        }
        Ok(if below {
            Pattern::Below(n)
        } else {
            Pattern::Exact(n)
        })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Exact(n) => f.write_str(n),
            Pattern::Below(n) => write!(f, "*.{n}"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Pattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Pattern, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Pattern {
    /// How well `host` (normalized) matches: `None` not at all; a higher rank wins.
    fn rank(&self, host: &str) -> Option<usize> {
        match self {
            Pattern::Exact(n) if n == host => Some(usize::MAX),
            Pattern::Below(suffix) => {
                let below = host.strip_suffix(suffix.as_str())?;
                below
                    .strip_suffix('.')
                    .filter(|l| !l.is_empty())
                    .map(|_| suffix.len())
            }
            Pattern::Exact(_) => None,
        }
    }
}

/// The index of the pattern (of the allow-list's entries, in order) that applies to `host`
/// (normalized), if any: an exact name before a suffix, a longer suffix before a shorter.
pub fn entry_for<'a>(patterns: impl IntoIterator<Item = &'a Pattern>, host: &str) -> Option<usize> {
    patterns
        .into_iter()
        .enumerate()
        .filter_map(|(i, p)| p.rank(host).map(|r| (r, i)))
        .max_by_key(|(r, _)| *r)
        .map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> Pattern {
        name.parse().unwrap()
    }

    #[test]
    fn a_suffix_matches_names_below_it_and_not_itself_or_lookalikes() {
        let hosts = [entry("*.example.org")];
        for h in ["a.example.org", "b.a.example.org"] {
            assert!(entry_for(&hosts, h).is_some(), "{h}");
        }
        for h in [
            "example.org",
            "badexample.org",
            "example.org.evil.net",
            "a.example.com",
        ] {
            assert!(entry_for(&hosts, h).is_none(), "{h}");
        }
    }

    #[test]
    fn an_exact_entry_wins_over_a_suffix_and_a_longer_suffix_over_a_shorter() {
        let hosts = [
            entry("*.example.org"),
            entry("*.eu.example.org"),
            entry("api.eu.example.org"),
        ];
        let name = |h: &str| hosts[entry_for(&hosts, h).unwrap()].to_string();
        assert_eq!(name("api.eu.example.org"), "api.eu.example.org");
        assert_eq!(name("www.eu.example.org"), "*.eu.example.org");
        assert_eq!(name("other.example.org"), "*.example.org");
    }

    #[test]
    fn names_compare_without_case_or_a_final_dot() {
        let hosts = [entry("Example.ORG.")];
        assert!(entry_for(&hosts, &normalize("EXAMPLE.org.")).is_some());
        assert_eq!(normalize("[::1]"), "::1");
    }

    #[test]
    fn a_pattern_that_is_not_a_name_is_refused() {
        for bad in [
            "",
            "*",
            "*.",
            "a b.org",
            "*.10.0.0.1",
            "exa/mple.org",
            "ex@mple.org",
            "*.*.org",
            "*.org",
            "*.lan",
        ] {
            assert!(bad.parse::<Pattern>().is_err(), "{bad:?}");
        }
        assert!("10.0.0.1".parse::<Pattern>().is_ok());
        assert!("::1".parse::<Pattern>().is_ok());
    }
}
