//! A dev box as the commands that are not `dev` see it: [`DevHome`] answers
//! [`crate::target::Target`] for a home `dev up` made. Its configs are under `<home>/etc`, its
//! daemons are the processes its pid files name (pid and start time), its logs are files under
//! `<home>/logs`, and as root each socket is talked to as its client, the user `dev up` made for
//! that daemon of this box.

use std::path::{Path, PathBuf};
use std::process::Command;

use bxcore::layout::{self, SocketSpec};
use nix::unistd::{User, geteuid};

use super::home::DevHome;
use super::{procs, user};
use crate::target::{self, Log, LoopdSelftest, SelftestRun, Target};
use crate::thread_ids::Ids;

/// The dev box's home when none is named: `$XDG_STATE_HOME/boxmaker-dev`, else
/// `~/.local/state/boxmaker-dev`.
pub fn default_home() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .map(|d| PathBuf::from(d).join("boxmaker-dev"))
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".local/state/boxmaker-dev"))
        })
        .unwrap_or_else(|| PathBuf::from("boxmaker-dev"))
}

/// The home `bxctl dev` works on: `--home`, `$BOXMAKER_HOME`, else the dev box's default.
pub fn home_for_dev(home: Option<&Path>) -> PathBuf {
    target::named(home).unwrap_or_else(default_home)
}

/// The dev box a command that is not `dev` means, if it means one: the named home (`--home`,
/// `$BOXMAKER_HOME`) when `dev up` made it; with none named, the dev box's default home when
/// `dev up` made it and this machine is not a device.
pub fn find(home: Option<&Path>) -> Option<DevHome> {
    let root = match target::named(home) {
        Some(named) => named,
        None if target::on_device() => return None,
        None => default_home(),
    };
    DevHome::new(&root).ok().filter(DevHome::is_made)
}

impl Target for DevHome {
    fn home(&self) -> &Path {
        self.root()
    }

    /// `<home>/etc/<daemon>.toml`, as `dev up` wrote it.
    fn config(&self, daemon: &str) -> PathBuf {
        DevHome::config(self, daemon)
    }

    /// A running daemon whose log's sink is not running writes into a pipe nobody reads.
    fn log_problems(&self) -> Vec<String> {
        crate::dev::configured(self)
            .into_iter()
            .filter(|d| procs::running_from(&self.pid_file(d)).is_some())
            .filter(|d| procs::running_from(&self.sink_pid_file(d)).is_none())
            .map(|d| {
                format!(
                    "{d}'s log sink is not running: what {d} logs now is lost, not in \
                     logs/{d}.log; restart the box (`bxctl dev restart --home {}`)",
                    self.root().display()
                )
            })
            .collect()
    }

    /// The process its pid file names, while the process with that pid has the start time the
    /// file recorded.
    fn pids(&self, daemon: &str) -> Vec<u32> {
        procs::running_from(&self.pid_file(daemon))
            .into_iter()
            .collect()
    }

    /// As root in a box made as root, a daemon's socket is talked to as its client, the user
    /// `dev up` made for it; the owner's sockets, and a box whose daemons keep the caller's uid,
    /// as this process.
    fn client_ids(&self, spec: &SocketSpec) -> Option<Ids> {
        if !geteuid().is_root() || spec.client == layout::OWNER {
            return None;
        }
        let box_id = self.read_marker().ok()??.box_id?;
        let name = user::name(&box_id, spec.client)?;
        let u = User::from_name(&name).ok()??;
        Some(Ids {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        })
    }

    /// `<home>/logs/<daemon>.log`.
    fn start_hint(&self) -> String {
        format!("start it: `bxctl dev up --home {}`", self.root().display())
    }

    fn logs(&self, daemon: &str) -> Log {
        Log::File(self.log(daemon))
    }

    /// The loopd beside bxctl, on the home's config, as loopd's user where the box has one
    /// (the client of the sockets loopd talks to).
    fn loopd_selftest(&self) -> Result<LoopdSelftest, String> {
        let loopd = procs::find_daemon("loopd").ok_or("cannot find the loopd executable")?;
        let mut command = Command::new(loopd);
        command
            .arg("selftest")
            .arg("--config")
            .arg(DevHome::config(self, "loopd"));
        if let Some(ids) = self.client_ids(&layout::BROKER) {
            use std::os::unix::process::CommandExt;
            // std drops the supplementary groups when root sets the uid.
            command.uid(ids.uid).gid(ids.gid);
        }
        Ok(LoopdSelftest {
            run: SelftestRun::Command(command),
            what: "loopd selftest".to_string(),
        })
    }
}
