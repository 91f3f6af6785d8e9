//! The one start-up every daemon runs, as a straight line of named steps in the design's order:
//!
//! 1. [`Start::load`]: the TOML configuration ([`load`], one [`ConfigError`] for every daemon),
//!    the identity to drop to and each socket's peers, resolved now (names are looked up before
//!    the sandbox closes);
//! 2. [`Start::own_dir`]: the daemon's own directories (`bxharden::own_dir`);
//! 3. the daemon's own preparation, whatever must be read or opened while the whole filesystem is
//!    there (a key, a lock, the audit chain);
//! 4. [`Start::listen`]: each socket, handed over by systemd or bound here;
//! 5. [`Start::sandbox`]: privilege drop, `no_new_privs`, Landlock, seccomp, in `main` before any
//!    thread; it returns the [`Running`] daemon, the only thing that can start threads;
//! 6. [`Running::serve`] per socket (the one accept path, `crate::serve`), then
//!    [`Running::ready`]: the heap the start-up freed given back, readiness to the service
//!    manager, and the daemon serves until a signal ends it (`SIGTERM`'s default action: every
//!    record is durable before it is answered, so there is nothing to flush).
//!
//! Every daemon's command line is one [`Cli`] (`crate::cli`): `serve --config FILE`, `check
//! --config FILE`, and the commands of its own (brokerd's `audit`, loopd's `selftest`), worded by
//! its [`Usage`].
//!
//! Every step fails with a [`StartError`], which knows its runbook anchor ([`Anchored`]); [`exit`]
//! logs it once, through the logger that adds the pointer and `RUNBOOK=`, and exits 1.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bxcore::Envelope;
use bxcore::layout::SocketSpec;
use bxcore::runbook::Anchored;
use serde::de::DeserializeOwned;

pub use crate::cli::{Args, Body, Cli, CliEnd, Cmd, Command, More, NoMore, Usage};
use crate::config::{Peers, SandboxConfig, ServeConfig};
use crate::dirs::{DirError, STATE_DIR_ANCHOR};
use crate::identity::{Identity, LookupError, Owner};
use crate::log::Daemon;
use crate::peers::PeerError;
use crate::sandbox::{Profile, Report, SANDBOX_ANCHOR, SandboxError};
use crate::serve::{LISTENER_ANCHOR, Socket};
use crate::socket::{Activated, ActivationError, LISTEN_ANCHOR, ListenError};

/// What a daemon is, for the start-up: its name and version, and the runbook entry of a
/// configuration it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub daemon: Daemon,
    /// The anchor of `{daemon}: {config}: {why}` lines: `broker-config-invalid`, ...
    pub config_anchor: &'static str,
}

/// A daemon's configuration file: TOML read by serde (every table `deny_unknown_fields`), then
/// the checks serde cannot make.
pub trait DaemonConfig: DeserializeOwned {
    /// Check what serde cannot, and fill in defaults that depend on other keys. `Err` says what
    /// is wrong, in the configuration's own terms (`[loop] max_tool_rounds must be ...`).
    fn check(&mut self) -> Result<(), String>;

    /// After [`check`](Self::check), for a configuration read from a file: take the paths it
    /// names relative to `dir`, the file's own directory. By default nothing changes.
    fn resolve(&mut self, dir: &Path) {
        let _ = dir;
    }

    /// `[sandbox]`.
    fn sandbox(&self) -> &SandboxConfig;
    /// `[peers]`.
    fn peers(&self) -> &Peers;
    /// `[serve]`.
    fn serve(&self) -> &ServeConfig;
}

/// Why a configuration does not load: the file's path, then what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read the configuration: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: {}", path.display(), message.trim_end())]
    Parse { path: PathBuf, message: String },
    #[error("{}: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
}

/// Parse and check `text`, named `path` in errors.
pub fn parse<C: DaemonConfig>(path: &Path, text: &str) -> Result<C, ConfigError> {
    let mut cfg: C = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    cfg.check().map_err(|why| ConfigError::Invalid {
        path: path.to_path_buf(),
        why,
    })?;
    Ok(cfg)
}

