//! The dev box's daemon processes: found beside `bxctl` or on `PATH`, started detached in their
//! own session with their output in a log file, remembered in pid files (pid and start time,
//! so a reused pid is never taken for a daemon), stopped with SIGTERM and, after a deadline,
//! SIGKILL. Nothing here looks for daemons in `/proc` by name.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub use crate::target::find_daemon;

/// What a dev box daemon inherits of `bxctl`'s environment: nothing but these, when set. The
/// daemons read no other variable of the caller's; `NOTIFY_SOCKET` and `LISTEN_*` are set by
/// `dev up` itself ([`spawn_detached`]), as systemd sets them on the device, and the dev box's
/// daemons log to a pipe ([`log_sink`]).
pub const PASSED_ENV: [&str; 1] = ["RUST_LOG"];

/// The write end of a pipe whose read end a process of its own appends to `log`: what the dev
/// box gives a daemon as its stdout and stderr, as journald's stream is on the device. The
/// daemon can add lines to its log and nothing else: it holds no descriptor of the file, so it
/// cannot truncate, rewrite or seek in what it wrote before (a compromised brokerd could
/// otherwise cut its chain-head lines).
///
/// The sink is forked from this process and never executes a program: it closes every
/// descriptor but the pipe's read end and the log, enters seccomp's strict mode (`read`,
/// `write`, `exit` and nothing else), copies until the last writer closes, and exits. It runs
/// in its own session, so it outlives `dev up` and ends with the daemon (and any child the
/// daemon gave its stderr to).
/// Returns the pipe's write end and the sink's pid.
pub fn log_sink(log: &Path) -> io::Result<(std::os::fd::OwnedFd, u32)> {
    use std::os::fd::AsRawFd;
    let file = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let (read_fd, file_fd) = (read.as_raw_fd(), file.as_raw_fd());
    // SAFETY: between fork and its exit the child calls only async-signal-safe system calls
    // (setsid, dup2, close_range, prctl, chdir, read, write, exit) on descriptors and a buffer of its
    // own stack; it allocates nothing and takes no lock.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => unsafe {
            use nix::libc;
            libc::setsid();
            if libc::dup2(read_fd, 0) < 0 || libc::dup2(file_fd, 1) < 0 {
                libc::_exit(126);
            }
            // Everything else this process had open (other daemons' listeners, the pipe's
            // write end) goes, or the pipe would never see its end.
            if libc::syscall(libc::SYS_close_range, 2u32, u32::MAX, 0u32) != 0 {
                libc::_exit(126);
            }
            // Named for what it is in `ps -o comm`, and holding no directory in use.
            libc::prctl(libc::PR_SET_NAME, c"bx-log-sink".as_ptr());
            libc::chdir(c"/".as_ptr());
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_STRICT as libc::c_ulong,
            ) != 0
            {
                libc::_exit(126);
            }
            let mut buf = [0u8; 4096];
            loop {
                let n = libc::read(0, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    // EINTR cannot happen: strict mode delivers no handled signal.
                    break;
                }
                let mut done = 0;
                while done < n {
                    let w = libc::write(
                        1,
                        buf.as_ptr().add(done as usize).cast(),
                        (n - done) as usize,
                    );
                    if w <= 0 {
                        break;
                    }
                    done += w;
                }
            }
            // `exit`, not `exit_group`: strict mode allows only the former.
            libc::syscall(libc::SYS_exit, 0);
            libc::_exit(0)
        },
        nix::unistd::ForkResult::Parent { child } => {
            drop(read);
            Ok((write, child.as_raw() as u32))
        }
    }
}

/// A daemon [`spawn_detached`] started, and the sink of its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spawned {
    pub pid: u32,
    pub sink: u32,
}

