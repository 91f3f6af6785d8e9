//! One program started for the `run` tool or a declared tool's server, and everything it
//! started, ended whole: once run to its end ([`run`]), or kept to be talked to again ([`Live`]).
//!
//! brokerd is threaded, so between `fork` and `execve` only system calls may run: everything is
//! built before the fork (the pipes, the argument and environment arrays, the sandbox), and the
//! two forked processes below touch only what was built.
//!
//! ```text
//! brokerd (a connection thread)
//!   └─ supervisor: leads a new process group, waits for the program, the deadline or
//!      │           (a live program's) the stop pipe, then kill(0, SIGKILL): the whole
//!      │           group, itself included
//!      └─ program: rlimits, a user and network namespace of its own (where the system lets
//!                  it), the child sandbox (Landlock, seccomp), then execve
//! ```
//!
//! The program's seccomp list lets it signal only itself and never leave the group
//! (`setpgid`/`setsid` are not on it), and Landlock scopes its signals to its own domain, so
//! nothing it starts can stop the supervisor or escape the group's end. brokerd itself signals
//! nothing: its own list allows `kill` on its own pid or group (0) only, and the supervisor,
//! a fork of brokerd, uses exactly that `kill(0, ..)` on the group it leads.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use bxharden::ChildSandbox;

/// The resource limits the program sets on itself before `execve` (soft and hard alike, so it
/// cannot raise them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `RLIMIT_CPU`, seconds.
    pub cpu_seconds: u64,
    /// `RLIMIT_AS`, bytes.
    pub memory_bytes: u64,
    /// `RLIMIT_FSIZE`, bytes.
    pub file_bytes: u64,
    /// `RLIMIT_NPROC`: processes of its user (in its own user namespace where it has one).
    pub processes: u64,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
}

/// One program to start.
#[derive(Debug)]
pub struct Job<'a> {
    /// The absolute path of the program.
    pub program: CString,
    /// Its arguments, `argv[0]` first, as given.
    pub argv: Vec<CString>,
    /// Its whole environment.
    pub env: Vec<CString>,
    /// The directory it starts in.
    pub cwd: OwnedFd,
    /// What it reads on its standard input.
    pub stdin: Input<'a>,
    /// How long it (and everything it starts) may run.
    pub timeout: Duration,
    pub limits: Limits,
    pub sandbox: &'a ChildSandbox,
    /// Try a user and network namespace of its own.
    pub own_network: bool,
    /// The most of each of stdout and stderr kept; past it the pipe is closed.
    pub max_output: usize,
}

/// A program's whole environment as the box gives it: the fixed `PATH`, its `HOME`, `LANG`.
pub fn environment(
    path: &[std::path::PathBuf],
    home: &str,
) -> Result<Vec<CString>, std::ffi::NulError> {
    let path = path
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    [
        format!("PATH={path}"),
        format!("HOME={home}"),
        "LANG=C.UTF-8".to_string(),
    ]
    .into_iter()
    .map(CString::new)
    .collect()
}

/// What the program reads on its standard input.
pub enum Input<'a> {
    /// These bytes, then the end of its input (none: its input ends at once).
    Bytes(&'a [u8]),
    /// A conversation: what it reads next depends on what it wrote (an MCP server's
    /// JSON-RPC, `crate::declared`).
    Talk(&'a mut dyn Talk),
}

impl std::fmt::Debug for Input<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Input::Talk(_) => f.write_str("Talk"),
        }
    }
}

