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
//! A daemon is a [`Table`]: its configuration, what it reads, what it opens, its sandbox, its
//! sockets' handlers and its own commands. [`main`] writes its `main`, `check` and `serve` from
//! the table, the same for every daemon; each daemon's `main.rs` is its table.
//!
//! Every step fails with a [`StartError`], which knows its runbook anchor ([`Anchored`]); [`exit`]
//! logs it once, through the logger that adds the pointer and `RUNBOOK=`, and exits 1.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bxcore::layout::{Requests, SocketSpec};
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
    /// The sockets the daemon serves: what `[peers]` and `[serve.connections]` may name.
    const SOCKETS: &'static [SocketSpec];

    /// Check what serde cannot, and fill in defaults that depend on other keys. `Err` says what
    /// is wrong, in the configuration's own terms (`[loop] max_tool_rounds must be ...`).
    /// `[serve]` and `[peers]` are checked against [`Self::SOCKETS`] after it.
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

    /// Read, parse and check the configuration at `path`; relative paths in it are taken from
    /// the file's directory ([`DaemonConfig::resolve`]).
    fn load(path: &Path) -> Result<Self, ConfigError>
    where
        Self: Sized,
    {
        load(path)
    }

    /// Parse and check a configuration's text (errors name no file).
    fn parse(text: &str) -> Result<Self, ConfigError>
    where
        Self: Sized,
    {
        parse(Path::new(""), text)
    }
}

