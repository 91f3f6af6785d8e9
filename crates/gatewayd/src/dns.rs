//! Name lookups over TCP, to the configured name servers only.
//!
//! gatewayd's seccomp filter lets it make stream sockets only, so a datagram can never leave it;
//! DNS over TCP (RFC 7766) needs none. One connection per server asks for `A` and `AAAA` at
//! once; the first server that answers decides. Every address an answer gives is returned (the
//! caller checks them all and connects only to checked ones: resolve once, connect to what was
//! checked). The wire format is `simple-dns`'s; nothing here parses DNS by hand.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use simple_dns::rdata::RData;
use simple_dns::{CLASS, Name, Packet, PacketFlag, QCLASS, QTYPE, Question, RCODE, TYPE};

/// The most addresses kept of one answer.
pub const MOST: usize = 16;

/// The name servers of `/etc/resolv.conf` (its `nameserver` lines), port 53.
pub fn system_servers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| {
            let a = rest.trim();
            // A scoped IPv6 address (`fe80::1%eth0`) names no scope a socket address keeps.
            a.split('%').next()?.parse::<IpAddr>().ok()
        })
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Why a name has no addresses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LookupError {
    #[error("{name} does not exist (the name server says so)")]
    NotFound { name: String },
    #[error("{name} has no IPv4 or IPv6 address")]
    NoAddress { name: String },
    #[error("no name server answered for {name}: {why}")]
    NoServer { name: String, why: String },
}

/// Look `name` up by `servers` in turn, each given `per_server`, none past `until`.
pub fn lookup(
    servers: &[SocketAddr],
    name: &str,
    per_server: Duration,
    until: Instant,
) -> Result<Vec<IpAddr>, LookupError> {
    let mut why = String::from("no name server is configured");
    for server in servers {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            why = "the fetch's time ran out".into();
            break;
        }
        match ask(*server, name, per_server.min(left)) {
            Ok(Answer::Addresses(a)) if a.is_empty() => {
                return Err(LookupError::NoAddress { name: name.into() });
            }
            Ok(Answer::Addresses(a)) => return Ok(a),
            Ok(Answer::NotFound) => return Err(LookupError::NotFound { name: name.into() }),
            Err(e) => why = format!("{server}: {e}"),
        }
    }
    Err(LookupError::NoServer {
        name: name.into(),
        why,
    })
}

enum Answer {
    Addresses(Vec<IpAddr>),
    NotFound,
}

fn query(id: u16, name: &str, ty: TYPE) -> Result<Vec<u8>, String> {
    let mut q = Packet::new_query(id);
    q.set_flags(PacketFlag::RECURSION_DESIRED);
    let qname = Name::new(name).map_err(|e| format!("{name:?} is not a DNS name: {e}"))?;
    q.questions.push(Question::new(
        qname,
        QTYPE::TYPE(ty),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    let body = q.build_bytes_vec().map_err(|e| e.to_string())?;
    let len = u16::try_from(body.len()).map_err(|_| "the query is too long".to_string())?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend(body);
    Ok(framed)
}

fn ask(server: SocketAddr, name: &str, timeout: Duration) -> Result<Answer, String> {
    let until = Instant::now() + timeout;
    let mut tcp = TcpStream::connect_timeout(&server, timeout).map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    tcp.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    // Two ids from the clock: over TCP no one off the path can answer, so they need not be
    // secret, only distinct.
    let base = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        & 0x7ffe) as u16;
    let (id4, id6) = (base, base + 1);
    let mut out = query(id4, name, TYPE::A)?;
    out.extend(query(id6, name, TYPE::AAAA)?);
    tcp.write_all(&out).map_err(|e| e.to_string())?;

    let mut found = Vec::new();
    let mut not_found = 0;
    for _ in 0..2 {
        let msg = read_message(&mut tcp, until)?;
        let p = Packet::parse(&msg).map_err(|e| format!("a malformed answer: {e}"))?;
        if p.id() != id4 && p.id() != id6 {
            return Err("an answer to a question not asked".into());
        }
        match p.rcode() {
            RCODE::NoError => {}
            RCODE::NameError => {
                not_found += 1;
                continue;
            }
            other => return Err(format!("the server answered {other:?}")),
        }
        for rr in &p.answers {
            if rr.class != CLASS::IN || found.len() >= MOST {
                continue;
            }
            match &rr.rdata {
                RData::A(a) => found.push(IpAddr::V4(Ipv4Addr::from(a.address))),
                RData::AAAA(a) => found.push(IpAddr::V6(Ipv6Addr::from(a.address))),
                _ => {}
            }
        }
    }
    if not_found == 2 && found.is_empty() {
        return Ok(Answer::NotFound);
    }
    found.dedup();
    Ok(Answer::Addresses(found))
}

/// One length-prefixed message, read whole before `until`.
fn read_message(tcp: &mut TcpStream, until: Instant) -> Result<Vec<u8>, String> {
    let mut len = [0u8; 2];
    read_exact_by(tcp, &mut len, until)?;
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    read_exact_by(tcp, &mut msg, until)?;
    Ok(msg)
}

fn read_exact_by(tcp: &mut TcpStream, mut buf: &mut [u8], until: Instant) -> Result<(), String> {
    while !buf.is_empty() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no answer in time".into());
        }
        tcp.set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        match tcp.read(buf) {
            Ok(0) => return Err("the server closed the connection".into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if bxcore::deadline::is_timeout(&e) => return Err("no answer in time".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_gives_its_name_servers_on_port_53() {
        let text = "# comment\nnameserver 9.9.9.9\nsearch lan\nnameserver fe80::1%eth0\n  nameserver 2620:fe::fe\nnameserver bogus\n";
        let s: Vec<String> = system_servers(text).iter().map(|s| s.to_string()).collect();
        assert_eq!(s, ["9.9.9.9:53", "[fe80::1]:53", "[2620:fe::fe]:53"]);
    }
}
