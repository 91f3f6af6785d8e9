//! What runs inside the child process: one scenario, chosen by `BXH_CHILD`, with its inputs in
//! `BXH_*` variables. It prints `result: ...` lines on stdout for the runner to check; it runs
//! single-threaded from `main` until the scenario itself spawns threads.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bxharden::log::Anchored;
use bxharden::{Daemon, PeerPolicy, Profile, SandboxConfig, SeccompProfile};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn home() -> PathBuf {
    PathBuf::from(var("BXH_HOME"))
}

pub fn profile_named(name: &str) -> Option<SeccompProfile> {
    SeccompProfile::ALL.into_iter().find(|p| p.name() == name)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
}

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// The sandbox the scenario's daemon applies: its own dir read-write, the uid and gid of
/// `BXH_USER` when root, kill or log mode, TCP connect to `BXH_PORT` for network profiles.
fn sandbox() -> Result<bxharden::Report, bxharden::SandboxError> {
    let profile = profile_named(&var("BXH_PROFILE")).expect("BXH_PROFILE names a profile");
    let mut p = Profile::new(profile).read_write(home().join("own"));
    if let Ok(port) = var("BXH_PORT").parse::<u16>() {
        if profile.inet() {
            p = p.connect_tcp(port).resolver_and_ca();
        }
    }
    if var("BXH_UNIT_FILTER") == "1" {
        unit_filter();
    }
    let user = var("BXH_USER");
    let cfg = SandboxConfig {
        user: (!user.is_empty()).then(|| user.clone()),
        group: (!user.is_empty()).then(|| user.clone()),
        require: true,
        seccomp_log: var("BXH_MODE") == "log",
    };
    bxharden::apply(&cfg, &p)
}

/// What a NixOS unit's `SystemCallFilter=~@privileged @setuid` does to the daemon it starts:
/// the credential and capability calls kill the process. A daemon that is not root must come
/// up under it, so `apply` makes none of those calls when it has nothing to drop.
fn unit_filter() {
    use std::collections::BTreeMap;

    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

    let denied = [
        libc::SYS_capset,
        libc::SYS_setgroups,
        libc::SYS_setresuid,
        libc::SYS_setresgid,
        libc::SYS_setuid,
        libc::SYS_setgid,
        libc::SYS_setreuid,
        libc::SYS_setregid,
        libc::SYS_setfsuid,
        libc::SYS_setfsgid,
    ];
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        denied.iter().map(|n| (*n, Vec::new())).collect();
    let arch = TargetArch::try_from(std::env::consts::ARCH).expect("a supported architecture");
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::KillProcess,
        arch,
    )
    .expect("the unit's filter builds");
    let prog: BpfProgram = filter.try_into().expect("the unit's filter compiles");
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only; an unprivileged
    // process needs it to install a filter, as systemd sets it for a filtered unit.
    assert_eq!(
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) },
        0
    );
    seccompiler::apply_filter(&prog).expect("the unit's filter installs");
}

fn init_log() {
    bxharden::log::init(Daemon {
        name: "testd",
        version: "9.8.7",
    });
}

pub fn run(scenario: &str) -> i32 {
    match scenario {
        "op" => op(),
        "needs" => needs(),
        "status" => status(),
        "apply-refusal" => apply_refusal(),
        "listen" => listen(),
        "activated" => activated(),
        "activated-env" => activated_env(),
        "server" => server(),
        "client" => client(),
        "journal" => journal(),
        "notify" => notify(),
        "run-tool" => run_tool(),
        other => {
            eprintln!("unknown scenario {other}");
            2
        }
    }
}

