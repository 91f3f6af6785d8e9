//! The runner: each case starts children of this binary and checks what they print, how they
//! end, and what `/proc` and the filesystem say about them.

use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use bxharden::SeccompProfile;

const NOBODY: u32 = 65534;
const WAIT: Duration = Duration::from_secs(60);
/// The most one case may take, all its waits together, before the watchdog ends the run.
const CASE_LIMIT: Duration = Duration::from_secs(20 * 60);

type Case = (&'static str, fn() -> Outcome);

/// How a case ended.
pub enum Outcome {
    Pass,
    Skip(String),
    Fail(String),
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Outcome::Fail(format!($($arg)+));
        }
    };
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

macro_rules! needs_root {
    () => {
        if !is_root() {
            return Outcome::Skip("needs root".to_string());
        }
    };
}

/// Cases that expect what only Landlock ABI `$abi` enforces (6: the scoping of abstract Unix
/// sockets and signals, Linux 6.12) skip on an older kernel and say so. The Nix build sandbox
/// runs on its builder's kernel, which may be older; the VM test (nixos-module/test.nix) runs
/// this binary as root on the VM's own kernel, where they run.
macro_rules! needs_landlock_abi {
    ($abi:expr) => {
        let have = bxharden::landlock_layer::kernel_abi();
        if have < $abi {
            return Outcome::Skip(format!(
                "needs Landlock ABI {} and this kernel has ABI {have}: the VM test runs it",
                $abi
            ));
        }
    };
}

fn cases() -> Vec<Case> {
    vec![
        (
            "forbidden_things_work_before_the_sandbox",
            forbidden_things_work_before_the_sandbox,
        ),
        ("proof_matrix_loopd", || proof_matrix("loopd")),
        ("proof_matrix_loopd_worker", || proof_matrix("loopd-worker")),
        ("proof_matrix_brokerd", || proof_matrix("brokerd")),
        ("proof_matrix_brokerd_run", || proof_matrix("brokerd+run")),
        ("proof_matrix_gatewayd", || proof_matrix("gatewayd")),
        ("proof_matrix_inferproxy", || proof_matrix("inferproxy")),
        ("proof_matrix_memoryd", || proof_matrix("memoryd")),
        ("proof_matrix_memoryd_net", || proof_matrix("memoryd+net")),
        ("proof_matrix_run_child", || proof_matrix("run-child")),
        ("proof_matrix_channeld", || proof_matrix("channeld")),
        (
            "what_a_daemon_needs_works_inside_every_profile",
            what_a_daemon_needs_works_inside,
        ),
        (
            "every_thread_shows_the_sandbox_in_proc_status",
            every_thread_shows_the_sandbox,
        ),
        (
            "the_privilege_drop_cannot_be_undone",
            the_privilege_drop_cannot_be_undone,
        ),
        (
            "an_unprivileged_daemon_applies_landlock_and_seccomp",
            unprivileged_apply,
        ),
        (
            "an_unprivileged_daemon_comes_up_under_its_units_system_call_filter",
            unprivileged_apply_under_the_units_filter,
        ),
        ("root_without_a_user_is_refused", || {
            refusal(
                "root-without-user",
                true,
                "started as root with no [sandbox] user",
            )
        }),
        (
            "root_without_a_user_runs_on_only_when_not_required",
            root_without_user_not_required,
        ),
        ("apply_beside_a_second_thread_is_refused", || {
            refusal("second-thread", false, "threads exist already")
        }),
        ("a_path_that_cannot_be_opened_is_refused", || {
            refusal("missing-path", true, "no-such-dir")
        }),
        ("an_unknown_user_is_refused", || {
            refusal(
                "no-such-user",
                false,
                "there is no user \"no-such-user-bx\"",
            )
        }),
        (
            "another_user_without_root_is_refused",
            another_user_without_root,
        ),
        (
            "listen_makes_0700_and_0600_under_umask_0_and_0022",
            listen_modes,
        ),
        ("listen_replaces_a_stale_socket", listen_stale),
        ("listen_refuses_a_regular_file", || {
            listen_refuses("file", "a regular file")
        }),
        ("listen_refuses_a_symlink", || {
            listen_refuses("symlink", "a symlink")
        }),
        ("listen_refuses_a_directory", || {
            listen_refuses("dir", "a directory")
        }),
        ("listen_refuses_a_socket_someone_serves", listen_live),
        (
            "listen_corrects_a_directory_with_a_wrong_mode",
            listen_wrong_mode,
        ),
        (
            "listen_gives_directory_and_socket_to_the_owner",
            listen_owner,
        ),
        (
            "activated_takes_named_sockets_from_systemd_and_clears_the_env",
            activated,
        ),
        (
            "activated_ignores_descriptors_meant_for_another_pid",
            || {
                activated_env(
                    "other-pid",
                    &[("BXH_LISTEN_PID", "1"), ("BXH_LISTEN_FDS", "1")],
                    "names: []",
                )
            },
        ),
        (
            "activated_refuses_a_listen_fds_that_is_not_a_number",
            || {
                activated_env(
                    "bad-fds",
                    &[("BXH_LISTEN_PID", "self"), ("BXH_LISTEN_FDS", "two")],
                    "error: LISTEN_FDS=\"two\" is not a number",
                )
            },
        ),
        (
            "activated_refuses_names_that_do_not_match_the_count",
            || {
                activated_env(
                    "names",
                    &[
                        ("BXH_LISTEN_PID", "self"),
                        ("BXH_LISTEN_FDS", "1"),
                        ("BXH_LISTEN_FDNAMES", "a:b"),
                        ("BXH_FD3", "listener"),
                    ],
                    "error: LISTEN_FDS says 1 descriptors but LISTEN_FDNAMES names 2",
                )
            },
        ),
        (
            "activated_refuses_a_descriptor_that_is_not_a_listener",
            || {
                activated_env(
                    "not-listening",
                    &[
                        ("BXH_LISTEN_PID", "self"),
                        ("BXH_LISTEN_FDS", "1"),
                        ("BXH_LISTEN_FDNAMES", "a"),
                        ("BXH_FD3", "socketpair"),
                    ],
                    "error: descriptor 3 handed over is not a listening Unix stream socket: it is not listening",
                )
            },
        ),
        (
            "activated_takes_a_listener_without_names_as_unknown",
            || {
                activated_env(
                    "unnamed",
                    &[
                        ("BXH_LISTEN_PID", "self"),
                        ("BXH_LISTEN_FDS", "1"),
                        ("BXH_FD3", "listener"),
                    ],
                    "names: [unknown]",
                )
            },
        ),
        ("listen_refuses_a_symlinked_directory", listen_symlinked_dir),
        (
            "listen_refuses_a_directory_of_another_user",
            listen_foreign_dir,
        ),
        ("listen_refuses_a_path_without_a_directory", listen_bad_path),
        (
            "a_peer_with_another_uid_is_refused_with_the_runbook_line",
            peer_refused,
        ),
        (
            "a_forbidden_kind_is_logged_with_the_runbook_line",
            forbidden_kind_logged,
        ),
        (
            "the_journal_gets_runbook_and_syslog_identifier_fields",
            journal_fields,
        ),
        ("the_run_tools_child_enters_a_stricter_sandbox", run_tool),
        (
            "readiness_reaches_notify_socket_by_path_and_abstract_name",
            notify,
        ),
    ]
}