/// One side of a conversation with a program over its standard input and output.
pub trait Talk {
    /// What the program reads first.
    fn start(&mut self) -> Vec<u8>;
    /// The program wrote more: `stdout` is all it wrote so far (as far as it is kept). What it
    /// reads next, and whether the conversation is over: its input then ends once that is sent
    /// (a [`Live`] program's stays open for the next talk).
    fn heard(&mut self, stdout: &[u8]) -> (Vec<u8>, bool);
    /// How much of `stdout` it has read: a [`Live`] program's next talk starts at the rest.
    fn used(&self) -> usize;
}

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it (a limit: `SIGXCPU`, `SIGXFSZ`; `SIGPIPE` past the output limit;
    /// `SIGSYS` for a system call its sandbox refuses).
    Signaled(i32),
    /// The deadline came first: its whole process group was killed.
    TimedOut,
    /// brokerd ended it (a [`Live`] program: idle, a failed talk, brokerd's own end).
    Stopped,
}

/// One of its output streams, as far as it was kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    pub bytes: Vec<u8>,
    /// It wrote more than was kept: the pipe was closed at the limit.
    pub cut: bool,
}

/// What came of a started program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub ended: Ended,
    pub stdout: Captured,
    pub stderr: Captured,
    /// The errno of the refused network namespace, when the system refused it (a unit with
    /// `RestrictNamespaces=`, a kernel without unprivileged user namespaces); `None` when it
    /// was made or not asked for.
    pub no_namespace: Option<i32>,
}

/// Why the program could not be started, or its end not seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnError {
    /// A pipe or the fork failed in brokerd.
    #[error("{step}: {errno}", step = .0, errno = errno_text(*.1))]
    Setup(&'static str, i32),
    /// A step before `execve` failed in the child (the step, the errno).
    #[error("{step}: {errno}", step = .0, errno = errno_text(*.1))]
    Start(&'static str, i32),
    /// No end was reported by the deadline and its grace: the supervisor is gone or stuck.
    #[error("{0}")]
    Lost(String),
}

fn errno_text(e: i32) -> String {
    nix::errno::Errno::from_raw(e).desc().to_string()
}

/// How long brokerd waits past the deadline for the supervisor's report.
const GRACE: Duration = Duration::from_secs(10);

// The report records the children write to brokerd: three native `u32`s, one `write` each
// (under PIPE_BUF, so never interleaved).
const NOTE_NO_NAMESPACE: u32 = 1;
const START_FAILED: u32 = 2;
const EXITED: u32 = 3;
const TIMED_OUT: u32 = 4;
const STOPPED: u32 = 5;

// The steps of the child, as a start failure names them.
const STEPS: [&str; 11] = [
    "",
    "the signal mask",
    "its standard input and output",
    "its working directory",
    "its resource limits",
    "its sandbox",
    "its descriptors",
    "execve",
    "fork",
    "its supervisor, gone before it started",
    "its supervisor's wait",
];
const STEP_MASK: u32 = 1;
const STEP_STDIO: u32 = 2;
const STEP_CWD: u32 = 3;
const STEP_RLIMIT: u32 = 4;
const STEP_SANDBOX: u32 = 5;
const STEP_FDS: u32 = 6;
const STEP_EXEC: u32 = 7;
const STEP_FORK: u32 = 8;
const STEP_SUPERVISOR: u32 = 9;
const STEP_WAIT: u32 = 10;

/// Everything the two forked processes use, built before the fork.
struct Prepared<'a> {
    program: *const libc::c_char,
    argv: Vec<*const libc::c_char>,
    env: Vec<*const libc::c_char>,
    cwd: RawFd,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    report: RawFd,
    /// The read end of the stop pipe of a [`Live`] program (-1 for one run): when brokerd
    /// closes its end, the supervisor ends the group.
    stop: RawFd,
    limits: [(libc::__rlimit_resource_t, u64); 6],
    timeout: libc::timespec,
    own_network: bool,
    sandbox: &'a ChildSandbox,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SpawnError::Setup("a pipe", errno()));
    }
    // The program's 0, 1 and 2 are made by `dup2` from these: none of them may already be one
    // of those numbers (a daemon started with a closed standard descriptor).
    for fd in &mut fds {
        if *fd < 3 {
            // SAFETY: a copy at 3 or above, then the original closed; both ours.
            let high = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 3) };
            let e = errno();
            unsafe { libc::close(*fd) };
            if high < 0 {
                return Err(SpawnError::Setup("a pipe", e));
            }
            *fd = high;
        }
    }
    // SAFETY: both are new descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `fork` as the bare system call: no `atfork` handlers, nothing of the C library's own state
