//! The seccomp allow-lists, one per daemon, per architecture: every list in one place, pinned by
//! a test (`tests/pinned/seccomp-*.txt`) so a change shows in review.
//!
//! Each list starts from a server skeleton (configuration, journald, Unix sockets, threads,
//! files, fsync, flock) measured under `strace -f`, then grows by what each daemon's own suite
//! needs when run with `KillProcess` as the default action. Remember what glibc really calls:
//! on x86_64 `mkdir`, `rename`, `unlink`, `poll` rather than their `*at` forms; aarch64 has only
//! the `*at` forms. Never on any list: `ptrace`, `mount`, `bpf`, `keyctl`, `userfaultfd`,
//! `perf_event_open`, `kexec_*`, `init_module`, and (but for brokerd with the `run` tool)
//! `execve`, `seccomp`, `landlock_*` and `unshare` (there only of a user and network namespace
//! together, for the tool's child).

use std::collections::BTreeSet;
use std::fmt;

/// A CPU architecture with a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arch {
    /// x86_64.
    X86_64,
    /// aarch64 (no `open`, `mkdir`, `rename`, `unlink`, `poll`: only their `*at` forms).
    Aarch64,
}

impl Arch {
    /// Every architecture with lists.
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The architecture this build runs on, if it has lists.
    pub const fn current() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// Its name, as `uname -m` says it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// Which seccomp profile: one per daemon, with the variants its configuration selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SeccompProfile {
    /// The agent loop's monitor: Unix sockets, its own files, and its session workers, each
    /// started from its own binary ([`WORKER_PARENT`]), whose own sandbox it lets them enter.
    Loopd,
    /// One session's worker, started by loopd's monitor: the server skeleton without `socket`,
    /// `socketpair`, `connect` or `accept` ([`NO_SOCKETS`]); it reaches its peers only through
    /// connections the monitor makes and hands it.
    LoopWorker,
    /// The broker; with `run_tool`, it may also start the `run` tool's child (fork, `execve`,
    /// and the child's own `seccomp` and `landlock_*` before its `execve`).
    Brokerd {
        /// The `run` tool is enabled.
        run_tool: bool,
    },
    /// The network door for tools: TCP out.
    Gatewayd,
    /// The model's door: TCP out.
    Inferproxy,
    /// Files turns into Honcho; with `remote`, TCP out to a remote Honcho.
    Memoryd {
        /// Honcho is remote (TCP), not the embedded local store.
        remote: bool,
    },
    /// The `run` tool's child, installed after `fork` and before `execve`: what an ordinary
    /// program needs, Unix sockets only, no way out of its domain.
    RunChild,
    /// The Matrix channel: the server skeleton (its owner socket, its own files, the journal),
    /// Unix sockets to loopd and brokerd, and TCP stream sockets to its homeserver, whose
    /// addresses it resolved before the sandbox closed: no datagram socket (no name lookup
    /// inside), so none of [`NET_CLIENT`]'s calls; nothing else of its own ([`CHANNELD`]).
    Channeld,
}

impl SeccompProfile {
    /// Every profile, for the pin test and the proof matrix.
    pub const ALL: [SeccompProfile; 10] = [
        SeccompProfile::Loopd,
        SeccompProfile::LoopWorker,
        SeccompProfile::Brokerd { run_tool: false },
        SeccompProfile::Brokerd { run_tool: true },
        SeccompProfile::Gatewayd,
        SeccompProfile::Inferproxy,
        SeccompProfile::Memoryd { remote: false },
        SeccompProfile::Memoryd { remote: true },
        SeccompProfile::RunChild,
        SeccompProfile::Channeld,
    ];

