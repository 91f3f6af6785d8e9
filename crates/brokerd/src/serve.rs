//! `brokerd serve`: bring the broker up, listen on its three sockets, and keep it running.
//!
//! In order, on the first thread: the directories, the audit lock, the chain verified (a torn
//! tail recovered, a break refused), the three sockets (state, broker, admin), the sandbox, the
//! `started` record; then the notices, one accept thread per socket, and readiness.

use std::fmt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bxcore::{Envelope, layout};
use bxharden::identity::LookupError;
use bxharden::peers::PeerError;
use bxharden::sandbox::SandboxError;
use bxharden::socket::{ActivationError, ListenError};
use bxharden::{Identity, PeerPolicy, Profile, Report, SeccompProfile};
use serde_json::json;
use toolkit::Env;

use crate::broker::{self, Broker};
use crate::config::{Config, ConfigError};
use crate::dirs;
use crate::fingerprints::Fingerprints;
use crate::ledger::Ledger;
use crate::ledger::chain::{self, ChainError, OnBreak, Opened};
use crate::ledger::lock::{AuditLock, LockError};
use crate::ledger::record::{Draft, Event};
use crate::state::StateStore;
use crate::{admin, state_socket};
use bxharden::DirError;

/// The runbook anchor of a configuration brokerd refuses.
pub const CONFIG_ANCHOR: &str = "broker-config-invalid";

/// Why brokerd did not start. Each text ends with its runbook pointer.
#[derive(Debug)]
pub enum ServeError {
    Config(ConfigError),
    Lookup(LookupError),
    Peers(PeerError),
    Dir(DirError),
    Lock(LockError),
    Chain(ChainError),
    Activation(ActivationError),
    Listen(ListenError),
    Fingerprints(crate::fingerprints::StoreError),
    Sandbox(SandboxError),
}