/// touched in a process that may only make system calls.
fn raw_fork() -> libc::pid_t {
    // SAFETY: clone with only the exit signal and no stack is fork; the child continues on a
    // copy of this thread's stack.
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::SIGCHLD as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        ) as libc::pid_t
    }
}

/// A started program as brokerd holds it: the supervisor's pid and brokerd's ends of the pipes.
struct Started {
    supervisor: libc::pid_t,
    streams: Streams,
    /// brokerd's end of the stop pipe (a [`Live`] program's only).
    stop: Option<OwnedFd>,
}

/// Fork the supervisor for `job` (which forks the program); `live`: with a stop pipe, its
/// standard error drained past the bound, its input kept open between talks.
fn start(job: &Job<'_>, live: bool) -> Result<Started, SpawnError> {
    let mut argv: Vec<*const libc::c_char> = job.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut env: Vec<*const libc::c_char> = job.env.iter().map(|a| a.as_ptr()).collect();
    env.push(std::ptr::null());
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (rep_r, rep_w) = pipe()?;
    let stop = if live { Some(pipe()?) } else { None };
    let l = job.limits;
    let prepared = Prepared {
        program: job.program.as_ptr(),
        argv,
        env,
        cwd: job.cwd.as_raw_fd(),
        stdin: in_r.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        report: rep_w.as_raw_fd(),
        stop: stop.as_ref().map_or(-1, |(r, _)| r.as_raw_fd()),
        limits: [
            (libc::RLIMIT_CPU, l.cpu_seconds),
            (libc::RLIMIT_AS, l.memory_bytes),
            (libc::RLIMIT_FSIZE, l.file_bytes),
            (libc::RLIMIT_NPROC, l.processes),
            (libc::RLIMIT_NOFILE, l.open_files),
            (libc::RLIMIT_CORE, 0),
        ],
        timeout: libc::timespec {
            tv_sec: job.timeout.as_secs() as libc::time_t,
            tv_nsec: job.timeout.subsec_nanos() as libc::c_long,
        },
        own_network: job.own_network,
        sandbox: job.sandbox,
    };
    let supervisor = raw_fork();
    if supervisor == 0 {
        // SAFETY: the forked child runs only system calls on what `prepared` holds.
        unsafe { supervise(&prepared) }
    }
    if supervisor < 0 {
        return Err(SpawnError::Setup("fork", errno()));
    }
    // Only the children keep their ends.
    drop((in_r, out_w, err_w, rep_w));
    let stop = stop.map(|(_, w)| w);
    Ok(Started {
        supervisor,
        streams: Streams::new(in_w, out_r, err_r, rep_r, job.max_output, live),
        stop,
    })
}

/// Reap the supervisor, which has ended its group (itself included) once its report closed;
/// one still there after the grace is reaped later by nobody, so ask once without waiting.
fn reap(supervisor: libc::pid_t, ended: bool) {
    let mut status = 0;
    let flags = if ended { 0 } else { libc::WNOHANG };
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(supervisor, &mut status, flags) };
}

/// Start `job` and wait for it to end (or its deadline), keeping its output.
pub fn run(job: Job<'_>) -> Result<Finished, SpawnError> {
    let started = Instant::now();
    let Started {
        supervisor,
        mut streams,
        ..
    } = start(&job, false)?;
    let until = started + job.timeout + GRACE;
    let outcome = match job.stdin {
        Input::Bytes(b) => streams.pump(None, b.to_vec(), until),
        Input::Talk(t) => {
            let first = t.start();
            streams.pump(Some(t), first, until)
        }
    }
    .and_then(|pumped| match pumped {
        Pumped::Closed => streams.finish(),
        _ => Err(lost()),
    });
    reap(supervisor, outcome.is_ok());
    outcome
}