/// One forbidden thing, tried with or without the sandbox (`BXH_PROFILE=none`). Prints
/// `result: ok` or `result: errno N`; a seccomp kill ends the process before it prints.
fn op() -> i32 {
    init_log();
    let name = var("BXH_OP");
    if name == "mount" {
        // The attempt before the sandbox must not touch the host's mounts.
        // SAFETY: plain syscalls with valid arguments.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                println!("setup: unshare: errno {}", errno());
                return 3;
            }
            let root = CString::new("/").unwrap();
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                println!("setup: private mounts: errno {}", errno());
                return 3;
            }
        }
    }
    match var("BXH_PROFILE").as_str() {
        "none" => {}
        "drop" => {
            // Only the privilege drop, so what refuses `setresuid(0, ..)` is the kernel.
            let id = bxharden::Identity::resolve(&SandboxConfig {
                user: Some(var("BXH_USER")),
                group: Some(var("BXH_USER")),
                ..SandboxConfig::default()
            })
            .unwrap();
            if let Err(e) = bxharden::privdrop::drop_to(&id) {
                println!("setup: {e}");
                return 3;
            }
        }
        _ => match sandbox() {
            Ok(r) => println!("report: {r}"),
            Err(e) => {
                println!("setup: {e}");
                return 3;
            }
        },
    }
    let _ = std::io::stdout().flush();
    let r = attempt(&name);
    match r {
        Ok(()) => println!("result: ok"),
        Err(e) => println!("result: errno {e}"),
    }
    0
}