/// Wait up to `within` for the process `which` to end (a log sink whose daemon has ended copies
/// what is left in its pipe first); whether it did.
pub fn wait_gone(which: Started, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        // Reaped when it is this process's child; otherwise its end is seen by its start time.
        let _ = exited(which.pid);
        if !which.runs() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Start `exe serve --config config` in its own session with a clean environment (only
/// [`PASSED_ENV`]), stdin from /dev/null, stdout and stderr a pipe to `log` ([`log_sink`]). The listening
/// `sockets` are handed over as systemd does (socket activation): descriptors 3, 4, ... in
/// order, `LISTEN_FDS`, `LISTEN_FDNAMES` with their names, and `LISTEN_PID` the child's own
/// pid, written after the fork. With `notify`, `NOTIFY_SOCKET` names it. Returns the child's
/// pid; the child is not waited for here ([`exited`]).
pub fn spawn_detached(
    exe: &Path,
    config: &Path,
    log: &Path,
    sockets: &[(&str, UnixListener)],
    notify: Option<&Path>,
) -> io::Result<Spawned> {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;

    let cstr = |b: &[u8]| CString::new(b).map_err(io::Error::other);
    let (out, sink) = log_sink(log)?;
    let null = fs::File::open("/dev/null")?;
    let path = cstr(exe.as_os_str().as_bytes())?;
    let argv = [
        path.clone(),
        cstr(b"serve")?,
        cstr(b"--config")?,
        cstr(config.as_os_str().as_bytes())?,
    ];
    let mut env = Vec::new();
    for var in PASSED_ENV {
        if let Some(v) = std::env::var_os(var) {
            let mut kv = format!("{var}=").into_bytes();
            kv.extend_from_slice(v.as_bytes());
            env.push(cstr(&kv)?);
        }
    }
    if let Some(n) = notify {
        let mut kv = b"NOTIFY_SOCKET=".to_vec();
        kv.extend_from_slice(n.as_os_str().as_bytes());
        env.push(cstr(&kv)?);
    }
    if !sockets.is_empty() {
        env.push(cstr(format!("LISTEN_FDS={}", sockets.len()).as_bytes())?);
        let names: Vec<&str> = sockets.iter().map(|(n, _)| *n).collect();
        env.push(cstr(
            format!("LISTEN_FDNAMES={}", names.join(":")).as_bytes(),
        )?);
    }
    // `LISTEN_PID=` and room for any pid's digits and the NUL: the child fills it in.
    let mut listen_pid = b"LISTEN_PID=".to_vec();
    let digits_at = listen_pid.len();
    listen_pid.extend_from_slice(&[0u8; 21]);
    let listen_pid_ptr = listen_pid.as_mut_ptr();

    let argv_p: Vec<*const nix::libc::c_char> = argv
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let mut env_p: Vec<*const nix::libc::c_char> = env.iter().map(|c| c.as_ptr()).collect();
    if !sockets.is_empty() {
        env_p.push(listen_pid_ptr.cast_const().cast());
    }
    env_p.push(std::ptr::null());
    let fds: Vec<i32> = sockets.iter().map(|(_, l)| l.as_raw_fd()).collect();
    let (out_fd, null_fd) = (out.as_raw_fd(), null.as_raw_fd());

    // SAFETY: between fork and execve the child calls only async-signal-safe functions (setsid,
    // fcntl, dup2, getpid, execve, _exit) and writes only into memory prepared before the fork
    // (the LISTEN_PID buffer); everything it needs was allocated above.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => unsafe {
            use nix::libc;
            libc::setsid();
            // The sockets first to descriptors above any that is in the way, then stdio, then
            // the sockets to 3, 4, ... (dup2 leaves the new descriptor open across execve;
            // everything else is close-on-exec).
            let high = 3 + fds.len() as i32 + 3;
            let mut moved = [0i32; 16];
            if fds.len() > moved.len() {
                libc::_exit(126);
            }
            for (i, fd) in fds.iter().enumerate() {
                moved[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, high);
                if moved[i] < 0 {
                    libc::_exit(126);
                }
            }
            if libc::dup2(null_fd, 0) < 0 || libc::dup2(out_fd, 1) < 0 || libc::dup2(out_fd, 2) < 0
            {
                libc::_exit(126);
            }
            for (i, fd) in moved.iter().take(fds.len()).enumerate() {
                if libc::dup2(*fd, 3 + i as i32) < 0 {
                    libc::_exit(126);
                }
            }
            // The pid's digits, in place.
            let mut pid = libc::getpid() as u64;
            let mut digits = [0u8; 20];
            let mut n = 0;
            loop {
                digits[n] = b'0' + (pid % 10) as u8;
                n += 1;
                pid /= 10;
                if pid == 0 {
                    break;
                }
            }
            for i in 0..n {
                *listen_pid_ptr.add(digits_at + i) = digits[n - 1 - i];
            }
            *listen_pid_ptr.add(digits_at + n) = 0;
            libc::execve(path.as_ptr(), argv_p.as_ptr(), env_p.as_ptr());
            libc::_exit(127)
        },
        nix::unistd::ForkResult::Parent { child } => {
            drop(listen_pid);
            Ok(Spawned {
                pid: child.as_raw() as u32,
                sink,
            })
        }
    }
}

/// How the child `pid` of this process ended, if it has (reaped now); `None` while it runs.
pub fn exited(pid: u32) -> Option<std::process::ExitStatus> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use std::os::unix::process::ExitStatusExt;
    match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Some(std::process::ExitStatus::from_raw(code << 8)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(std::process::ExitStatus::from_raw(sig as i32)),
        _ => None,
    }
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

/// Write `pid` and its start time to `path` durably (`bxcore::durable`): `<pid> <start time>`.
pub fn write_pid(path: &Path, pid: u32) -> io::Result<()> {
    let start = start_time(pid).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("process {pid} ended before its pid file was written"),
        )
    })?;
    bxcore::durable::replace(path, format!("{pid} {start}\n").as_bytes()).map_err(Into::into)
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

/// The last `n` lines a log file gained after byte `since` (a daemon that died during start:
/// only this run's lines, never an earlier run's, as the file is appended to).
pub fn tail_since(path: &Path, since: u64, n: usize) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = fs::File::open(path) else {
        return Vec::new();
    };
    let mut text = Vec::new();
    if f.seek(SeekFrom::Start(since)).is_err() || f.read_to_end(&mut text).is_err() {
        return Vec::new();
    }
    let lines: Vec<String> = String::from_utf8_lossy(&text)
        .lines()
        .map(str::to_string)
        .collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}
