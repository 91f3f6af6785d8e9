//! bxharden: what every boxmaker daemon does at start to be hard to misuse once compromised,
//! and the one connection path every socket uses.
//!
//! A daemon's `main`, in this order:
//!
//! 1. `log::init(Daemon { name, version })`: the journal when stderr is the journal, else plain
//!    lines on stderr; the `runbook!` macro for every fail-closed line.
//! 2. Read its configuration (with `[sandbox]`: [`SandboxConfig`], and `[peers]`: [`Peers`]) and
//!    its secrets; resolve [`Identity::resolve`] and each socket's [`PeerPolicy`]
//!    ([`Peers::policy`]): user names are looked up now, before the sandbox.
//! 3. Its listening sockets: [`activated`] once, then [`socket_for`] per socket (the one systemd
//!    handed over by name, else [`listen`] with [`Identity::owner`]).
//! 4. [`apply`] with its [`Profile`]: privilege drop, `PR_SET_NO_NEW_PRIVS`, Landlock, seccomp.
//!    Log the returned [`Report`] as its startup notice.
//! 5. Serve: [`serve::accept_loop`] per socket; then [`notify::ready`].
//!
//! Steps 1 to 4 run before any thread exists: credentials, capabilities and Landlock are per
//! thread, and [`apply`] refuses to run beside another thread.

pub mod child_sandbox;
pub mod config;
pub mod dirs;
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