pub fn run_all(filters: &[String]) -> i32 {
    let all = cases();
    let chosen: Vec<&Case> = all
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests", chosen.len());
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut failures = Vec::new();
    for (name, case) in chosen {
        // Every wait inside has its deadline; this ends the run, naming the case, if one hangs.
        let _watchdog = bxtest::Watchdog::arm(&format!("the sandbox case {name}"), CASE_LIMIT);
        match case() {
            Outcome::Pass => {
                passed += 1;
                println!("test {name} ... ok");
            }
            Outcome::Skip(why) => {
                print!("test {name} ... ");
                if let Err(e) = bxtest::check_skip(&why) {
                    failed += 1;
                    failures.push(format!("---- {name} ----\n{e}"));
                } else {
                    skipped += 1;
                }
            }
            Outcome::Fail(why) => {
                failed += 1;
                println!("test {name} ... FAILED");
                failures.push(format!("---- {name} ----\n{why}"));
            }
        }
    }
    for f in &failures {
        println!("\n{f}");
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {skipped} ignored; 0 measured; {} filtered out\n",
        all.len() - passed - failed - skipped
    );
    if failed == 0 { 0 } else { 101 }
}

/// A child of this binary running `scenario`, with `envs`.
fn child(scenario: &str, envs: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.env("BXH_CHILD", scenario)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_FDNAMES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

/// Run to the end, with a deadline: a child still running then is killed (with its process
/// group) before its output is read, and reported.
fn output(mut cmd: Command) -> Result<Output, String> {
    bxtest::Bounded::spawn(&mut cmd, "the child")?.finish(WAIT)
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Kills and reaps a child when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        bxtest::reap(&mut self.0);
    }
}

/// The world a matrix child sees: its own directory (given to nobody), another daemon's
/// directory that everyone may read (so only Landlock stops the read), a directory everyone may
/// write (so only Landlock stops the write), a process outside, an abstract socket made before,
/// two TCP listeners (one port allowed to network profiles, one not).
struct World {
    home: tempfile::TempDir,
    _outside: Guard,
    outside_pid: u32,
    _abstract: UnixListener,
    abstract_name: String,
    _tcp: (std::net::TcpListener, std::net::TcpListener),
    port: u16,
    other_port: u16,
    /// Where `udp-send` sends its datagram.
    udp: std::net::UdpSocket,
}