fn attempt(op: &str) -> Result<(), i32> {
    let home = home();
    let outside: i32 = var("BXH_OUTSIDE_PID").parse().unwrap_or(0);
    // SAFETY (every block below): system calls with valid, owned arguments; a process made by
    // `clone` exits at once without touching shared state.
    match op {
        "read-shadow" => std::fs::read("/etc/shadow").map(drop).map_err(io_errno),
        "read-other" => std::fs::read(home.join("other/secret"))
            .map(drop)
            .map_err(io_errno),
        "write-outside" => std::fs::write(home.join("outside/x"), b"x").map_err(io_errno),
        "write-own" => std::fs::write(home.join("own/x"), b"x").map_err(io_errno),
        "socket-inet" => {
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            if fd < 0 { Err(errno()) } else { Ok(()) }
        }
        // A datagram to a loopback port the runner listens on; `ok` only if it was sent.
        "udp-send" => {
            let port: u16 = var("BXH_UDP_PORT").parse().unwrap();
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
            if fd < 0 {
                return Err(errno());
            }
            let to = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
                },
                sin_zero: [0; 8],
            };
            let sent = unsafe {
                libc::sendto(
                    fd,
                    b"x".as_ptr().cast(),
                    1,
                    0,
                    (&to as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if sent < 0 { Err(errno()) } else { Ok(()) }
        }
        "tcp-bind" => std::net::TcpListener::bind("127.0.0.1:0")
            .map(drop)
            .map_err(io_errno),
        "ptrace" => {
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_SEIZE,
                    outside,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            if r < 0 { Err(errno()) } else { Ok(()) }
        }
        "mount" => {
            let dir = home.join("own");
            let target = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            let fstype = CString::new("tmpfs").unwrap();
            let r = unsafe {
                libc::mount(
                    fstype.as_ptr(),
                    target.as_ptr(),
                    fstype.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if r < 0 { Err(errno()) } else { Ok(()) }
        }
        "execve" => {
            let prog = CString::new("/bin/true").unwrap();
            let argv = [prog.as_ptr(), std::ptr::null()];
            let envp = [std::ptr::null()];
            println!("result: exec");
            let _ = std::io::stdout().flush();
            unsafe { libc::execve(prog.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            Err(errno())
        }
        "unshare-user" => {
            if unsafe { libc::unshare(libc::CLONE_NEWUSER) } < 0 {
                Err(errno())
            } else {
                Ok(())
            }
        }
        "clone-newuser" => {
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
            let pid =
                unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
            if pid == 0 {
                unsafe { libc::_exit(0) };
            }
            if pid < 0 { Err(errno()) } else { Ok(()) }
        }
        "signal-outside" => {
            if unsafe { libc::kill(outside, libc::SIGCONT) } < 0 {
                Err(errno())
            } else {
                Ok(())
            }
        }
        // Another process of the same uid, in the same sandbox: forked now, waiting on a pipe.
        "prlimit-other" | "tgkill-other" | "kill-other" => {
            let mut fds = [0; 2];
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(errno());
            }
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                return Err(errno());
            }
            if pid == 0 {
                // Until the caller closes its end (or dies): this side holds no write end.
                let mut b = [0u8; 1];
                unsafe {
                    libc::close(fds[1]);
                    libc::read(fds[0], b.as_mut_ptr().cast(), 1);
                    libc::_exit(0)
                };
            }
            unsafe { libc::close(fds[0]) };
            let rc = match op {
                // What stopped brokerd: a file size limit of one byte (SIGXFSZ at its next write).
                "prlimit-other" => {
                    let one = libc::rlimit {
                        rlim_cur: 1,
                        rlim_max: 1,
                    };
                    unsafe { libc::prlimit(pid, libc::RLIMIT_FSIZE, &one, std::ptr::null_mut()) }
                }
                "tgkill-other" => unsafe { libc::syscall(libc::SYS_tgkill, pid, pid, 0) as i32 },
                _ => unsafe { libc::kill(pid, 0) },
            };
            let r = if rc < 0 { Err(errno()) } else { Ok(()) };
            unsafe { libc::close(fds[1]) };
            r
        }
        // The caller's own limits, by pid 0 (glibc's getrlimit) and by its own pid.
        "prlimit-own" => {
            let mut old = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            let own = unsafe { libc::getpid() };
            if unsafe { libc::prlimit(0, libc::RLIMIT_FSIZE, std::ptr::null(), &mut old) } != 0
                || unsafe { libc::prlimit(own, libc::RLIMIT_FSIZE, &old, std::ptr::null_mut()) }
                    != 0
            {
                Err(errno())
            } else {
                Ok(())
            }
        }
        "abstract-connect" => {
            let addr = SocketAddr::from_abstract_name(var("BXH_ABSTRACT").as_bytes()).unwrap();
            UnixStream::connect_addr(&addr).map(drop).map_err(io_errno)
        }
        "clone3" => {
            // A zero-sized argument: EINVAL where clone3 is reachable, ENOSYS where the first
            // filter answers.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    std::ptr::null_mut::<libc::c_void>(),
                    0usize,
                )
            };
            if r < 0 { Err(errno()) } else { Ok(()) }
        }
        "ioctl-tiocsti" => {
            // On stdin (/dev/null in these children): ENOTTY where the kernel is reached.
            let c: libc::c_char = b'x' as libc::c_char;
            if unsafe { libc::ioctl(0, libc::TIOCSTI, &c) } < 0 {
                Err(errno())
            } else {
                Ok(())
            }
        }
        // A new executable mapping, as an exploit would make one to run its own code.
        "mmap-exec" | "mprotect-exec" => {
            let len = 4096;
            // SAFETY: an anonymous private mapping of one page, unmapped below; no pointer
            // into it is kept.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    if op == "mmap-exec" {
                        libc::PROT_READ | libc::PROT_EXEC
                    } else {
                        libc::PROT_READ | libc::PROT_WRITE
                    },
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(errno());
            }
            let r = if op == "mprotect-exec" {
                // SAFETY: `p` is the page mapped just above.
                unsafe { libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC) }
            } else {
                0
            };
            let e = errno();
            // SAFETY: `p` is the page mapped above, and nothing refers to it.
            unsafe { libc::munmap(p, len) };
            if r == 0 { Ok(()) } else { Err(e) }
        }
        "thread" => std::thread::spawn(|| 7)
            .join() // bounded: the thread ends at once
            .map_err(|_| -1)
            .and_then(|v| if v == 7 { Ok(()) } else { Err(-1) }),
        "tcp-connect-allowed" | "tcp-connect-other" => {
            let key = if op == "tcp-connect-allowed" {
                "BXH_PORT"
            } else {
                "BXH_OTHER_PORT"
            };
            let port: u16 = var(key).parse().unwrap();
            std::net::TcpStream::connect(("127.0.0.1", port))
                .map(drop)
                .map_err(io_errno)
        }
        "setresuid-root" => {
            if unsafe { libc::setresuid(0, 0, 0) } < 0 {
                Err(errno())
            } else {
                Ok(())
            }
        }
        other => panic!("unknown op {other}"),
    }
}

