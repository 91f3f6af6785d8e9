//! A compromised session worker: this binary plays one. loopd's real monitor starts it as the
//! worker of session `a` (`Monitor::new` with this binary for loopd's own), hands it `a`'s log
//! and a connection over the real channel, and it enters the real worker's sandbox
//! (`loopd::worker::profile`). Then it tries, as code an exploit runs would, everything a worker
//! must not do, writes what each attempt got into its own directory (the one place it may
//! write), and last sends its monitor a message no worker may send.
//!
//! The runner checks each answer: no other session's log, outbox or directory; no file of
//! loopd's but its own; no socket and no connect; no signal, trace or memory read of the
//! monitor; and the monitor ends it for the hostile message. The sandbox runs with
//! `seccomp_log` so a refused call answers `EPERM` (and the worker lives to report it) rather
//! than killing it.
//!
//! `harness = false`: the worker's sandbox is applied with one thread, from `main`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bxcore::{SessionId, Turn};
use bxharden::daemon::{DaemonConfig, Start};
use loopd::config::Config;
use loopd::control::{self, ToWorker};
use loopd::monitor::Monitor;

const WAIT: Duration = Duration::from_secs(60);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        match args[5].as_str() {
            "flood" => flood(&PathBuf::from(&args[3]), &args[5]),
            s => hostile(&PathBuf::from(&args[3]), s),
        }
        return;
    }
    runner();
    flood_runner();
}

/// The worker's start as the real one makes it, for a session whose log does not exist:
/// its configuration and its sandbox. The channel, and the configuration.
fn enter(config: &Path, session: &str) -> (UnixStream, Config) {
    use std::os::fd::AsFd;
    let session = SessionId::new(session).unwrap();
    let fd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let mut channel = UnixStream::from(fd);
    let (msg, _) = control::recv_to_worker(&mut channel).unwrap();
    assert!(matches!(msg, ToWorker::Start { log: false, .. }), "{msg:?}");
    let start = Start::<Config>::load_within(loopd::daemon::SPEC, config).unwrap();
    let cfg = start.cfg().clone();
    let profile = loopd::worker::profile(&cfg, &session, config);
    let (_cfg, _running) = start.sandbox(&profile).unwrap();
    (channel, cfg)
}

/// A worker that asks for more connections than a turn needs, then floods its monitor with
/// dials and never reads an answer.
fn flood(config: &Path, session: &str) {
    let (mut channel, cfg) = enter(config, session);
    let (hand, conn) = control::recv_to_worker(&mut channel).unwrap();
    assert!(matches!(hand, ToWorker::Hand { .. }), "{hand:?}");
    drop(conn);
    let dial = loopd::control::ToMonitor::Dial {
        peer: loopd::control::Peer::Inference,
    };
    let (mut dialed, mut bound) = (Vec::new(), 0);
    for _ in 0..loopd::monitor::MAX_OPEN_PER_PEER + 2 {
        control::send(&mut channel, &dial, None).unwrap();
        match control::recv_to_worker(&mut channel).unwrap() {
            (ToWorker::Dialed, Some(fd)) => dialed.push(fd),
            (ToWorker::NotDialed { why }, _) if why.contains("its bound") => bound += 1,
            (other, _) => panic!("{other:?}"),
        }
    }
    let report = format!("dialed: {}\nrefused at the bound: {bound}\n", dialed.len());
    let dir = cfg.worker_dir(&SessionId::new(session).unwrap());
    std::fs::write(dir.join("report.tmp"), report).unwrap();
    std::fs::rename(dir.join("report.tmp"), dir.join("report")).unwrap();
    // Now ask without end and read nothing: the monitor's answers fill the channel.
    loop {
        if control::send(&mut channel, &dial, None).is_err() {
            return;
        }
    }
}

