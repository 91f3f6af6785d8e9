//! The configuration tables every daemon embeds: `[paths]` (the box's home), `[sandbox]` (who it
//! drops to and how strict the sandbox is), `[peers]` (who may connect to each of its sockets)
//! and `[serve]` (how much its sockets take at once).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[paths]`: the box's home (`/var/lib/boxmaker` on the device), under which every daemon's own
/// directory and every socket's default path lie.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paths {
    pub home: PathBuf,
}

impl Paths {
    /// The home must be absolute: every path under it is taken as it is, whatever the
    /// daemon's working directory.
    pub fn check(&self) -> Result<(), String> {
        if self.home.is_absolute() {
            Ok(())
        } else {
            Err(format!(
                "[paths] home = {:?} is not an absolute path",
                self.home
            ))
        }
    }
}

/// `[sandbox]`: the identity a daemon started as root drops to, and how strict the sandbox is.
///
/// `require = true` (the default) makes a layer that cannot be applied a refusal to start
/// (`sandbox-unavailable`); `false` logs each skipped layer once and runs on (dev box, tests).
/// `seccomp_log = true` turns the seccomp default action from killing the process into `EPERM`
/// plus a kernel log line, for tuning a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// The user to drop to when started as root: a name or a numeric uid.
    pub user: Option<String>,
    /// The group to drop to: a name or a numeric gid. Absent: the user's primary group.
    pub group: Option<String>,
    /// Refuse to start when a layer cannot be applied.
    pub require: bool,
    /// `EPERM` and a kernel log line instead of killing the process on a syscall off the list.
    pub seccomp_log: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            user: None,
            group: None,
            require: true,
            seccomp_log: false,
        }
    }
}

/// One entry of a `[peers]` list: a user name or a numeric uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PeerName {
    /// A numeric uid, written as a TOML integer.
    Uid(u32),
    /// A user name (or a uid written as a string of digits).
    Name(String),
}

impl fmt::Display for PeerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerName::Uid(uid) => write!(f, "{uid}"),
            PeerName::Name(name) => f.write_str(name),
        }
    }
}

/// `[peers]`: `<socket> = ["name-or-uid", ...]`, who may connect to each socket. A socket with
/// no entry serves only the daemon's own uid. Resolve it with [`Peers::policy`] at start, before
/// the sandbox closes (user names are looked up in `/etc/passwd` or NSS).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Peers(pub BTreeMap<String, Vec<PeerName>>);

/// `[serve]`: every bound of the daemon's sockets, in one table for every daemon.
///
/// ```toml
/// [serve]
/// first_frame_ms = 10000          # a new connection's whole first frame arrives within this
/// write_ms = 30000                # each frame written is taken within this
/// frame_budget = 4194304          # bytes of frames being read at once, on each socket
/// [serve.connections]
/// "broker.sock" = 32               # connections served at once; absent: the socket's default
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// How long a new connection has to send its whole first frame.
    pub first_frame_ms: u64,
    /// How long a peer has to take each frame written to it.
    pub write_ms: u64,
    /// Bytes of frame bodies being read at once on one socket; at least one whole frame
    /// (`MAX_FRAME`). Each socket has its own: no peer of one socket can use up another's.
    pub frame_budget: usize,
    /// `"<socket>" = N`: the connections a socket serves at once (at least 1).
    pub connections: BTreeMap<String, usize>,
}

/// The default frame budget of each socket: four whole frames of `MAX_FRAME`.
pub const DEFAULT_FRAME_BUDGET: usize = 4 * bxcore::MAX_FRAME;

/// The longest `first_frame_ms` and `write_ms`: an hour.
pub const MAX_SERVE_MS: u64 = 3_600_000;

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            first_frame_ms: 10_000,
            write_ms: 30_000,
            frame_budget: DEFAULT_FRAME_BUDGET,
            connections: BTreeMap::new(),
        }
    }
}

impl ServeConfig {
    /// How `spec`'s socket serves: the configured cap (else its default in `bxcore::layout`),
    /// the deadlines and the frame budget.
    pub fn limits(&self, spec: &bxcore::layout::SocketSpec) -> crate::serve::Limits {
        crate::serve::Limits {
            max_connections: self
                .connections
                .get(&spec.file())
                .copied()
                .unwrap_or(spec.max_connections),
            first_frame: std::time::Duration::from_millis(self.first_frame_ms),
            write: std::time::Duration::from_millis(self.write_ms),
            frame_budget: self.frame_budget,
        }
    }