impl ServeError {
    /// The anchor its text ends with.
    pub fn anchor(&self) -> &'static str {
        match self {
            ServeError::Config(_) | ServeError::Lookup(_) | ServeError::Peers(_) => CONFIG_ANCHOR,
            ServeError::Dir(_) => bxharden::STATE_DIR_ANCHOR,
            ServeError::Lock(_) => crate::ledger::lock::RUNNING_ANCHOR,
            ServeError::Chain(ChainError::Io(..)) => chain::WRITE_ANCHOR,
            ServeError::Chain(_) => chain::BROKEN_ANCHOR,
            ServeError::Activation(_) | ServeError::Listen(_) => bxharden::socket::LISTEN_ANCHOR,
            ServeError::Sandbox(_) => bxharden::sandbox::SANDBOX_ANCHOR,
            ServeError::Fingerprints(_) => crate::fingerprints::STORE_ANCHOR,
        }
    }
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "{e}; see docs/runbook.md#{CONFIG_ANCHOR}"),
            ServeError::Lookup(e) => write!(f, "{e}; see docs/runbook.md#{CONFIG_ANCHOR}"),
            ServeError::Peers(e) => write!(f, "{e}; see docs/runbook.md#{CONFIG_ANCHOR}"),
            ServeError::Dir(e) => write!(f, "{e}"),
            ServeError::Lock(e) => write!(f, "{e}"),
            ServeError::Chain(e) => write!(f, "{e}"),
            ServeError::Activation(e) => write!(f, "{e}"),
            ServeError::Listen(e) => write!(f, "{e}"),
            ServeError::Sandbox(e) => write!(f, "{e}"),
            ServeError::Fingerprints(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ServeError {}

/// A broker with its sockets open and its sandbox applied, not yet accepting.
#[derive(Debug)]
pub struct Started {
    pub broker: Arc<Broker>,
    pub opened: Opened,
    pub report: Report,
    tools: (UnixListener, PeerPolicy),
    admin: (UnixListener, PeerPolicy),
    state: (UnixListener, PeerPolicy),
    _lock: AuditLock,
}

/// Start the broker from `cfg` (read from `config_path`, which the sandbox keeps readable).
pub fn start(cfg: Config, config_path: &Path) -> Result<Started, ServeError> {
    let id = Identity::resolve(&cfg.sandbox).map_err(ServeError::Lookup)?;
    let owner = id.owner();
    let policy = |socket: &str| cfg.peers.policy(socket, id.uid).map_err(ServeError::Peers);
    let policies = (
        policy(broker::SOCKET)?,
        policy(admin::SOCKET)?,
        policy(state_socket::SOCKET)?,
    );
    let registry = cfg
        .registry()
        .map_err(|e| ServeError::Config(ConfigError::Invalid(config_path.into(), e.to_string())))?;
    let roots = cfg
        .roots()
        .map_err(|e| ServeError::Config(ConfigError::Invalid(config_path.into(), e.to_string())))?;

    for dir in [cfg.broker_dir(), cfg.state_dir(), cfg.audit_dir()] {
        bxharden::own_dir(&dir, owner).map_err(ServeError::Dir)?;
    }
    let lock = AuditLock::take(&cfg.lock_path()).map_err(ServeError::Lock)?;
    let (audit, opened) =
        chain::open(&cfg.chain_path(), OnBreak::Refuse).map_err(ServeError::Chain)?;
    for file in [cfg.lock_path(), cfg.chain_path()] {
        dirs::give(&file, owner).map_err(ServeError::Dir)?;
    }
    let fingerprints = Fingerprints::open(&cfg.broker_dir()).map_err(ServeError::Fingerprints)?;

    // The three sockets. `state.sock` comes first: whoever waits for the tool and admin sockets
    // then finds it bound too.
    let mut activated = bxharden::activated().map_err(ServeError::Activation)?;
    let mut bind = |name: &str, path: PathBuf| {
        bxharden::socket_for(&mut activated, name, &path, owner).map_err(ServeError::Listen)
    };
    let state = bind(layout::STATE.name, cfg.state_socket())?;
    let tools = bind(layout::BROKER.name, cfg.broker_socket())?;
    let admin = bind(layout::ADMIN.name, cfg.admin_socket())?;

    let mut profile = Profile::new(SeccompProfile::Brokerd { run_tool: false })
        .read_write(cfg.broker_dir())
        .read_only(config_path.to_path_buf());
    for root in roots.iter() {
        profile = if root.writable {
            profile.read_write(root.path.clone())
        } else {
            profile.read_only(root.path.clone())
        };
    }
    let report = bxharden::apply(&cfg.sandbox, &profile).map_err(ServeError::Sandbox)?;
    bxharden::serve::set_frame_budget(cfg.serve.frame_budget);

    audit
        .commit(vec![Draft::broker(
            Event::Started,
            json!({
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "recovered": opened.torn.is_some(),
                "accepted": opened.accepted.iter().map(|b| b.at).collect::<Vec<_>>(),
                "expired_at_restart": opened.expired,
                "head_found": {"seq": opened.found.0, "hash": opened.found.1},
                "sandbox": report.to_string(),
            }),
        )])
        .map_err(|e| ServeError::Chain(ChainError::Io(cfg.chain_path(), e.0)))?;

    let env = Env {
        roots,
        gateway: cfg.gateway.socket.clone(),
    };
    let ledger = Ledger::new(StateStore::new(&cfg.state_dir()), audit);
    let broker = Arc::new(Broker::new(cfg, registry, env, ledger, fingerprints));
    Ok(Started {
        broker,
        opened,
        report,
        tools: (tools, policies.0),
        admin: (admin, policies.1),
        state: (state, policies.2),
        _lock: lock,
    })
}

/// The write end of the pipe the stop signals write to (-1 before it exists).
static STOP_PIPE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// SIGTERM and SIGINT: one byte into the stop pipe (`write` is async-signal-safe); the main
/// thread reads it and logs the head before the process ends.
extern "C" fn on_stop(_: libc::c_int) {
    let fd = STOP_PIPE.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: writing one byte from a static buffer to a descriptor this process owns.
    unsafe {
        libc::write(fd, b"x".as_ptr().cast(), 1);
    }
}

/// The read end of a pipe that SIGTERM and SIGINT write to.
fn stop_pipe() -> nix::Result<std::os::fd::OwnedFd> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    use std::os::fd::IntoRawFd;
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    STOP_PIPE.store(w.into_raw_fd(), std::sync::atomic::Ordering::Relaxed);
    let action = SigAction::new(
        SigHandler::Handler(on_stop),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only calls `write`, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(r)
}

impl Started {
    /// Print the notices, accept on the three sockets, tell systemd it is ready, and serve until
    /// the process ends. An accept loop that loses its socket ends the process (`bxharden`).
    pub fn run(self) -> ! {
        let cfg = self.broker.cfg();
        let notice = bxharden::log::notice;
        notice(&format!(
            "serving tools on {} and approvals on {}",
            cfg.broker_socket().display(),
            cfg.admin_socket().display()
        ));
        notice(&format!(
            "serving session state on {}",
            cfg.state_socket().display()
        ));
        notice(&self.report.to_string());
        let (seq, hash) = self.broker.ledger().audit().head();
        chain::log_head("at start", seq, &hash);
        if let Some(t) = &self.opened.torn {
            notice(&format!(
                "a torn tail is recovered: {} bytes at offset {} of {} were cut off and recorded",
                t.len,
                t.offset,
                cfg.chain_path().display()
            ));
        }
        for b in &self.opened.accepted {
            notice(&format!(
                "the audit chain has an accepted break at {}: {} (it resumes from {})",
                b.at, b.why, b.resumes
            ));
        }
        if self.opened.expired > 0 {
            notice(&format!(
                "{} approval(s) pending at the last stop are recorded as expired at restart",
                self.opened.expired
            ));
        }
        let stop = stop_pipe();
        if let Err(e) = &stop {
            bxharden::log::notice(&format!("cannot catch SIGTERM for a clean stop: {e}"));
        }
        let serve = |(listener, policy): (UnixListener, PeerPolicy),
                     spec: layout::SocketSpec,
                     handler: fn(UnixStream, Envelope, &Broker)| {
            let broker = Arc::clone(&self.broker);
            let cap = cfg.serve.max_connections(&spec);
            let socket = bxharden::serve::Socket::new(listener, spec, policy, cap);
            bxharden::serve::accept_loop(socket, move |s, env| handler(s, env, &broker))
        };
        let spawned = [
            serve(self.state, layout::STATE, state_socket::handle),
            serve(self.tools, layout::BROKER, broker::handle),
            serve(self.admin, layout::ADMIN, admin::handle),
        ];
        for s in &spawned {
            if let Err(e) = s {
                bxharden::runbook!(
                    bxharden::serve::LISTENER_ANCHOR,
                    "cannot start an accept thread: {e}"
                );
                std::process::exit(1);
            }
        }
        if let Err(e) = bxharden::notify::ready() {
            bxharden::log::notice(&format!("cannot tell systemd it is ready: {e}"));
        }
        let _lock = self._lock;
        // A stop signal writes to the pipe: the journal gets the head at stop.
        if let Ok(r) = stop {
            use std::os::fd::AsRawFd;
            let mut byte = [0u8; 1];
            loop {
                match nix::unistd::read(r.as_raw_fd(), &mut byte) {
                    Ok(1) => {
                        let (seq, hash) = self.broker.ledger().audit().head();
                        chain::log_head("at stop", seq, &hash);
                        std::process::exit(0);
                    }
                    Err(nix::errno::Errno::EINTR) => continue,
                    _ => break,
                }
            }
        }
        loop {
            std::thread::park();
        }
    }
}
