//! What every test of the workspace shares, so that no test hangs and no skip hides:
//!
//! - [`skip`]: the one way a test says it cannot run here. Under `CI=true` a skip fails the test
//!   unless its reason is listed in `.ci/allowed-skips` (with why a CI machine cannot have it),
//!   so a missing install step on CI is a failure, not a quiet pass.
//! - [`wait_for`]: every wait has a deadline, and a wait past it fails saying what it waited for.
//! - [`run`] and [`Bounded`]: a child runs in its own process group with its output read by
//!   threads; past its deadline the whole group is killed before anything more is read, so a
//!   grandchild that keeps a pipe open cannot hang the test.
//! - [`recv`], [`join`], [`Barrier`]: waits on other threads that end at a deadline.
//! - [`Server`] and [`accept`]: fake servers that stop with their test and connections whose
//!   reads and writes give up at a deadline.
//! - [`Daemon`]: a real daemon under test, waited for, its log read, killed when dropped.
//! - [`Watchdog`]: a last line of defence for a whole test binary.
//! - [`model::PacedModel`]: a model server that streams at a person's pace, or stays silent.
//!
//! This is a test-only crate: it is a dev-dependency of the crates whose tests use it.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

mod daemon;
pub mod model;
mod serve;
mod threads;

pub use daemon::{Daemon, without_time, without_times};
pub use serve::{HttpRequest, Listener, Server, Stream, accept, accept_within, read_http_request};
pub use threads::{Barrier, gate, join, join_within, recv, recv_within};

/// Generous deadlines: a loaded two-core machine builds and starts slowly, and nothing here
/// measures speed (timing lives in benchmarks).
pub const DEADLINE: Duration = Duration::from_secs(120);

/// How long output is still read after a killed child's group is gone.
const DRAIN: Duration = Duration::from_secs(5);

/// The file listing the skip reasons CI accepts.
pub fn allowed_skips_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/allowed-skips")
}