/// What every daemon needs, inside its sandbox: the server skeleton. A socket bound before the
/// sandbox and served by a thread spawned after it; its own directory read and written with
/// fsync, flock and an atomic replace; a log line; time, randomness, threads. Prints `needs: ok`.
fn needs() -> i32 {
    init_log();
    let own = home().join("own");
    let id = bxharden::Identity::resolve(&SandboxConfig {
        user: Some(var("BXH_USER")).filter(|u| !u.is_empty()),
        ..SandboxConfig::default()
    })
    .unwrap();
    let sock = own.join("run/s.sock");
    let listener = bxharden::listen(&sock, id.owner()).unwrap();
    if var("BXH_PROFILE") != "none" {
        match sandbox() {
            Ok(r) => println!("report: {r}"),
            Err(e) => {
                println!("setup: {e}");
                return 3;
            }
        }
    }
    let policy = PeerPolicy::new("s.sock", [id.uid]);
    let limits = bxharden::serve::Limits::of(&S_SOCK);
    let socket = bxharden::serve::Socket::<SRequest>::new(listener, policy, limits);
    bxharden::serve::accept_loop(socket, |_, _, r| match r {}).unwrap();
    let mut failures = Vec::new();
    let mut check = |what: &str, r: Result<(), String>| {
        if let Err(e) = r {
            failures.push(format!("{what}: {e}"));
        }
    };
    if var("BXH_PROFILE") == "run-child" {
        // A program under the `run` tool may make no socket (EACCES), so it is no client: the
        // listener it had before serves, and a new socket is refused.
        // SAFETY: socket with integer arguments.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
        check(
            "no socket of any family",
            if fd < 0 && errno() == libc::EACCES {
                Ok(())
            } else {
                Err(format!("socket(AF_UNIX) gave {fd}, errno {}", errno()))
            },
        );
    } else {
        let pong = bxcore::client::ping(&sock, Duration::from_secs(20));
        check(
            "ping over a thread spawned after the sandbox",
            pong.map(drop).map_err(|e| e.to_string()),
        );
    }
    check(
        "files in its own directory",
        files(&own).map_err(|e| e.to_string()),
    );
    bxharden::runbook!(
        "listener-lost",
        "a test line from inside the sandbox, {}",
        std::collections::HashMap::<u8, u8>::new().len()
    );
    std::thread::sleep(Duration::from_millis(1));
    let joined = std::thread::spawn(std::time::Instant::now).join(); // bounded: ends at once
    check(
        "a thread",
        joined.map(drop).map_err(|_| "panicked".to_owned()),
    );
    check(
        "readiness without NOTIFY_SOCKET",
        match bxharden::notify::ready() {
            Ok(false) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    if var("BXH_PORT").parse::<u16>().is_ok() {
        let profile = profile_named(&var("BXH_PROFILE"));
        if profile.is_some_and(|p| p.inet()) {
            check(
                "TCP connect to its port",
                attempt("tcp-connect-allowed").map_err(|e| format!("errno {e}")),
            );
            check("a name resolved and connected to", resolve_and_connect());
        }
    }
    if failures.is_empty() {
        println!("needs: ok");
        0
    } else {
        for f in failures {
            println!("needs: FAILED {f}");
        }
        1
    }
}

/// What gatewayd, inferproxy and a remote memoryd do: resolve a name (`/etc/hosts`, NSS), then
/// connect to the address it gave.
fn resolve_and_connect() -> Result<(), String> {
    use std::net::ToSocketAddrs;
    let port: u16 = var("BXH_PORT").parse().unwrap();
    let addrs: Vec<_> = ("localhost", port)
        .to_socket_addrs()
        .map_err(|e| format!("resolve localhost: {e}"))?
        .filter(|a| a.is_ipv4())
        .collect();
    let addr = addrs.first().ok_or("localhost has no IPv4 address")?;
    std::net::TcpStream::connect(addr)
        .map(drop)
        .map_err(|e| format!("connect {addr}: {e}"))
}

fn files(own: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let dir = own.join("state");
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join("s.json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(b"{\"a\":1}\n")?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join("s.json"))?;
    std::fs::File::open(&dir)?.sync_all()?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("lock"))?;
    // SAFETY: flock on an owned, open descriptor.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log.jsonl"))?;
    log.write_all(b"{}\n")?;
    log.sync_data()?;
    let mut s = String::new();
    std::fs::File::open(dir.join("s.json"))?.read_to_string(&mut s)?; // bounded: a file
    let n = std::fs::read_dir(&dir)?.count();
    if n != 3 {
        return Err(std::io::Error::other(format!("{n} entries")));
    }
    std::fs::metadata(dir.join("s.json"))?;
    std::fs::remove_file(dir.join("log.jsonl"))?;
    std::fs::remove_file(dir.join("lock"))?;
    std::fs::remove_file(dir.join("s.json"))?;
    std::fs::remove_dir(&dir)?;
    Ok(())
}

/// Apply, then keep two more threads alive until stdin closes, so the runner can read every
/// thread's `/proc/<pid>/task/*/status`.
fn status() -> i32 {
    init_log();
    match sandbox() {
        Ok(r) => println!("report: {r}"),
        Err(e) => {
            println!("setup: {e}");
            return 3;
        }
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut threads = Vec::new();
    for _ in 0..2 {
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            std::thread::park();
            drop(tx);
        }));
    }
    drop(tx);
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    // bounded: the sandboxed child, killed with its group at cases.rs's deadline
    let _ = std::io::stdin().read_to_end(&mut sink);
    for t in &threads {
        t.thread().unpark();
    }
    // bounded: the sandboxed child, killed with its group at cases.rs's deadline
    let _ = rx.recv();
    0
}

