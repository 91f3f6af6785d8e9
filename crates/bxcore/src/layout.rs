//! Where every socket lives, who serves it and who is its one client.
//!
//! A box keeps its sockets in its run directory: `/run/boxmaker` on the device (the NixOS
//! module's home is `/var/lib/boxmaker`, and sockets live under `/run`, not among state), and
//! `<home>/run` for any other home (a dev box, a test).
//!
//! The daemons' default socket paths, `bxctl` and the NixOS module all follow this table; the
//! module keeps the same facts as data in `nixos-module/layout.json`, and `tests/layout.rs`
//! checks that the two agree, so a socket cannot move in one place and not the other.

use std::path::{Path, PathBuf};

use crate::ErrorCode;

/// One socket: `<run>/<dir>/<name>.sock` (see [`run_dir`]), handed over by systemd under the
/// descriptor name `name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketSpec {
    /// The activation name (systemd's `FileDescriptorName`), and the file's stem.
    pub name: &'static str,
    /// The 0700 directory under the run directory, named `<client>-<server>`.
    pub dir: &'static str,
    /// The daemon that serves it.
    pub server: &'static str,
    /// Its one client: a daemon, or `@owner` for the owner's login account.
    pub client: &'static str,
    /// Its dispatch table: the request kinds it accepts besides `ping` (which every socket
    /// answers). The accept path checks it before a handler sees the request.
    pub accepts: &'static [&'static str],
    /// How it answers a kind the table does not list.
    pub wrong_kind: WrongKind,
    /// Its connection cap when the configuration names none: sized for one owner's device.
    pub max_connections: usize,
}

/// How a socket answers a request kind its table does not list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrongKind {
    /// `error forbidden`, logged with the `socket-forbidden` pointer: every socket but loop.sock.
    Forbidden,
    /// `error bad_message`, not logged: loop.sock, as the channel server's plan fixes.
    BadMessage,
}

impl WrongKind {
    /// The error code it answers with.
    pub fn code(self) -> ErrorCode {
        match self {
            WrongKind::Forbidden => ErrorCode::Forbidden,
            WrongKind::BadMessage => ErrorCode::BadMessage,
        }
    }
}

impl SocketSpec {
    /// The file name, e.g. `broker.sock`; `[peers]` tables name sockets this way.
    pub fn file(&self) -> String {
        format!("{}.sock", self.name)
    }

    /// Whether its table lists `kind`.
    pub fn accepts(&self, kind: &str) -> bool {
        self.accepts.contains(&kind)
    }

    /// The socket's default path for the box at `home`: in [`run_dir`]`(home)`.
    pub fn path(&self, home: &Path) -> PathBuf {
        run_dir(home).join(self.dir).join(self.file())
    }
}

/// The owner's login account, as a socket's client.
pub const OWNER: &str = "@owner";

pub const LOOP: SocketSpec = SocketSpec {
    name: "loop",
    dir: "channel-loop",
    server: "loopd",
    client: OWNER,
    accepts: &["turn", "health"],
    wrong_kind: WrongKind::BadMessage,
    max_connections: 16,
};
pub const BROKER: SocketSpec = SocketSpec {
    name: "broker",
    dir: "loop-broker",
    server: "brokerd",
    client: "loopd",
    accepts: &["tool_request", "tools_list"],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 32,
};
pub const INFER: SocketSpec = SocketSpec {
    name: "infer",
    dir: "loop-infer",
    server: "inferproxy",
    client: "loopd",
    accepts: &["infer_request", "provider_probe"],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 16,
};
pub const MEMORY: SocketSpec = SocketSpec {
    name: "memory",
    dir: "loop-memory",
    server: "memoryd",
    client: "loopd",
    accepts: &["turn_record", "memory_recall"],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 16,
};
pub const STATE: SocketSpec = SocketSpec {
    name: "state",
    dir: "memory-broker",
    server: "brokerd",
    client: "memoryd",
    accepts: &["session_state"],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 16,
};
/// The owner's view of memoryd: what was filed where, a search, and forgetting a session.
pub const MEMORIES: SocketSpec = SocketSpec {
    name: "memories",
    dir: "owner-memory",
    server: "memoryd",
    client: OWNER,
    accepts: &[
        "memory_recent",
        "memory_search",
        "memory_forget",
        "memory_status",
    ],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 8,
};
pub const ADMIN: SocketSpec = SocketSpec {
    name: "admin",
    dir: "owner-broker",
    server: "brokerd",
    client: OWNER,
    accepts: &[
        "approvals_list",
        "approval_show",
        "approval_decision",
        "audit_verify",
        "audit_verify_head",
        "leases_list",
        "lease_revoke",
    ],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 8,
};
pub const GATEWAY: SocketSpec = SocketSpec {
    name: "gateway",
    dir: "broker-gateway",
    server: "gatewayd",
    client: "brokerd",
    accepts: &["fetch_request", "hosts_list"],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 16,
};