fn flood_runner() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    for d in ["loop/sessions", "loop/workers", "run/loop-infer"] {
        std::fs::create_dir_all(h.join(d)).unwrap();
    }
    // Something on inferproxy's socket that takes connections and never answers.
    let _infer =
        std::os::unix::net::UnixListener::bind(h.join("run/loop-infer/infer.sock")).unwrap();
    let text = format!(
        "[paths]\nhome = {:?}\n[sandbox]\nrequire = false\nseccomp_log = true\n",
        h.display().to_string()
    );
    let config = h.join("loopd.toml");
    std::fs::write(&config, &text).unwrap();
    let cfg = Config::parse(&text).unwrap();
    let monitor = Arc::new(Monitor::new(cfg, config, std::env::current_exe().unwrap()));
    let (_ours, theirs) = UnixStream::pair().unwrap();
    let turn = Turn {
        session: SessionId::new("flood").unwrap(),
        resume: false,
        text: "hi".to_string(),
    };
    monitor.hand(theirs, 1, turn, None);
    let report = h.join("loop/workers/flood/report");
    bxtest::wait_for("the flooding worker's report", WAIT, || report.exists());
    let got = std::fs::read_to_string(&report).unwrap();
    let want = format!(
        "dialed: {}\nrefused at the bound: 2\n",
        loopd::monitor::MAX_OPEN_PER_PEER
    );
    assert_eq!(
        got, want,
        "a worker holds at most its bound of one peer's connections"
    );
    // The monitor stays free (its table answers) and ends the worker that does not read.
    bxtest::wait_for("the monitor to end the worker that floods it", WAIT, || {
        monitor.running().is_empty()
    });
    println!("hostile_worker: a flooding worker was held to its bound and ended");
}

fn errno_of(r: std::io::Result<impl Sized>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

fn last_errno(r: i64) -> String {
    if r >= 0 {
        "ok".to_string()
    } else {
        errno_of(Err::<(), _>(std::io::Error::last_os_error()))
    }
}

/// The compromised worker: `worker --config FILE --session ID`, its channel on stdin.
fn hostile(config: &Path, session: &str) {
    use std::os::fd::AsFd;
    let session = SessionId::new(session).unwrap();
    let fd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let mut channel = UnixStream::from(fd);
    let (msg, _) = control::recv_to_worker(&mut channel).unwrap();
    assert!(matches!(msg, ToWorker::Start { log: false, .. }), "{msg:?}");
    // Its session is new: the monitor makes its log when asked.
    control::send(&mut channel, &loopd::control::ToMonitor::Create, None).unwrap();
    let start = Start::<Config>::load_within(loopd::daemon::SPEC, config).unwrap();
    let cfg = start.cfg().clone();
    let profile = loopd::worker::profile(&cfg, &session, config);
    let (_cfg, _running) = start.sandbox(&profile).unwrap();
    // The connection the monitor handed over, and the log it made.
    let mut log = None;
    for _ in 0..2 {
        match control::recv_to_worker(&mut channel).unwrap() {
            (ToWorker::Hand { .. }, conn) => drop(conn),
            (ToWorker::Created, fd) => log = fd.map(std::fs::File::from),
            (other, _) => panic!("{other:?}"),
        }
    }
    let log = log.unwrap();

    let home = cfg.paths.home.clone();
    let monitor = std::os::unix::process::parent_id() as i32;
    let mut got: BTreeMap<&str, String> = BTreeMap::new();
    got.insert("read its own log", errno_of(log.metadata()));
    got.insert(
        "open another session's log",
        errno_of(std::fs::File::open(home.join("loop/sessions/b.jsonl"))),
    );
    got.insert(
        "list the sessions",
        errno_of(std::fs::read_dir(home.join("loop/sessions"))),
    );
    got.insert(
        "make a session's log",
        errno_of(std::fs::File::create(home.join("loop/sessions/c.jsonl"))),
    );
    got.insert(
        "read another worker's outbox",
        errno_of(std::fs::read_dir(home.join("loop/workers/b/outbox"))),
    );
    got.insert(
        "read the owner's system.md",
        errno_of(std::fs::read(home.join("loop/system.md"))),
    );
    // SAFETY: plain system calls with integer arguments, made to be refused.
    unsafe {
        got.insert(
            "make a socket",
            last_errno(libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) as i64),
        );
        let mut pair = [0i32; 2];
        got.insert(
            "make a socket pair",
            last_errno(
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) as i64,
            ),
        );
        got.insert(
            "signal the monitor",
            last_errno(libc::kill(monitor, 0) as i64),
        );
        let pid = libc::fork();
        if pid == 0 {
            libc::_exit(0);
        }
        got.insert("fork a process", last_errno(pid as i64));
        got.insert(
            "trace the monitor",
            last_errno(libc::ptrace(libc::PTRACE_ATTACH, monitor, 0, 0)),
        );
    }
    got.insert(
        "read the monitor's memory",
        errno_of(std::fs::File::open(format!("/proc/{monitor}/mem"))),
    );
    let path = CString::new(home.join("run").to_string_lossy().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and integer flags.
    got.insert(
        "open the run directory",
        last_errno(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) } as i64),
    );
    let report: String = got.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
    let dir = cfg.worker_dir(&session);
    let mut f = std::fs::File::create(dir.join("report.tmp")).unwrap();
    f.write_all(report.as_bytes()).unwrap();
    f.sync_all().unwrap();
    std::fs::rename(dir.join("report.tmp"), dir.join("report")).unwrap();
    // Last, a message no worker may send: a dial of a socket by its path.
    let bad = br#"{"kind":"dial","peer":"broker","path":"/run/boxmaker/state.sock"}"#;
    let _ = channel.write_all(&(bad.len() as u32).to_be_bytes());
    let _ = channel.write_all(bad);
    // Wait for the monitor to end it.
    std::thread::sleep(WAIT);
}