impl World {
    fn new() -> World {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        std::fs::set_permissions(h, PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::create_dir(h.join("own")).unwrap();
        std::fs::create_dir(h.join("other")).unwrap();
        std::fs::write(h.join("other/secret"), b"secret").unwrap();
        std::fs::set_permissions(h.join("other/secret"), PermissionsExt::from_mode(0o644)).unwrap();
        std::fs::create_dir(h.join("outside")).unwrap();
        std::fs::set_permissions(h.join("outside"), PermissionsExt::from_mode(0o777)).unwrap();
        if is_root() {
            nix::unistd::chown(
                &h.join("own"),
                Some(nix::unistd::Uid::from_raw(NOBODY)),
                Some(nix::unistd::Gid::from_raw(NOBODY)),
            )
            .unwrap();
        }
        let outside = Command::new("sleep").arg("600").spawn().unwrap();
        let outside_pid = outside.id();
        let abstract_name = format!("bxharden-test-{}-{}", std::process::id(), rand_suffix());
        let abs = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&abstract_name).unwrap())
            .unwrap();
        let t1 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let t2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = t1.local_addr().unwrap().port();
        let other_port = t2.local_addr().unwrap().port();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.set_nonblocking(true).unwrap();
        World {
            udp,
            home,
            _outside: Guard(outside),
            outside_pid,
            _abstract: abs,
            abstract_name,
            _tcp: (t1, t2),
            port,
            other_port,
        }
    }

    fn envs(&self, profile: &str, mode: &str, op: &str) -> Vec<(&'static str, String)> {
        let user = if is_root() {
            NOBODY.to_string()
        } else {
            String::new()
        };
        vec![
            ("BXH_HOME", self.home.path().display().to_string()),
            ("BXH_PROFILE", profile.to_owned()),
            ("BXH_MODE", mode.to_owned()),
            ("BXH_OP", op.to_owned()),
            ("BXH_OUTSIDE_PID", self.outside_pid.to_string()),
            ("BXH_ABSTRACT", self.abstract_name.clone()),
            ("BXH_PORT", self.port.to_string()),
            ("BXH_OTHER_PORT", self.other_port.to_string()),
            (
                "BXH_UDP_PORT",
                self.udp.local_addr().unwrap().port().to_string(),
            ),
            ("BXH_USER", user),
        ]
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    Ok,
    Errno(i32),
    Sigsys,
    Other(String),
}

fn attempt(world: &World, profile: &str, mode: &str, op: &str) -> Ended {
    let out = match output(child("op", &world.envs(profile, mode, op))) {
        Ok(o) => o,
        Err(e) => return Ended::Other(e),
    };
    if out.status.signal() == Some(libc::SIGSYS) {
        return Ended::Sigsys;
    }
    let text = stdout(&out);
    let result = text.lines().rev().find_map(|l| l.strip_prefix("result: "));
    match (out.status.code(), result) {
        (Some(0), Some("ok" | "exec")) => Ended::Ok,
        (Some(0), Some(r)) if r.starts_with("errno ") => {
            Ended::Errno(r["errno ".len()..].parse().unwrap_or(-1))
        }
        _ => Ended::Other(show(&out)),
    }
}

const OPS: [&str; 15] = [
    "read-shadow",
    "read-other",
    "write-outside",
    "socket-inet",
    "tcp-bind",
    "ptrace",
    "mount",
    "execve",
    "unshare-user",
    "clone-newuser",
    "signal-outside",
    "abstract-connect",
    "prlimit-other",
    "tgkill-other",
    "kill-other",
];

fn forbidden_things_work_before_the_sandbox() -> Outcome {
    needs_root!();
    let world = World::new();
    for op in OPS {
        let got = attempt(&world, "none", "kill", op);
        ensure!(got == Ended::Ok, "{op} without the sandbox: {got:?}");
    }
    let got = attempt(&world, "none", "kill", "ioctl-tiocsti");
    ensure!(
        got == Ended::Errno(libc::ENOTTY),
        "TIOCSTI without the sandbox reaches the kernel (ENOTTY on /dev/null): {got:?}"
    );
    let got = attempt(&world, "none", "kill", "clone3");
    ensure!(
        got == Ended::Errno(libc::EINVAL),
        "clone3 without the sandbox reaches the kernel (EINVAL for a zero size): {got:?}"
    );
    Outcome::Pass
}

/// What stops each forbidden thing in a profile: seccomp (a kill, or EPERM in log mode), or
/// Landlock with an errno.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Seccomp,
    Errno(i32),
    Allowed,
}

fn expected(p: SeccompProfile, op: &str) -> Stop {
    // loopd's monitor starts its own binary as each session's worker: it may `execve` and map
    // code as where programs are started, and signal what is in its own domain.
    let runs_programs = p.execs();
    let monitor = p == SeccompProfile::Loopd;
    match op {
        "read-shadow" | "read-other" | "write-outside" => Stop::Errno(libc::EACCES),
        "socket-inet" if p.inet() => Stop::Allowed,
        "socket-inet" | "tcp-bind" | "ptrace" | "mount" | "unshare-user" | "clone-newuser" => {
            Stop::Seccomp
        }
        // Allowed by the list where programs are started, refused by Landlock (no execute right
        // on /bin).
        "execve" if runs_programs => Stop::Errno(libc::EACCES),
        "execve" => Stop::Seccomp,
        // The calls that take a pid name the caller only (pid 0 or its own), on every list;
        // `kill` is on a list only where programs are started. A process of the same uid in
        // the same sandbox (a fork) is out of reach as much as one outside.
        // loopd's monitor has `kill` (it ends its workers): Landlock's signal scope refuses
        // anything outside its domain; a process inside it (a fork, its workers) it may signal.
        "signal-outside" if monitor => Stop::Errno(libc::EPERM),
        "kill-other" if monitor => Stop::Allowed,
        "signal-outside" | "prlimit-other" | "tgkill-other" | "kill-other" => Stop::Seccomp,
        "prlimit-own" => Stop::Allowed,
        // The `run` tool's child may make no socket at all.
        "abstract-connect" if p == SeccompProfile::RunChild => Stop::Errno(libc::EACCES),
        // A session's worker may make no socket at all: not on its list.
        "abstract-connect" if p == SeccompProfile::LoopWorker => Stop::Seccomp,
        "abstract-connect" => Stop::Errno(libc::EPERM),
        "clone3" => Stop::Errno(libc::ENOSYS),
        "ioctl-tiocsti" => Stop::Seccomp,
        "tcp-connect-other" => Stop::Errno(libc::EACCES),
        // inferproxy's network sockets are stream only; the other network profiles may still
        // send datagrams (docs/hardening.md says where to).
        "udp-send" if p.inet_stream_only() => Stop::Errno(libc::EACCES),
        "udp-send" if p.inet() => Stop::Allowed,
        "udp-send" => Stop::Seccomp,
        // Code is mapped before the sandbox closes; only where programs are started may more be.
        "mmap-exec" | "mprotect-exec" if runs_programs => Stop::Allowed,
        "mmap-exec" | "mprotect-exec" => Stop::Errno(libc::EACCES),
        "tcp-connect-allowed" | "write-own" | "thread" => Stop::Allowed,
        other => panic!("no expectation for {other}"),
    }
}