fn lost() -> SpawnError {
    SpawnError::Lost("the program's end was not reported by its deadline and grace".to_string())
}

/// A program kept past one conversation (a tool server kept for its session): talked to again
/// and again over its standard input and output, until it exits, its deadline ([`Job::timeout`],
/// its whole life) comes, or brokerd ends it (closing the stop pipe, which its supervisor
/// watches: brokerd signals nothing but itself).
pub struct Live {
    started: Option<Started>,
    /// What the last talk left unread of the program's output (the start of its next message).
    unread: Vec<u8>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.started {
            Some(s) => write!(f, "Live(supervisor {})", s.supervisor),
            None => f.write_str("Live(ended)"),
        }
    }
}

/// Why a talk with a [`Live`] program ended short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    /// The program ended (or could not start) before the talk was over.
    Ended,
    /// The talk's deadline came first; brokerd ended the program.
    Late,
    /// It wrote more than the bound in one talk; brokerd ended the program.
    Cut,
}

/// A talk with a [`Live`] program that ended short: why, and how the program ended (it has).
#[derive(Debug)]
pub struct Stopped {
    pub why: Short,
    pub finished: Result<Finished, SpawnError>,
}

impl Live {
    /// Start `job` (its `stdin` the first talk, its `timeout` the program's whole life) and
    /// hold the first talk until it is over or `until`.
    pub fn start(job: Job<'_>, until: Instant) -> Result<Live, Stopped> {
        let started = start(&job, true).map_err(|e| Stopped {
            why: Short::Ended,
            finished: Err(e),
        })?;
        let mut live = Live {
            started: Some(started),
            unread: Vec::new(),
        };
        match job.stdin {
            Input::Talk(t) => live.talk(t, until)?,
            Input::Bytes(_) => {
                return Err(Stopped {
                    why: Short::Ended,
                    finished: Err(SpawnError::Setup(
                        "a live program's input is a talk",
                        libc::EINVAL,
                    )),
                });
            }
        }
        Ok(live)
    }

    fn streams(&mut self) -> &mut Streams {
        // `started` is `None` only once `end` has taken it, and `end` takes `self`.
        &mut self
            .started
            .as_mut()
            .expect("a live program is held until it is ended")
            .streams
    }

    /// One more talk: what `talk` starts with, then what it hears, until it is over (`Ok`, the
    /// program still running) or it ends short (the program has ended, or is ended).
    pub fn talk(&mut self, talk: &mut dyn Talk, until: Instant) -> Result<(), Stopped> {
        let unread = std::mem::take(&mut self.unread);
        let first = talk.start();
        let streams = self.streams();
        streams.out[0].1 = Captured {
            bytes: unread,
            cut: false,
        };
        let pumped = streams.pump(Some(&mut *talk), first, until);
        let why = match pumped {
            Ok(Pumped::Said) => {
                let out = &mut self.streams().out[0].1.bytes;
                let used = talk.used().min(out.len());
                self.unread = out.split_off(used);
                return Ok(());
            }
            Ok(Pumped::Closed) => Short::Ended,
            Ok(Pumped::Late) | Err(_) => Short::Late,
            Ok(Pumped::Cut) => Short::Cut,
        };
        Err(Stopped {
            why,
            finished: self.end_now(),
        })
    }

    /// Whether the program is still running (it may have exited, or met its deadline, since
    /// its last talk).
    pub fn running(&mut self) -> bool {
        let streams = self.streams();
        streams.read_report();
        streams.report.is_some() && !streams.ended()
    }

    /// What it wrote on its standard error so far (its last bytes, as far as they are kept).
    pub fn stderr(&mut self) -> &[u8] {
        &self.streams().out[1].1.bytes
    }

    /// End it: its supervisor ends the group, and how it ended is read (within the grace).
    pub fn end(mut self) -> Result<Finished, SpawnError> {
        self.end_now()
    }

