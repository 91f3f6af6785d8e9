//! `bxctl dev up` and `bxctl dev down`: the whole box on one machine, for a newcomer, the demo
//! and the end-to-end tests. Each daemon still applies its own sandbox; run as root, they all
//! drop to one unprivileged user, and the invoking user may connect to every socket.

pub mod configs;
pub mod home;
pub mod procs;
pub mod user;

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use bxcore::client;
use bxcore::layout::{SOCKETS, SocketSpec};
use bxcore::runbook::pointer;
use nix::unistd::{geteuid, getuid};

pub use configs::{ModelChoice, ModelFlags};
pub use home::{DAEMONS, DevHome, MADE_BY, Marker, Provider};
pub use procs::Stopped;

/// How long `up` waits for every socket to answer `ping`.
pub const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long `down` waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// What `dev up` is asked to do.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub home: PathBuf,
    /// As root: the user the daemons drop to (created when missing); default `bx-dev`.
    pub user: Option<String>,
    /// The model flags given (none at all: a fresh home gets the scripted provider, a reused
    /// home keeps what it has).
    pub model: ModelFlags,
}

/// Why the dev box did not come up, or go down.
#[derive(Debug)]
pub enum DevError {
    /// The home is not one `dev up` made, or its marker is damaged.
    NotADevBox(String),
    /// The dev box in this home runs already.
    Running {
        home: PathBuf,
        pids: Vec<(String, u32)>,
    },
    /// The home was made with other settings than those asked for now.
    Mismatch {
        home: PathBuf,
        what: String,
    },
    /// Options that do not go together.
    Usage(String),
    User(user::UserError),
    Io {
        what: String,
        error: io::Error,
    },
    /// A daemon's executable is neither beside bxctl nor on PATH.
    NoExecutable(String),
    /// A daemon exited while the box was starting.
    Died {
        daemon: String,
        status: ExitStatus,
        log: PathBuf,
        tail: Vec<String>,
    },
    /// A daemon's socket did not answer `ping` in time.
    NoAnswer {
        daemon: String,
        socket: PathBuf,
        why: String,
    },
}

impl fmt::Display for DevError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DevError::NotADevBox(why) => f.write_str(why),
            DevError::Running { home, pids } => {
                let list: Vec<String> =
                    pids.iter().map(|(d, p)| format!("{d} (pid {p})")).collect();
                write!(
                    f,
                    "the dev box in {} runs already: {}; `bxctl dev down --home {}` stops it",
                    home.display(),
                    list.join(", "),
                    home.display()
                )
            }
            DevError::Mismatch { home, what } => write!(
                f,
                "the dev box in {} was made {what}; use another --home, or remove this one",
                home.display()
            ),
            DevError::Usage(why) => f.write_str(why),
            DevError::User(e) => write!(f, "{e}"),
            DevError::Io { what, error } => write!(f, "{what}: {error}"),
            DevError::NoExecutable(d) => write!(
                f,
                "cannot find the {d} executable beside bxctl or on PATH; build the workspace \
                 (`cargo build --release`) or install the package; {}",
                pointer("devbox-start-failed")
            ),
            DevError::Died {
                daemon,
                status,
                log,
                tail,
            } => {
                write!(
                    f,
                    "{daemon} ended ({status}) while the dev box was starting; its last log lines ({}):",
                    log.display()
                )?;
                for line in tail {
                    write!(f, "\n    {line}")?;
                }
                write!(f, "\n{}", pointer("devbox-start-failed"))
            }
            DevError::NoAnswer {
                daemon,
                socket,
                why,
            } => write!(
                f,
                "{daemon} did not answer ping on {} within {} s: {why}; {}",
                socket.display(),
                START_DEADLINE.as_secs(),
                pointer("devbox-start-failed")
            ),
        }
    }
}

impl std::error::Error for DevError {}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DevError {
    let what = what.into();
    move |error| DevError::Io { what, error }
}

/// The sockets `daemon` serves.
pub fn sockets_of(daemon: &str) -> Vec<SocketSpec> {
    SOCKETS
        .iter()
        .copied()
        .filter(|s| s.server == daemon)
        .collect()
}

/// The daemons of the dev box in `home` that are running now, with their pids: the processes
/// its pid files name, with the start times they recorded.
pub fn running(home: &DevHome) -> Vec<(String, u32)> {
    DAEMONS
        .iter()
        .filter_map(|d| Some((d.to_string(), procs::running_from(&home.pid_file(d))?)))
        .collect()
}

/// A dev box that came up.
#[derive(Debug)]
pub struct Up {
    pub home: DevHome,
    pub pids: Vec<(String, u32)>,
    /// Whether it reused a home made before.
    pub reused: bool,
}