/// The accessors of the tables every daemon's configuration has (`[sandbox]`, `[peers]`,
/// `[serve]`), for a configuration whose fields are called so.
#[macro_export]
macro_rules! common_tables {
    () => {
        fn sandbox(&self) -> &$crate::SandboxConfig {
            &self.sandbox
        }
        fn peers(&self) -> &$crate::Peers {
            &self.peers
        }
        fn serve(&self) -> &$crate::ServeConfig {
            &self.serve
        }
    };
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
    let invalid = |why| ConfigError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    cfg.check().map_err(invalid)?;
    cfg.serve().check(C::SOCKETS).map_err(invalid)?;
    let names: Vec<String> = C::SOCKETS.iter().map(SocketSpec::file).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    cfg.peers()
        .check_sockets(&names)
        .map_err(|e| invalid(format!("[peers]: {e}")))?;
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

/// One daemon, as a table: what bxharden needs to write its `main`, its `check` and its `serve`
/// (the start-up's steps in their order, module doc). Each daemon's `main.rs` is its table.
pub trait Table: Sized {
    /// Its name, version, and the anchor of a configuration it refuses.
    const SPEC: Spec;
    /// The words of its command line.
    const USAGE: Usage;
    /// Its configuration file.
    type Config: DaemonConfig;
    /// What the files its configuration names hold, read by `check` and `serve` alike (a key,
    /// a CA bundle, a script), before anything is made.
    type Read;
    /// What `serve` opens with the whole filesystem there: its sockets, its stores, its locks.
    type Prepared;
    /// Its own commands beside `serve` and `check`.
    type More: More;

    /// Step 3's reading: the files the configuration names. Makes nothing.
    fn read(cfg: &Self::Config) -> Result<Self::Read, StartError>;

    /// What it serves, line by line, the first naming its sockets (`gateway.sock on ...`): what
    /// [`describe`](Self::describe) and [`check`](Self::check) say by default. Never a secret.
    fn serves(cfg: &Self::Config, read: &Self::Read) -> Vec<String>;

    /// What it serves, for the start-up notices: by default [`serves`](Self::serves), its first
    /// line `serving ...`.
    fn describe(cfg: &Self::Config, read: &Self::Read) -> Vec<String> {
        let mut lines = Self::serves(cfg, read);
        if let Some(first) = lines.first_mut() {
            *first = format!("serving {first}");
        }
        lines
    }

    /// What `check` prints after the configuration loaded and was read, and whether it passes
    /// (`false`: status 1). By default `<daemon>: configuration ok`, then `<daemon>: would
    /// serve ...` and the rest of [`serves`](Self::serves), each line named by the daemon.
    fn check(cfg: &Self::Config, read: &Self::Read) -> (Vec<String>, bool) {
        let name = Self::SPEC.daemon.name;
        let mut lines = vec![format!("{name}: configuration ok")];
        for (i, l) in Self::serves(cfg, read).into_iter().enumerate() {
            lines.push(if i == 0 {
                format!("{name}: would serve {l}")
            } else {
                format!("{name}: {l}")
            });
        }
        (lines, true)
    }

    /// How `check` says it refused the configuration or what it names: by default on stderr,
    /// `<daemon>: <why>; see <pointer>`.
    fn check_refused(e: &StartError) {
        eprintln!("{}: {}", Self::SPEC.daemon.name, e.pointed());
    }

    /// Steps 2 to 4: its own directories, what it opens, its sockets (`Start::listen`).
    fn prepare(
        start: &mut Start<Self::Config>,
        read: Self::Read,
    ) -> Result<Self::Prepared, StartError>;

    /// Step 5's sandbox: what it may touch, and its seccomp profile.
    fn profile(start: &Start<Self::Config>, prepared: &Self::Prepared) -> Profile;

    /// Step 6: each socket its handler (`Running::serve`), its own threads, its stop hook.
    fn serve(
        cfg: Self::Config,
        prepared: Self::Prepared,
        running: &Running,
    ) -> Result<(), StartError>;

    /// One of its own commands.
    fn more(command: Self::More) -> ExitCode;
}

/// The whole program of the daemon `T`: the logger, the command line, then `serve`, `check` or
/// one of its own commands.
pub fn main<T: Table>() -> ExitCode {
    let inherited = crate::fds::close_inherited();
    crate::log::init(T::SPEC.daemon);
    crate::fds::log_closed(&inherited);
    match Cli::<T::More>::parse(T::SPEC.daemon, &T::USAGE) {
        Command::Serve { config } => match serve::<T>(&config) {
            Ok(never) => match never {},
            Err(e) => exit(&e),
        },
        Command::Check { config } => check::<T>(&config),
        Command::More(command) => T::more(command),
    }
}

/// `<daemon> serve --config FILE`: the start-up, then serving until a signal ends the process.
/// Returns only with the reason the daemon did not start.
fn serve<T: Table>(config: &Path) -> Result<std::convert::Infallible, StartError> {
    let mut s = Start::<T::Config>::load(T::SPEC, config)?;
    let read = T::read(s.cfg())?;
    let notices = T::describe(s.cfg(), &read);
    let prepared = T::prepare(&mut s, read)?;
    let profile = T::profile(&s, &prepared);
    let (cfg, running) = s.sandbox(&profile)?;
    T::serve(cfg, prepared, &running)?;
    for n in notices {
        crate::log::notice(&n);
    }
    running.ready()
}

/// `<daemon> check --config FILE`: load and check the configuration, read what it names, print
/// what would be served. A refusal is printed on stderr as `<daemon>: <why>; see <pointer>`,
/// with status 1.
fn check<T: Table>(config: &Path) -> ExitCode {
    let done = load::<T::Config>(config)
        .map_err(|error| StartError::Config {
            anchor: T::SPEC.config_anchor,
            error,
        })
        .and_then(|cfg| T::read(&cfg).map(|read| T::check(&cfg, &read)));
    match done {
        Ok((lines, ok)) => {
            for l in lines {
                println!("{l}");
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            T::check_refused(&e);
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

    /// Step 1 for a process its daemon started inside its own sandbox (loopd's session worker):
    /// the configuration at `path`, and the identity it runs as, with nothing to look up.
    pub fn load_within(spec: Spec, path: &Path) -> Result<Start<C>, StartError> {
        let cfg: C = load(path).map_err(|error| StartError::Config {
            anchor: spec.config_anchor,
            error,
        })?;
        Ok(Start {
            spec,
            path: path.to_path_buf(),
            cfg,
            id: Identity::current(),
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

    /// Step 4: the socket `R` serves (the one systemd handed over by its name, else bound at
    /// `path`), with its peers and its limits from the configuration.
    pub fn listen<R: Requests>(&mut self, path: &Path) -> Result<Socket<R>, StartError> {
        let spec = R::SPEC;
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
        let limits = self.cfg.serve().limits(&spec);
        Ok(Socket::new(listener, policy, limits))
    }

    /// Step 5: the sandbox, applied with `profile`; its report is the start-up notice. From here
    /// on threads may start, through the [`Running`] daemon this returns with the configuration.
    pub fn sandbox(self, profile: &Profile) -> Result<(C, Running), StartError> {
        let report = crate::apply(self.cfg.sandbox(), profile)?;
        crate::log::notice(&report.to_string());
        crate::heap::tune();
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

    /// Step 6: serve `socket` on its own accept thread, each request (an `R`: a kind its table
    /// accepts) handed to `handler` with its id.
    pub fn serve<R, H>(&self, socket: Socket<R>, handler: H) -> Result<(), StartError>
    where
        R: Requests,
        H: Fn(UnixStream, u64, R) + Send + Sync + 'static,
    {
        let file = R::SPEC.file();
        crate::serve::accept_loop(socket, handler)
            .map(drop)
            .map_err(|error| StartError::Thread {
                socket: file,
                error,
            })
    }

    /// A thread of the daemon's own, named `name`.
    pub fn thread<F>(&self, name: &str, f: F) -> Result<(), StartError>
    where
        F: FnOnce() + Send + 'static,
    {
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(f)
            .map(drop)
            .map_err(|error| StartError::Thread {
                socket: name.to_owned(),
                error,
            })
    }

    /// Run `f` when SIGTERM or SIGINT asks the daemon to stop, then end the process with status
    /// 0 (brokerd logs its chain's head). The signal's handler only writes one byte into a pipe
    /// (async-signal-safe); a thread of its own reads it and runs `f`.
    pub fn on_stop<F>(&self, f: F) -> Result<(), StartError>
    where
        F: FnOnce() + Send + 'static,
    {
        let r = crate::stop::pipe().map_err(|e| {
            StartError::own(
                LISTENER_ANCHOR,
                format!("cannot catch SIGTERM for a clean stop: {e}"),
            )
        })?;
        self.thread("stop", move || {
            if crate::stop::wait(&r) {
                f();
                std::process::exit(0);
            }
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