fn proof_matrix(name: &str) -> Outcome {
    needs_root!();
    needs_landlock_abi!(bxharden::landlock_layer::LANDLOCK_ABI_NUMBER);
    let profile = crate::child::profile_named(name).unwrap();
    let world = World::new();
    let mut ops: Vec<&str> = OPS.to_vec();
    ops.extend([
        "clone3",
        "ioctl-tiocsti",
        "write-own",
        "thread",
        "prlimit-own",
        "mmap-exec",
        "mprotect-exec",
    ]);
    if profile.inet() {
        ops.extend(["tcp-connect-allowed", "tcp-connect-other"]);
    }
    ops.push("udp-send");
    let mut wrong = Vec::new();
    for mode in ["kill", "log"] {
        for op in &ops {
            let got = attempt(&world, name, mode, op);
            let ok = match (expected(profile, op), mode) {
                (Stop::Allowed, _) => got == Ended::Ok,
                (Stop::Seccomp, "kill") => got == Ended::Sigsys,
                (Stop::Seccomp, _) => got == Ended::Errno(libc::EPERM),
                (Stop::Errno(e), _) => got == Ended::Errno(e),
            };
            if !ok {
                wrong.push(format!(
                    "{name} {mode} {op}: expected {:?}, got {got:?}",
                    expected(profile, op)
                ));
            }
        }
    }
    if matches!(
        expected(profile, "udp-send"),
        Stop::Errno(_) | Stop::Seccomp
    ) {
        let mut buf = [0u8; 16];
        let got = world.udp.recv(&mut buf);
        ensure!(
            got.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
            "{name}: a datagram reached the runner's UDP port: {got:?}"
        );
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Outcome::Pass
}

fn what_a_daemon_needs_works_inside() -> Outcome {
    needs_root!();
    // A nested profile (loopd's session worker) is entered by a daemon's child, which drops
    // nothing and serves no socket: loopd's own suite proves what it needs
    // (`crates/loopd/tests/hostile_worker.rs`, `workers.rs`).
    for profile in SeccompProfile::ALL.into_iter().filter(|p| !p.nested()) {
        let world = World::new();
        let out = match output(child("needs", &world.envs(profile.name(), "kill", ""))) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(format!("{profile}: {e}")),
        };
        ensure!(
            out.status.code() == Some(0) && stdout(&out).contains("needs: ok\n"),
            "{profile}: {}",
            show(&out)
        );
        let report = stdout(&out);
        ensure!(
            report.contains(&format!(
                "report: sandbox: uid {NOBODY} gid {NOBODY} (dropped from root), Landlock ABI "
            )) && report.contains(&format!(", seccomp {profile} (")),
            "{profile}: the startup notice: {report}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            err.contains(
                "testd: a test line from inside the sandbox, 0; see docs/runbook.md#listener-lost\n"
            ),
            "{profile}: the log line on stderr: {err}"
        );
    }
    Outcome::Pass
}

fn every_thread_shows_the_sandbox() -> Outcome {
    needs_root!();
    // As above: a nested profile drops nothing, so it is not a daemon's own start.
    for profile in SeccompProfile::ALL.into_iter().filter(|p| !p.nested()) {
        let world = World::new();
        let mut cmd = child("status", &world.envs(profile.name(), "kill", ""));
        cmd.stdin(Stdio::piped());
        let mut ch = match bxtest::Bounded::spawn(&mut cmd, "the status child") {
            Ok(ch) => ch,
            Err(e) => return Outcome::Fail(e),
        };
        if let Err(e) = ch.wait_for_stdout("ready\n", WAIT) {
            return Outcome::Fail(format!("{profile}: {e}"));
        }
        let pid = ch.id();
        let threads = bxharden::proc_status::threads(pid).unwrap();
        ensure!(
            threads.len() == 3,
            "{profile}: {} threads, expected 3",
            threads.len()
        );
        for t in threads {
            let problems = t.problems(NOBODY, NOBODY);
            ensure!(
                problems.is_empty(),
                "{profile} thread {}: {problems:?}",
                t.tid
            );
        }
        ch.close_stdin();
        let out = match ch.finish(WAIT) {
            Ok(out) => out,
            Err(e) => return Outcome::Fail(format!("{profile}: {e}")),
        };
        ensure!(out.status.success(), "{profile}: {}", show(&out));
    }
    Outcome::Pass
}

