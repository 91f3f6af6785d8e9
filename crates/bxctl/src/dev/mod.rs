//! `bxctl dev up` and `bxctl dev down`: the whole box on one machine, for a newcomer, the demo
//! and the end-to-end tests. Each daemon still applies its own sandbox. Run as root, each
//! daemon drops to a user of its own, made for this box, and each socket belongs to its one
//! client, as on the device: `dev up` binds every socket itself with its client as owner and
//! hands it over as systemd does (`LISTEN_FDS`), and waits for each daemon's `READY=1`
//! (`NOTIFY_SOCKET`). Run as a normal user, every daemon keeps that user's uid.

pub mod command;
pub mod configs;
pub mod daemons;
pub mod home;
pub mod honcho;
pub mod procs;
pub mod target;
pub mod user;

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use bxcore::layout::{self, SOCKETS, SocketSpec};
use bxcore::runbook::Anchored;
use bxharden::Owner;
use nix::unistd::{geteuid, getuid};

use crate::health::{self, Pinged};
use crate::thread_ids::Ids;

pub use command::DevCommand;
pub use configs::{ModelChoice, ModelFlags};
pub use daemons::{ALL_DAEMONS, DAEMONS, ROWS};
pub use home::{DevHome, MADE_BY, Marker, Provider};
pub use honcho::{HonchoChoice, HonchoFlags};
pub use procs::Stopped;
pub use target::find;
pub use user::DevUser;

/// How long `up` waits for every socket to answer `ping`.
pub const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a log's sink may take to copy what its daemon left in the pipe.
const SINK_GRACE: Duration = Duration::from_secs(2);

/// How long `down` waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// What `dev up` is asked to do.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub home: PathBuf,
    /// The model flags given (none at all: a fresh home gets the scripted provider, a reused
    /// home keeps what it has).
    pub model: ModelFlags,
    /// The Honcho flags given (none: a fresh home gets the embedded store, a reused home keeps
    /// what it has).
    pub honcho: HonchoFlags,
    /// The hosts gatewayd may fetch from (`--web-host`), for a fresh home.
    pub web_hosts: Vec<String>,
    /// channeld's `[matrix]` (and `[limits]`) as a TOML file: the Matrix channel joins the box
    /// (a new home only).
    pub matrix: Option<PathBuf>,
}

/// The runbook entry of a dev box that did not come up: a daemon ended, did not say ready or
/// answer, its socket could not be bound, or its executable is missing.
pub const START_ANCHOR: &str = "devbox-start-failed";

/// The runbook entry of a `dev` command refused before anything started: the home, its users,
/// a file of its own.
pub const REFUSED_ANCHOR: &str = "devbox-refused";

/// Why the dev box did not come up, or go down. The text has no runbook pointer; the line a
/// person reads is its [`Anchored::pointed`] form.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The home is not one `dev up` made, or its marker is damaged.
    #[error("{0}")]
    NotADevBox(String),
    /// The dev box in this home runs already.
    #[error(
        "the dev box in {} runs already: {}; `bxctl dev down --home {}` stops it",
        home.display(),
        pids.iter().map(|(d, p)| format!("{d} (pid {p})")).collect::<Vec<_>>().join(", "),
        home.display()
    )]
    Running {
        home: PathBuf,
        pids: Vec<(String, u32)>,
    },
    /// The home was made with other settings than those asked for now.
    #[error(
        "the dev box in {} was made {what}; use another --home, or remove this one",
        home.display()
    )]
    Mismatch { home: PathBuf, what: String },
    /// Options that do not go together.
    #[error("{0}")]
    Usage(String),
    /// A Honcho flag that cannot be used (`dev::honcho`).
    #[error(transparent)]
    Honcho(Box<honcho::HonchoFlagError>),
    #[error(transparent)]
    User(user::UserError),
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
    /// A daemon's executable is neither beside bxctl nor on PATH.
    #[error(
        "cannot find the {0} executable beside bxctl or on PATH; build the workspace \
         (`cargo build --release`) or install the package"
    )]
    NoExecutable(String),
    /// A daemon exited while the box was starting: its last log lines, then what happened, so
    /// that the line's pointer ends it.
    #[error(
        "{daemon}'s last log lines ({}):{}\n{daemon} ended ({status}) while the dev box was starting",
        log.display(),
        tail.iter().map(|l| format!("\n    {l}")).collect::<String>()
    )]
    Died {
        daemon: String,
        status: ExitStatus,
        log: PathBuf,
        tail: Vec<String>,
    },
    /// A daemon's socket could not be bound for it.
    #[error("cannot bind a socket for {daemon}: {error}")]
    Listen {
        daemon: String,
        error: bxharden::socket::ListenError,
    },
    /// A daemon did not say `READY=1` in time.
    #[error(
        "{daemon} did not say READY=1 on {} within {} s (its log says what it was doing)",
        notify.display(),
        START_DEADLINE.as_secs()
    )]
    NotReady { daemon: String, notify: PathBuf },
    /// A daemon's configuration does not load: a running box is left running.
    #[error(
        "{daemon}'s configuration does not load, so the running dev box was left as it is \
         (fix {}, then restart):\n{said}",
        config.display()
    )]
    Unloadable {
        daemon: String,
        config: PathBuf,
        said: String,
        anchor: String,
    },
    /// A daemon's socket did not answer `ping` in time.
    #[error(
        "{daemon} did not answer ping on {} within {} s: {why}",
        socket.display(),
        START_DEADLINE.as_secs()
    )]
    NoAnswer {
        daemon: String,
        socket: PathBuf,
        why: String,
    },
}