/// Whether this runs as CI (`CI=true`, as `.ci/run` and most CI systems set it).
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The reasons in `text` (the format of `.ci/allowed-skips`): one reason a line, compared as
/// a prefix of a skip's reason; `#` lines say why, blank lines separate.
pub fn parse_allowed(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Whether a skip for `reason` is acceptable: always off CI; on CI only when `allowed` has an
/// entry that `reason` starts with.
pub fn skip_verdict(reason: &str, ci: bool, allowed: &[String]) -> Result<(), String> {
    if !ci || allowed.iter().any(|a| reason.starts_with(a.as_str())) {
        return Ok(());
    }
    Err(format!(
        "skipped on CI: {reason}; CI must provide what this test needs (.ci/run), or the \
         reason goes into {} with why a CI machine cannot have it",
        allowed_skips_file().display()
    ))
}

/// Check a skip for `reason` against this run (CI or not) and `.ci/allowed-skips`, printing
/// `skipped: reason`. `Err` says why the skip is not acceptable here.
pub fn check_skip(reason: &str) -> Result<(), String> {
    println!("skipped: {reason}");
    log_skip(reason);
    let allowed = std::fs::read_to_string(allowed_skips_file())
        .map(|t| parse_allowed(&t))
        .unwrap_or_default();
    skip_verdict(reason, on_ci(), &allowed)
}

/// The environment variable naming the file every skip is added to (one reason a line):
/// `make gate` sets it, and before its last line lists what skipped and fails on a skip
/// `.ci/allowed-skips` does not list, so `gate: ok` never hides a test that did not run.
pub const SKIP_LOG: &str = "BXTEST_SKIP_LOG";

fn log_skip(reason: &str) {
    use std::io::Write;
    let Some(path) = std::env::var_os(SKIP_LOG) else {
        return;
    };
    // One `write` of a whole line to a file opened for appending: lines of tests running at
    // once do not interleave.
    let line = format!("{}\n", reason.replace('\n', " "));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Say that this test cannot run here and why; the caller returns right after. Under `CI=true`
/// this panics (the test fails) unless the reason is listed in `.ci/allowed-skips`.
#[track_caller]
pub fn skip(reason: &str) {
    if let Err(e) = check_skip(reason) {
        panic!("{e}");
    }
}

/// The environment variable naming the Honcho server tests file into (`http://host:port`);
/// `.ci/run` brings one up and sets it (docs/testing.md).
pub const HONCHO_URL: &str = "HONCHO_URL";

/// The Honcho server to test against, or `None` after a skip saying why (a failure under
/// `CI=true`, where `.ci/run` provides it). Tests share the server and keep apart by giving each
/// its own workspace ([`unique_name`]).
#[track_caller]
pub fn honcho_url() -> Option<String> {
    match std::env::var(HONCHO_URL) {
        Ok(u) if !u.trim().is_empty() => Some(u.trim().to_string()),
        _ => {
            skip(
                "HONCHO_URL is not set: no Honcho server to test against (.ci/run brings one up \
                 with honcho-up.sh; see docs/testing.md)",
            );
            None
        }
    }
}

/// A Honcho server with its auth on, for the bearer token's tests: `$HONCHO_AUTH_URL` and the
/// file holding its admin token, `$HONCHO_AUTH_TOKEN_FILE` (`.ci/run` and `make honcho` bring one
/// up), or `None` after a skip saying why.
#[track_caller]
pub fn honcho_auth() -> Option<(String, PathBuf)> {
    let url = std::env::var("HONCHO_AUTH_URL").unwrap_or_default();
    let token = std::env::var("HONCHO_AUTH_TOKEN_FILE").unwrap_or_default();
    if url.trim().is_empty() || token.trim().is_empty() {
        skip(
            "HONCHO_AUTH_URL or HONCHO_AUTH_TOKEN_FILE is not set: no Honcho with its auth on to \
             test the token against (.ci/run brings one up; see docs/testing.md)",
        );
        return None;
    }
    Some((url.trim().to_string(), PathBuf::from(token.trim())))
}

/// The MCP reference server `mcp-server-time` (`$MCP_SERVER_TIME`; `.ci/peers` installs it with
/// `mcp-server-git` and `mcp-server-fetch` beside it in one virtualenv), or `None` after a skip
/// saying why (a failure under `CI=true`).
#[track_caller]
pub fn mcp_server_time() -> Option<PathBuf> {
    peer_path(
        "MCP_SERVER_TIME",
        "MCP_SERVER_TIME is not set: no MCP reference server to test declared tools against \
         (.ci/peers installs mcp-server-time; see docs/testing.md)",
    )
}

/// The Python of the benchmark's virtualenv with AgentDojo in it (`bench/injbench/venv`, which
/// `.ci/peers` runs and names in `INJBENCH_PYTHON`), or `None` after a skip saying why.
#[track_caller]
pub fn injbench_python() -> Option<PathBuf> {
    peer_path(
        "INJBENCH_PYTHON",
        "INJBENCH_PYTHON is not set: no AgentDojo to run the benchmark's sample on (.ci/peers \
         installs it with bench/injbench/venv; see docs/testing.md)",
    )
}

/// The path `.ci/peers` named in `$var`, or `None` after skipping with `missing` (a failure
/// under `CI=true`).
#[track_caller]
fn peer_path(var: &str, missing: &str) -> Option<PathBuf> {
    match std::env::var(var) {
        Ok(p) if !p.trim().is_empty() => Some(PathBuf::from(p.trim())),
        _ => {
            skip(missing);
            None
        }
    }
}

/// The directory of the MCP reference servers on npm (`server-everything`, `-filesystem`,
/// `-memory`), which `.ci/peers` installs and names in `MCP_NODE_SERVERS`, and the system's
/// node that runs them; `None`, said as a skip, without either.
pub fn mcp_node_servers() -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::var("MCP_NODE_SERVERS")
        .ok()
        .filter(|p| !p.trim().is_empty());
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    match (dir, node) {
        (Some(d), Some(node)) => Some((PathBuf::from(d.trim()), node)),
        _ => {
            skip(
                "MCP_NODE_SERVERS is not set or there is no node: no MCP reference server on \
                 npm to test declared tools against (.ci/peers installs them; see \
                 docs/testing.md)",
            );
            None
        }
    }
}

/// What a server of the virtualenv `program` lies in must read: the virtualenv, and the Python
/// installation its interpreter links to (a declared tool server's `read_paths`).
pub fn venv_read_paths(program: &Path) -> Vec<PathBuf> {
    let venv = program
        .parent()
        .and_then(Path::parent)
        .expect("a program in <venv>/bin")
        .to_path_buf();
    let python = std::fs::canonicalize(venv.join("bin/python")).expect("the venv's python");
    let prefix = python
        .parent()
        .and_then(Path::parent)
        .expect("<prefix>/bin/python")
        .to_path_buf();
    vec![venv, prefix]
}

/// A name no other test, run or process uses at the same time: `prefix`, the process id, the
/// time in nanoseconds and a counter, in the characters every id allows (`A-Z a-z 0-9 _ -`).
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The command a test starts a daemon with: `bin <command> --config <config>`, with none of the
/// service manager's variables inherited (`JOURNAL_STREAM`, `LISTEN_PID`, `LISTEN_FDS`,
/// `NOTIFY_SOCKET`, `CREDENTIALS_DIRECTORY`: a test sets those it means), stdin and stdout
/// closed, stderr appended to `log` (made when missing).
pub fn daemon_command(bin: &Path, command: &str, config: &Path, log: &Path) -> Command {
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot open the log {}: {e}", log.display()));
    let mut cmd = Command::new(bin);
    cmd.arg(command)
        .arg("--config")
        .arg(config)
        .env_remove("JOURNAL_STREAM")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("CREDENTIALS_DIRECTORY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err);
    cmd
}

/// Write `text` to `path`, readable and writable by its owner only, as a key or secret file must
/// be (`bxcore::secret` refuses any other).
pub fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("cannot chmod 600 {}: {e}", path.display()));
}