    fn end_now(&mut self) -> Result<Finished, SpawnError> {
        let Some(mut s) = self.started.take() else {
            return Err(SpawnError::Lost("it was ended already".to_string()));
        };
        // The supervisor sees the stop pipe close and ends the group, itself included; the
        // program's input closes too.
        drop(s.stop.take());
        s.streams.stdin = None;
        let outcome = match s.streams.pump(None, Vec::new(), Instant::now() + GRACE) {
            Ok(Pumped::Closed) => s.streams.finish(),
            _ => Err(lost()),
        };
        reap(s.supervisor, outcome.is_ok());
        outcome
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if self.started.is_some() {
            let _ = self.end_now();
        }
    }
}

/// Why [`Streams::pump`] returned.
enum Pumped {
    /// Every stream and the report closed: the program and its supervisor have ended.
    Closed,
    /// A live program's talk is over (it is still running).
    Said,
    /// The deadline came first.
    Late,
    /// A live program wrote more than the bound in one talk.
    Cut,
}

/// brokerd's ends of a program's pipes, and what came through them.
struct Streams {
    stdin: Option<OwnedFd>,
    /// What is still to be written to its input.
    pending: Vec<u8>,
    written: usize,
    /// Its standard output and error while open, and what was kept of each.
    out: [(Option<OwnedFd>, Captured); 2],
    report: Option<OwnedFd>,
    records: Vec<u8>,
    max_output: usize,
    /// A live program: its input stays open between talks, and past the bound its standard
    /// error is still read, its oldest bytes dropped (closing it would end a server that logs).
    live: bool,
}