fn the_privilege_drop_cannot_be_undone() -> Outcome {
    needs_root!();
    let world = World::new();
    let got = attempt(&world, "none", "kill", "setresuid-root");
    ensure!(got == Ended::Ok, "as root setresuid(0,0,0) works: {got:?}");
    let got = attempt(&world, "drop", "kill", "setresuid-root");
    ensure!(
        got == Ended::Errno(libc::EPERM),
        "after the drop (no seccomp) the kernel refuses: {got:?}"
    );
    Outcome::Pass
}

/// No root needed: run as an unprivileged uid (nobody, when the runner is root; else the
/// runner's own), `apply` with no `[sandbox] user` still applies Landlock and seccomp.
fn unprivileged_apply() -> Outcome {
    needs_landlock_abi!(bxharden::landlock_layer::LANDLOCK_ABI_NUMBER);
    let world = World::new();
    let mut wrong = Vec::new();
    for (op, want) in [
        ("read-other", Ended::Errno(libc::EACCES)),
        ("write-outside", Ended::Errno(libc::EACCES)),
        ("abstract-connect", Ended::Errno(libc::EPERM)),
        ("unshare-user", Ended::Errno(libc::EPERM)),
        ("clone3", Ended::Errno(libc::ENOSYS)),
        ("thread", Ended::Ok),
    ] {
        let mut envs = world.envs("loopd", "log", op);
        envs.retain(|(k, _)| *k != "BXH_USER");
        let mut cmd = child("op", &envs);
        if is_root() {
            // std clears the supplementary groups when root sets a uid.
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let out = match output(cmd) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(e),
        };
        let text = stdout(&out);
        let me = if is_root() {
            NOBODY
        } else {
            nix::unistd::Uid::effective().as_raw()
        };
        if !text.contains(&format!("report: sandbox: uid {me} ")) {
            wrong.push(format!("{op}: no report for uid {me}: {}", show(&out)));
            continue;
        }
        let got = match text.lines().rev().find_map(|l| l.strip_prefix("result: ")) {
            Some("ok") => Ended::Ok,
            Some(r) => Ended::Errno(r.trim_start_matches("errno ").parse().unwrap_or(-1)),
            None => Ended::Other(show(&out)),
        };
        if got != want {
            wrong.push(format!("{op}: expected {want:?}, got {got:?}"));
        }
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Outcome::Pass
}

/// Under its NixOS unit a daemon starts unprivileged with `SystemCallFilter=~@privileged
/// @setuid`, which kills a process that calls `capset`, `setgroups` or `set*id`: `apply` must
/// still come up there (it has nothing to drop, so it must not try).
fn unprivileged_apply_under_the_units_filter() -> Outcome {
    // Any Landlock will do: [sandbox] require refuses only a kernel without it.
    needs_landlock_abi!(1);
    let world = World::new();
    let mut envs = world.envs("loopd", "kill", "thread");
    envs.retain(|(k, _)| *k != "BXH_USER");
    envs.push(("BXH_UNIT_FILTER", "1".to_string()));
    let mut cmd = child("op", &envs);
    if is_root() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    let out = match output(cmd) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    let text = stdout(&out);
    ensure!(
        text.contains("report: sandbox: ") && text.contains("result: ok"),
        "apply under the unit's filter: {}",
        show(&out)
    );
    Outcome::Pass
}

fn refusal(case: &str, root_only: bool, text: &str) -> Outcome {
    if root_only {
        needs_root!();
    }
    let world = World::new();
    let mut envs = world.envs("loopd", "kill", "");
    envs.push(("BXH_CASE", case.to_owned()));
    let out = match output(child("apply-refusal", &envs)) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    let s = stdout(&out);
    ensure!(
        out.status.code() == Some(0)
            && s.contains("refused: cannot apply the sandbox: ")
            && s.contains(text)
            && s.trim_end()
                .ends_with("; see docs/runbook.md#sandbox-unavailable"),
        "{}",
        show(&out)
    );
    Outcome::Pass
}

fn root_without_user_not_required() -> Outcome {
    needs_root!();
    let world = World::new();
    let mut envs = world.envs("loopd", "kill", "");
    envs.push(("BXH_CASE", "root-without-user-not-required".to_owned()));
    let out = match output(child("apply-refusal", &envs)) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        stdout(&out).contains("report: sandbox: uid 0 gid 0, Landlock ABI ")
            && err.contains("testd: started as root with no [sandbox] user, it keeps running as root, and [sandbox] require = false runs on without it; see docs/runbook.md#sandbox-unavailable\n"),
        "{}",
        show(&out)
    );
    Outcome::Pass
}

