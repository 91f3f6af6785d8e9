//! Which addresses a fetch may connect to: every address a name resolves to (or a URL names) is
//! checked here before anything connects, and one that lies in a range the box must not reach
//! from the web (its own machine, the local networks, the cloud metadata service) is refused
//! unless a `[[hosts]]` entry lists it in `addresses`.
//!
//! IPv6 forms that carry an IPv4 address are judged by what they reach: IPv4-mapped
//! (`::ffff:a.b.c.d`) and IPv4-compatible (`::a.b.c.d`) addresses are refused outright (no
//! public host needs them, and a socket may reach the IPv4 address through them); NAT64
//! (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002::/16`) are judged by the IPv4 address they
//! embed, so an IPv6-only network with DNS64 still reaches the public web.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The range a refused address lies in, named as the refusal says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    Unspecified,
    Loopback,
    Private,
    SharedCgnat,
    LinkLocal,
    CloudMetadata,
    Multicast,
    Broadcast,
    Reserved,
    Documentation,
    Benchmarking,
    UniqueLocal,
    SiteLocal,
    Ipv4Mapped,
    Ipv4Compatible,
    /// NAT64 or 6to4 around this IPv4 address, itself refused.
    Embedded(Ipv4Addr),
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Range::Unspecified => "an unspecified address",
            Range::Loopback => "a loopback address (this machine)",
            Range::Private => "a private network address",
            Range::SharedCgnat => "a carrier-grade NAT address (100.64.0.0/10)",
            Range::LinkLocal => "a link-local address",
            Range::CloudMetadata => "the cloud metadata address",
            Range::Multicast => "a multicast address",
            Range::Broadcast => "the broadcast address",
            Range::Reserved => "a reserved address",
            Range::Documentation => "a documentation address",
            Range::Benchmarking => "a benchmarking address (198.18.0.0/15)",
            Range::UniqueLocal => "an IPv6 unique local address (fc00::/7)",
            Range::SiteLocal => "an IPv6 site-local address (fec0::/10)",
            Range::Ipv4Mapped => "an IPv4-mapped IPv6 address",
            Range::Ipv4Compatible => "an IPv4-compatible IPv6 address",
            Range::Embedded(v4) => {
                return match forbidden_v4(*v4) {
                    Some(inner) => write!(f, "an IPv6 form of {v4}, {inner}"),
                    None => write!(f, "an IPv6 form of {v4}"),
                };
            }
        };
        f.write_str(s)
    }
}

/// The metadata service of every major cloud, and its IPv6 form on some.
pub const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
pub const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// The range `ip` lies in when the web must not reach it; `None` for a public address.
pub fn forbidden(ip: IpAddr) -> Option<Range> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<Range> {
    let [a, b, c, _] = ip.octets();
    let r = if ip == METADATA_V4 {
        Range::CloudMetadata
    } else if ip.is_unspecified() || a == 0 {
        // 0.0.0.0/8: "this network"; Linux connects 0.0.0.0 to the machine itself.
        Range::Unspecified
    } else if ip.is_loopback() {
        Range::Loopback
    } else if ip.is_private() {
        Range::Private
    } else if a == 100 && (b & 0xc0) == 64 {
        Range::SharedCgnat
    } else if ip.is_link_local() {
        Range::LinkLocal
    } else if ip.is_multicast() {
        Range::Multicast
    } else if ip.is_broadcast() {
        Range::Broadcast
    } else if a >= 240 {
        Range::Reserved
    } else if (a, b, c) == (192, 0, 0) || (a, b, c) == (192, 88, 99) {
        // IETF protocol assignments; the deprecated 6to4 relay anycast.
        Range::Reserved
    } else if (a, b, c) == (192, 0, 2) || (a, b, c) == (198, 51, 100) || (a, b, c) == (203, 0, 113)
    {
        Range::Documentation
    } else if a == 198 && (b & 0xfe) == 18 {
        Range::Benchmarking
    } else {
        return None;
    };
    Some(r)
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<Range> {
    let seg = ip.segments();
    if ip == METADATA_V6 {
        return Some(Range::CloudMetadata);
    }
    if ip.is_unspecified() {
        return Some(Range::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Range::Loopback);
    }
    if ip.to_ipv4_mapped().is_some() {
        return Some(Range::Ipv4Mapped);
    }
    // ::a.b.c.d (deprecated IPv4-compatible), ::/96 but for :: and ::1 handled above.
    if seg[..6] == [0; 6] {
        return Some(Range::Ipv4Compatible);
    }
    let v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    // NAT64: the well-known prefix and the local-use one: judged by the IPv4 address inside.
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let inner = v4(seg[6], seg[7]);
        return forbidden_v4(inner).map(|_| Range::Embedded(inner));
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1 {
        return Some(Range::Reserved);
    }
    // 6to4: 2002:AABB:CCDD::/48 embeds AA.BB.CC.DD.
    if seg[0] == 0x2002 {
        let inner = v4(seg[1], seg[2]);
        return forbidden_v4(inner).map(|_| Range::Embedded(inner));
    }
    let r = if (seg[0] & 0xff00) == 0xff00 {
        Range::Multicast
    } else if (seg[0] & 0xffc0) == 0xfe80 {
        Range::LinkLocal
    } else if (seg[0] & 0xffc0) == 0xfec0 {
        Range::SiteLocal
    } else if (seg[0] & 0xfe00) == 0xfc00 {
        Range::UniqueLocal
    } else if seg[0] == 0x2001 && seg[1] == 0x0db8 || seg[0] == 0x3fff && seg[1] < 0x1000 {
        Range::Documentation
    } else if seg[..4] == [0x100, 0, 0, 0] || (seg[0] == 0x2001 && seg[1] < 0x200) {
        // Discard-only 100::/64; the IETF protocol assignments 2001::/23 (Teredo, ORCHID...).
        Range::Reserved
    } else {
        return None;
    };
    Some(r)
}

/// An address block an owner lets one host reach: `10.0.0.5`, `192.168.1.0/24`, `fd00::/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    net: IpAddr,
    bits: u8,
}