/// Bring the dev box up; progress lines go to `out`.
pub fn up(opts: &UpOptions, out: &mut dyn Write) -> Result<Up, DevError> {
    let home = DevHome::new(&opts.home).map_err(io_err("cannot find the current directory"))?;
    let marker = home.read_marker().map_err(DevError::NotADevBox)?;
    if marker.is_none() && !home.is_fresh() {
        return Err(DevError::NotADevBox(format!(
            "{} is not empty and was not made by `bxctl dev up`; give a new or empty --home",
            home.root().display()
        )));
    }
    // Every flag is checked before anything is written, made or started.
    let choice = match &marker {
        None => Some(opts.model.resolve().map_err(DevError::Usage)?),
        Some(m) => {
            opts.model.check_each().map_err(DevError::Usage)?;
            let differ = opts.model.differences(&home, m.provider);
            if !differ.is_empty() {
                return Err(DevError::Mismatch {
                    home: home.root().into(),
                    what: format!("with other settings than {}", differ.join("; ")),
                });
            }
            None
        }
    };
    let as_root = geteuid().is_root();
    if !as_root && opts.user.is_some() {
        return Err(DevError::Usage(
            "--user needs root: run as a normal user, the daemons keep your uid".into(),
        ));
    }
    if marker.is_none() {
        make_parents(home.root())?;
    }
    let dev_user = if as_root {
        let name = opts.user.as_deref().unwrap_or(user::DEFAULT_USER);
        let u = user::create_or_take(name).map_err(DevError::User)?;
        user::check_reachable(home.root(), &u).map_err(DevError::User)?;
        Some(u)
    } else {
        None
    };
    let who = configs::Who {
        user: dev_user.as_ref().map(|u| u.name.clone()),
        peers: {
            let mut peers: Vec<String> = dev_user.iter().map(|u| u.name.clone()).collect();
            peers.push(getuid().as_raw().to_string());
            peers
        },
    };

    let reused = match &marker {
        Some(m) => {
            if m.user != who.user {
                let said = |u: &Option<String>| u.clone().unwrap_or_else(|| "your own uid".into());
                return Err(DevError::Mismatch {
                    home: home.root().into(),
                    what: format!("to run as {}, not {}", said(&m.user), said(&who.user)),
                });
            }
            let pids = running(&home);
            if pids.len() == DAEMONS.len() {
                return Err(DevError::Running {
                    home: home.root().into(),
                    pids,
                });
            }
            let _ = writeln!(out, "reusing the dev box in {}", home.root().display());
            true
        }
        None => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(home.root())
                .map_err(io_err(format!("cannot make {}", home.root().display())))?;
            let Some(choice) = &choice else {
                unreachable!("a fresh home always has its resolved choice")
            };
            configs::write_all(&home, &who, choice).map_err(io_err(format!(
                "cannot write the configs in {}",
                home.root().display()
            )))?;
            let m = Marker {
                made_by: MADE_BY.into(),
                provider: choice.provider,
                user: who.user.clone(),
            };
            let text = toml::to_string(&m).map_err(|e| DevError::Io {
                what: "cannot write the marker".into(),
                error: io::Error::other(e),
            })?;
            fs::write(home.marker(), text).map_err(io_err("cannot write the marker"))?;
            let _ = writeln!(out, "made a dev box in {}", home.root().display());
            false
        }
    };
    if let Some(u) = &dev_user {
        user::give(home.root(), u).map_err(DevError::User)?;
    }

    let mut started: Vec<(String, u32, Child)> = Vec::new();
    let result = start_all(&home, &mut started, out);
    if let Err(e) = result {
        for (d, _, mut child) in started {
            if let Some(which) = procs::read_started(&home.pid_file(&d)) {
                procs::stop(which, STOP_GRACE);
            }
            let _ = child.try_wait();
            let _ = fs::remove_file(home.pid_file(&d));
        }
        return Err(e);
    }
    let pids = started.iter().map(|(d, p, _)| (d.clone(), *p)).collect();
    let r = home.root().display();
    let _ = writeln!(out, "the dev box is up in {r}");
    let _ = writeln!(out, "  chat:    bxctl chat --home {r} \"hello\"");
    let _ = writeln!(out, "  status:  bxctl status --home {r}");
    let _ = writeln!(out, "  logs:    {r}/logs/<daemon>.log");
    let _ = writeln!(out, "  stop:    bxctl dev down --home {r}");
    Ok(Up { home, pids, reused })
}

