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

use crate::{
    ApprovalDecision, ApprovalShow, AuditHead, ChannelPair, ChannelTurn, ErrorCode, FetchRequest,
    InferRequest, LeaseRef, MarkRef, MemoryForget, MemoryRecall, MemoryRecent, MemorySearch,
    Message, SessionQuery, ToolRequest, Turn, TurnRecord,
};

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

/// The requests one socket accepts besides `ping` (which every socket answers): one variant per
/// kind of its dispatch table, each holding what came with it. The accept path turns a request's
/// `Message` into it before any handler sees the request, and a handler matches on it whole, so
/// a kind the table lists and no handler takes cannot be written, nor one the other way round.
pub trait Requests: Sized + std::fmt::Debug + Send + 'static {
    /// The socket these are the requests of.
    const SPEC: SocketSpec;
    /// The request `msg` is, or `msg` back when its kind is not in the table.
    #[allow(clippy::result_large_err)] // the message is handed back as it came, moved
    fn from_message(msg: Message) -> Result<Self, Message>;
}

/// One socket, declared once: its [`SocketSpec`] constant (the table as data, for the docs,
/// the module and `bxctl`) and its [`Requests`] enum (the table as a type, for the handlers),
/// from one list of kinds. A variant is `Name(Payload) = "wire_kind"` for a message with a
/// payload, `Name = "wire_kind"` for one with none (`tools_list {}`).
#[macro_export]
macro_rules! socket {
    (
        $(#[$doc:meta])*
        $spec:ident, $requests:ident {
            name: $name:literal,
            dir: $dir:literal,
            server: $server:literal,
            client: $client:expr,
            wrong_kind: $wrong:ident,
            max_connections: $cap:literal,
            accepts: { $($variants:tt)* }
        }
    ) => {
        $(#[$doc])*
        pub const $spec: $crate::layout::SocketSpec = $crate::layout::SocketSpec {
            name: $name,
            dir: $dir,
            server: $server,
            client: $client,
            accepts: $crate::socket!(@kinds [] $($variants)*),
            wrong_kind: $crate::layout::WrongKind::$wrong,
            max_connections: $cap,
        };

        $crate::socket!(@enum $requests [$name] [] $($variants)*);

        impl $crate::layout::Requests for $requests {
            const SPEC: $crate::layout::SocketSpec = $spec;
            fn from_message(msg: $crate::Message) -> Result<Self, $crate::Message> {
                $crate::socket!(@arms msg [] $($variants)*)
            }
        }
    };
    // The kinds, as `&[...]`.
    (@kinds [$($k:literal)*]) => { &[$($k),*] };
    (@kinds [$($k:literal)*] $v:ident ($t:ty) = $kind:literal $(, $($rest:tt)*)?) => {
        $crate::socket!(@kinds [$($k)* $kind] $($($rest)*)?)
    };
    (@kinds [$($k:literal)*] $v:ident = $kind:literal $(, $($rest:tt)*)?) => {
        $crate::socket!(@kinds [$($k)* $kind] $($($rest)*)?)
    };
    // The enum.
    (@enum $requests:ident [$name:literal] [$($done:tt)*]) => {
        #[doc = concat!("A request `", $name, ".sock` accepts (its dispatch table as a type).")]
        #[derive(Debug)]
        pub enum $requests { $($done)* }
    };
    (@enum $requests:ident [$name:literal] [$($done:tt)*] $v:ident ($t:ty) = $kind:literal $(, $($rest:tt)*)?) => {
        $crate::socket!(@enum $requests [$name] [$($done)* #[doc = concat!("`", $kind, "`")] $v($t),] $($($rest)*)?);
    };
    (@enum $requests:ident [$name:literal] [$($done:tt)*] $v:ident = $kind:literal $(, $($rest:tt)*)?) => {
        $crate::socket!(@enum $requests [$name] [$($done)* #[doc = concat!("`", $kind, "`")] $v,] $($($rest)*)?);
    };
    // The match from `Message`.
    (@arms $m:ident [$($done:tt)*]) => {
        match $m { $($done)* other => Err(other) }
    };
    (@arms $m:ident [$($done:tt)*] $v:ident ($t:ty) = $kind:literal $(, $($rest:tt)*)?) => {
        $crate::socket!(@arms $m [$($done)* $crate::Message::$v(x) => Ok(Self::$v(x)),] $($($rest)*)?)
    };
    (@arms $m:ident [$($done:tt)*] $v:ident = $kind:literal $(, $($rest:tt)*)?) => {
        $crate::socket!(@arms $m [$($done)* $crate::Message::$v {} => Ok(Self::$v),] $($($rest)*)?)
    };
}

socket! {
    /// A channel's turns: the owner's `bxctl chat`, and `health`.
    LOOP, LoopRequest {
        name: "loop", dir: "channel-loop", server: "loopd", client: OWNER,
        wrong_kind: BadMessage, max_connections: 16,
        accepts: { Turn(Turn) = "turn", Health = "health" }
    }
}
socket! {
    /// loopd's tool calls, and the tools it may offer.
    BROKER, BrokerRequest {
        name: "broker", dir: "loop-broker", server: "brokerd", client: "loopd",
        wrong_kind: Forbidden, max_connections: 32,
        accepts: { ToolRequest(ToolRequest) = "tool_request", ToolsList = "tools_list" }
    }
}
socket! {
    /// loopd's model calls, and whether the provider answers.
    INFER, InferRequests {
        name: "infer", dir: "loop-infer", server: "inferproxy", client: "loopd",
        wrong_kind: Forbidden, max_connections: 16,
        accepts: { InferRequest(InferRequest) = "infer_request", ProviderProbe = "provider_probe" }
    }
}
socket! {
    /// loopd's finished turns, and recall.
    MEMORY, MemoryRequest {
        name: "memory", dir: "loop-memory", server: "memoryd", client: "loopd",
        wrong_kind: Forbidden, max_connections: 16,
        accepts: { TurnRecord(TurnRecord) = "turn_record", MemoryRecall(MemoryRecall) = "memory_recall" }
    }
}
socket! {
    /// memoryd's question: what a session has read.
    STATE, StateRequest {
        name: "state", dir: "memory-broker", server: "brokerd", client: "memoryd",
        wrong_kind: Forbidden, max_connections: 16,
        accepts: { SessionState(SessionQuery) = "session_state" }
    }
}
socket! {
    /// The owner's view of memoryd: what was filed where, a search, and forgetting a session.
    MEMORIES, MemoriesRequest {
        name: "memories", dir: "owner-memory", server: "memoryd", client: OWNER,
        wrong_kind: Forbidden, max_connections: 8,
        accepts: {
            MemoryRecent(MemoryRecent) = "memory_recent",
            MemorySearch(MemorySearch) = "memory_search",
            MemoryForget(MemoryForget) = "memory_forget",
            MemoryStatus = "memory_status",
        }
    }
}
socket! {
    /// The owner's approvals, leases, marks and audit chain.
    ADMIN, AdminRequest {
        name: "admin", dir: "owner-broker", server: "brokerd", client: OWNER,
        wrong_kind: Forbidden, max_connections: 8,
        accepts: {
            ApprovalsList = "approvals_list",
            ApprovalShow(ApprovalShow) = "approval_show",
            ApprovalDecision(ApprovalDecision) = "approval_decision",
            AuditVerify = "audit_verify",
            AuditVerifyHead(AuditHead) = "audit_verify_head",
            LeasesList = "leases_list",
            LeaseRevoke(LeaseRef) = "lease_revoke",
            MarksList = "marks_list",
            MarkClear(MarkRef) = "mark_clear",
        }
    }
}
socket! {
    /// brokerd's requests to the web, and the hosts it may ask for.
    GATEWAY, GatewayRequest {
        name: "gateway", dir: "broker-gateway", server: "gatewayd", client: "brokerd",
        wrong_kind: Forbidden, max_connections: 16,
        accepts: { FetchRequest(FetchRequest) = "fetch_request", HostsList = "hosts_list" }
    }
}
socket! {
    /// A channel daemon's turns (channeld, the Matrix channel): loop.sock's twin, the same
    /// answers, on a socket of its own so that loopd knows every turn on it comes from the
    /// channel (whose sessions carry its prefix, `docs/channels.md`) and no other user can reach
    /// it. Each turn names the owner's message it is, so a message handed off twice runs once.
    BRIDGE, BridgeRequest {
        name: "bridge", dir: "bridge-loop", server: "loopd", client: "channeld",
        wrong_kind: BadMessage, max_connections: 8,
        accepts: { ChannelTurn(ChannelTurn) = "channel_turn" }
    }
}

/// What every session the channel daemon runs is named with, unless loopd's `[bridge]
/// session_prefix` and brokerd's `[decide] session_prefix` say otherwise: loopd refuses a turn on
/// bridge.sock for any other session, and brokerd refuses decide.sock any other session's approval.
pub const CHANNEL_SESSION_PREFIX: &str = "matrix-";

socket! {
    /// The channel's right to decide approvals: brokerd serves it to channeld, for the approvals
    /// of the channel's own sessions only (`docs/channels.md`), the approver recorded by name.
    DECIDE, DecideRequest {
        name: "decide", dir: "bridge-broker", server: "brokerd", client: "channeld",
        wrong_kind: Forbidden, max_connections: 8,
        accepts: {
            ApprovalShow(ApprovalShow) = "approval_show",
            ApprovalDecision(ApprovalDecision) = "approval_decision",
        }
    }
}
socket! {
    /// The owner's view of channeld: pairing the owner's Matrix id, and the channel's status.
    CHANNEL, ChannelRequest {
        name: "channel", dir: "owner-channel", server: "channeld", client: OWNER,
        wrong_kind: Forbidden, max_connections: 4,
        accepts: { ChannelPair(ChannelPair) = "channel_pair", ChannelStatus = "channel_status" }
    }
}

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