/// The refusals of `apply`: which one is `BXH_CASE`. Prints `refused: {error}`.
fn apply_refusal() -> i32 {
    init_log();
    let p = Profile::new(SeccompProfile::Loopd).read_write(home().join("own"));
    let r = match var("BXH_CASE").as_str() {
        "root-without-user" => bxharden::apply(&SandboxConfig::default(), &p),
        "second-thread" => {
            let t = std::thread::spawn(std::thread::park);
            let r = bxharden::apply(&SandboxConfig::default(), &p);
            t.thread().unpark();
            r
        }
        "missing-path" => bxharden::apply(
            &SandboxConfig {
                user: Some("65534".into()),
                group: Some("65534".into()),
                ..SandboxConfig::default()
            },
            &p.read_only(home().join("no-such-dir")),
        ),
        "no-such-user" => bxharden::apply(
            &SandboxConfig {
                user: Some("no-such-user-bx".into()),
                ..SandboxConfig::default()
            },
            &p,
        ),
        "not-root-group" => bxharden::apply(
            &SandboxConfig {
                group: Some("0".into()),
                ..SandboxConfig::default()
            },
            &p,
        ),
        "not-root" => bxharden::apply(
            &SandboxConfig {
                user: Some("0".into()),
                ..SandboxConfig::default()
            },
            &p,
        ),
        "root-without-user-not-required" => {
            let r = bxharden::apply(
                &SandboxConfig {
                    require: false,
                    ..SandboxConfig::default()
                },
                &p,
            );
            match r {
                Ok(report) => {
                    println!("report: {report}");
                    return 0;
                }
                Err(e) => Err(e),
            }
        }
        other => panic!("unknown case {other}"),
    };
    match r {
        Ok(report) => {
            println!("applied: {report}");
            1
        }
        Err(e) => {
            println!("refused: {}", e.pointed());
            0
        }
    }
}

/// `listen` under `BXH_UMASK`, at `BXH_SOCKET`, with the owner `BXH_USER` when set. Prints
/// `listened` or `error: {e}`, then `umask: NNN` (the umask after the call).
fn listen() -> i32 {
    init_log();
    let mask: u32 = u32::from_str_radix(&var("BXH_UMASK"), 8).unwrap_or(0o022);
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
    let owner = match var("BXH_USER").parse::<u32>() {
        Ok(u) => Some(bxharden::Owner { uid: u, gid: u }),
        Err(_) => None,
    };
    match bxharden::listen(Path::new(&var("BXH_SOCKET")), owner) {
        Ok(_l) => println!("listened"),
        Err(e) => println!("error: {}", e.pointed()),
    }
    let now = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    println!("umask: {:03o}", now.bits());
    0
}