fn another_user_without_root() -> Outcome {
    needs_root!();
    let world = World::new();
    for (case, says) in [
        (
            "not-root",
            format!("[sandbox] user is uid 0, but this process runs as uid {NOBODY}"),
        ),
        (
            "not-root-group",
            format!("[sandbox] group is gid 0, but this process runs as gid {NOBODY}"),
        ),
    ] {
        let mut envs = world.envs("loopd", "kill", "");
        envs.push(("BXH_CASE", case.to_owned()));
        let mut cmd = child("apply-refusal", &envs);
        cmd.uid(NOBODY).gid(NOBODY);
        let out = match output(cmd) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(e),
        };
        ensure!(
            stdout(&out).contains(&format!(
                "refused: cannot apply the sandbox: {says} without the privilege to switch; see docs/runbook.md#sandbox-unavailable"
            )),
            "{case}: {}",
            show(&out)
        );
    }
    Outcome::Pass
}

fn run_listen(socket: &Path, umask: &str, owner: Option<u32>) -> Result<String, String> {
    let mut envs = vec![
        ("BXH_SOCKET", socket.display().to_string()),
        ("BXH_UMASK", umask.to_owned()),
    ];
    if let Some(o) = owner {
        envs.push(("BXH_USER", o.to_string()));
    }
    output(child("listen", &envs)).map(|o| stdout(&o) + &String::from_utf8_lossy(&o.stderr))
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn listen_modes() -> Outcome {
    for umask in ["000", "022"] {
        let home = tempfile::tempdir().unwrap();
        let sock = home.path().join("run/a-b/s.sock");
        let s = match run_listen(&sock, umask, None) {
            Ok(s) => s,
            Err(e) => return Outcome::Fail(e),
        };
        ensure!(s.contains("listened\n"), "umask {umask}: {s}");
        ensure!(
            s.contains(&format!("umask: {umask}\n")),
            "umask {umask} restored: {s}"
        );
        ensure!(
            mode(&sock) == 0o600,
            "umask {umask}: socket {:o}",
            mode(&sock)
        );
        ensure!(
            mode(sock.parent().unwrap()) == 0o700,
            "umask {umask}: dir {:o}",
            mode(sock.parent().unwrap())
        );
        ensure!(
            mode(&home.path().join("run")) == 0o711,
            "umask {umask}: parent {:o}",
            mode(&home.path().join("run"))
        );
    }
    Outcome::Pass
}

fn listen_stale() -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o700)).unwrap();
    let sock = dir.join("s.sock");
    drop(UnixListener::bind(&sock).unwrap());
    // A stale socket with another mode: the new one is 0600. (A bind over a socket file that
    // was not removed fails, so "listened" says it was removed.)
    std::fs::set_permissions(&sock, PermissionsExt::from_mode(0o644)).unwrap();
    let s = match run_listen(&sock, "022", None) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(s.contains("listened\n"), "{s}");
    ensure!(mode(&sock) == 0o600, "{:o}", mode(&sock));
    Outcome::Pass
}

fn listen_refuses(what: &str, says: &str) -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    let sock = dir.join("s.sock");
    match what {
        "file" => std::fs::write(&sock, b"keep me").unwrap(),
        "symlink" => std::os::unix::fs::symlink("/etc/passwd", &sock).unwrap(),
        _ => std::fs::create_dir(&sock).unwrap(),
    }
    let s = match run_listen(&sock, "022", None) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(
        s.contains(&format!(
            "error: {}: {says} is in the socket's place, and only a stale socket is ever removed; see docs/runbook.md#socket-listen-failed\n",
            sock.display()
        )),
        "{s}"
    );
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    match what {
        "file" => ensure!(
            std::fs::read(&sock).unwrap() == b"keep me",
            "the file is unchanged"
        ),
        "symlink" => ensure!(meta.file_type().is_symlink(), "the symlink is still there"),
        _ => ensure!(meta.is_dir(), "the directory is still there"),
    }
    Outcome::Pass
}

fn listen_live() -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    let sock = dir.join("s.sock");
    let _live = UnixListener::bind(&sock).unwrap();
    let s = match run_listen(&sock, "022", None) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(s.contains("another process is serving this socket"), "{s}");
    Outcome::Pass
}

fn listen_wrong_mode() -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o755)).unwrap();
    let sock = dir.join("s.sock");
    let s = match run_listen(&sock, "022", None) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(s.contains("listened\n"), "{s}");
    ensure!(mode(&dir) == 0o700, "{:o}", mode(&dir));
    ensure!(s.contains("d: the directory was 0755, made 0700"), "{s}");
    Outcome::Pass
}

fn listen_owner() -> Outcome {
    needs_root!();
    let home = tempfile::tempdir().unwrap();
    let sock = home.path().join("run/x/s.sock");
    let s = match run_listen(&sock, "022", Some(NOBODY)) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(s.contains("listened\n"), "{s}");
    for p in [sock.as_path(), sock.parent().unwrap()] {
        let m = std::fs::symlink_metadata(p).unwrap();
        ensure!(
            m.uid() == NOBODY && m.gid() == NOBODY,
            "{p:?} owned by {}:{}",
            m.uid(),
            m.gid()
        );
    }
    Outcome::Pass
}