impl Streams {
    fn new(
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
        report: OwnedFd,
        max_output: usize,
        live: bool,
    ) -> Streams {
        for fd in [&stdin, &stdout, &stderr, &report] {
            // SAFETY: fcntl on descriptors we own.
            unsafe {
                let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
        }
        Streams {
            stdin: Some(stdin),
            pending: Vec::new(),
            written: 0,
            out: [
                (Some(stdout), Captured::default()),
                (Some(stderr), Captured::default()),
            ],
            report: Some(report),
            records: Vec::new(),
            max_output,
            live,
        }
    }

    /// Write `first` (then what `talk` answers) to the program's input, and read its output
    /// and the report, until `talk` is over (a live program: [`Pumped::Said`]), everything is
    /// closed, or `until`. Without a talk, or once a one-run program's talk is over, its input
    /// ends when all is written.
    fn pump(
        &mut self,
        mut talk: Option<&mut dyn Talk>,
        first: Vec<u8>,
        until: Instant,
    ) -> Result<Pumped, SpawnError> {
        self.pending = first;
        self.written = 0;
        let mut over = talk.is_none();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let all_sent = self.written >= self.pending.len();
            if over && all_sent {
                if self.live && talk.is_some() {
                    return Ok(Pumped::Said);
                }
                // Nothing more to come: its end of input.
                if !self.live {
                    self.stdin = None;
                }
            }
            if self.out.iter().all(|s| s.0.is_none()) && self.report.is_none() {
                return Ok(Pumped::Closed);
            }
            if self.live && self.out[0].1.cut {
                return Ok(Pumped::Cut);
            }
            let now = Instant::now();
            if now >= until {
                return Ok(Pumped::Late);
            }
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
            let mut which: Vec<usize> = Vec::with_capacity(4);
            for (i, s) in self.out.iter().enumerate() {
                if let Some(fd) = &s.0 {
                    fds.push(pollfd(fd, libc::POLLIN));
                    which.push(i);
                }
            }
            if let Some(fd) = &self.report {
                fds.push(pollfd(fd, libc::POLLIN));
                which.push(2);
            }
            if let Some(fd) = self.stdin.as_ref().filter(|_| !all_sent) {
                fds.push(pollfd(fd, libc::POLLOUT));
                which.push(3);
            }
            let wait = (until - now).as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: `fds` is a valid array of `fds.len()` entries.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
            if n < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Err(SpawnError::Lost(format!(
                    "waiting for the program's output: {}",
                    errno_text(errno())
                )));
            }
            for (p, w) in fds.iter().zip(which) {
                if p.revents == 0 {
                    continue;
                }
                match w {
                    0 | 1 => {
                        let got = self.read_stream(w, &mut buf);
                        if let (true, Some(t), false) = (got && w == 0, talk.as_mut(), over) {
                            let (more, done) = t.heard(&self.out[0].1.bytes);
                            self.pending.extend_from_slice(&more);
                            over = done;
                        }
                    }
                    2 => self.read_report(),
                    _ => self.write_some(),
                }
            }
        }
    }

    /// Read what stream `w` (0 stdout, 1 stderr) has; whether anything came.
    fn read_stream(&mut self, w: usize, buf: &mut [u8]) -> bool {
        let live = self.live;
        let max = self.max_output;
        let (slot, cap) = &mut self.out[w];
        let Some(fd) = slot else { return false };
        match read_some(fd, buf) {
            Read::Again => false,
            Read::End => {
                *slot = None;
                false
            }
            Read::Data(k) => {
                if live && w == 1 {
                    // A live program's standard error: its last bytes kept.
                    cap.bytes.extend_from_slice(&buf[..k]);
                    if cap.bytes.len() > max {
                        let extra = cap.bytes.len() - max;
                        cap.bytes.drain(..extra);
                        cap.cut = true;
                    }
                    return true;
                }
                let room = max - cap.bytes.len().min(max);
                cap.bytes.extend_from_slice(&buf[..k.min(room)]);
                if k > room {
                    // Past the limit: the pipe closes, and a program still writing gets
                    // SIGPIPE.
                    cap.cut = true;
                    *slot = None;
                }
                true
            }
        }
    }

    /// Read what the report has (the supervisor's records, or its end).
    fn read_report(&mut self) {
        let mut buf = [0u8; 256];
        while let Some(fd) = &self.report {
            match read_some(fd, &mut buf) {
                Read::Again => return,
                Read::End => self.report = None,
                Read::Data(k) => self.records.extend_from_slice(&buf[..k]),
            }
        }
    }

    /// Whether the report says the program has ended (or was ended).
    fn ended(&self) -> bool {
        self.records
            .chunks_exact(12)
            .any(|r| [EXITED, TIMED_OUT, STOPPED, START_FAILED].contains(&word(r, 0)))
    }

    /// Write what is pending to the program's input, as far as it takes it.
    fn write_some(&mut self) {
        let Some(fd) = &self.stdin else { return };
        // SAFETY: writing from a live slice to a descriptor we own.
        let k = unsafe {
            libc::write(
                fd.as_raw_fd(),
                self.pending[self.written..].as_ptr().cast(),
                self.pending.len() - self.written,
            )
        };
        if k > 0 {
            self.written += k as usize;
        }
        // The program closed its input: its end of input.
        if k < 0 && errno() != libc::EAGAIN {
            self.stdin = None;
        }
    }

    /// How the program ended, once everything is closed.
    fn finish(&mut self) -> Result<Finished, SpawnError> {
        finish(
            &self.records,
            std::mem::take(&mut self.out[0].1),
            std::mem::take(&mut self.out[1].1),
        )
    }
}

fn pollfd(fd: &OwnedFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }
}

/// What one `read` found.
enum Read {
    Data(usize),
    /// The end of the stream, or an error that ends it.
    End,
    /// Nothing yet (poll woke us for nothing).
    Again,
}

fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> Read {
    loop {
        // SAFETY: reading into a live buffer from a descriptor we own.
        let k = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if k > 0 {
            return Read::Data(k as usize);
        }
        if k == 0 {
            return Read::End;
        }
        match errno() {
            libc::EINTR => continue,
            libc::EAGAIN => return Read::Again,
            _ => return Read::End,
        }
    }
}

