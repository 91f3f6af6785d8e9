//! Which box a command talks to, and what it asks of that box: its home and sockets, its
//! daemons and their pids, its logs, the config files, the ids root takes to talk to a daemon's
//! socket, and how loopd's own selftest runs there. [`Target`] is the question; [`Device`] is
//! the answer on a device (systemd, the journal, `/etc/boxmaker`), and the dev box answers it
//! for its own homes from the top floor (`dev::DevHome`, behind the `devbox` feature). Nothing
//! below the command line knows which of them it talks to.
//!
//! The home is `--home DIR`, else `$BOXMAKER_HOME`, else the device's `/var/lib/boxmaker`; its
//! sockets are where `bxcore::layout` puts them for that home (`/run/boxmaker` on the device).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use bxcore::layout::{self, SocketSpec};

use crate::thread_ids::{Ids, as_ids};

/// The environment variable naming the home when `--home` is not given.
pub const HOME_ENV: &str = "BOXMAKER_HOME";

/// Where the NixOS module puts the daemons' configs on the device.
pub const DEVICE_CONFIGS: &str = "/etc/boxmaker";

/// What the NixOS module installed, as the device check reads it (`crate::check::manifest`).
pub const DEVICE_MANIFEST: &str = "/etc/boxmaker/device.json";

/// The device's template unit that runs `loopd selftest` as loopd's user, one instance per
/// connection on the owner's selftest socket (`crate::ondemand`).
pub const SELFTEST_UNIT: &str = "boxmaker-selftest@.service";

/// The daemons every box has: the dev box starts each of them and the NixOS module installs each
/// (a user who cannot read the box's configuration still knows which sockets to try).
pub const REQUIRED: [&str; 5] = ["loopd", "brokerd", "inferproxy", "gatewayd", "memoryd"];

/// Where a daemon's log lines are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Log {
    /// A file of lines, each stamped with its time by the daemon.
    File(PathBuf),
    /// The journal of a systemd unit.
    Journal(String),
}

/// How loopd's own selftest runs on a box: how it is started, and what it is called in the
/// check's line.
#[derive(Debug)]
pub struct LoopdSelftest {
    pub run: SelftestRun,
    pub what: String,
}

/// How `loopd selftest` is started.
#[derive(Debug)]
pub enum SelftestRun {
    /// A command whose exit status and standard error say how it went.
    Command(Command),
    /// An on-demand socket of the owner's: connecting starts one instance of a unit that runs
    /// it, and the connection carries back what it printed (`crate::ondemand`).
    OnDemand(PathBuf),
}

/// A box, as the commands that are not `dev` see it.
pub trait Target: fmt::Debug {
    /// The box's home.
    fn home(&self) -> &Path;

    /// Where `spec`'s socket of this box is.
    fn socket(&self, spec: &SocketSpec) -> PathBuf {
        spec.path(self.home())
    }

    /// A daemon's config file.
    fn config(&self, daemon: &str) -> PathBuf;

    /// Whether `daemon` is part of this box: every box has the [`REQUIRED`] ones, and the
    /// others (channeld) where their configuration is.
    fn has(&self, daemon: &str) -> bool {
        REQUIRED.contains(&daemon) || self.config(daemon).exists()
    }

    /// The running processes of `daemon`, found by what started them (never by its name: a name
    /// finds every box's daemons on the machine).
    fn pids(&self, daemon: &str) -> Vec<u32>;

    /// The ids to talk to `spec`'s socket with: its client's, when this process is root and the
    /// client is a daemon with a user of its own; `None`: as this process.
    fn client_ids(&self, spec: &SocketSpec) -> Option<Ids>;

    /// Where `daemon`'s log lines are.
    fn logs(&self, daemon: &str) -> Log;

    /// How the owner starts this box when none of its daemons runs.
    fn start_hint(&self) -> String;

    /// What is wrong with where the running daemons' log lines go, one line each (the dev box:
    /// a log's sink that ended, so the daemon's lines are lost). On the device journald is
    /// systemd's to watch.
    fn log_problems(&self) -> Vec<String> {
        Vec::new()
    }

    /// How `loopd selftest` runs here, as loopd's user; `Err` says why it cannot.
    fn loopd_selftest(&self) -> Result<LoopdSelftest, String>;

    /// Whether `selftest` asks `spec`'s socket itself (`ping`, and the model through
    /// infer.sock): on a box where a socket whose client is a daemon's user is that user's
    /// alone, those are left to loopd's selftest and to the device check.
    fn selftest_asks(&self, spec: &SocketSpec) -> bool {
        let _ = spec;
        true
    }
}