    /// Its name in the startup notice and the pinned file.
    pub fn name(self) -> &'static str {
        match self {
            SeccompProfile::Loopd => "loopd",
            SeccompProfile::LoopWorker => "loopd-worker",
            SeccompProfile::Brokerd { run_tool: false } => "brokerd",
            SeccompProfile::Brokerd { run_tool: true } => "brokerd+run",
            SeccompProfile::Gatewayd => "gatewayd",
            SeccompProfile::Inferproxy => "inferproxy",
            SeccompProfile::Memoryd { remote: false } => "memoryd",
            SeccompProfile::Memoryd { remote: true } => "memoryd+net",
            SeccompProfile::RunChild => "run-child",
            SeccompProfile::Channeld => "channeld",
        }
    }

    /// Whether it may open TCP (and UDP, for DNS) sockets: `socket(AF_INET*)`.
    pub fn inet(self) -> bool {
        matches!(
            self,
            SeccompProfile::Gatewayd
                | SeccompProfile::Inferproxy
                | SeccompProfile::Memoryd { remote: true }
                | SeccompProfile::Channeld
        )
    }

    /// Whether its `AF_INET*` sockets are `SOCK_STREAM` only: any other type (a datagram, a raw
    /// socket) fails with `EACCES`, and so does a TCP Fast Open send (`MSG_FASTOPEN`, a connect
    /// by `sendto`). inferproxy, whose one peer is the provider, over TCP; gatewayd, which
    /// looks names up over TCP too.
    pub fn inet_stream_only(self) -> bool {
        matches!(
            self,
            SeccompProfile::Inferproxy | SeccompProfile::Gatewayd | SeccompProfile::Channeld
        )
    }

    /// Whether programs are started under it: brokerd with the `run` tool, whose children
    /// inherit its filters, and the tool's child itself. Only these may map code after start.
    pub fn starts_programs(self) -> bool {
        matches!(
            self,
            SeccompProfile::Brokerd { run_tool: true } | SeccompProfile::RunChild
        )
    }

    /// Whether a daemon starts processes under it inside its own sandbox (loopd's session
    /// worker): they drop nothing and look nothing up, holding what their daemon holds.
    pub fn nested(self) -> bool {
        self == SeccompProfile::LoopWorker
    }

    /// Whether `clone` may make threads only (`CLONE_THREAD`), no process: loopd's session
    /// worker, so nothing it forks outlives the worker's end or holds its session past it.
    pub fn threads_only(self) -> bool {
        self == SeccompProfile::LoopWorker
    }

    /// Whether it starts a program (`execve`), so what it starts maps code after its start:
    /// brokerd with the `run` tool and the tool's child ([`Self::starts_programs`]), and loopd's
    /// monitor, which starts its own binary as each session's worker.
    pub fn execs(self) -> bool {
        self.starts_programs() || self == SeccompProfile::Loopd
    }

    /// The socket families `socket` and `socketpair` accept: none for a session's worker.
    pub fn socket_families(self) -> Vec<(i32, &'static str)> {
        if self == SeccompProfile::LoopWorker {
            return Vec::new();
        }
        let mut f = vec![(libc::AF_UNIX, "AF_UNIX")];
        if self.inet() {
            f.push((libc::AF_INET, "AF_INET"));
            f.push((libc::AF_INET6, "AF_INET6"));
        }
        f
    }

    /// The system calls allowed without a condition on `arch`. `clone` (no `CLONE_NEW*` flag),
    /// `socket` and `socketpair` (by family) are allowed with conditions besides; see
    /// [`crate::seccomp`].
    pub fn syscalls(self, arch: Arch) -> BTreeSet<&'static str> {
        let mut s: BTreeSet<&'static str> = BTreeSet::new();
        s.extend(SERVER);
        s.extend(match arch {
            Arch::X86_64 => SERVER_X86_64,
            Arch::Aarch64 => SERVER_AARCH64,
        });
        // channeld resolves its homeserver before the sandbox: no lookup, no datagram inside.
        if self.inet() && self != SeccompProfile::Channeld {
            s.extend(NET_CLIENT);
        }
        if self == SeccompProfile::Channeld {
            s.extend(CHANNELD);
        }
        if matches!(self, SeccompProfile::Brokerd { .. }) {
            s.extend(BROKERD);
        }
        if matches!(self, SeccompProfile::Memoryd { .. }) {
            s.extend(MEMORYD);
        }
        // Filters stack: a program the run tool starts passes brokerd's list as well as its
        // own, so brokerd's list with the run tool holds the child's whole list.
        if self.starts_programs() {
            s.extend(PROGRAM);
            s.extend(match arch {
                Arch::X86_64 => PROGRAM_X86_64,
                Arch::Aarch64 => &[][..],
            });
        }
        if self == (SeccompProfile::Brokerd { run_tool: true }) {
            s.extend(RUN_PARENT);
        }
        if self == SeccompProfile::Loopd {
            s.extend(WORKER_PARENT);
            s.extend(match arch {
                Arch::X86_64 => &["arch_prctl"][..],
                Arch::Aarch64 => &[][..],
            });
        }
        if self == SeccompProfile::LoopWorker {
            for call in NO_SOCKETS {
                s.remove(call);
            }
        }
        s
    }
}

