//! One real daemon under test: started from its binary with its stderr in a log file, waited for
//! until it is ready (or has exited, saying why), read back without the times its lines start
//! with, and killed and reaped when the test drops it, before the test's home goes.
//!
//! Every daemon's tests start their daemon through this, so "start it, wait for ping, read its
//! log, kill it" is written once. What "ready" means is the caller's: a socket that answers
//! `ping`, or a notice in the log for a daemon that refuses the test's uid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::{DEADLINE, daemon_command, reap};

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// A running daemon; killed and reaped when dropped.
#[derive(Debug)]
pub struct Daemon {
    what: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Start `bin command --config config`, its stderr appended to `log` (see
    /// [`daemon_command`]), without waiting for anything.
    pub fn spawn(bin: &Path, command: &str, config: &Path, log: &Path) -> Daemon {
        Daemon::spawn_command(&mut daemon_command(bin, command, config, log), log)
    }

    /// Start `cmd` (built by [`daemon_command`], then changed), its stderr going to `log`.
    pub fn spawn_command(cmd: &mut Command, log: &Path) -> Daemon {
        let what = Path::new(cmd.get_program())
            .file_name()
            .map_or_else(|| "the daemon".into(), |n| n.to_string_lossy().into_owned());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Daemon {
            what,
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    /// Wait until `ready` says so. `Err` with the log when the daemon exits first (it is reaped)
    /// or the deadline passes.
    pub fn wait_ready(
        &mut self,
        what: &str,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let until = Instant::now() + DEADLINE;
        loop {
            if ready() {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(format!(
                    "{} exited with {status} before {what}: {}",
                    self.what,
                    self.log_text()
                ));
            }
            if Instant::now() > until {
                return Err(format!(
                    "{} did not reach {what} within {DEADLINE:?}: {}",
                    self.what,
                    self.log_text()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Wait until the log holds `text`: the whole log. Panics at the deadline, with the log.
    pub fn wait_log(&self, text: &str) -> String {
        self.wait_log_n(text, 1)
    }

    /// Wait until the log holds `text` at least `n` times: the whole log.
    pub fn wait_log_n(&self, text: &str, n: usize) -> String {
        let until = Instant::now() + DEADLINE;
        loop {
            let log = self.log_text();
            if log.matches(text).count() >= n {
                return log;
            }
            assert!(
                Instant::now() < until,
                "{}'s log never said {text:?} {n} time(s): {log}",
                self.what
            );
            std::thread::sleep(POLL);
        }
    }

    /// Wait until the daemon exits on its own: its status. Panics at the deadline, with the log.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < until,
                "{} did not exit: {}",
                self.what,
                self.log_text()
            );
            std::thread::sleep(POLL);
        }
    }

    /// Its status if it has exited (and is reaped), `None` while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    /// Whether it is still running (reaping it if not).
    pub fn running(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }

    /// Its process id (0 once it is gone).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The log file its stderr goes to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// What it logged so far, each line without the time it starts with.
    pub fn log_text(&self) -> String {
        without_times(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// `SIGKILL`, and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            reap(&mut c);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A plain log line without the RFC 3339 time a daemon's plain log starts it with
/// (`2026-11-30T22:50:29.123Z `); a line without one, as it is.
pub fn without_time(line: &str) -> &str {
    match line.split_once(' ') {
        Some((stamp, rest))
            if stamp.len() == 24 && stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T' =>
        {
            rest
        }
        _ => line,
    }
}

/// Every line of a plain log [`without_time`].
pub fn without_times(text: &str) -> String {
    text.split_inclusive('\n').map(without_time).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_that_exits_before_it_is_ready_is_an_error_with_its_log() {
        let dir = std::env::temp_dir().join(format!("bxtest-daemon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sh.log");
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo '2026-11-30T22:50:29.123Z sh: no config' >&2; exit 3",
        ])
        .stderr(std::fs::File::create(&log).unwrap());
        let mut d = Daemon::spawn_command(&mut cmd, &log);
        let err = d.wait_ready("ping", || false).unwrap_err();
        assert!(err.contains("exited with exit status: 3"), "{err}");
        assert!(
            err.contains("sh: no config\n") && !err.contains("2026-"),
            "{err}"
        );
        assert!(!d.running() && d.pid() == 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_line_keeps_what_is_not_a_time() {
        assert_eq!(
            without_time("2026-11-30T22:50:29.123Z loopd: up"),
            "loopd: up"
        );
        assert_eq!(without_time("loopd: up at 2026"), "loopd: up at 2026");
        assert_eq!(without_times("a\n2026-11-30T22:50:29.123Z b\n"), "a\nb\n");
    }
}