impl Anchored for DevError {
    fn anchor(&self) -> &str {
        match self {
            DevError::NoExecutable(_)
            | DevError::Died { .. }
            | DevError::Listen { .. }
            | DevError::NotReady { .. }
            | DevError::NoAnswer { .. } => START_ANCHOR,
            DevError::User(e) => e.anchor(),
            DevError::Honcho(e) => e.anchor(),
            DevError::Unloadable { anchor, .. } => anchor,
            DevError::NotADevBox(_)
            | DevError::Running { .. }
            | DevError::Mismatch { .. }
            | DevError::Usage(_)
            | DevError::Io { .. } => REFUSED_ANCHOR,
        }
    }
}

impl DevError {
    fn honcho(e: honcho::HonchoFlagError) -> DevError {
        DevError::Honcho(Box::new(e))
    }
}

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

/// The daemons the dev box in `home` runs: every row's, but an optional daemon's (channeld)
/// only when the home has its configuration.
pub fn configured(home: &DevHome) -> Vec<&'static str> {
    ROWS.iter()
        .filter(|r| !r.optional || home.config(r.daemon).is_file())
        .map(|r| r.daemon)
        .collect()
}

/// The daemons of the dev box in `home` that are running now, with their pids: the processes
/// its pid files name, with the start times they recorded.
pub fn running(home: &DevHome) -> Vec<(String, u32)> {
    ALL_DAEMONS
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

/// Who runs the box: as root, its users by daemon; else nobody but the caller.
#[derive(Debug, Clone, Default)]
struct Users(BTreeMap<&'static str, DevUser>);

impl Users {
    /// The ids root gives `spec`'s socket to and talks to it as: its client's user; `None` for
    /// the owner's sockets, and when the daemons keep the caller's uid.
    fn client_ids(&self, spec: &SocketSpec) -> Option<Ids> {
        self.0.get(spec.client).map(|u| Ids {
            uid: u.uid,
            gid: u.gid,
        })
    }
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
    for h in &opts.web_hosts {
        configs::check_web_host(h).map_err(DevError::Usage)?;
    }
    let matrix = match (&opts.matrix, &marker) {
        (Some(_), Some(_)) => {
            return Err(DevError::Usage(
                "--matrix is for a new home: a reused home keeps its etc/channeld.toml".into(),
            ));
        }
        (Some(file), None) => Some(configs::matrix_tables(file).map_err(DevError::Usage)?),
        (None, _) => None,
    };
    let choice = match &marker {
        None => {
            let model = opts.model.resolve().map_err(DevError::Usage)?;
            opts.honcho.check_each().map_err(DevError::honcho)?;
            Some(Fresh { model, matrix })
        }
        Some(m) => {
            opts.model.check_each().map_err(DevError::Usage)?;
            let mut differ = opts.model.differences(&home, m.provider);
            differ.extend(
                opts.honcho
                    .differences(m.honcho.as_ref())
                    .map_err(DevError::honcho)?,
            );
            if !opts.web_hosts.is_empty() {
                differ.push(format!(
                    "--web-host {} (a reused home keeps the hosts of its etc/gatewayd.toml)",
                    opts.web_hosts.join(" --web-host ")
                ));
            }
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
    if let Some(m) = &marker {
        if let Some(one) = &m.user {
            return Err(DevError::Mismatch {
                home: home.root().into(),
                what: format!(
                    "by an earlier `dev up` to run every daemon as the one user {one}, where each \
                     daemon now has a user of its own"
                ),
            });
        }
        match (&m.box_id, as_root) {
            (Some(id), false) => {
                return Err(DevError::Mismatch {
                    home: home.root().into(),
                    what: format!(
                        "as root, to run each daemon as its own user (bx-dev-{id}-*), not as \
                         your own uid; run `dev up` as root"
                    ),
                });
            }
            (None, true) => {
                return Err(DevError::Mismatch {
                    home: home.root().into(),
                    what: "by a normal user, to run every daemon as that user's uid, not as \
                           root with a user per daemon"
                        .to_string(),
                });
            }
            _ => {}
        }
    }
    let fresh = marker.is_none();
    let mut undo = Undo::new(&home, fresh);
    if fresh {
        undo.parents = make_parents(home.root())?;
    }
    let box_id = match (&marker, as_root) {
        (Some(m), _) => m.box_id.clone(),
        (None, true) => Some(user::draw_box_id().map_err(DevError::User)?),
        (None, false) => None,
    };
    if fresh {
        undo.users.clone_from(&box_id);
    }
    // A box that was down when this `dev up` began is down again when it fails: its users
    // go as `dev down` takes them (a fresh home's go with the home).
    let was_down = running(&home).is_empty();
    let result = up_on(opts, out, &home, marker, choice, box_id.clone(), as_root);
    match result {
        Ok(up) => {
            undo.keep();
            Ok(up)
        }
        Err(e) => {
            if let (false, true, true, Some(id)) = (fresh, was_down, as_root, &box_id) {
                if let Err(u) = take_users_back(&home, id, out) {
                    let _ = writeln!(out, "  could not remove the box's users: {u}");
                }
            }
            undo.run(out);
            Err(e)
        }
    }
}

/// What a `dev up` on a fresh home made before it failed, taken back so the home and the machine
/// are as they were: the users drawn for it, the home, and the parents made for it. A reused
/// home keeps everything (its users and files were there before).
struct Undo<'a> {
    home: &'a DevHome,
    fresh: bool,
    /// The box id whose users this `dev up` made or took.
    users: Option<String>,
    /// The parents of the home this `dev up` made, deepest first.
    parents: Vec<PathBuf>,
    /// The mode of the (empty) home when it was there before: it is emptied and given its mode
    /// back, not removed.
    was_there: Option<u32>,
    kept: bool,
}

impl<'a> Undo<'a> {
    fn new(home: &'a DevHome, fresh: bool) -> Undo<'a> {
        Undo {
            home,
            fresh,
            users: None,
            parents: Vec::new(),
            was_there: fs::metadata(home.root())
                .ok()
                .filter(|m| m.is_dir())
                .map(|m| m.permissions().mode() & 0o7777),
            kept: false,
        }
    }

    fn keep(&mut self) {
        self.kept = true;
    }

    fn run(&mut self, out: &mut dyn Write) {
        if self.kept || !self.fresh {
            return;
        }
        self.kept = true;
        // No daemon of this home runs now (a failed start stops those it started).
        let root = self.home.root();
        if let Some(mode) = self.was_there {
            let emptied = fs::read_dir(root).and_then(|entries| {
                for e in entries {
                    let p = e?.path();
                    if fs::symlink_metadata(&p)?.is_dir() {
                        fs::remove_dir_all(&p)?;
                    } else {
                        fs::remove_file(&p)?;
                    }
                }
                fs::set_permissions(root, fs::Permissions::from_mode(mode))
            });
            let _ = match emptied {
                Ok(()) => writeln!(out, "emptied {} again", root.display()),
                Err(e) => writeln!(out, "could not empty {} again: {e}", root.display()),
            };
        } else if fs::symlink_metadata(root).is_ok() {
            match fs::remove_dir_all(root) {
                Ok(()) => {
                    let _ = writeln!(out, "removed {} again", self.home.root().display());
                }
                Err(e) => {
                    let _ = writeln!(
                        out,
                        "could not remove {} again: {e}",
                        self.home.root().display()
                    );
                }
            }
        }
        for dir in &self.parents {
            let _ = fs::remove_dir(dir);
        }
        if let Some(id) = &self.users {
            match user::remove_all(id) {
                Ok(removed) => {
                    for (name, result) in removed {
                        match result {
                            Ok(()) => {
                                let _ = writeln!(out, "removed the user {name} again");
                            }
                            Err(why) => {
                                let _ = writeln!(out, "kept the user {name}: {why}");
                            }
                        }
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "could not remove the users bx-dev-{id}-*: {e}");
                }
            }
        }
    }
}

/// What a fresh home is made with, its flags checked.
struct Fresh {
    model: configs::ModelChoice,
    /// channeld's tables (`--matrix`).
    matrix: Option<toml::Table>,
}

/// The rest of `dev up`, on a home whose flags are checked and whose box id is drawn.
fn up_on(
    opts: &UpOptions,
    out: &mut dyn Write,
    home: &DevHome,
    marker: Option<Marker>,
    choice: Option<Fresh>,
    box_id: Option<String>,
    as_root: bool,
) -> Result<Up, DevError> {
    let users = match &box_id {
        Some(id) => {
            let all = user::create_or_take_all(id).map_err(DevError::User)?;
            for u in all.values() {
                user::check_reachable(home.root(), u).map_err(DevError::User)?;
            }
            Users(all)
        }
        None => Users::default(),
    };
    let who = configs::Who {
        owner: getuid().as_raw(),
        users: users.0.iter().map(|(d, u)| (*d, u.name.clone())).collect(),
    };

    let (reused, store) = match &marker {
        Some(m) => {
            let pids = running(home);
            if pids.len() == configured(home).len() {
                return Err(DevError::Running {
                    home: home.root().into(),
                    pids,
                });
            }
            let _ = writeln!(out, "reusing the dev box in {}", home.root().display());
            // The same key file given again: its copy is made anew (a token changed in place).
            if let (Some(h), Some(_)) = (&m.honcho, &opts.honcho.key_file) {
                honcho::install_key(home, h).map_err(io_err(format!(
                    "cannot copy the Honcho key into {}",
                    honcho::key_copy(home).display()
                )))?;
            }
            (true, m.honcho.clone())
        }
        None => {
            // As root the daemons' users walk through the home to their own directories; as
            // a normal user it is that user's alone.
            let mode = if as_root { 0o711 } else { 0o700 };
            fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(home.root())
                .map_err(io_err(format!("cannot make {}", home.root().display())))?;
            fs::set_permissions(home.root(), fs::Permissions::from_mode(mode))
                .map_err(io_err(format!("cannot make {}", home.root().display())))?;
            let Some(Fresh { model, matrix }) = &choice else {
                unreachable!("a fresh home always has its resolved choice")
            };
            // Main memory's Honcho workspace is this home's own: the box's id as root, else
            // one drawn for it.
            let id = match &box_id {
                Some(id) => id.clone(),
                None => user::random_id(user::BOX_ID_LEN)
                    .map_err(io_err("cannot draw an id for the Honcho workspace"))?,
            };
            let choice = configs::Choice {
                model: model.clone(),
                honcho: opts.honcho.resolve(&id).map_err(DevError::honcho)?,
                web_hosts: opts.web_hosts.clone(),
                matrix: matrix.clone(),
            };
            configs::write_all(home, &who, &choice).map_err(io_err(format!(
                "cannot write the configs in {}",
                home.root().display()
            )))?;
            if let Some(h) = &choice.honcho {
                honcho::install_key(home, h).map_err(io_err(format!(
                    "cannot copy the Honcho key into {}",
                    honcho::key_copy(home).display()
                )))?;
            }
            let m = Marker {
                made_by: MADE_BY.into(),
                provider: model.provider,
                box_id: box_id.clone(),
                user: None,
                honcho: choice.honcho.clone(),
            };
            let text = toml::to_string(&m).map_err(|e| DevError::Io {
                what: "cannot write the marker".into(),
                error: io::Error::other(e),
            })?;
            fs::write(home.marker(), text).map_err(io_err("cannot write the marker"))?;
            let _ = writeln!(
                out,
                "wrote a dev box's configs in {}",
                home.root().display()
            );
            (false, choice.honcho)
        }
    };
    if box_id.is_some() {
        give_all(home, &users).map_err(DevError::User)?;
    }

    let mut started: Vec<Launched> = Vec::new();
    let result = start_all(home, &users, &mut started, out);
    for l in &started {
        let _ = fs::remove_file(home.notify_socket(&l.daemon));
    }
    if let Err(e) = result {
        for l in started {
            if let Some(which) = procs::read_started(&home.pid_file(&l.daemon)) {
                let s = procs::stop(which, STOP_GRACE);
                if s != Stopped::NotRunning {
                    let _ = writeln!(
                        out,
                        "  {}: stopped again, as the box did not come up ({s})",
                        l.daemon
                    );
                }
            }
            let _ = procs::exited(l.pid);
            let _ = fs::remove_file(home.pid_file(&l.daemon));
            let _ = wait_sink(home, &l.daemon, Some(l.sink));
        }
        return Err(e);
    }
    let pids = started.iter().map(|l| (l.daemon.clone(), l.pid)).collect();
    let r = home.root().display();
    if let Some(id) = &box_id {
        let _ = writeln!(
            out,
            "  users:   bx-dev-{id}-* (one per daemon; `dev down` removes them)"
        );
    }
    let _ = writeln!(out, "the dev box is up in {r}");
    let _ = writeln!(out, "  memory:  {}", honcho::describe(store.as_ref()));
    let _ = writeln!(out, "  chat:    bxctl chat --home {r} \"hello\"");
    let _ = writeln!(out, "  status:  bxctl status --home {r}");
    let _ = writeln!(out, "  logs:    {r}/logs/<daemon>.log");
    let _ = writeln!(out, "  stop:    bxctl dev down --home {r}");
    Ok(Up {
        home: home.clone(),
        pids,
        reused,
    })
}

/// Give every directory of the home back to root and remove the box's users (`bx-dev-<id>-*`),
/// saying which went: a box that is down owns nothing a uid handed out later could reach.
fn take_users_back(home: &DevHome, id: &str, out: &mut dyn Write) -> Result<(), DevError> {
    give_all(home, &Users::default()).map_err(DevError::User)?;
    for d in configured(home) {
        for dir in own_dirs(home, d) {
            user::give(&dir, 0, 0).map_err(DevError::User)?;
        }
    }
    for (name, result) in user::remove_all(id).map_err(DevError::User)? {
        match result {
            Ok(()) => {
                let _ = writeln!(out, "  removed the user {name}");
            }
            Err(why) => {
                let _ = writeln!(out, "  kept the user {name}: {why}");
            }
        }
    }
    Ok(())
}

/// The directories of the home that belong to `daemon`'s user: its state directory and what
/// its row says it owns.
fn own_dirs(home: &DevHome, daemon: &str) -> Vec<PathBuf> {
    let state = layout::daemon(daemon).map(|d| d.state_path(home.root()));
    let owns = daemons::row(daemon)
        .map(|r| r.owns)
        .unwrap_or_default()
        .iter()
        .map(|dir| home.root().join(dir));
    state.into_iter().chain(owns).collect()
}

/// As root: give each daemon's directories to its user and each socket's directory to its
/// client (a user made again since has another uid; nothing of a box stays with a uid that
/// may now be someone else's).
fn give_all(home: &DevHome, users: &Users) -> Result<(), user::UserError> {
    let daemons = configured(home);
    for d in &daemons {
        if let Some(u) = users.0.get(d) {
            for dir in own_dirs(home, d) {
                user::give(&dir, u.uid, u.gid)?;
            }
        }
    }
    for spec in SOCKETS.iter().filter(|s| daemons.contains(&s.server)) {
        let dir = layout::run_dir(home.root()).join(spec.dir);
        let ids = users.client_ids(spec).unwrap_or(Ids { uid: 0, gid: 0 });
        user::give(&dir, ids.uid, ids.gid)?;
    }
    Ok(())
}

/// Make the missing parents of a new home, 0755 whatever the umask (the daemons' users walk
/// through them), before anything else is written or started. A parent that exists is left as
/// it is; `user::check_reachable` says when it keeps a daemon out.
fn make_parents(root: &Path) -> Result<Vec<PathBuf>, DevError> {
    let Some(parent) = root.parent() else {
        return Ok(Vec::new());
    };
    let missing: Vec<&Path> = parent
        .ancestors()
        .take_while(|p| fs::symlink_metadata(p).is_err())
        .collect();
    let mut made_here = Vec::new();
    for dir in missing.into_iter().rev() {
        let made = fs::DirBuilder::new().mode(0o755).create(dir);
        match made {
            Ok(()) => {
                made_here.insert(0, dir.to_path_buf());
                fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
                    .map_err(io_err(format!("cannot make {} 0755", dir.display())))?
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(DevError::Io {
                    what: format!("cannot make {}", dir.display()),
                    error: e,
                });
            }
        }
    }
    Ok(made_here)
}

/// A daemon `dev up` started, until it is ready.
#[derive(Debug)]
struct Launched {
    daemon: String,
    pid: u32,
    /// The process that appends its output to its log.
    sink: u32,
    /// Where its readiness comes in.
    notify: UnixDatagram,
    /// Where this run's lines begin in its log, which earlier runs appended to.
    since: u64,
}

/// Bind `daemon`'s sockets at their places in the home, each given to its client (0600, in a
/// 0700 directory of the client's: `bxharden::listen`, the rules every daemon binds by).
fn bind_sockets(
    home: &DevHome,
    users: &Users,
    daemon: &str,
) -> Result<Vec<(&'static str, UnixListener)>, DevError> {
    sockets_of(daemon)
        .iter()
        .map(|spec| {
            let owner = users.client_ids(spec).map(|i| Owner {
                uid: i.uid,
                gid: i.gid,
            });
            bxharden::listen(&spec.path(home.root()), owner)
                .map(|l| (spec.name, l))
                .map_err(|error| DevError::Listen {
                    daemon: daemon.to_string(),
                    error,
                })
        })
        .collect()
}

/// The datagram socket `daemon` says `READY=1` on: 0600, so only whoever runs `dev up` (and
/// the daemon, which connects before it drops its privileges) reaches it.
fn notify_socket(home: &DevHome, daemon: &str) -> Result<UnixDatagram, DevError> {
    let path = home.notify_socket(daemon);
    let what = format!("cannot make {}", path.display());
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(what)(e)),
    }
    let sock = UnixDatagram::bind(&path).map_err(io_err(what.clone()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(io_err(what.clone()))?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(io_err(what))?;
    Ok(sock)
}

fn start_all(
    home: &DevHome,
    users: &Users,
    started: &mut Vec<Launched>,
    out: &mut dyn Write,
) -> Result<(), DevError> {
    let already = running(home);
    for d in configured(home) {
        // Only the daemons that are missing are started; the others keep running.
        if let Some((_, pid)) = already.iter().find(|(name, _)| name == d) {
            let _ = writeln!(out, "  {d}: runs already, pid {pid}");
            continue;
        }
        let exe = procs::find_daemon(d).ok_or_else(|| DevError::NoExecutable(d.to_string()))?;
        let since = fs::metadata(home.log(d)).map_or(0, |m| m.len());
        let sockets = bind_sockets(home, users, d)?;
        let notify = notify_socket(home, d)?;
        let procs::Spawned { pid, sink } = procs::spawn_detached(
            &exe,
            &home.config(d),
            &home.log(d),
            &sockets,
            Some(&home.notify_socket(d)),
        )
        .map_err(io_err(format!("cannot start {}", exe.display())))?;
        // The daemon holds its sockets now; this process's copies go.
        drop(sockets);
        started.push(Launched {
            daemon: d.to_string(),
            pid,
            sink,
            notify,
            since,
        });
        procs::write_pid(&home.pid_file(d), pid).map_err(io_err("cannot write a pid file"))?;
        // A sink that ended already (its daemon died at once) has no start time to record.
        let _ = procs::write_pid(&home.sink_pid_file(d), sink);
    }
    let until = Instant::now() + START_DEADLINE;
    for l in started.iter() {
        wait_ready(home, l, until)?;
        let sockets = sockets_of(&l.daemon);
        for spec in &sockets {
            wait_for_ping(home, users, l, spec, until)?;
        }
        let paths: Vec<String> = sockets
            .iter()
            .map(|s| s.path(home.root()).display().to_string())
            .collect();
        let _ = writeln!(
            out,
            "  {}: up, pid {}, answering on {}",
            l.daemon,
            l.pid,
            paths.join(", ")
        );
    }
    Ok(())
}

/// Wait (at most [`SINK_GRACE`]) for the sink of `daemon`'s log to copy what is left and end,
/// once the daemon has: the log is then whole. `child`: the sink's pid, when this process
/// started it (and so must reap it). A sink still running past the grace (a process the daemon
/// started holds its output) keeps its pid file, and its pid is returned.
fn wait_sink(home: &DevHome, daemon: &str, child: Option<u32>) -> Option<u32> {
    let file = home.sink_pid_file(daemon);
    if let Some(which) = procs::read_started(&file) {
        if !procs::wait_gone(which, SINK_GRACE) {
            return Some(which.pid);
        }
    } else if let Some(pid) = child {
        let until = Instant::now() + SINK_GRACE;
        while procs::exited(pid).is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = fs::remove_file(&file);
    None
}

fn died(home: &DevHome, l: &Launched, status: ExitStatus) -> DevError {
    // The daemon's last lines may still be in its pipe: the sink copies them, then ends.
    let _ = wait_sink(home, &l.daemon, Some(l.sink));
    DevError::Died {
        daemon: l.daemon.clone(),
        status,
        log: home.log(&l.daemon),
        tail: procs::tail_since(&home.log(&l.daemon), l.since, 20),
    }
}

/// Wait for the daemon's `READY=1` (every socket served, the sandbox applied), its end, or
/// the deadline.
fn wait_ready(home: &DevHome, l: &Launched, until: Instant) -> Result<(), DevError> {
    let mut buf = [0u8; 512];
    loop {
        if let Some(status) = procs::exited(l.pid) {
            return Err(died(home, l, status));
        }
        match l.notify.recv(&mut buf) {
            Ok(n)
                if buf[..n]
                    .split(|b| *b == b'\n')
                    .any(|line| line == b"READY=1") =>
            {
                return Ok(());
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                return Err(DevError::Io {
                    what: format!("cannot read {}'s readiness", l.daemon),
                    error: e,
                });
            }
        }
        if Instant::now() >= until {
            return Err(DevError::NotReady {
                daemon: l.daemon.clone(),
                notify: home.notify_socket(&l.daemon),
            });
        }
    }
}

/// `ping` on `spec`'s socket as its client, until it answers as its daemon.
fn wait_for_ping(
    home: &DevHome,
    users: &Users,
    l: &Launched,
    spec: &SocketSpec,
    until: Instant,
) -> Result<(), DevError> {
    let socket = spec.path(home.root());
    loop {
        if let Some(status) = procs::exited(l.pid) {
            return Err(died(home, l, status));
        }
        let why = match health::ping(&socket, users.client_ids(spec), Duration::from_secs(2)) {
            Pinged::Answered(p) if p.daemon == l.daemon => return Ok(()),
            Pinged::Answered(p) => format!("{} answered instead", p.daemon),
            Pinged::Absent => format!("{} is absent", socket.display()),
            Pinged::NotYours(why) | Pinged::Refused(why) => why,
        };
        if Instant::now() >= until {
            return Err(DevError::NoAnswer {
                daemon: l.daemon.clone(),
                socket,
                why,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `dev restart`: stop the dev box in `home`, then bring it up again as it was made (no flags).
pub fn restart(home: &Path, out: &mut dyn Write) -> Result<Up, DevError> {
    loadable(home)?;
    down(home, out)?;
    up(
        &UpOptions {
            home: home.to_path_buf(),
            model: ModelFlags::default(),
            honcho: HonchoFlags::default(),
            web_hosts: Vec::new(),
            matrix: None,
        },
        out,
    )
}

/// Every running daemon's configuration, as the owner may have changed it, loads (`<daemon>
/// check`): a restart that could not start the box again does not stop it.
fn loadable(home: &Path) -> Result<(), DevError> {
    let home = DevHome::new(home).map_err(io_err("cannot find the current directory"))?;
    for d in configured(&home) {
        if crate::target::Target::pids(&home, d).is_empty() {
            continue;
        }
        let exe = procs::find_daemon(d).ok_or_else(|| DevError::NoExecutable(d.to_string()))?;
        let config = home.config(d);
        // Bounded by the daemon: `check` reads its files and starts nothing.
        let out = std::process::Command::new(&exe)
            .arg("check")
            .arg("--config")
            .arg(&config)
            .output()
            .map_err(io_err(format!("cannot run {} check", exe.display())))?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
            let (said, anchor) = match bxcore::runbook::split_pointer(&said) {
                Some((said, anchor)) => (said.to_string(), anchor.to_string()),
                None => (said, REFUSED_ANCHOR.to_string()),
            };
            return Err(DevError::Unloadable {
                daemon: d.to_string(),
                config,
                said,
                anchor,
            });
        }
    }
    Ok(())
}

/// Stop the dev box in `home`; one line per daemon goes to `out`. As root, the box's users go
/// too, once its directories are root's again: a uid `useradd` hands out later then owns
/// nothing of this box.
pub fn down(home: &Path, out: &mut dyn Write) -> Result<Vec<(String, Stopped)>, DevError> {
    let home = DevHome::new(home).map_err(io_err("cannot find the current directory"))?;
    let Some(marker) = home.read_marker().map_err(DevError::NotADevBox)? else {
        return Err(DevError::NotADevBox(format!(
            "{} was not made by `bxctl dev up`: there is no dev box to stop",
            home.root().display()
        )));
    };
    let mut all = Vec::new();
    // The reverse of the start order: the loop first, so nothing calls a daemon that is gone.
    for d in configured(&home).iter().rev() {
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
        if let Some(sink) = wait_sink(&home, d, None) {
            let _ = writeln!(
                out,
                "  {d}: its log's sink (pid {sink}) still runs: a process {d} started holds its \
                 output, and its lines go on into logs/{d}.log until that process ends"
            );
        }
        all.push((d.to_string(), stopped));
    }
    if let (Some(id), true) = (&marker.box_id, geteuid().is_root()) {
        take_users_back(&home, id, out)?;
    }
    let _ = writeln!(out, "the dev box in {} is down", home.root().display());
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_box_that_did_not_come_up_points_at_devbox_start_failed_once_at_the_end() {
        let died = DevError::Died {
            daemon: "brokerd".into(),
            status: ExitStatus::from_raw(1 << 8),
            log: "/h/logs/brokerd.log".into(),
            tail: vec!["brokerd: no_such_key".into(), "second".into()],
        };
        assert_eq!(
            died.pointed().to_string(),
            format!(
                "brokerd's last log lines (/h/logs/brokerd.log):\n    brokerd: no_such_key\n    \
                 second\nbrokerd ended (exit status: 1) while the dev box was starting; {}",
                bxcore::runbook::pointer(START_ANCHOR)
            )
        );
        for e in [
            DevError::NoExecutable("loopd".into()),
            DevError::NotReady {
                daemon: "loopd".into(),
                notify: "/h/dev/loopd.notify".into(),
            },
            DevError::NoAnswer {
                daemon: "loopd".into(),
                socket: "/h/run/loop.sock".into(),
                why: "refused".into(),
            },
        ] {
            assert_eq!(e.anchor(), START_ANCHOR, "{e}");
            let line = e.pointed().to_string();
            assert_eq!(line.matches("see docs/").count(), 1, "{line}");
        }
    }

    #[test]
    fn a_refused_dev_command_points_at_devbox_refused() {
        for e in [
            DevError::NotADevBox("/h is not a dev box".into()),
            DevError::Running {
                home: "/h".into(),
                pids: vec![("loopd".into(), 7)],
            },
            DevError::Mismatch {
                home: "/h".into(),
                what: "as root".into(),
            },
            DevError::User(user::UserError::IsRoot("bx-dev-x-loop".into())),
        ] {
            assert_eq!(e.anchor(), REFUSED_ANCHOR, "{e}");
            assert!(!e.to_string().contains("see docs/"), "{e}");
        }
        let running = DevError::Running {
            home: "/h".into(),
            pids: vec![("loopd".into(), 7), ("brokerd".into(), 8)],
        };
        assert_eq!(
            running.to_string(),
            "the dev box in /h runs already: loopd (pid 7), brokerd (pid 8); \
             `bxctl dev down --home /h` stops it"
        );
    }
}