fn activated() -> Outcome {
    if bxtest::run(
        Command::new("systemd-socket-activate").arg("--version"),
        "systemd-socket-activate --version",
        WAIT,
    )
    .is_err()
    {
        // A skip, not a failure: the package's check phase (Nix's build sandbox) has no
        // systemd on PATH; under CI=true a skip fails unless .ci/allowed-skips lists it.
        return Outcome::Skip(
            "systemd-socket-activate is not installed (apt-get install systemd)".into(),
        );
    }
    let home = tempfile::tempdir().unwrap();
    let a = home.path().join("a.sock");
    let b = home.path().join("b.sock");
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("systemd-socket-activate");
    cmd.arg("-l")
        .arg(&a)
        .arg("-l")
        .arg(&b)
        .arg("--fdname=a:b")
        .arg("-E")
        .arg("BXH_CHILD=activated")
        .arg(&exe)
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_FDNAMES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let ch = match bxtest::Bounded::spawn(&mut cmd, "systemd-socket-activate and its child") {
        Ok(ch) => ch,
        Err(e) => return Outcome::Fail(e),
    };
    if let Err(e) = bxtest::try_wait_for("systemd-socket-activate to listen", WAIT, || a.exists()) {
        return Outcome::Fail(e);
    }
    // The first connection starts the child; it answers ping through the shared path. The
    // file appears at bind(), before listen(): a connect in between is refused, so a refusal
    // is retried until the deadline.
    let mut answer = None;
    let listening = bxtest::try_wait_for("systemd-socket-activate to accept", WAIT, || {
        match bxcore::client::ping(&a, WAIT) {
            Err(bxcore::client::ClientError::Connect { error, .. })
                if error.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                false
            }
            other => {
                answer = Some(other);
                true
            }
        }
    });
    let pong = match (listening, answer) {
        (Ok(()), Some(pong)) => pong,
        (Err(e), _) => return Outcome::Fail(e),
        (Ok(()), None) => return Outcome::Fail("ping: accepted but no answer kept".into()),
    };
    // The child ends after the ping; one that does not is killed (with anything it started)
    // before its output is read, so a child past its deadline cannot hang the test.
    let (status, out, err) = match ch.finish(WAIT) {
        Ok(o) => (
            Some(o.status),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        ),
        Err(e) => (None, e, String::new()),
    };
    ensure!(
        matches!(&pong, Ok(p) if p.daemon == "testd"),
        "ping: {pong:?}\n{out}\n{err}"
    );
    ensure!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{out}\n{err}"
    );
    for want in [
        "names: a,b\n",
        "LISTEN_PID: unset\n",
        "LISTEN_FDS: unset\n",
        "LISTEN_FDNAMES: unset\n",
        "cloexec: true\n",
        "request after ping: false\n",
    ] {
        ensure!(out.contains(want), "missing {want:?} in:\n{out}\n{err}");
    }
    Outcome::Pass
}

/// A server child with peers `peers`, and a client child as `uid` sending `kind`.
fn exchange(peers: &str, uid: u32, kind: &str) -> Result<(String, String), String> {
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let sock = home.path().join("p.sock");
    let mut server = child(
        "server",
        &[
            ("BXH_SOCKET", sock.display().to_string()),
            ("BXH_PEERS", peers.to_owned()),
        ],
    );
    let mut sv = bxtest::Bounded::spawn(&mut server, "the server child")?;
    sv.wait_for_stdout("serving\n", WAIT)?;
    let mut client = child(
        "client",
        &[
            ("BXH_SOCKET", sock.display().to_string()),
            ("BXH_KIND", kind.to_owned()),
        ],
    );
    if uid != 0 {
        client.uid(uid).gid(uid);
    }
    let out = output(client)?;
    let answer = stdout(&out);
    // The refusal line is written before the answer is sent: it is on stderr by now.
    let err = String::from_utf8_lossy(&sv.kill_and_collect().stderr).into_owned();
    // Each line starts with its time (checked in tests/flags.rs); the text is what is compared.
    Ok((answer, bxtest::without_times(&err)))
}

