//! The dev box's daemon processes: found beside `bxctl` or on `PATH`, started detached in their
//! own session with their output in a log file, remembered in pid files, stopped with SIGTERM
//! and, after a deadline, SIGKILL.

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

/// Start `exe serve --config config` in its own session, stdin from /dev/null, stdout and
/// stderr appended to `log`.
pub fn spawn_detached(exe: &Path, config: &Path, log: &Path) -> io::Result<Child> {
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(exe);
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

/// Write `pid` to `path` atomically.
pub fn write_pid(path: &Path, pid: u32) -> io::Result<()> {
    let tmp = path.with_extension("pid.tmp");
    let mut f = fs::File::create(&tmp)?;
    writeln!(f, "{pid}")?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// The pid in `path`, if the file exists and holds one.
pub fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether `pid` is alive and is the daemon `name` (a pid file may outlive its process, and the
/// pid may have been reused since).
pub fn is_daemon(pid: u32, name: &str) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let is_it = Path::new(std::str::from_utf8(argv0).unwrap_or_default())
        .file_name()
        .is_some_and(|f| f == name);
    // A zombie has an empty cmdline; it is not running.
    is_it && alive(pid)
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

/// Stop the daemon `name` whose pid is `pid`: SIGTERM, wait up to `grace`, then SIGKILL.
pub fn stop(pid: u32, name: &str, grace: Duration) -> Stopped {
    if !is_daemon(pid, name) {
        return Stopped::NotRunning;
    }
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