/// Make the missing parents of a new home, 0755 whatever the umask (the daemons' users walk
/// through them), before anything else is written or started. A parent that exists is left as
/// it is; `user::check_reachable` says when it keeps a daemon out.
fn make_parents(root: &Path) -> Result<(), DevError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(parent) = root.parent() else {
        return Ok(());
    };
    let missing: Vec<&Path> = parent
        .ancestors()
        .take_while(|p| fs::symlink_metadata(p).is_err())
        .collect();
    for dir in missing.into_iter().rev() {
        let made = fs::DirBuilder::new().mode(0o755).create(dir);
        match made {
            Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
                .map_err(io_err(format!("cannot make {} 0755", dir.display())))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(DevError::Io {
                    what: format!("cannot make {}", dir.display()),
                    error: e,
                });
            }
        }
    }
    Ok(())
}

fn start_all(
    home: &DevHome,
    started: &mut Vec<(String, u32, Child)>,
    out: &mut dyn Write,
) -> Result<(), DevError> {
    let already = running(home);
    for d in DAEMONS {
        // Only the daemons that are missing are started; the others keep running.
        if let Some((_, pid)) = already.iter().find(|(name, _)| name == d) {
            let _ = writeln!(out, "  {d}: runs already, pid {pid}");
            continue;
        }
        let exe = procs::find_daemon(d).ok_or_else(|| DevError::NoExecutable(d.to_string()))?;
        let child = procs::spawn_detached(&exe, &home.config(d), &home.log(d))
            .map_err(io_err(format!("cannot start {}", exe.display())))?;
        let pid = child.id();
        procs::write_pid(&home.pid_file(d), pid).map_err(io_err("cannot write a pid file"))?;
        started.push((d.to_string(), pid, child));
    }
    let until = Instant::now() + START_DEADLINE;
    for (d, pid, child) in started.iter_mut() {
        let sockets = sockets_of(d);
        for spec in &sockets {
            wait_for_ping(home, d, spec, child, until)?;
        }
        let paths: Vec<String> = sockets
            .iter()
            .map(|s| s.path(home.root()).display().to_string())
            .collect();
        let _ = writeln!(
            out,
            "  {d}: up, pid {pid}, answering on {}",
            paths.join(", ")
        );
    }
    Ok(())
}

fn wait_for_ping(
    home: &DevHome,
    daemon: &str,
    spec: &SocketSpec,
    child: &mut Child,
    until: Instant,
) -> Result<(), DevError> {
    let socket = spec.path(home.root());
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(DevError::Died {
                daemon: daemon.to_string(),
                status,
                log: home.log(daemon),
                tail: procs::tail(&home.log(daemon), 20),
            });
        }
        let why = match client::ping(&socket, Duration::from_secs(2)) {
            Ok(p) if p.daemon == daemon => return Ok(()),
            Ok(p) => format!("{} answered instead", p.daemon),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= until {
            return Err(DevError::NoAnswer {
                daemon: daemon.to_string(),
                socket,
                why,
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `dev restart`: stop the dev box in `home`, then bring it up again as it was made (no flags).
pub fn restart(home: &Path, user: Option<String>, out: &mut dyn Write) -> Result<Up, DevError> {
    down(home, out)?;
    up(
        &UpOptions {
            home: home.to_path_buf(),
            user,
            model: ModelFlags::default(),
        },
        out,
    )
}

/// Stop the dev box in `home`; one line per daemon goes to `out`.
pub fn down(home: &Path, out: &mut dyn Write) -> Result<Vec<(String, Stopped)>, DevError> {
    let home = DevHome::new(home).map_err(io_err("cannot find the current directory"))?;
    if home.read_marker().map_err(DevError::NotADevBox)?.is_none() {
        return Err(DevError::NotADevBox(format!(
            "{} was not made by `bxctl dev up`: there is no dev box to stop",
            home.root().display()
        )));
    }
    let mut all = Vec::new();
    // The reverse of the start order: the loop first, so nothing calls a daemon that is gone.
    for d in DAEMONS.iter().rev() {
        let pid_file = home.pid_file(d);
        let stopped = match procs::read_started(&pid_file) {
            Some(which) => {
                let s = procs::stop(which, STOP_GRACE);
                let _ = writeln!(out, "  {d} (pid {}): {s}", which.pid);
                s
            }
            None => {
                let _ = writeln!(out, "  {d}: {}", Stopped::NotRunning);
                Stopped::NotRunning
            }
        };
        let _ = fs::remove_file(&pid_file);
        all.push((d.to_string(), stopped));
    }
    let _ = writeln!(out, "the dev box in {} is down", home.root().display());
    Ok(all)
}