fn peer_refused() -> Outcome {
    needs_root!();
    let (answer, log) = match exchange("0", NOBODY, "ping") {
        Ok(x) => x,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(
        answer.contains(&format!(
            r#"answer: {{"v":1,"id":0,"final":true,"msg":{{"kind":"error","code":"forbidden","detail":"uid {NOBODY} may not connect to p.sock"}}}}"#
        )),
        "{answer}"
    );
    ensure!(
        log == format!(
            "testd: refused a connection from uid {NOBODY} on p.sock; see docs/runbook.md#socket-peer-refused\n"
        ),
        "{log:?}"
    );
    let (answer, log) = match exchange(&format!("0,{NOBODY}"), NOBODY, "ping") {
        Ok(x) => x,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(
        answer.contains(r#""kind":"pong","daemon":"testd""#),
        "listed, it is served: {answer}"
    );
    ensure!(log.is_empty(), "nothing logged for a ping: {log:?}");
    Outcome::Pass
}

fn forbidden_kind_logged() -> Outcome {
    let me = nix::unistd::Uid::effective().as_raw();
    let (answer, log) = match exchange(&me.to_string(), 0, "tools_list") {
        Ok(x) => x,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(
        answer.contains(r#"answer: {"v":1,"id":5,"final":true,"msg":{"kind":"error","code":"forbidden","detail":"tools_list is not accepted on p.sock"}}"#),
        "{answer}"
    );
    ensure!(
        log == "testd: refused the message kind tools_list on p.sock; see docs/runbook.md#socket-forbidden\n",
        "{log:?}"
    );
    Outcome::Pass
}

fn journal_fields() -> Outcome {
    needs_root!();
    let world = World::new();
    let out = match output(child("journal", &world.envs("loopd", "kill", ""))) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    let s = stdout(&out);
    for want in [
        "sink: Journal\n",
        "field: RUNBOOK=listener-lost\n",
        "field: SYSLOG_IDENTIFIER=testd\n",
        "field: MESSAGE=testd: a journal test line 42; see docs/runbook.md#listener-lost\n",
        "inside: RUNBOOK=listener-lost\n",
        "inside: MESSAGE=testd: a journal line from inside the sandbox; see docs/runbook.md#listener-lost\n",
    ] {
        ensure!(s.contains(want), "missing {want:?}: {}", show(&out));
    }
    ensure!(!s.contains("F_RUNBOOK"), "no prefixed field: {s}");
    Outcome::Pass
}

fn notify() -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let path = home.path().join("notify");
    let by_path = UnixDatagram::bind(&path).unwrap();
    let name = format!("bxharden-notify-{}-{}", std::process::id(), rand_suffix());
    let by_name = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
    for (target, sock) in [
        (path.display().to_string(), &by_path),
        (format!("@{name}"), &by_name),
    ] {
        sock.set_read_timeout(Some(WAIT)).unwrap();
        let out = match output(child("notify", &[("NOTIFY_SOCKET", target.clone())])) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(e),
        };
        ensure!(
            stdout(&out) == "ready: Ok(true)\nstopping: Ok(true)\n",
            "{target}: {}",
            show(&out)
        );
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf).unwrap();
        ensure!(&buf[..n] == b"READY=1\n", "{target}: {:?}", &buf[..n]);
        let n = sock.recv(&mut buf).unwrap();
        ensure!(&buf[..n] == b"STOPPING=1\n", "{target}: {:?}", &buf[..n]);
    }
    let out = match output(child("notify", &[])) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(
        stdout(&out) == "ready: Ok(false)\nstopping: Ok(false)\n",
        "{}",
        show(&out)
    );
    let _ = std::io::stdout().flush();
    Outcome::Pass
}

fn run_tool() -> Outcome {
    needs_root!();
    let world = World::new();
    let out = match output(child("run-tool", &world.envs("brokerd+run", "kill", ""))) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    let s = stdout(&out);
    for want in [
        "run: workspace: Some(0) in the workspace\n",
        "run: daemon-state: Some(1) \n",
        "run: system: Some(2) \n",
        "run: read-only-root: Some(0) a document\n",
        "run: write-read-only-root: Some(1) \n",
        "run: write-workspace: Some(0) \n",
    ] {
        ensure!(s.contains(want), "missing {want:?}: {}", show(&out));
    }
    Outcome::Pass
}

fn activated_env(what: &str, vars: &[(&str, &str)], want: &str) -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let mut envs = vec![("BXH_HOME", home.path().display().to_string())];
    envs.extend(vars.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let out = match output(child("activated-env", &envs)) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    let s = stdout(&out);
    ensure!(s.starts_with(want), "{what}: {}", show(&out));
    ensure!(
        s.contains("LISTEN_PID: unset\nLISTEN_FDS: unset\nLISTEN_FDNAMES: unset\n"),
        "{what}: the environment is cleared whatever happened: {s}"
    );
    if want.starts_with("error: ") {
        ensure!(
            s.lines()
                .next()
                .unwrap()
                .ends_with("; see docs/runbook.md#socket-listen-failed"),
            "{s}"
        );
    }
    Outcome::Pass
}

fn listen_symlinked_dir() -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let real = home.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, PermissionsExt::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, home.path().join("d")).unwrap();
    let sock = home.path().join("d/s.sock");
    let s = match run_listen(&sock, "022", None) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(
        s.contains(&format!(
            "error: {}: the socket's directory is not a directory (a symlink or a file); see docs/runbook.md#socket-listen-failed\n",
            home.path().join("d").display()
        )),
        "{s}"
    );
    ensure!(
        !real.join("s.sock").exists(),
        "nothing was bound through the symlink"
    );
    Outcome::Pass
}

fn listen_foreign_dir() -> Outcome {
    needs_root!();
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let dir = home.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o777)).unwrap();
    let sock = dir.join("s.sock");
    let mut cmd = child(
        "listen",
        &[
            ("BXH_SOCKET", sock.display().to_string()),
            ("BXH_UMASK", "022".to_owned()),
        ],
    );
    cmd.uid(NOBODY).gid(NOBODY);
    let out = match output(cmd) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(
        stdout(&out).contains(&format!(
            "error: {}: the socket's directory belongs to uid 0, not to this daemon",
            dir.display()
        )),
        "{}",
        show(&out)
    );
    ensure!(mode(&dir) == 0o777 && !sock.exists(), "nothing changed");
    Outcome::Pass
}

fn listen_bad_path() -> Outcome {
    let s = match run_listen(Path::new("s.sock"), "022", None) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(e),
    };
    ensure!(s.contains("error: s.sock: not a socket path in a directory; see docs/runbook.md#socket-listen-failed\n"), "{s}");
    Outcome::Pass
}