/// The children's report, read: how the program ended, or why it could not start.
fn finish(records: &[u8], stdout: Captured, stderr: Captured) -> Result<Finished, SpawnError> {
    let mut no_namespace = None;
    let mut ended = None;
    for rec in records.chunks_exact(12) {
        let (tag, a, b) = (word(rec, 0), word(rec, 4), word(rec, 8));
        match tag {
            NOTE_NO_NAMESPACE => no_namespace = Some(a as i32),
            START_FAILED => {
                let step = STEPS.get(a as usize).copied().unwrap_or("a step");
                return Err(SpawnError::Start(step, b as i32));
            }
            EXITED => {
                let status = a as i32;
                ended = Some(if libc::WIFSIGNALED(status) {
                    Ended::Signaled(libc::WTERMSIG(status))
                } else {
                    Ended::Exited(libc::WEXITSTATUS(status))
                });
            }
            TIMED_OUT => ended = Some(Ended::TimedOut),
            STOPPED => ended = Some(Ended::Stopped),
            _ => {}
        }
    }
    let Some(ended) = ended else {
        return Err(SpawnError::Lost(
            "the program's supervisor ended without saying how the program did".to_string(),
        ));
    };
    Ok(Finished {
        ended,
        stdout,
        stderr,
        no_namespace,
    })
}

/// The `u32` at `i` of a report record.
fn word(rec: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes([rec[i], rec[i + 1], rec[i + 2], rec[i + 3]])
}

// What follows runs in the forked children: system calls only, no allocation, no lock.

fn raw_errno() -> i32 {
    // SAFETY: the thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// One report record, in one `write`.
fn record(fd: RawFd, tag: u32, a: u32, b: u32) {
    let mut rec = [0u8; 12];
    rec[..4].copy_from_slice(&tag.to_ne_bytes());
    rec[4..8].copy_from_slice(&a.to_ne_bytes());
    rec[8..].copy_from_slice(&b.to_ne_bytes());
    // SAFETY: writing a stack buffer to a descriptor this process holds.
    unsafe { libc::write(fd, rec.as_ptr().cast(), rec.len()) };
}

fn close_range(first: u32, last: u32, flags: u32) -> libc::c_long {
    // SAFETY: close_range takes plain integers.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) }
}

const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;

fn monotonic() -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts
}