/// Whether this process runs as root (many sandbox tests need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether process `pid` has ended: gone from `/proc`, or a zombie (`Z`, `X`), whose files, and
/// so the sockets it served, the kernel has closed. An empty `/proc/<pid>/cmdline` is not
/// enough: the memory goes first, while the files are still open.
pub fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state == 'Z' || state == 'X')
    })
}

/// Wait until `ready` returns true, polling, for at most `deadline`; past it, panic saying
/// `what` was awaited.
#[track_caller]
pub fn wait_for(what: &str, deadline: Duration, mut ready: impl FnMut() -> bool) {
    if let Err(e) = try_wait_for(what, deadline, &mut ready) {
        panic!("{e}");
    }
}

/// [`wait_for`] that returns the failure instead of panicking.
pub fn try_wait_for(
    what: &str,
    deadline: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let until = Instant::now() + deadline;
    loop {
        if ready() {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(format!("waited {deadline:?} for {what}, in vain"));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A child started in its own process group, its stdout and stderr (when piped) read by
/// threads, so that waiting never blocks on a pipe; killed with its whole group when dropped.
#[derive(Debug)]
pub struct Bounded {
    child: Child,
    what: String,
    stdout: Pipe,
    stderr: Pipe,
    status: Option<ExitStatus>,
}

/// What a reader thread has passed on from one pipe, and whether the pipe has closed.
#[derive(Debug)]
struct Pipe {
    rx: Option<mpsc::Receiver<Vec<u8>>>,
    got: Vec<u8>,
    closed: bool,
}

impl Pipe {
    fn new(pipe: Option<impl Read + Send + 'static>) -> Pipe {
        let Some(mut pipe) = pipe else {
            return Pipe {
                rx: None,
                got: Vec::new(),
                closed: true,
            };
        };
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Pipe {
            rx: Some(rx),
            got: Vec::new(),
            closed: false,
        }
    }

    /// Take what arrives until `until`; false when nothing more will come (closed) or the time
    /// is up.
    fn take_one(&mut self, until: Instant) -> bool {
        let Some(rx) = &self.rx else {
            return false;
        };
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(chunk) => {
                self.got.extend_from_slice(&chunk);
                true
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.closed = true;
                self.rx = None;
                false
            }
            Err(mpsc::RecvTimeoutError::Timeout) => false,
        }
    }

    /// Everything until the pipe closes or `until`.
    fn drain(&mut self, until: Instant) -> Vec<u8> {
        while self.take_one(until) {}
        std::mem::take(&mut self.got)
    }
}

impl Bounded {
    /// Start `cmd` (described as `what` in failures) in a process group of its own.
    pub fn spawn(cmd: &mut Command, what: &str) -> Result<Bounded, String> {
        cmd.process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {what}: {e}"))?;
        let stdout = Pipe::new(child.stdout.take());
        let stderr = Pipe::new(child.stderr.take());
        Ok(Bounded {
            child,
            what: what.to_string(),
            stdout,
            stderr,
            status: None,
        })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdin, when it was piped.
    pub fn stdin(&mut self) -> Option<&mut std::process::ChildStdin> {
        self.child.stdin.as_mut()
    }

    /// The child's exit status if it has ended, without waiting: a test that waits for a
    /// server to answer stops waiting once the server is gone.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.status = Some(s);
        }
        self.status
    }

    /// Close the child's stdin.
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Wait until the child's stdout holds `needle`, for at most `deadline`; `Ok` is the
    /// stdout so far. `Err` says what was awaited, and what the child said, when it closed its
    /// stdout first or the deadline passed.
    pub fn wait_for_stdout(&mut self, needle: &str, deadline: Duration) -> Result<String, String> {
        let until = Instant::now() + deadline;
        loop {
            let so_far = String::from_utf8_lossy(&self.stdout.got).into_owned();
            if so_far.contains(needle) {
                return Ok(so_far);
            }
            if !self.stdout.take_one(until) {
                let why = if self.stdout.closed {
                    "it closed its stdout first".to_string()
                } else {
                    format!("waited {deadline:?} in vain")
                };
                return Err(format!(
                    "{} never printed {needle:?} ({why}); stdout so far:\n{so_far}",
                    self.what
                ));
            }
        }
    }

    /// Wait for the child to end within `deadline`; past it, kill its whole group first. The
    /// output is what the pipes gave until they closed (or a few seconds after the end).
    pub fn finish(mut self, deadline: Duration) -> Result<Output, String> {
        let ended = self.wait_until(Instant::now() + deadline);
        if !ended {
            self.kill();
        }
        let drain = Instant::now() + DRAIN;
        let out = Output {
            // Reaped by `kill` when it did not end by itself.
            status: self.status.unwrap_or_default(),
            stdout: self.stdout.drain(drain),
            stderr: self.stderr.drain(drain),
        };
        if ended {
            Ok(out)
        } else {
            Err(format!(
                "{} did not end within {deadline:?} and was killed; it said:\n{}",
                self.what,
                said(&out)
            ))
        }
    }

    /// Kill the child's whole group now, then return what it said.
    pub fn kill_and_collect(mut self) -> Output {
        self.kill();
        let drain = Instant::now() + DRAIN;
        Output {
            status: self.status.unwrap_or_default(),
            stdout: self.stdout.drain(drain),
            stderr: self.stderr.drain(drain),
        }
    }

    fn wait_until(&mut self, until: Instant) -> bool {
        loop {
            if self.status.is_some() {
                return true;
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kill the child's whole process group and reap the child.
    pub fn kill(&mut self) {
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
        if self.status.is_none() {
            self.status = self.child.wait().ok();
        }
    }
}

impl Drop for Bounded {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.kill();
        } else {
            // The child ended; anything it left in its group goes with it.
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        }
    }
}

/// Kill `child` and reap it: the end of a guard that holds a daemon. A killed child is reaped
/// at once, so this wait is bounded.
pub fn reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait(); // bounded: killed just before
}

/// Run `cmd` to its end within `deadline` (see [`Bounded`]): `Err` says what did not end.
pub fn run(cmd: &mut Command, what: &str, deadline: Duration) -> Result<Output, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Bounded::spawn(cmd, what)?.finish(deadline)
}

/// Everything a command printed, for assertion messages.
pub fn said(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Ends the whole test process if it is still running after `limit`, saying `what` ran: a
/// last line of defence against a hang no deadline caught. Disarmed when dropped.
#[derive(Debug)]
pub struct Watchdog {
    disarm: Option<mpsc::Sender<()>>,
}

impl Watchdog {
    pub fn arm(what: &str, limit: Duration) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let what = what.to_string();
        thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("watchdog: {what} still ran after {limit:?}; ending the test process");
                std::process::exit(101);
            }
        });
        Watchdog { disarm: Some(tx) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.disarm.take());
    }
}

/// `Command::output` with a deadline: `cmd.output_bounded()` runs it as [`run`] does, within
/// [`DEADLINE`], described by its program and arguments.
pub trait OutputBounded {
    fn output_bounded(&mut self) -> Result<Output, String>;
}

impl OutputBounded for Command {
    fn output_bounded(&mut self) -> Result<Output, String> {
        let what = std::iter::once(self.get_program())
            .chain(self.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        run(self, &what, DEADLINE)
    }
}
