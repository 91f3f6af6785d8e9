//! One program started for the `run` tool, and everything it started, ended whole.
//!
//! brokerd is threaded, so between `fork` and `execve` only system calls may run: everything is
//! built before the fork (the pipes, the argument and environment arrays, the sandbox), and the
//! two forked processes below touch only what was built.
//!
//! ```text
//! brokerd (a connection thread)
//!   └─ supervisor: leads a new process group, waits for the program or the deadline,
//!      │           then kill(0, SIGKILL): the whole group, itself included
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
    /// reads next, and whether the conversation is over: its input then ends once that is sent.
    fn heard(&mut self, stdout: &[u8]) -> (Vec<u8>, bool);
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

// The steps of the child, as a start failure names them.
const STEPS: [&str; 10] = [
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

/// Start `job` and wait for it to end (or its deadline), keeping its output.
pub fn run(job: Job<'_>) -> Result<Finished, SpawnError> {
    let mut argv: Vec<*const libc::c_char> = job.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut env: Vec<*const libc::c_char> = job.env.iter().map(|a| a.as_ptr()).collect();
    env.push(std::ptr::null());
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (rep_r, rep_w) = pipe()?;
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
    let started = Instant::now();
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
    let outcome = collect(
        in_w,
        out_r,
        err_r,
        rep_r,
        job.stdin,
        job.max_output,
        started + job.timeout + GRACE,
    );
    // The supervisor has killed its group (itself included) when its report pipe closed; a
    // supervisor still there after the grace is reaped later by nobody, so ask once more
    // without waiting.
    let mut status = 0;
    let flags = if outcome.is_ok() { 0 } else { libc::WNOHANG };
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(supervisor, &mut status, flags) };
    outcome
}

/// Read stdout, stderr and the report, write stdin, until all three are closed or `until`.
fn collect(
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    report: OwnedFd,
    mut input: Input<'_>,
    max_output: usize,
    until: Instant,
) -> Result<Finished, SpawnError> {
    for fd in [&stdin, &stdout, &stderr, &report] {
        // SAFETY: fcntl on descriptors we own.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
    // What is still to be written, and whether the input ends once it is.
    let (mut pending, mut last) = match &mut input {
        Input::Bytes(b) => (b.to_vec(), true),
        Input::Talk(t) => (t.start(), false),
    };
    let mut stdin = (!(pending.is_empty() && last)).then_some(stdin);
    let mut written = 0usize;
    let mut streams: [(Option<OwnedFd>, Captured); 2] = [
        (Some(stdout), Captured::default()),
        (Some(stderr), Captured::default()),
    ];
    let mut report = Some(report);
    let mut records: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if streams.iter().all(|s| s.0.is_none()) && report.is_none() {
            break;
        }
        let now = Instant::now();
        if now >= until {
            return Err(SpawnError::Lost(
                "the program's end was not reported by its deadline and grace".to_string(),
            ));
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
        let mut which: Vec<usize> = Vec::with_capacity(4);
        for (i, s) in streams.iter().enumerate() {
            if let Some(fd) = &s.0 {
                fds.push(pollfd(fd, libc::POLLIN));
                which.push(i);
            }
        }
        if let Some(fd) = &report {
            fds.push(pollfd(fd, libc::POLLIN));
            which.push(2);
        }
        if let Some(fd) = stdin.as_ref().filter(|_| written < pending.len()) {
            fds.push(pollfd(fd, libc::POLLOUT));
            which.push(3);
        }
        let wait = (until - now).as_millis().min(i32::MAX as u128) as i32;
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
                    let (slot, cap) = &mut streams[w];
                    let Some(fd) = slot else { continue };
                    match read_some(fd, &mut buf) {
                        Read::Again => {}
                        Read::End => *slot = None,
                        Read::Data(k) => {
                            let room = max_output - cap.bytes.len();
                            cap.bytes.extend_from_slice(&buf[..k.min(room)]);
                            if k > room {
                                // Past the limit: the pipe closes, and a program still
                                // writing gets SIGPIPE.
                                cap.cut = true;
                                *slot = None;
                            }
                            if let (0, Input::Talk(t), false) = (w, &mut input, last) {
                                let (more, over) = t.heard(&cap.bytes);
                                pending.extend_from_slice(&more);
                                last = over;
                            }
                        }
                    }
                }
                2 => {
                    let Some(fd) = &report else { continue };
                    match read_some(fd, &mut buf) {
                        Read::Again => {}
                        Read::End => report = None,
                        Read::Data(k) => records.extend_from_slice(&buf[..k]),
                    }
                }
                _ => {
                    let Some(fd) = &stdin else { continue };
                    // SAFETY: writing from a live slice to a descriptor we own.
                    let k = unsafe {
                        libc::write(
                            fd.as_raw_fd(),
                            pending[written..].as_ptr().cast(),
                            pending.len() - written,
                        )
                    };
                    if k > 0 {
                        written += k as usize;
                    }
                    // The program closed its input: its end of input.
                    if k < 0 && errno() != libc::EAGAIN {
                        stdin = None;
                    }
                }
            }
        }
        // All of it written, and nothing more to come: its end of input.
        if last && written >= pending.len() {
            stdin = None;
        }
    }
    let [(_, stdout), (_, stderr)] = streams;
    finish(&records, stdout, stderr)
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
        let word = |i: usize| u32::from_ne_bytes([rec[i], rec[i + 1], rec[i + 2], rec[i + 3]]);
        let (tag, a, b) = (word(0), word(4), word(8));
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

/// The supervisor: leads the group, starts the program, waits for it or the deadline, reports,
/// then ends the whole group, itself included.
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
        // Hold nothing of brokerd's but the report.
        let rep = p.report as u32;
        if rep > 0 {
            close_range(0, rep - 1, 0);
        }
        close_range(rep + 1, u32::MAX, 0);
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
            let r = libc::sigtimedwait(&chld, std::ptr::null_mut(), &wait);
            if r < 0 && raw_errno() == libc::EAGAIN {
                record(p.report, TIMED_OUT, 0, 0);
                break;
            }
            let mut status = 0;
            if libc::waitpid(program, &mut status, libc::WNOHANG) == program {
                record(p.report, EXITED, status as u32, 0);
                break;
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
