//! The dev box's daemon processes: found beside `bxctl` or on `PATH`, started detached in their
//! own session with their output in a log file, remembered in pid files (pid and start time,
//! so a reused pid is never taken for a daemon), stopped with SIGTERM and, after a deadline,
//! SIGKILL. Nothing here looks for daemons in `/proc` by name.

use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Where a daemon's executable is: beside this `bxctl`, else the first on `PATH`.
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
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// What a dev box daemon inherits of `bxctl`'s environment: nothing but these, when set. The
/// daemons read no other variable; `JOURNAL_STREAM`, `NOTIFY_SOCKET` and `LISTEN_*` are for
/// whoever starts them (systemd on the device), and the dev box's daemons log to a file.
pub const PASSED_ENV: [&str; 1] = ["RUST_LOG"];

/// Start `exe serve --config config` in its own session with a clean environment (only
/// [`PASSED_ENV`]), stdin from /dev/null, stdout and stderr appended to `log`.
pub fn spawn_detached(exe: &Path, config: &Path, log: &Path) -> io::Result<Child> {
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(exe);
    cmd.env_clear();
    for var in PASSED_ENV {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // Its own session: the daemon outlives this command and the terminal it ran in.
    // SAFETY: setsid(2) is async-signal-safe, and the closure touches nothing else.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(drop).map_err(io::Error::from));
    }
    cmd.spawn()
}

/// When `pid` started, in clock ticks after boot (`/proc/<pid>/stat`, field 22): with the pid,
/// it names one process for the life of the machine, where a pid alone may be reused.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces and parentheses): state is
    // field 3, so the start time (22) is the 20th after the `)`.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Write `pid` and its start time to `path` atomically: `<pid> <start time>`.
pub fn write_pid(path: &Path, pid: u32) -> io::Result<()> {
    let start = start_time(pid).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("process {pid} ended before its pid file was written"),
        )
    })?;
    let tmp = path.with_extension("pid.tmp");
    let mut f = fs::File::create(&tmp)?;
    writeln!(f, "{pid} {start}")?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// What a pid file says: the process `dev up` started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub pid: u32,
    pub start: u64,
}

/// The process in the pid file `path`, if the file exists and holds a pid and start time.
pub fn read_started(path: &Path) -> Option<Started> {
    let text = fs::read_to_string(path).ok()?;
    let mut it = text.split_whitespace();
    let pid = it.next()?.parse().ok()?;
    let start = it.next()?.parse().ok()?;
    Some(Started { pid, start })
}

/// The pid in `path`, if the file exists and holds one.
pub fn read_pid(path: &Path) -> Option<u32> {
    read_started(path).map(|s| s.pid)
}

impl Started {
    /// Whether the process `dev up` started still runs: the same pid with the same start time
    /// (not another process that got the pid since), not a zombie.
    pub fn runs(&self) -> bool {
        start_time(self.pid) == Some(self.start) && alive(self.pid)
    }
}

/// Whether the daemon recorded in the pid file `path` still runs.
pub fn running_from(path: &Path) -> Option<u32> {
    read_started(path).filter(Started::runs).map(|s| s.pid)
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    match kill(Pid::from_raw(pid), None) {
        Ok(()) => !is_zombie(pid),
        Err(Errno::EPERM) => true,
        Err(_) => false,
    }
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// How a daemon ended when it was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// It was not running (no pid file, or its process was gone).
    NotRunning,
    /// It exited after SIGTERM, within the deadline.
    OnTerm(Duration),
    /// It did not exit within the deadline after SIGTERM, and was killed with SIGKILL.
    Killed,
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stopped::NotRunning => f.write_str("was not running"),
            Stopped::OnTerm(d) => write!(f, "stopped on SIGTERM after {} ms", d.as_millis()),
            Stopped::Killed => f.write_str("did not stop on SIGTERM and was killed with SIGKILL"),
        }
    }
}

/// Stop the process `dev up` started (`which`): SIGTERM, wait up to `grace`, then SIGKILL.
pub fn stop(which: Started, grace: Duration) -> Stopped {
    if !which.runs() {
        return Stopped::NotRunning;
    }
    let pid = which.pid;
    let raw = Pid::from_raw(pid as i32);
    let start = Instant::now();
    if kill(raw, Signal::SIGTERM).is_err() {
        return Stopped::NotRunning;
    }
    while start.elapsed() < grace {
        if !alive(pid) {
            return Stopped::OnTerm(start.elapsed());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = kill(raw, Signal::SIGKILL);
    let until = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < until {
        thread::sleep(Duration::from_millis(20));
    }
    Stopped::Killed
}

/// The last `n` lines of a log file (for a daemon that died during start).
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(f) = fs::File::open(path) else {
        return Vec::new();
    };
    let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}