fn nanos(ts: &libc::timespec) -> i128 {
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// The supervisor: leads the group, starts the program, waits for it, the deadline or the stop
/// pipe, reports, then ends the whole group, itself included.
unsafe fn supervise(p: &Prepared<'_>) -> ! {
    // SAFETY (the whole function): system calls on values built before the fork.
    unsafe {
        // brokerd's handlers (its stop pipe) must not run here; SIGPIPE, which Rust ignores,
        // is the program's default again.
        for sig in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::setpgid(0, 0);
        let mut chld: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut chld);
        libc::sigaddset(&mut chld, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &chld, std::ptr::null_mut());
        let deadline = nanos(&monotonic()) + nanos(&p.timeout);
        let supervisor = libc::getpid();
        let program = raw_fork();
        if program == 0 {
            exec_program(p, supervisor);
        }
        if program < 0 {
            record(p.report, START_FAILED, STEP_FORK, raw_errno() as u32);
            libc::kill(0, libc::SIGKILL);
            libc::_exit(127);
        }
        // Hold nothing of brokerd's but the report and the stop pipe.
        let (low, high) = if p.stop < 0 {
            (p.report, p.report)
        } else {
            (p.report.min(p.stop), p.report.max(p.stop))
        };
        let (low, high) = (low as u32, high as u32);
        if low > 0 {
            close_range(0, low - 1, 0);
        }
        if high > low + 1 {
            close_range(low + 1, high - 1, 0);
        }
        close_range(high + 1, u32::MAX, 0);
        // SIGCHLD stays blocked and is read from a descriptor, so one wait hears the program's
        // end, the stop pipe and the deadline.
        let chld_fd = libc::signalfd(-1, &chld, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if chld_fd < 0 {
            record(p.report, START_FAILED, STEP_WAIT, raw_errno() as u32);
            libc::kill(0, libc::SIGKILL);
            libc::_exit(127);
        }
        loop {
            let left = deadline - nanos(&monotonic());
            if left <= 0 {
                record(p.report, TIMED_OUT, 0, 0);
                break;
            }
            let wait = libc::timespec {
                tv_sec: (left / 1_000_000_000) as libc::time_t,
                tv_nsec: (left % 1_000_000_000) as libc::c_long,
            };
            // A negative descriptor (no stop pipe) is skipped by ppoll.
            let mut fds = [
                libc::pollfd {
                    fd: chld_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: p.stop,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let r = libc::ppoll(fds.as_mut_ptr(), 2, &wait, std::ptr::null());
            if r < 0 && raw_errno() != libc::EINTR {
                record(p.report, STOPPED, 0, 0);
                break;
            }
            let mut status = 0;
            if libc::waitpid(program, &mut status, libc::WNOHANG) == program {
                record(p.report, EXITED, status as u32, 0);
                break;
            }
            // brokerd closed its end (or wrote to it): end the group.
            if fds[1].revents != 0 {
                record(p.report, STOPPED, 0, 0);
                break;
            }
            if fds[0].revents != 0 {
                let mut info = [0u8; 128];
                libc::read(chld_fd, info.as_mut_ptr().cast(), info.len());
            }
        }
        // The program and everything it started: it cannot leave the group, nor signal us.
        libc::kill(0, libc::SIGKILL);
        libc::_exit(0)
    }
}

/// The program: its input and output, its directory, its limits, its namespaces, its sandbox,
/// then `execve`. A step that fails is reported and ends it with 127.
unsafe fn exec_program(p: &Prepared<'_>, supervisor: libc::pid_t) -> ! {
    // SAFETY (the whole function): system calls on values built before the fork.
    unsafe {
        let fail = |step: u32, e: i32| -> ! {
            record(p.report, START_FAILED, step, e as u32);
            libc::_exit(127)
        };
        // Should the supervisor die before it can end the group (killed from outside), the
        // program dies with it rather than run on unwatched.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() != supervisor
        {
            fail(STEP_SUPERVISOR, libc::ESRCH);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
            fail(STEP_MASK, raw_errno());
        }
        for (from, to) in [(p.stdin, 0), (p.stdout, 1), (p.stderr, 2)] {
            if libc::dup2(from, to) != to {
                fail(STEP_STDIO, raw_errno());
            }
        }
        if libc::fchdir(p.cwd) != 0 {
            fail(STEP_CWD, raw_errno());
        }
        for (resource, value) in p.limits {
            let lim = libc::rlimit {
                rlim_cur: value as libc::rlim_t,
                rlim_max: value as libc::rlim_t,
            };
            if libc::setrlimit(resource, &lim) != 0 {
                fail(STEP_RLIMIT, raw_errno());
            }
        }
        if p.own_network && libc::unshare(bxharden::seccomp::RUN_NAMESPACES as libc::c_int) != 0 {
            // Not fatal: seccomp refuses every network socket anyway; brokerd says so once.
            record(p.report, NOTE_NO_NAMESPACE, raw_errno() as u32, 0);
        }
        if let Err(e) = p.sandbox.enter() {
            fail(STEP_SANDBOX, e.raw_os_error().unwrap_or(libc::EIO));
        }
        // Everything of brokerd's closes at execve; the report too, which tells brokerd the
        // program started.
        if close_range(3, u32::MAX, CLOSE_RANGE_CLOEXEC) != 0 {
            fail(STEP_FDS, raw_errno());
        }
        libc::execve(p.program, p.argv.as_ptr(), p.env.as_ptr());
        fail(STEP_EXEC, raw_errno())
    }
}
