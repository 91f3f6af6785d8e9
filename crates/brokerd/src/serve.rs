//! `brokerd serve`: bring the broker up, listen on its three sockets, and keep it running.
//!
//! In order, on the first thread: the directories, the audit lock, the chain verified (a torn
//! tail recovered, a break refused), the three sockets (state, broker, admin), the sandbox, the
//! `started` record; then the notices, one accept thread per socket, and readiness.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use bxcore::{Envelope, layout};
use bxharden::daemon::{self, Running, Spec, Start, StartError};
use bxharden::serve::Socket;
use bxharden::{Daemon, Profile, SeccompProfile};
use serde_json::json;
use toolkit::Env;

use crate::broker::{self, Broker};
use crate::config::Config;
use crate::dirs;
use crate::fingerprints::Fingerprints;
use crate::ledger::Ledger;
use crate::ledger::chain::{self, ChainError, OnBreak, Opened};
use crate::ledger::lock::AuditLock;
use crate::ledger::record::{Draft, Event};
use crate::state::StateStore;
use crate::{admin, decide, state_socket};

/// The runbook anchor of a configuration brokerd refuses.
pub const CONFIG_ANCHOR: &str = "broker-config-invalid";

/// brokerd, for the start-up every daemon runs.
pub const SPEC: Spec = Spec {
    daemon: Daemon {
        name: "brokerd",
        version: env!("CARGO_PKG_VERSION"),
    },
    config_anchor: CONFIG_ANCHOR,
};

/// A broker with its sockets open and its sandbox applied, not yet accepting.
#[derive(Debug)]
pub struct Started {
    pub broker: Arc<Broker>,
    pub opened: Opened,
    running: Running,
    tools: Socket,
    admin: Socket,
    state: Socket,
    decide: Socket,
    _lock: AuditLock,
}