/// `f` as the client of `spec`'s socket of `target` ([`Target::client_ids`]), else as this
/// process; `Err` says why the client's ids could not be taken.
pub fn as_client<T>(
    target: &dyn Target,
    spec: &SocketSpec,
    f: impl FnOnce() -> T,
) -> Result<T, String> {
    match target.client_ids(spec) {
        Some(ids) => as_ids(ids, f),
        None => Ok(f()),
    }
}

/// The home named on the command line (`--home`) or in `$BOXMAKER_HOME`.
pub fn named(home: Option<&Path>) -> Option<PathBuf> {
    home.map(Path::to_path_buf)
        .or_else(|| std::env::var_os(HOME_ENV).map(PathBuf::from))
}

/// Whether this machine is a device: the module's home or run directory is there.
pub fn on_device() -> bool {
    Path::new(layout::DEVICE_HOME).exists() || Path::new(layout::DEVICE_RUN).exists()
}

/// Run `cmd` to its end: whether it succeeded, and what it said (its standard output, and its
/// standard error when it failed).
pub fn run(cmd: &mut Command) -> Result<(bool, String), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let mut text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !err.is_empty() {
            if !text.is_empty() {
                text.push_str("; ");
            }
            text.push_str(&err);
        }
    }
    Ok((out.status.success(), text))
}

/// The main process systemd started for `unit`.
pub fn main_pid(unit: &str) -> Result<u32, String> {
    let (_, text) =
        run(Command::new("systemctl").args(["show", "-p", "MainPID", "--value", unit]))?;
    match text.parse::<u32>() {
        Ok(0) => Err("systemd knows no main process of it".into()),
        Ok(pid) => Ok(pid),
        Err(_) => Err(format!("systemctl show MainPID said `{text}`")),
    }
}

/// The unit systemd runs `daemon` in on the device.
pub fn unit(daemon: &str) -> String {
    format!("boxmaker-{daemon}.service")
}

/// The box the NixOS module installed: its units, the journal, `/etc/boxmaker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    home: PathBuf,
}

impl Device {
    /// The box at the named home (`--home`, `$BOXMAKER_HOME`), else the device's home.
    pub fn resolve(home: Option<&Path>) -> Device {
        Device {
            home: named(home).unwrap_or_else(|| PathBuf::from(layout::DEVICE_HOME)),
        }
    }
}

impl Target for Device {
    fn home(&self) -> &Path {
        &self.home
    }

    /// Where the NixOS module puts it: `/etc/boxmaker/<daemon>.toml`.
    fn config(&self, daemon: &str) -> PathBuf {
        Path::new(DEVICE_CONFIGS).join(format!("{daemon}.toml"))
    }

    /// The main process systemd gives for the daemon's unit; none in a home that does not exist.
    fn pids(&self, daemon: &str) -> Vec<u32> {
        if std::fs::symlink_metadata(&self.home).is_err() {
            return Vec::new();
        }
        main_pid(&unit(daemon)).into_iter().collect()
    }

    /// As this process: on the device each socket's client is a user of its own, and the owner
    /// reaches the owner's sockets as themselves.
    fn client_ids(&self, _spec: &SocketSpec) -> Option<Ids> {
        None
    }

    fn start_hint(&self) -> String {
        "start its units: `systemctl start 'boxmaker-*.socket' 'boxmaker-*.service'`".to_string()
    }

    fn logs(&self, daemon: &str) -> Log {
        Log::Journal(unit(daemon))
    }

    /// The owner's selftest socket the module installed (`/etc/boxmaker/device.json`), on
    /// which systemd starts [`SELFTEST_UNIT`], `loopd selftest` as `bx-loop` in loopd's sandbox:
    /// the owner needs neither sudo nor polkit.
    fn loopd_selftest(&self) -> Result<LoopdSelftest, String> {
        let sockets = crate::ondemand::of_device(Path::new(DEVICE_MANIFEST))?;
        Ok(LoopdSelftest {
            run: SelftestRun::OnDemand(sockets.selftest),
            what: SELFTEST_UNIT.to_string(),
        })
    }

    /// The owner's sockets only: every other socket is its daemon client's user's alone (0600 in
    /// a 0700 directory), reached by loopd's selftest and the device check as that user.
    fn selftest_asks(&self, spec: &SocketSpec) -> bool {
        spec.client == layout::OWNER
    }
}

/// Where a daemon's executable is: beside this `bxctl` (the package installs them together),
/// else the first on `PATH`.
pub fn find_daemon(name: &str) -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    beside.into_iter().chain(on_path).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