/// Read, parse and check the configuration at `path`; relative paths in it are taken from the
/// file's directory ([`DaemonConfig::resolve`]).
pub fn load<C: DaemonConfig>(path: &Path) -> Result<C, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut cfg: C = parse(path, &text)?;
    cfg.resolve(path.parent().unwrap_or(Path::new("")));
    Ok(cfg)
}

/// Why a daemon did not start. Each variant knows its runbook anchor ([`StartError::anchor`]);
/// the text never carries the pointer itself, [`exit`] adds it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{error}")]
    Config {
        anchor: &'static str,
        error: ConfigError,
    },
    #[error("[sandbox]: {0}")]
    Lookup(#[from] LookupError),
    #[error("{config}: [peers]: {error}")]
    Peers {
        anchor: &'static str,
        config: String,
        error: PeerError,
    },
    #[error("{0}")]
    Dir(#[from] DirError),
    #[error("socket activation: {0}")]
    Activation(#[from] ActivationError),
    #[error("{0}")]
    Listen(#[from] ListenError),
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
    #[error("cannot start the accept thread of {socket}: {error}")]
    Thread { socket: String, error: io::Error },
    /// A step of the daemon's own (its key, its lock, its audit chain), with its anchor.
    #[error("{text}")]
    Own { anchor: String, text: String },
}

impl Anchored for StartError {
    /// The runbook entry the line points at.
    fn anchor(&self) -> &str {
        match self {
            StartError::Config { anchor, .. } | StartError::Peers { anchor, .. } => anchor,
            StartError::Own { anchor, .. } => anchor,
            StartError::Lookup(_) | StartError::Sandbox(_) => SANDBOX_ANCHOR,
            StartError::Dir(_) => STATE_DIR_ANCHOR,
            StartError::Activation(_) | StartError::Listen(_) => LISTEN_ANCHOR,
            StartError::Thread { .. } => LISTENER_ANCHOR,
        }
    }
}

impl StartError {
    /// A step of the daemon's own that failed with an error that knows its runbook entry.
    pub fn anchored(error: &dyn Anchored) -> StartError {
        StartError::Own {
            anchor: error.anchor().to_string(),
            text: error.to_string(),
        }
    }

    /// A step of the daemon's own that failed with `error`, whose runbook entry is `anchor`.
    pub fn own(anchor: &'static str, error: impl std::fmt::Display) -> StartError {
        StartError::Own {
            anchor: anchor.to_string(),
            text: error.to_string(),
        }
    }
}

/// Log why the daemon did not start (once, with its pointer and `RUNBOOK=`), and give the exit
/// status 1.
pub fn exit(e: &StartError) -> ExitCode {
    crate::log::fail(e);
    ExitCode::FAILURE
}

/// `<daemon> serve`: the logger for `spec`'s daemon, then `start`, the daemon's start-up, which
/// returns only with the reason the daemon did not start (it serves until a signal ends the
/// process); log it and give status 1.
pub fn run(
    spec: Spec,
    start: impl FnOnce() -> Result<std::convert::Infallible, StartError>,
) -> ExitCode {
    crate::log::init(spec.daemon);
    match start() {
        Ok(never) => match never {},
        Err(e) => exit(&e),
    }
}

/// `<daemon> check --config FILE`: load and check the configuration, then `report`, which
/// reads what it names and prints what would be served. A refusal is printed on stderr as
/// `<daemon>: <why>; see <pointer>`, with status 1.
pub fn check<C: DaemonConfig>(
    spec: Spec,
    path: &Path,
    report: impl FnOnce(C) -> Result<(), StartError>,
) -> ExitCode {
    let done = load::<C>(path)
        .map_err(|error| StartError::Config {
            anchor: spec.config_anchor,
            error,
        })
        .and_then(report);
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {}", spec.daemon.name, e.pointed());
            ExitCode::FAILURE
        }
    }
}

/// A daemon being started: configuration loaded, identity resolved, no thread yet.
#[derive(Debug)]
pub struct Start<C> {
    spec: Spec,
    path: PathBuf,
    cfg: C,
    id: Identity,
    activated: Option<Activated>,
}

impl<C: DaemonConfig> Start<C> {
    /// Step 1: load the configuration at `path` and resolve the identity to drop to.
    pub fn load(spec: Spec, path: &Path) -> Result<Start<C>, StartError> {
        let cfg: C = load(path).map_err(|error| StartError::Config {
            anchor: spec.config_anchor,
            error,
        })?;
        let id = Identity::resolve(cfg.sandbox())?;
        Ok(Start {
            spec,
            path: path.to_path_buf(),
            cfg,
            id,
            activated: None,
        })
    }

    /// The configuration.
    pub fn cfg(&self) -> &C {
        &self.cfg
    }

    /// The configuration file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The identity root drops to, `None` when no drop is due.
    pub fn owner(&self) -> Option<Owner> {
        self.id.owner()
    }

    /// Step 2: one of the daemon's own directories, made or checked (`bxharden::own_dir`).
    pub fn own_dir(&self, dir: &Path) -> Result<(), StartError> {
        Ok(crate::own_dir(dir, self.owner())?)
    }

    /// Step 4: the socket `spec` (the one systemd handed over by its name, else bound at `path`),
    /// with its peers and its connection cap from the configuration.
    pub fn listen(&mut self, spec: SocketSpec, path: &Path) -> Result<Socket, StartError> {
        let policy = self
            .cfg
            .peers()
            .policy(&spec.file(), self.id.uid)
            .map_err(|error| StartError::Peers {
                anchor: self.spec.config_anchor,
                config: self.path.display().to_string(),
                error,
            })?;
        let owner = self.owner();
        let handed = match &mut self.activated {
            Some(a) => a,
            empty => empty.insert(crate::activated()?),
        };
        let listener = crate::socket_for(handed, spec.name, path, owner)?;
        let cap = self.cfg.serve().max_connections(&spec);
        Ok(Socket::new(listener, spec, policy, cap))
    }

    /// Step 5: the sandbox, applied with `profile`; its report is the start-up notice. From here
    /// on threads may start, through the [`Running`] daemon this returns with the configuration.
    pub fn sandbox(self, profile: &Profile) -> Result<(C, Running), StartError> {
        let report = crate::apply(self.cfg.sandbox(), profile)?;
        crate::log::notice(&report.to_string());
        crate::serve::set_frame_budget(self.cfg.serve().frame_budget);
        Ok((self.cfg, Running { report }))
    }
}

/// A daemon inside its sandbox: the only value that starts its threads.
#[derive(Debug)]
pub struct Running {
    report: Report,
}

impl Running {
    /// The sandbox in force.
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Step 6: serve `socket` on its own accept thread, each request (a kind its table accepts)
    /// handed to `handler`.
    pub fn serve<H>(&self, socket: Socket, handler: H) -> Result<(), StartError>
    where
        H: Fn(UnixStream, Envelope) + Send + Sync + 'static,
    {
        let file = socket.spec.file();
        crate::serve::accept_loop(socket, handler)
            .map(drop)
            .map_err(|error| StartError::Thread {
                socket: file,
                error,
            })
    }

    /// Give back the heap the start-up freed ([`crate::heap`]), tell the service manager the
    /// daemon is ready, then serve until a signal ends the process
    /// (an accept thread that loses its socket ends it too, with status 1).
    pub fn ready(self) -> ! {
        // What the start-up freed goes back to the system before the daemon idles.
        crate::heap::give_back();
        if let Err(e) = crate::notify::ready() {
            crate::log::notice(&format!("cannot tell the service manager it is ready: {e}"));
        }
        loop {
            std::thread::park();
        }
    }
}