/// Start the broker from the configuration at `config_path` (which the sandbox keeps readable):
/// the start-up every daemon runs, with brokerd's own step between its directories and its
/// sockets: the audit lock taken and the chain verified (a torn tail recovered, a break refused).
pub fn start(config_path: &Path) -> Result<Started, StartError> {
    let mut s = Start::<Config>::load(SPEC, config_path)?;
    let cfg = s.cfg();
    let registry = cfg
        .registry()
        .map_err(|e| StartError::own(CONFIG_ANCHOR, e))?;
    let roots = cfg.roots().map_err(|e| StartError::own(CONFIG_ANCHOR, e))?;
    for dir in [cfg.broker_dir(), cfg.state_dir(), cfg.audit_dir()] {
        s.own_dir(&dir)?;
    }

    let lock = AuditLock::take(&cfg.lock_path()).map_err(|e| StartError::anchored(&e))?;
    let (audit, opened) =
        chain::open(&cfg.chain_path(), OnBreak::Refuse).map_err(|e| StartError::anchored(&e))?;
    for file in [cfg.lock_path(), cfg.chain_path()] {
        dirs::give(&file, s.owner())?;
    }
    let fingerprints =
        Fingerprints::open(&cfg.broker_dir()).map_err(|e| StartError::anchored(&e))?;

    // The three sockets. `state.sock` comes first: whoever waits for the tool and admin sockets
    // then finds it bound too.
    let (state_path, tools_path, admin_path) =
        (cfg.state_socket(), cfg.broker_socket(), cfg.admin_socket());
    let state = s.listen(layout::STATE, &state_path)?;
    let tools = s.listen(layout::BROKER, &tools_path)?;
    let admin = s.listen(layout::ADMIN, &admin_path)?;
    let decide_path = s.cfg().decide_socket();
    let decide = s.listen(layout::DECIDE, &decide_path)?;

    let run_cfg = s.cfg().run.clone();
    let mut profile = Profile::new(SeccompProfile::Brokerd {
        run_tool: run_cfg.is_some(),
    })
    .read_write(s.cfg().broker_dir())
    .read_only(config_path.to_path_buf());
    // The run tool's programs reach nothing brokerd cannot: its domain holds theirs.
    let run_sandbox = match &run_cfg {
        Some(run) => {
            let mut child = Profile::new(SeccompProfile::RunChild);
            for p in run.system_paths() {
                profile = profile.read_only(p.clone());
                child = child.read_only(p);
            }
            let mismatch = if s.cfg().sandbox.seccomp_log {
                bxharden::seccomp::Mismatch::LogEperm
            } else {
                bxharden::seccomp::Mismatch::KillProcess
            };
            let sandbox =
                bxharden::ChildSandbox::prepare(&child, mismatch, s.cfg().sandbox.require)
                    .map_err(|e| StartError::own(bxharden::sandbox::SANDBOX_ANCHOR, e))?;
            Some(sandbox)
        }
        None => None,
    };
    for root in roots.iter() {
        profile = if root.writable {
            profile.read_write(root.path.clone())
        } else {
            profile.read_only(root.path.clone())
        };
    }
    let (cfg, running) = s.sandbox(&profile)?;

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
                "sandbox": running.report().to_string(),
            }),
        )])
        .map_err(|e| StartError::anchored(&ChainError::Io(cfg.chain_path(), e.0)))?;

    let run = match (run_cfg, run_sandbox) {
        (Some(r), Some(sandbox)) => Some(Arc::new(toolkit::run::Settings {
            path: r.path.clone(),
            programs: r.programs.clone(),
            memory_bytes: r.memory_mb << 20,
            file_bytes: r.file_size_mb << 20,
            processes: r.processes,
            open_files: r.open_files,
            max_output: r.max_output_bytes,
            own_network: r.network_namespace,
            sandbox,
        })),
        _ => None,
    };
    let env = Env {
        roots,
        gateway: cfg.gateway.socket.clone(),
        run,
    };
    let ledger = Ledger::new(StateStore::new(&cfg.state_dir()), audit);
    // A tool whose daemon is absent (web_fetch with no gateway) is not offered.
    let registry = registry.offered(&env);
    let broker = Arc::new(Broker::new(cfg, registry, env, ledger, fingerprints));
    Ok(Started {
        broker,
        opened,
        running,
        tools,
        admin,
        state,
        decide,
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
        notice(&format!(
            "serving the channel's decisions on {} (sessions {}...)",
            cfg.decide_socket().display(),
            cfg.decide.session_prefix
        ));
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
        let (seq, hash) = self.broker.ledger().audit().head();
        chain::log_head("at start", seq, &hash);
        // A stop signal writes to the pipe; a thread of its own logs the head and ends the
        // process, so the journal gets the head at stop.
        match stop_pipe() {
            Ok(r) => {
                let broker = Arc::clone(&self.broker);
                let waiter = std::thread::Builder::new()
                    .name("stop".into())
                    .spawn(move || wait_for_stop(&r, &broker));
                if let Err(e) = waiter {
                    notice(&format!("cannot wait for SIGTERM for a clean stop: {e}"));
                }
            }
            Err(e) => notice(&format!("cannot catch SIGTERM for a clean stop: {e}")),
        }
        let serve = |socket: Socket, handler: fn(UnixStream, Envelope, &Broker)| {
            let broker = Arc::clone(&self.broker);
            self.running
                .serve(socket, move |s, env| handler(s, env, &broker))
        };
        let served = serve(self.state, state_socket::handle)
            .and_then(|()| serve(self.tools, broker::handle))
            .and_then(|()| serve(self.admin, admin::handle))
            .and_then(|()| serve(self.decide, decide::handle));
        if let Err(e) = served {
            daemon::exit(&e);
            std::process::exit(1);
        }
        let _lock = self._lock;
        self.running.ready()
    }
}

/// Wait for a stop signal's byte, then log the head and end the process.
fn wait_for_stop(r: &std::os::fd::OwnedFd, broker: &Broker) {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(r.as_raw_fd(), &mut byte) {
            Ok(1) => {
                let (seq, hash) = broker.ledger().audit().head();
                chain::log_head("at stop", seq, &hash);
                std::process::exit(0);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}