/// Started by `systemd-socket-activate` with two named sockets: takes them by name, checks the
/// environment is cleared, serves one connection on `a`.
fn activated() -> i32 {
    init_log();
    let mut act = match bxharden::activated() {
        Ok(a) => a,
        Err(e) => {
            println!("error: {}", e.pointed());
            return 1;
        }
    };
    println!("names: {}", act.names().join(","));
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        println!(
            "{v}: {}",
            std::env::var(v).unwrap_or_else(|_| "unset".into())
        );
    }
    let a = act.take("a").expect("a");
    let b = act.take("b").expect("b");
    let fd_b = std::os::fd::AsRawFd::as_raw_fd(&b);
    // SAFETY: fcntl F_GETFD on an open descriptor.
    let flags = unsafe { libc::fcntl(fd_b, libc::F_GETFD) };
    println!("cloexec: {}", flags & libc::FD_CLOEXEC != 0);
    let _ = std::io::stdout().flush();
    // bounded: the sandboxed child, killed with its group at cases.rs's deadline
    let (mut s, _) = a.accept().unwrap();
    let r = bxharden::serve::read_request(&mut s, &bxharden::serve::Limits::of(&S_SOCK));
    println!("request after ping: {}", r.is_some());
    0
}

/// A daemon serving `BXH_SOCKET` with peers `BXH_PEERS` (comma-separated uids) until killed;
/// a `tools_list` is forbidden there. Prints `serving` once it accepts.
fn server() -> i32 {
    init_log();
    let path = PathBuf::from(var("BXH_SOCKET"));
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let uids: Vec<u32> = var("BXH_PEERS")
        .split(',')
        .filter_map(|u| u.parse().ok())
        .collect();
    let policy = PeerPolicy::new("p.sock", uids);
    let limits = bxharden::serve::Limits::of(&P_SOCK);
    let socket = bxharden::serve::Socket::<PRequest>::new(listener, policy, limits);
    let h = bxharden::serve::accept_loop(socket, |_, _, r| match r {}).unwrap();
    println!("serving");
    let _ = std::io::stdout().flush();
    // bounded: the sandboxed child, killed with its group at cases.rs's deadline
    let _ = h.join();
    0
}