fn runner() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    for d in ["loop/sessions", "loop/workers/b/outbox", "run"] {
        std::fs::create_dir_all(h.join(d)).unwrap();
    }
    std::fs::write(h.join("loop/sessions/b.jsonl"), "the secret of session b\n").unwrap();
    std::fs::write(h.join("loop/workers/b/outbox/1.json"), "b's turn\n").unwrap();
    std::fs::write(h.join("loop/system.md"), "the owner's words\n").unwrap();
    let text = format!(
        "[paths]\nhome = {:?}\n[sandbox]\nrequire = false\nseccomp_log = true\n",
        h.display().to_string()
    );
    let config = h.join("loopd.toml");
    std::fs::write(&config, &text).unwrap();
    let cfg = Config::parse(&text).unwrap();
    let exe = std::env::current_exe().unwrap();
    let monitor = Arc::new(Monitor::new(cfg, config, exe));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let turn = Turn {
        session: SessionId::new("a").unwrap(),
        resume: false,
        text: "hi".to_string(),
    };
    monitor.hand(theirs, 1, turn, None);
    let report = h.join("loop/workers/a/report");
    bxtest::wait_for("the hostile worker's report", WAIT, || report.exists());
    let got = std::fs::read_to_string(&report).unwrap();
    let eacces = format!("errno {}", libc::EACCES);
    let eperm = format!("errno {}", libc::EPERM);
    let enoent_or_eacces = if got.contains(&format!(
        "read the monitor's memory: errno {}",
        libc::ENOENT
    )) {
        format!("errno {}", libc::ENOENT)
    } else {
        eacces.clone()
    };
    let want: &[(&str, &str)] = &[
        ("read its own log", "ok"),
        ("open another session's log", &eacces),
        ("list the sessions", &eacces),
        ("make a session's log", &eacces),
        ("read another worker's outbox", &eacces),
        ("read the owner's system.md", &eacces),
        ("make a socket", &eperm),
        ("make a socket pair", &eperm),
        ("signal the monitor", &eperm),
        ("fork a process", &eperm),
        ("trace the monitor", &eperm),
        // Landlock has no rule for /proc in a worker: the entry is refused, or not there.
        ("read the monitor's memory", &enoent_or_eacces),
        ("open the run directory", &eacces),
    ];
    let mut failed = Vec::new();
    for (what, answer) in want {
        let line = format!("{what}: {answer}");
        if !got.lines().any(|l| l == line) {
            failed.push(line);
        }
    }
    assert!(
        failed.is_empty(),
        "wanted {failed:?}; the worker got:\n{got}"
    );
    bxtest::wait_for(
        "the monitor to end the worker for its message",
        WAIT,
        || monitor.running().is_empty(),
    );
    drop(ours);
    println!("hostile_worker: ok ({} attempts refused)", want.len() - 1);
}