impl Block {
    /// Whether `ip` lies in the block (an IPv4 block never holds an IPv6 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl Block {
    /// The refused range the whole block lies in: its first and its last address both in it.
    /// `None` for a block that reaches beyond one (`0.0.0.0/0`, `10.0.0.0/7`, a public block):
    /// `addresses` lets a host reach the owner's own network, never the web at large.
    pub fn refused_range(&self) -> Option<Range> {
        let (first, last) = match self.net {
            IpAddr::V4(n) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                let n = u32::from(n) & mask;
                (
                    IpAddr::V4(Ipv4Addr::from(n)),
                    IpAddr::V4(Ipv4Addr::from(n | !mask)),
                )
            }
            IpAddr::V6(n) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                let n = u128::from(n) & mask;
                (
                    IpAddr::V6(Ipv6Addr::from(n)),
                    IpAddr::V6(Ipv6Addr::from(n | !mask)),
                )
            }
        };
        let range = forbidden(first)?;
        (self.bits > 0 && forbidden(last) == Some(range)).then_some(range)
    }
}

impl FromStr for Block {
    type Err = String;
    fn from_str(s: &str) -> Result<Block, String> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or address/prefix"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Block { net, bits })
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.bits)
    }
}

impl<'de> serde::Deserialize<'de> for Block {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Block, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> Option<Range> {
        forbidden(s.parse().unwrap())
    }

    #[test]
    fn every_local_range_is_refused_and_public_addresses_pass() {
        for (a, r) in [
            ("127.0.0.1", Range::Loopback),
            ("127.255.0.9", Range::Loopback),
            ("0.0.0.0", Range::Unspecified),
            ("0.1.2.3", Range::Unspecified),
            ("10.1.2.3", Range::Private),
            ("172.16.0.1", Range::Private),
            ("172.31.255.255", Range::Private),
            ("192.168.0.1", Range::Private),
            ("100.64.0.1", Range::SharedCgnat),
            ("100.127.255.254", Range::SharedCgnat),
            ("169.254.1.1", Range::LinkLocal),
            ("169.254.169.254", Range::CloudMetadata),
            ("224.0.0.1", Range::Multicast),
            ("255.255.255.255", Range::Broadcast),
            ("240.0.0.1", Range::Reserved),
            ("192.0.2.1", Range::Documentation),
            ("198.18.0.1", Range::Benchmarking),
            ("::", Range::Unspecified),
            ("::1", Range::Loopback),
            ("fe80::1", Range::LinkLocal),
            ("fc00::1", Range::UniqueLocal),
            ("fd12:3456::1", Range::UniqueLocal),
            ("fec0::1", Range::SiteLocal),
            ("ff02::1", Range::Multicast),
            ("fd00:ec2::254", Range::CloudMetadata),
            ("::ffff:127.0.0.1", Range::Ipv4Mapped),
            ("::ffff:8.8.8.8", Range::Ipv4Mapped),
            ("::127.0.0.1", Range::Ipv4Compatible),
            ("2001:db8::1", Range::Documentation),
        ] {
            assert_eq!(refused(a), Some(r), "{a}");
        }
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
        ] {
            assert_eq!(refused(a), None, "{a}");
        }
    }

    #[test]
    fn nat64_and_6to4_are_judged_by_the_ipv4_address_inside() {
        assert_eq!(
            refused("64:ff9b::169.254.169.254"),
            Some(Range::Embedded(METADATA_V4))
        );
        assert_eq!(
            refused("64:ff9b::7f00:1"),
            Some(Range::Embedded(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(refused("64:ff9b::808:808"), None);
        assert_eq!(
            refused("2002:7f00:1::1"),
            Some(Range::Embedded(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(
            refused("2002:a00:1::"),
            Some(Range::Embedded(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(refused("2002:808:808::1"), None);
    }

    #[test]
    fn a_block_holds_its_addresses_and_no_others() {
        let b: Block = "192.168.1.0/24".parse().unwrap();
        assert!(b.contains("192.168.1.77".parse().unwrap()));
        assert!(!b.contains("192.168.2.1".parse().unwrap()));
        assert!(!b.contains("::ffff:192.168.1.77".parse().unwrap()));
        let one: Block = "127.0.0.1".parse().unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let all: Block = "::/0".parse().unwrap();
        assert!(all.contains("::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Block>().is_err());
        assert!("example.org".parse::<Block>().is_err());
    }
}
