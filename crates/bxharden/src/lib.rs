//! bxharden: what every boxmaker daemon does at start to be hard to misuse once compromised,
//! and the one connection path every socket uses.
//!
//! A daemon's `main` is the one start-up, [`daemon`]: `log::init`, then [`daemon::Start::load`]
//! (configuration, identity), `own_dir`, the daemon's own preparation, `listen` per socket,
//! `sandbox` (privilege drop, `PR_SET_NO_NEW_PRIVS`, Landlock, seccomp, before any thread),
//! then `serve` per socket through the one accept path ([`serve`]) and `ready`. Each step fails
//! with a [`daemon::StartError`] that knows its runbook anchor.

pub mod child_sandbox;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dirs;
pub mod fds;
pub mod heap;
pub mod identity;
pub mod landlock_layer;
pub mod log;
pub mod notify;
pub mod peers;
pub mod privdrop;
pub mod proc_status;
pub mod profiles;
pub mod sandbox;
pub mod seccomp;
pub mod serve;
pub mod socket;
pub mod stop;
pub mod threads;

pub use child_sandbox::ChildSandbox;
pub use config::{PeerName, Peers, SandboxConfig, ServeConfig};
pub use dirs::{DirError, STATE_DIR_ANCHOR, own_dir};
pub use identity::{Identity, Owner};
pub use log::Daemon;
pub use peers::{PeerPolicy, peer_uid};
pub use profiles::{Arch, SeccompProfile};
pub use sandbox::{Profile, Report, SandboxError, apply};
pub use seccomp::Mismatch;
pub use socket::{Activated, activated, listen, socket_for};