/// Connect to `BXH_SOCKET`, send `BXH_KIND` (`ping` or `tools_list`), print the answer's JSON.
fn client() -> i32 {
    let mut s = UnixStream::connect(var("BXH_SOCKET")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let msg = match var("BXH_KIND").as_str() {
        "tools_list" => bxcore::Message::ToolsList {},
        _ => bxcore::Message::Ping {},
    };
    let _ = bxcore::write_frame(&mut s, &bxcore::Envelope::new(5, true, msg));
    match bxcore::read_frame(&mut s) {
        Ok(env) => println!("answer: {}", serde_json_line(&env)),
        Err(e) => println!("answer: none: {e}"),
    }
    0
}

fn serde_json_line(env: &bxcore::Envelope) -> String {
    let mut buf = Vec::new();
    bxcore::write_frame(&mut buf, env).unwrap();
    String::from_utf8_lossy(&buf[4..]).into_owned()
}

/// The journal: in a mount namespace of its own, a datagram socket stands where journald's is;
/// with `JOURNAL_STREAM` naming stderr, `init` logs there. Prints the datagram received.
fn journal() -> i32 {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: plain syscalls with valid arguments, before any thread exists.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            println!("setup: unshare: errno {}", errno());
            return 3;
        }
        let root = CString::new("/").unwrap();
        let run = CString::new("/run").unwrap();
        let tmpfs = CString::new("tmpfs").unwrap();
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
            || libc::mount(
                tmpfs.as_ptr(),
                run.as_ptr(),
                tmpfs.as_ptr(),
                0,
                std::ptr::null(),
            ) != 0
        {
            println!("setup: mount: errno {}", errno());
            return 3;
        }
    }
    std::fs::create_dir_all("/run/systemd/journal").unwrap();
    let journald = std::os::unix::net::UnixDatagram::bind("/run/systemd/journal/socket").unwrap();
    journald
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let m = std::fs::metadata("/proc/self/fd/2").unwrap();
    // SAFETY: single-threaded here; nothing reads the environment concurrently.
    unsafe { std::env::set_var("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino())) };
    let sink = bxharden::log::init(Daemon {
        name: "testd",
        version: "9.8.7",
    });
    println!("sink: {sink:?}");
    std::fs::set_permissions(
        "/run/systemd/journal/socket",
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    bxharden::runbook!("listener-lost", "a journal test line {}", 42);
    if !receive(&journald, "field") {
        return 1;
    }
    // The same logger inside the sandbox: the journal is reached by path from a socket made
    // before, with the calls the list allows.
    match sandbox() {
        Ok(r) => println!("report: {r}"),
        Err(e) => {
            println!("setup: {e}");
            return 3;
        }
    }
    bxharden::runbook!("listener-lost", "a journal line from inside the sandbox");
    if !receive(&journald, "inside") {
        return 1;
    }
    0
}

fn receive(journald: &std::os::unix::net::UnixDatagram, prefix: &str) -> bool {
    let mut buf = vec![0u8; 65536];
    loop {
        let n = match journald.recv(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                println!("{prefix}: nothing received: {e}");
                return false;
            }
        };
        if n == 0 {
            continue; // the layer's probe
        }
        for (name, value) in journal_fields(&buf[..n]) {
            println!("{prefix}: {name}={value}");
        }
        return true;
    }
}

/// journald's native protocol: `NAME=value\n`, or `NAME\n`, a 64-bit little-endian length,
/// the value and `\n`.
fn journal_fields(mut b: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let end = b
            .iter()
            .position(|&c| c == b'\n' || c == b'=')
            .unwrap_or(b.len());
        let name = String::from_utf8_lossy(&b[..end]).into_owned();
        if end == b.len() {
            break;
        }
        if b[end] == b'=' {
            let rest = &b[end + 1..];
            let nl = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            out.push((name, String::from_utf8_lossy(&rest[..nl]).into_owned()));
            b = rest.get(nl + 1..).unwrap_or(&[]);
        } else {
            let rest = &b[end + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            out.push((
                name,
                String::from_utf8_lossy(&rest[8..8 + len]).into_owned(),
            ));
            b = rest.get(8 + len + 1..).unwrap_or(&[]);
        }
    }
    out
}

/// `ready` and `stopping` to `NOTIFY_SOCKET` (set by the runner, a path or `@abstract`).
fn notify() -> i32 {
    println!(
        "ready: {:?}",
        bxharden::notify::ready().map_err(|e| e.to_string())
    );
    println!(
        "stopping: {:?}",
        bxharden::notify::stopping().map_err(|e| e.to_string())
    );
    0
}

/// The system paths a program started by the `run` tool reads and executes in these tests.
fn program_paths() -> Vec<PathBuf> {
    [
        "/bin",
        "/usr/bin",
        "/lib",
        "/lib64",
        "/usr/lib",
        "/usr/lib64",
        "/etc/ld.so.cache",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect()
}

/// brokerd with the `run` tool: its own sandbox, threads, then a program started in the
/// stricter child sandbox. Prints one `run: {what}: {exit code} {stdout}` line per program.
fn run_tool() -> i32 {
    use std::os::unix::process::CommandExt;
    init_log();
    let own = home().join("own");
    let ws = own.join("ws");
    let docs = own.join("docs");
    let mut parent = Profile::new(SeccompProfile::Brokerd { run_tool: true }).read_write(&own);
    std::fs::create_dir(&docs).unwrap();
    // A root the call sees read-only, beside the one it may write.
    let mut child = Profile::new(SeccompProfile::RunChild)
        .read_write(&ws)
        .read_only(&docs);
    for p in program_paths() {
        parent = parent.read_only(&p);
        child = child.read_only(&p);
    }
    let cfg = SandboxConfig {
        user: Some(var("BXH_USER")).filter(|u| !u.is_empty()),
        group: Some(var("BXH_USER")).filter(|u| !u.is_empty()),
        ..SandboxConfig::default()
    };
    std::fs::create_dir(&ws).unwrap();
    if let Ok(uid) = var("BXH_USER").parse::<u32>() {
        for d in [&ws, &docs] {
            nix::unistd::chown(d, Some(uid.into()), Some(uid.into())).unwrap();
        }
    }
    // Prepared before the daemon's own sandbox closes (as brokerd does at start).
    let sandbox = match bxharden::ChildSandbox::prepare(
        &child,
        bxharden::seccomp::Mismatch::KillProcess,
        true,
    ) {
        Ok(s) => std::sync::Arc::new(s),
        Err(e) => {
            println!("setup: {e}");
            return 3;
        }
    };
    match bxharden::apply(&cfg, &parent) {
        Ok(r) => println!("report: {r}"),
        Err(e) => {
            println!("setup: {e}");
            return 3;
        }
    }
    std::fs::write(ws.join("note"), "in the workspace").unwrap();
    std::fs::write(own.join("state.json"), "the broker's state").unwrap();
    // A thread of the daemon's own, as brokerd has, so the fork is from a threaded process.
    let busy = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(50)));
    std::fs::write(docs.join("d.txt"), "a document").unwrap();
    let cases: [(&str, &str, &str, PathBuf); 6] = [
        ("workspace", "/bin/cat", "", ws.join("note")),
        ("daemon-state", "/bin/cat", "", own.join("state.json")),
        ("system", "/bin/ls", "", PathBuf::from("/etc")),
        ("read-only-root", "/bin/cat", "", docs.join("d.txt")),
        (
            "write-read-only-root",
            "/bin/cp",
            "/dev/null",
            docs.join("new"),
        ),
        ("write-workspace", "/bin/cp", "/dev/null", ws.join("new")),
    ];
    for (what, prog, first, arg) in cases {
        let sb = std::sync::Arc::clone(&sandbox);
        let mut cmd = std::process::Command::new(prog);
        if !first.is_empty() {
            cmd.arg(first);
        }
        cmd.arg(&arg).stdin(std::process::Stdio::null());
        // SAFETY: `enter` makes system calls only, which is what may run between fork and exec.
        unsafe { cmd.pre_exec(move || sb.enter()) };
        // bounded: the sandboxed child, killed with its group at cases.rs's deadline
        match cmd.output() {
            Ok(out) => println!(
                "run: {what}: {:?} {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
            Err(e) => println!("run: {what}: spawn failed: {e}"),
        }
    }
    let _ = busy.join(); // bounded: the thread sleeps 50 ms
    0
}

/// `activated` with the variables this child sets itself (`BXH_LISTEN_PID` = `self` for its own
/// pid), and descriptor 3 made as `BXH_FD3` says: `none`, `listener`, `socketpair`. Prints the
/// names or the error, then whether each variable is still set.
fn activated_env() -> i32 {
    use std::os::fd::AsRawFd;
    init_log();
    let dir = home();
    let keep: Vec<std::os::fd::OwnedFd> = match var("BXH_FD3").as_str() {
        "listener" => {
            let l = std::os::unix::net::UnixListener::bind(dir.join("l.sock")).unwrap();
            vec![l.into()]
        }
        "socketpair" => {
            let (a, b) = UnixStream::pair().unwrap();
            vec![a.into(), b.into()]
        }
        _ => vec![],
    };
    if let Some(first) = keep.first() {
        // SAFETY: dup2 onto 3, which nothing else in this process uses.
        if unsafe { libc::dup2(first.as_raw_fd(), 3) } != 3 {
            println!("setup: dup2: errno {}", errno());
            return 3;
        }
    }
    let pid = match var("BXH_LISTEN_PID").as_str() {
        "self" => std::process::id().to_string(),
        other => other.to_owned(),
    };
    // SAFETY: single-threaded here; nothing reads the environment concurrently.
    unsafe {
        std::env::set_var("LISTEN_PID", pid);
        std::env::set_var("LISTEN_FDS", var("BXH_LISTEN_FDS"));
        if let Ok(n) = std::env::var("BXH_LISTEN_FDNAMES") {
            std::env::set_var("LISTEN_FDNAMES", n);
        }
    }
    match bxharden::activated() {
        Ok(a) => println!("names: [{}]", a.names().join(",")),
        Err(e) => println!("error: {}", e.pointed()),
    }
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        println!(
            "{v}: {}",
            std::env::var(v).unwrap_or_else(|_| "unset".into())
        );
    }
    0
}

bxcore::socket! {
    /// `s.sock`: a table that takes nothing but `ping`.
    S_SOCK, SRequest {
        name: "s", dir: "test", server: "testd", client: "testd",
        wrong_kind: Forbidden, max_connections: 16,
        accepts: {}
    }
}

bxcore::socket! {
    /// `p.sock`: a table that takes nothing but `ping`.
    P_SOCK, PRequest {
        name: "p", dir: "test", server: "testd", client: "testd",
        wrong_kind: Forbidden, max_connections: 16,
        accepts: {}
    }
}