impl SeccompProfile {
    /// The system calls that take a pid, allowed only with pid 0 or the caller's own pid (see
    /// [`crate::seccomp::conditional`]); none of them is on [`SeccompProfile::syscalls`].
    pub fn pid_calls(self) -> BTreeSet<&'static str> {
        let mut s: BTreeSet<&'static str> = PID_SERVER.iter().copied().collect();
        if self.starts_programs() {
            s.extend(PID_PROGRAM);
        }
        s
    }
}

impl fmt::Display for SeccompProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The server skeleton, on both architectures: files in its own directory (read, write, fsync,
/// flock, atomic replace), Unix stream sockets served by a thread per connection, the journal,
/// time, randomness, memory, signals for its own threads.
const SERVER: &[&str] = &[
    // files
    "read",       // frames on every socket, configurations, state files, stdin of a CLI
    "write",      // frames, durable writes, the log on stderr
    "readv",      // std's vectored reads (BufReader over a socket, rustls)
    "writev",     // std's vectored writes: a frame's header and body in one call
    "pread64",    // SQLite's pages (memoryd); the audit chain read back at an offset (brokerd)
    "pwrite64",   // SQLite's pages and journal (memoryd)
    "lseek",      // a file read again from its start: the chain's tail, a queue record
    "openat",     // every file open (glibc's open on both architectures)
    "close",      // every descriptor a request or a file used
    "fstat",      // std's File::metadata: sizes and owners of opened files
    "newfstatat", // std's fs::metadata and symlink_metadata (glibc's stat on x86_64 too)
    "statx",      // std's metadata on kernels that have it (tried first)
    "getdents64", // fs::read_dir: the outboxes and queues, sessions, /proc/self/fd at start
    "fcntl",      // FD_CLOEXEC and status flags; SQLite's POSIX locks (memoryd)
    "flock",      // the one-daemon-per-home lock; the audit chain's lock (brokerd)
    "fsync",      // bxcore::durable::replace: a state file is on disk before it counts
    "fdatasync",  // the audit chain's group commit (brokerd); SQLite's journal (memoryd)
    "ftruncate",  // a torn tail of the chain or a session log cut back; SQLite's journal
    "fallocate",  // SQLite growing its file in one step (memoryd)
    "mkdirat",    // a daemon's own state directories, made 0700 at start
    "unlinkat",   // a queue record done, a temporary file of a failed write, a stale socket
    "renameat",   // durable::replace's rename over the file (glibc's rename, aarch64)
    "renameat2",  // the same, where glibc calls the newer form
    "linkat",     // std's fs::hard_link: never called by a daemon, kept for glibc's
    // tmpfile helpers the skeleton measured; it cannot reach past Landlock's rules
    "readlinkat", // /proc/self/fd/N named in the descriptor-inherited line; std's read_link
    "faccessat",  // glibc's access: a socket's directory checked before bind
    "faccessat2", // the same, where glibc calls the newer form
    "fchmod",     // a socket made 0600 (or 0660 for its group) after bind
    "fchmodat",   // a state directory made 0700; fs::set_permissions
    "utimensat",  // SQLite touching its journal (memoryd); never a daemon's own code
    "getcwd",     // std resolving a relative path in an error message
    "pipe2",      // the stop pipe a signal handler writes to end the accept loops
    "dup",        // std's try_clone of a stream: a reader and a writer of one connection
    "dup3",       // the same, where a descriptor is put at a number (aarch64's dup2)
    // memory
    "brk",      // the allocator's heap
    "mmap",     // the allocator's large blocks, thread stacks; PROT_EXEC refused (filters)
    "munmap",   // the same, given back
    "mprotect", // thread stack guard pages; PROT_EXEC refused (filters)
    "mremap",   // a large Vec grown in place
    "madvise",  // the allocator giving pages back (bxharden::heap::give_back)
    // threads and signals within the process
    "clone3",          // std::thread::spawn: a thread per connection, the filer, the sender
    "futex",           // every Mutex, Condvar and thread join
    "set_robust_list", // glibc at each thread's start
    "rseq",            // glibc at each thread's start (restartable sequences)
    "set_tid_address", // glibc at each thread's start
    "sched_yield",     // std's spin before a futex wait
    "sched_getaffinity", // glibc and std asking how many CPUs (thread pools, nproc)
    "rt_sigaction",    // the SIGTERM and SIGINT handlers (bxharden::stop); SIGPIPE ignored
    "rt_sigprocmask",  // glibc blocking signals around a thread's start
    "rt_sigreturn",    // the return from a signal handler
    "sigaltstack",     // std's stack for reporting a stack overflow, per thread
    "restart_syscall", // the kernel restarting a sleep a signal interrupted
    "exit",            // a thread's end
    "exit_group",      // the process's end
    // who and when
    "getpid",          // the pid in a log line, in LISTEN_PID and NOTIFY checks
    "gettid",          // glibc's raise; tracing's thread ids
    "getuid",          // the daemon's own uid, checked against its peers and its files
    "geteuid",         // the same, effective
    "getgid",          // its own gid, for a socket's group
    "getegid",         // the same, effective
    "clock_gettime",   // every deadline (Instant) and every timestamp (SystemTime)
    "clock_getres",    // std at start
    "gettimeofday",    // glibc's time, where the vDSO does not answer
    "nanosleep",       // backoff between retries (std::thread::sleep)
    "clock_nanosleep", // the same, where glibc calls the newer form
    "getrandom",       // approval, lease and session ids; std's HashMap keys; rustls
    "uname",           // glibc at start; the kernel release in a Landlock line
    // Unix sockets, already bound: accept, talk, connect to a peer daemon
    "accept",      // glibc's accept on aarch64 builds that do not use accept4
    "accept4",     // a connection on a listening socket (SOCK_CLOEXEC)
    "connect",     // a client of a peer daemon's socket; a TCP daemon's upstream
    "getsockname", // the address a listener is bound to, at start
    "getpeername", // the peer's address, for a log line
    "getsockopt",  // SO_PEERCRED: the peer's uid, checked against [peers]
    "setsockopt",  // SO_RCVTIMEO and SO_SNDTIMEO: every read and write has a deadline
    "sendto",      // a frame sent (std's send); the journal's datagram
    "recvfrom",    // a frame received (std's recv); a peek for a peer that went away
    "sendmsg",     // the journal's native protocol (tracing-journald); sd_notify
    "recvmsg",     // glibc's name service over a socket; sockets passed with SCM_RIGHTS
    "shutdown",    // a connection ended both ways: a cancelled turn, a bounded answer
    "ppoll",       // a wait with a deadline on a socket (glibc's poll on aarch64)
];

/// The system calls of the skeleton that act on a process named by its pid: allowed only on
/// the caller itself, pid 0 or its own pid ([`crate::seccomp::conditional`]), so no daemon sets
/// another's resource limits (`prlimit64`: `RLIMIT_FSIZE` of 1 kills at the next write) or
/// signals it. glibc's `raise` and `abort` call `tgkill(getpid(), ..)`; `getrlimit` and
/// `setrlimit` call `prlimit64(0, ..)`. The calls that only read about a process by pid stay
/// plain: `sched_getaffinity` (glibc asks it of each new thread by its tid), and for programs
/// `getpgid`, `getsid`, `sched_getparam`, `sched_getscheduler`.
const PID_SERVER: &[&str] = &["tgkill", "prlimit64"];

/// What an ordinary program calls with a pid to act on a process, on the caller only as well.
/// In brokerd `kill(0, ..)` is how the `run` tool's supervisor ends the process group it leads
/// at the deadline; the program itself may signal only its own pid, never pid 0, so nothing it
/// starts can stop or kill that supervisor ([`crate::seccomp::conditional`]).
/// `wait4`, `waitid` and `setpgid` stay plain: the kernel confines them to the caller and its
/// own children.
const PID_PROGRAM: &[&str] = &["kill"];

/// What glibc calls on x86_64 for `mkdir`, `rename`, `unlink`, `poll` and friends: the older
/// forms of calls the skeleton has, each for what its `*at` form is listed for.
const SERVER_X86_64: &[&str] = &[
    "open",     // openat's older form (glibc's open64 in some builds)
    "stat",     // newfstatat's: std's fs::metadata through glibc's stat
    "lstat",    // the same for symlink_metadata
    "access",   // faccessat's: a socket's directory checked before bind
    "mkdir",    // mkdirat's: a state directory made at start
    "rmdir",    // glibc's rmdir, measured in the skeleton; no daemon removes a directory
    "rename",   // renameat's: durable::replace's rename over the file
    "unlink",   // unlinkat's: a queue record done, a stale socket
    "readlink", // readlinkat's: /proc/self/fd/N at start
    "chmod",    // fchmodat's: a state directory made 0700
    "link",     // linkat's (never called by a daemon; glibc's tmpfile helpers)
    "poll",     // ppoll's: a wait with a deadline on a socket
    "pipe",     // pipe2's: the stop pipe
    "dup2",     // dup3's: a descriptor put at a number
];

/// aarch64 has only the `*at` forms, which the skeleton lists already.
const SERVER_AARCH64: &[&str] = &[];

/// A TCP client resolving names: DNS over UDP too.
const NET_CLIENT: &[&str] = &[
    "sendmmsg", // glibc's resolver sends a name's A and AAAA queries in one call
    "recvmmsg", // and reads their answers, where it reads more than one at once
];

/// channeld, beyond the skeleton, measured over its whole test suite (against a real Synapse)
/// under `KillProcess`: nothing. Its HTTP client (ureq with rustls) reads and writes TCP
/// streams with the skeleton's `read`, `write`, `sendto`, `recvfrom`, `ppoll`; its homeserver's
/// addresses were resolved before the sandbox (so neither `sendmmsg` nor `recvmmsg`, which a
/// lookup over UDP makes); its sync, relay and approval threads are the skeleton's threads;
/// its state files are the skeleton's durable writes. Each call a later measurement adds goes
/// here, with why.
const CHANNELD: &[&str] = &[];

/// brokerd, measured over its whole test suite under `KillProcess`: the workspace tools open
/// every path with `openat2(RESOLVE_BENEATH)`.
const BROKERD: &[&str] = &["openat2"];

/// memoryd's embedded store: SQLite gives a new journal its database's owner with `fchown` when
/// it runs as root (tests, a dev box run as root without a user). Unprivileged, as on the
/// device, the call never comes, and could change nothing but a file's group to one of its own.
const MEMORYD: &[&str] = &["fchown"];

/// brokerd with the `run` tool: start the child, which installs its own Landlock and seccomp
/// before `execve`, then wait for it (`toolkit::run::spawn`). brokerd signals only itself
/// ([`PID_SERVER`]): a child is bounded by the limits it sets on itself before `execve`
/// (`setrlimit`), not by a signal. What the child calls besides (`fchdir`, `dup2`, `wait4` in
/// its supervisor) is on [`PROGRAM`], which this list holds too.
const RUN_PARENT: &[&str] = &[
    "execve",                  // the child becomes the program
    "wait4",                   // brokerd reaps the supervisor (glibc's waitpid)
    "setpgid", // the supervisor leads a group of its own, ended whole at the deadline
    "prctl",   // PR_SET_NO_NEW_PRIVS before the child's sandbox; PR_SET_PDEATHSIG
    "seccomp", // the child's own filter, installed before execve
    "landlock_create_ruleset", // the child's own Landlock domain: its ruleset,
    "landlock_add_rule", // the roots the call may reach,
    "landlock_restrict_self", // entered before execve
    "close_range", // the supervisor keeps only the report; the program nothing past 2
    "setrlimit", // the program's limits, set on itself before execve
    "signalfd4", // the supervisor hears its program's end beside the stop pipe in one wait
];

/// loopd's monitor, beyond the skeleton: start each session's worker from its own binary and
/// end it. A worker passes this list as well as its own until its own sandbox closes, so it
/// holds what the worker calls from `execve` to there: the loader (`arch_prctl` on x86_64, and
/// `mmap(PROT_EXEC)`, which the monitor is not refused, [`SeccompProfile::execs`]), and the
/// worker's own Landlock and seccomp. `prctl` only for `PR_SET_NO_NEW_PRIVS` and
/// `PR_SET_DUMPABLE` besides a thread's name ([`crate::seccomp::conditional`]).
const WORKER_PARENT: &[&str] = &[
    "execve",                  // std's Command: the worker becomes loopd's own binary
    "wait4",                   // the monitor reaps a worker that ended
    "kill",                    // a worker ended (SIGKILL); Landlock scopes signals to its domain
    "seccomp",                 // the worker's own filter, installed at its start
    "landlock_create_ruleset", // the worker's own Landlock domain: its ruleset,
    "landlock_add_rule",       // its own directory and its configuration,
    "landlock_restrict_self",  // entered at its start
];

/// What a session's worker may not call of the skeleton: it makes no socket and connects to
/// none (its peers' connections come from the monitor, `SCM_RIGHTS` on its channel), and
/// serves no listening socket.
const NO_SOCKETS: &[&str] = &["accept", "accept4", "connect"];

/// An ordinary program under the `run` tool (a shell utility, an interpreter).
///
/// Not `setpgid` (nor `setsid`): a program stays in the process group its supervisor leads, so
/// the signal that ends the group at the deadline reaches every process the program started.
const PROGRAM: &[&str] = &[
    "execve", // a shell or `env` starting a command
    // An anonymous file a program may make (a JIT's code, a shell's here-document in newer
    // shells); no daemon makes one.
    "memfd_create",
    "wait4",              // a shell waiting for its command (waitpid)
    "waitid",             // the same in Python's subprocess and newer shells
    "getpgid",            // shells and job control reading a process group
    "getppid",            // the child checking its supervisor is alive; shells ($PPID)
    "getsid",             // shells and `ps`-like tools reading their session
    "getresuid",          // `id`, and shells checking for set-id at start
    "getresgid",          // the same for groups
    "getgroups",          // `id`, `ls -l` deciding what the caller may do
    "prctl",              // interpreters naming threads; the child's PR_SET_PDEATHSIG
    "close_range",        // Python's subprocess closing inherited descriptors
    "chdir",              // `cd` in a shell, `find`, `make -C`
    "fchdir",             // the child entering its working directory; `find`'s walk
    "umask",              // a shell's `umask`, `tar`, `install`
    "sysinfo",            // `sort` and `free` sizing by memory; `uptime`
    "times",              // bash at start and its `times`
    "getrusage",          // `time`, `make`, interpreters' resource module
    "getitimer",          // bash's `read -t`, alarms in scripts
    "setitimer",          // the same
    "sched_getparam",     // glibc's posix_spawn; Python's os module
    "sched_getscheduler", // the same
    "pselect6",           // select() in shells and scripts
    "epoll_create1",      // event loops (Python's asyncio, node)
    "epoll_ctl",          // the same
    "epoll_pwait",        // the same
    "eventfd2",           // the same, waking a loop
    "fstatfs",            // `df`, and coreutils asking what file system holds a file
    "statfs",             // the same by path
    "fchown",             // `cp -p`, `tar`, `install` on the program's own files
    "fchownat",           // the same by path
    "symlinkat",          // `ln -s`
    "truncate",           // `truncate`, a file cut by path
    "copy_file_range",    // `cp` copying in the kernel
    "sendfile",           // `cat` and older `cp` the same way
    "splice",             // `cat` and `tee` between pipes
    "rt_sigsuspend",      // shells waiting for a child's signal
    "rt_sigtimedwait",    // the same with a deadline (the child's supervisor too)
    "membarrier",         // runtimes and JITs (Go, node) at start
    "pkey_alloc",         // node's JIT (V8) keeping its code pages behind a protection key
    "pkey_mprotect",      // the same, marking pages with the key
    "pkey_free",          // the same, giving the key back
    "capget", // node at start, and libcap users reading what they hold (capset stays refused)
    "get_robust_list", // glibc and runtimes reading a thread's futex list
    "fadvise64", // `sort`, `cp`, `tail` telling the kernel how they read
    "msync",  // programs writing mapped files (`sqlite3`, `git`)
    "mincore", // runtimes probing which pages are resident (Go)
    "getxattr", // `ls -l` (ACLs, security labels), `cp -a`
    "lgetxattr", // the same without following a link
    "fgetxattr", // the same on an open file
    "flistxattr", // `cp -a` copying extended attributes
    "listxattr", // the same by path
    "llistxattr", // the same without following a link
];

/// What glibc and the loader call on x86_64 besides.
const PROGRAM_X86_64: &[&str] = &[
    "arch_prctl", // the loader setting a thread's TLS pointer at every program's start
    "vfork",      // posix_spawn in shells and older glibc
    "fork",       // shells, `make`, `xargs`
    "epoll_wait", // epoll_pwait's older form
    "select",     // pselect6's older form
    "getdents",   // getdents64's older form (old static binaries)
    "symlink",    // symlinkat's older form (`ln -s`)
    "creat",      // openat's oldest form
    "chown",      // fchownat's older form
    "lchown",     // the same without following a link
    "getpgrp",    // shells' job control
    "alarm",      // scripts' and tools' timeouts (`timeout`-like)
    "pause",      // a program waiting for a signal
    "time",       // the oldest clock, where the vDSO does not answer
    "dup2",       // a shell's redirections
];