/// A channel daemon's turns (channeld, the Matrix channel): loop.sock's twin, the same table and
/// answers, on a socket of its own so that loopd knows every turn on it comes from the channel
/// (whose sessions carry its prefix, `docs/channels.md`) and no other user can reach it.
pub const BRIDGE: SocketSpec = SocketSpec {
    name: "bridge",
    dir: "bridge-loop",
    server: "loopd",
    client: "channeld",
    accepts: &["turn"],
    wrong_kind: WrongKind::BadMessage,
    max_connections: 8,
};
/// What every session the channel daemon runs is named with, unless loopd's `[bridge]
/// session_prefix` and brokerd's `[decide] session_prefix` say otherwise: loopd refuses a turn on
/// bridge.sock for any other session, and brokerd refuses decide.sock any other session's approval.
pub const CHANNEL_SESSION_PREFIX: &str = "matrix-";

/// The channel's right to decide approvals: brokerd serves it to channeld, for the approvals of
/// the channel's own sessions only (`docs/channels.md`), the approver recorded by name.
pub const DECIDE: SocketSpec = SocketSpec {
    name: "decide",
    dir: "bridge-broker",
    server: "brokerd",
    client: "channeld",
    accepts: &["approval_show", "approval_decision"],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 8,
};
/// The owner's view of channeld: pairing the owner's Matrix id, and the channel's status.
pub const CHANNEL: SocketSpec = SocketSpec {
    name: "channel",
    dir: "owner-channel",
    server: "channeld",
    client: OWNER,
    accepts: &["channel_pair", "channel_status"],
    wrong_kind: WrongKind::Forbidden,
    max_connections: 4,
};

/// Every socket of the box.
pub const SOCKETS: [SocketSpec; 11] = [
    LOOP, BROKER, INFER, MEMORY, STATE, ADMIN, MEMORIES, GATEWAY, BRIDGE, DECIDE, CHANNEL,
];

/// A daemon's state directory under `home` and its user on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonSpec {
    pub name: &'static str,
    /// Under `<home>`, 0700, the daemon's own.
    pub state_dir: &'static str,
    /// The system user it runs as on the device.
    pub user: &'static str,
}

impl DaemonSpec {
    pub fn state_path(&self, home: &Path) -> PathBuf {
        home.join(self.state_dir)
    }
}

pub const DAEMONS: [DaemonSpec; 6] = [
    DaemonSpec {
        name: "loopd",
        state_dir: "loop",
        user: "bx-loop",
    },
    DaemonSpec {
        name: "brokerd",
        state_dir: "broker",
        user: "bx-broker",
    },
    DaemonSpec {
        name: "inferproxy",
        state_dir: "infer",
        user: "bx-infer",
    },
    DaemonSpec {
        name: "memoryd",
        state_dir: "memory",
        user: "bx-memory",
    },
    DaemonSpec {
        name: "gatewayd",
        state_dir: "gateway",
        user: "bx-gateway",
    },
    DaemonSpec {
        name: "channeld",
        state_dir: "channel",
        user: "bx-channel",
    },
];

/// The daemon called `name`, if the box has one.
pub fn daemon(name: &str) -> Option<&'static DaemonSpec> {
    DAEMONS.iter().find(|d| d.name == name)
}

/// The device's home.
pub const DEVICE_HOME: &str = "/var/lib/boxmaker";

/// The device's run directory: its socket directories, made by systemd-tmpfiles at boot.
pub const DEVICE_RUN: &str = "/run/boxmaker";

/// Where the box at `home` keeps its socket directories: [`DEVICE_RUN`] for the device's home,
/// `<home>/run` for any other.
pub fn run_dir(home: &Path) -> PathBuf {
    if home == Path::new(DEVICE_HOME) {
        PathBuf::from(DEVICE_RUN)
    } else {
        home.join("run")
    }
}