    /// Check the table against the sockets the daemon serves: deadlines between 1 ms and an
    /// hour, a budget of at least one frame, a cap of at least one, no socket the daemon does not
    /// serve. `Err` says what is wrong.
    pub fn check(&self, served: &[bxcore::layout::SocketSpec]) -> Result<(), String> {
        for (key, ms) in [
            ("first_frame_ms", self.first_frame_ms),
            ("write_ms", self.write_ms),
        ] {
            if ms == 0 || ms > MAX_SERVE_MS {
                return Err(format!(
                    "[serve] {key} must be between 1 and {MAX_SERVE_MS}, not {ms}"
                ));
            }
        }
        if self.frame_budget < bxcore::MAX_FRAME {
            return Err(format!(
                "[serve] frame_budget = {} is less than one whole frame ({} bytes)",
                self.frame_budget,
                bxcore::MAX_FRAME
            ));
        }
        for (socket, cap) in &self.connections {
            if !served.iter().any(|s| s.file() == *socket) {
                let names: Vec<String> = served.iter().map(|s| s.file()).collect();
                return Err(format!(
                    "[serve.connections] names {socket:?}, which is not served here (only {})",
                    names.join(", ")
                ));
            }
            if *cap == 0 {
                return Err(format!(
                    "[serve.connections] {socket:?} = 0: a socket serves at least one connection"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Daemon {
        #[serde(default)]
        sandbox: SandboxConfig,
        #[serde(default)]
        peers: Peers,
    }

    #[test]
    fn an_absent_sandbox_table_requires_the_sandbox() {
        let d: Daemon = toml::from_str("").unwrap();
        assert_eq!(d.sandbox, SandboxConfig::default());
        assert!(d.sandbox.require);
        assert!(!d.sandbox.seccomp_log);
        assert!(d.sandbox.user.is_none());
        assert!(d.peers.0.is_empty());
    }

    #[test]
    fn every_sandbox_key_is_read() {
        let d: Daemon = toml::from_str(
            "[sandbox]\nuser = \"bx-broker\"\ngroup = \"bx-broker\"\nrequire = false\nseccomp_log = true\n",
        )
        .unwrap();
        assert_eq!(d.sandbox.user.as_deref(), Some("bx-broker"));
        assert_eq!(d.sandbox.group.as_deref(), Some("bx-broker"));
        assert!(!d.sandbox.require);
        assert!(d.sandbox.seccomp_log);
    }

    #[test]
    fn an_unknown_sandbox_key_is_refused() {
        let e = toml::from_str::<Daemon>("[sandbox]\nusr = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn peers_take_names_and_uids() {
        let d: Daemon =
            toml::from_str("[peers]\n\"broker.sock\" = [\"bx-loop\", 1000, \"1001\"]\n").unwrap();
        assert_eq!(
            d.peers.0["broker.sock"],
            vec![
                PeerName::Name("bx-loop".into()),
                PeerName::Uid(1000),
                PeerName::Name("1001".into())
            ]
        );
    }

    #[test]
    fn a_peer_that_is_neither_name_nor_uid_is_refused() {
        assert!(toml::from_str::<Daemon>("[peers]\n\"a.sock\" = [true]\n").is_err());
        assert!(toml::from_str::<Daemon>("[peers]\n\"a.sock\" = [-1]\n").is_err());
    }

    #[test]
    fn a_home_that_is_not_absolute_is_refused_by_every_daemon_in_the_same_words() {
        let p: Paths = toml::from_str("home = \"/var/lib/boxmaker\"").unwrap();
        assert_eq!(p.check(), Ok(()));
        let p: Paths = toml::from_str("home = \"rel\"").unwrap();
        assert_eq!(
            p.check(),
            Err("[paths] home = \"rel\" is not an absolute path".to_string())
        );
        assert!(toml::from_str::<Paths>("home = \"/h\"\nhom = 1").is_err());
    }
}
