//! Who may connect: each connection's peer uid (`SO_PEERCRED`) checked against the `[peers]`
//! list of its socket. The socket's mode is the first check; this is the second.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt};

use crate::config::{PeerName, Peers};
use crate::identity::{LookupError, resolve_user};

/// The uid of the process at the other end of a connected Unix socket, as the kernel recorded
/// it at `connect`.
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let cred = getsockopt(stream, sockopt::PeerCredentials).map_err(io::Error::from)?;
    Ok(cred.uid())
}

/// Why `[peers]` could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// `[peers]` names a socket this daemon does not serve (a typo would otherwise fall back to
    /// the default silently).
    #[error(
        "[peers] names the socket {:?}, which this daemon does not serve (it serves {})",
        .0,
        .1.join(", ")
    )]
    UnknownSocket(String, Vec<String>),
    /// An entry names no user.
    #[error("[peers] {0:?}: {1}")]
    Lookup(String, #[source] LookupError),
}

/// The uids one socket serves, resolved at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPolicy {
    socket: String,
    uids: BTreeSet<u32>,
}

impl PeerPolicy {
    /// A policy serving exactly these uids on `socket`.
    pub fn new(socket: &str, uids: impl IntoIterator<Item = u32>) -> PeerPolicy {
        PeerPolicy {
            socket: socket.to_owned(),
            uids: uids.into_iter().collect(),
        }
    }

    /// A policy serving only the uid this process runs as: `[peers]`'s default.
    pub fn own(socket: &str) -> PeerPolicy {
        PeerPolicy::new(socket, [nix::unistd::Uid::effective().as_raw()])
    }

    /// The socket's name, as log lines and errors say it (`broker.sock`).
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// The uids served.
    pub fn uids(&self) -> &BTreeSet<u32> {
        &self.uids
    }

    /// Whether `uid` may use the socket.
    pub fn allows(&self, uid: u32) -> bool {
        self.uids.contains(&uid)
    }

    /// The peer's uid if the policy allows it; `Err(Some(uid))` for a refused peer, `Err(None)`
    /// when its credentials cannot be read (refused too).
    pub fn check(&self, stream: &UnixStream) -> Result<u32, Option<u32>> {
        match peer_uid(stream) {
            Ok(uid) if self.allows(uid) => Ok(uid),
            Ok(uid) => Err(Some(uid)),
            Err(_) => Err(None),
        }
    }
}

impl Peers {
    /// Check that `[peers]` names only sockets in `known` (the daemon's socket names).
    pub fn check_sockets(&self, known: &[&str]) -> Result<(), PeerError> {
        for socket in self.0.keys() {
            if !known.contains(&socket.as_str()) {
                return Err(PeerError::UnknownSocket(
                    socket.clone(),
                    known.iter().map(|s| (*s).to_owned()).collect(),
                ));
            }
        }
        Ok(())
    }

    /// The policy of one socket: its `[peers]` entries resolved to uids (names looked up now,
    /// before the sandbox), or only `own_uid` (the uid the daemon runs as after the drop) when
    /// the socket has no entry.
    pub fn policy(&self, socket: &str, own_uid: u32) -> Result<PeerPolicy, PeerError> {
        let Some(names) = self.0.get(socket) else {
            return Ok(PeerPolicy::new(socket, [own_uid]));
        };
        let mut uids = BTreeSet::new();
        for name in names {
            let uid = match name {
                PeerName::Uid(uid) => *uid,
                PeerName::Name(n) => {
                    resolve_user(n).map_err(|e| PeerError::Lookup(socket.to_owned(), e))?
                }
            };
            uids.insert(uid);
        }
        Ok(PeerPolicy {
            socket: socket.to_owned(),
            uids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn peers(entries: &[(&str, Vec<PeerName>)]) -> Peers {
        Peers(
            entries
                .iter()
                .map(|(s, v)| ((*s).to_owned(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    #[test]
    fn a_socket_without_an_entry_serves_the_daemons_own_uid() {
        let p = Peers::default().policy("broker.sock", 4242).unwrap();
        assert!(p.allows(4242));
        assert!(!p.allows(0));
        assert_eq!(p.socket(), "broker.sock");
    }

    #[test]
    fn names_and_uids_are_resolved() {
        let p = peers(&[(
            "admin.sock",
            vec![PeerName::Name("root".into()), PeerName::Uid(1000)],
        )])
        .policy("admin.sock", 4242)
        .unwrap();
        assert_eq!(p.uids().iter().copied().collect::<Vec<_>>(), vec![0, 1000]);
        assert!(!p.allows(4242), "an entry replaces the default");
    }

    #[test]
    fn an_unknown_name_is_an_error_not_a_default() {
        let e = peers(&[("a.sock", vec![PeerName::Name("no-such-user-bx".into())])])
            .policy("a.sock", 1)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "[peers] \"a.sock\": there is no user \"no-such-user-bx\""
        );
    }

    #[test]
    fn an_unknown_socket_is_an_error() {
        let p = peers(&[("brokr.sock", vec![PeerName::Uid(1)])]);
        let e = p.check_sockets(&["broker.sock", "admin.sock"]).unwrap_err();
        assert!(e.to_string().contains("\"brokr.sock\""), "{e}");
        assert!(p.check_sockets(&["brokr.sock"]).is_ok());
    }

    #[test]
    fn the_peer_uid_of_a_socket_pair_is_our_own() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = nix::unistd::Uid::effective().as_raw();
        assert_eq!(peer_uid(&a).unwrap(), me);
        assert_eq!(PeerPolicy::new("x", [me]).check(&a), Ok(me));
        assert_eq!(PeerPolicy::new("x", [me + 1]).check(&a), Err(Some(me)));
    }
}
