//! seccomp: the system calls a daemon may make, from its list in [`crate::profiles`].
//!
//! Two filters, installed on every thread at once (`TSYNC`), last of all the steps:
//!
//! 1. a small one that makes `clone3` fail with `ENOSYS`, so glibc falls back to `clone`, whose
//!    flags a filter can see (`clone3` passes them in memory);
//! 2. the allow-list, default `KillProcess` (or `EPERM` and a kernel log line with
//!    `seccomp_log`). It still *allows* `clone3`: when filters stack the most restrictive answer
//!    wins, so a kill there would beat the first filter's `ENOSYS` and kill the first thread spawn.
//!
//! `clone` is allowed without any `CLONE_NEW*` flag (and in a session's worker only with
//! `CLONE_THREAD`: a thread, never a process, [`SeccompProfile::threads_only`]); `socket` and `socketpair` only for the
//! profile's families; the calls that take a pid ([`SeccompProfile::pid_calls`]) only with pid 0
//! or the caller's own. The caller's pid is known only in the process the filter confines, so
//! the compiled list holds [`SELF_PID`] there and [`bind_self`] puts the real pid in just before
//! the filter is installed: by `apply` in the daemon, by the child itself after `fork`.
//! A profile whose network sockets are stream only (inferproxy) gets a third filter, built like
//! the first: `socket(AF_INET*)` of any type but `SOCK_STREAM`, and a send with `MSG_FASTOPEN`,
//! fail with `EACCES` (an errno, not a kill, so that glibc's resolver, which tries a datagram
//! socket, fails a lookup instead of killing the daemon).

use seccompiler::{BpfProgram, TargetArch};

use crate::profiles::{Arch, SeccompProfile};

/// Every `CLONE_NEW*` flag `clone` takes (`CLONE_NEWTIME` shares its bit with the exit signal in
/// `clone`'s flags and exists only for `clone3` and `unshare`, which are not reachable).
pub const CLONE_NEW_MASK: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// The namespaces the `run` tool's child may enter, and only together: `unshare`'s one allowed
/// argument on brokerd's list with the `run` tool.
pub const RUN_NAMESPACES: u64 = (libc::CLONE_NEWUSER | libc::CLONE_NEWNET) as u64;

/// The stand-in for the caller's own pid in a compiled list, above any pid the kernel hands out
/// (`pid_max` is at most 2^22) and unlike any other constant of a list (a test checks).
pub const SELF_PID: u32 = 0x7ffe_5e1f;

// Above every pid the kernel can hand out (`PID_MAX_LIMIT` is 2^22).
const _: () = assert!(SELF_PID > 1 << 22);

/// What the list does with a system call that is not on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// Kill the whole process (`SIGSYS`): production.
    KillProcess,
    /// Fail with `EPERM` and log a line in the kernel log: tuning a list.
    LogEperm,
}

/// Why a filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// This architecture has no lists.
    #[error("seccomp: no system call lists for {}", std::env::consts::ARCH)]
    Arch,
    /// The list did not compile (an unknown system call name, for one).
    #[error("seccomp: the list does not compile: {0}")]
    Compile(String),
    /// The kernel refused the filter.
    #[error("seccomp: the kernel refused the filter: {0}")]
    Install(#[source] std::io::Error),
    /// `TSYNC` could not put the filter on thread `tid`.
    #[error("seccomp: cannot put the filter on thread {0}")]
    Sync(i64),
    /// The compiled list did not hold the caller's pid where the pid calls need it.
    #[error("seccomp: the list holds the caller's pid in {found} places, not {wanted}")]
    SelfPid { found: usize, wanted: usize },
}

/// The two compiled filters of one profile.
#[derive(Debug)]
pub struct Filters {
    /// `clone3` → `ENOSYS`.
    pub clone3: BpfProgram,
    /// The allow-list.
    pub main: BpfProgram,
    /// How many system calls the allow-list names (with conditions or without).
    pub syscall_count: usize,
    /// The calls refused with `EACCES` rather than killed ([`refused_rules`]): an executable
    /// mapping in a daemon that starts no program; non-stream `AF_INET*` sockets and
    /// `MSG_FASTOPEN` sends for a profile whose network sockets are stream only; every `socket`
    /// for the `run` tool's child.
    pub refused: Option<BpfProgram>,
}

/// The socket types a stream-only profile is refused: every value of the type's low four bits
/// (`SOCK_TYPE_MASK`) but `SOCK_STREAM`, so no type the kernel adds later slips through.
const NOT_STREAM: [u64; 15] = [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// The third filter's rules, each refused with `EACCES`:
///
/// - `mmap` and `mprotect` asking for `PROT_EXEC`, in every daemon that starts no program: all
///   the code a daemon runs is mapped before its sandbox closes, so a new executable mapping
///   after it is only what an exploit would make (OpenSSH's sandbox masks it the same way). An
///   errno rather than a kill, so that a C library that would load a module (an NSS module for
///   a name lookup) carries on without it. brokerd with the `run` tool and the tool's child
///   keep it: the programs it starts inherit its filters, and their loader maps their code.
/// - For a stream-only profile, non-stream `AF_INET*` sockets and `MSG_FASTOPEN` sends.
/// - For the `run` tool's child, every `socket` (it may make no socket of any family: an
///   `AF_UNIX` one could connect by path to a socket brokerd's user is the client of, such as
///   `gateway.sock`, which Landlock before ABI 9 does not stop). An errno, not a kill, so that
///   a C library asking nscd for a user name falls back to the files; `socketpair` stays.
fn refused_rules(profile: SeccompProfile) -> Vec<String> {
    if profile == SeccompProfile::RunChild {
        return vec!["{\"syscall\":\"socket\"}".to_owned()];
    }
    let mut rules = Vec::new();
    if !profile.execs() {
        let exec = libc::PROT_EXEC as u32;
        for call in ["mmap", "mprotect"] {
            rules.push(format!(
                "{{\"syscall\":\"{call}\",\"args\":[{{\"index\":2,\"type\":\"dword\",\"op\":{{\"masked_eq\":{exec}}},\"val\":{exec}}}]}}"
            ));
        }
    }
    if !profile.inet_stream_only() {
        return rules;
    }
    for (family, _) in profile.socket_families() {
        if family == libc::AF_UNIX {
            continue;
        }
        for t in NOT_STREAM {
            rules.push(format!(
                "{{\"syscall\":\"socket\",\"args\":[{{\"index\":0,\"type\":\"dword\",\"op\":\"eq\",\"val\":{family}}},{{\"index\":1,\"type\":\"dword\",\"op\":{{\"masked_eq\":15}},\"val\":{t}}}]}}"
            ));
        }
    }
    let fastopen = libc::MSG_FASTOPEN as u32;
    for (call, arg) in [("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3)] {
        rules.push(format!(
            "{{\"syscall\":\"{call}\",\"args\":[{{\"index\":{arg},\"type\":\"dword\",\"op\":{{\"masked_eq\":{fastopen}}},\"val\":{fastopen}}}]}}"
        ));
    }
    rules
}

fn target(arch: Arch) -> TargetArch {
    match arch {
        Arch::X86_64 => TargetArch::x86_64,
        Arch::Aarch64 => TargetArch::aarch64,
    }
}

/// A system call allowed only when one argument has one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditional {
    /// The system call.
    pub call: &'static str,
    /// Which argument (from 0).
    pub arg: u8,
    /// The value it must have (its low 32 bits: every argument checked here is an `int` or an
    /// `unsigned int` in the kernel, which ignores the upper half).
    pub value: u64,
    /// The value's name, for people.
    pub label: &'static str,
}

const fn cond(call: &'static str, arg: u8, value: u64, label: &'static str) -> Conditional {
    Conditional {
        call,
        arg,
        value,
        label,
    }
}

/// The `ioctl` requests allowed: descriptor flags, non-blocking mode, bytes waiting, and the
/// terminal queries `isatty` and programs make. Not `TIOCSTI` (typing into a terminal the daemon
/// was started from), not any device's own requests.
// The request type is `c_ulong` on glibc and `c_int` on musl: the casts are for the latter.
#[allow(clippy::unnecessary_cast)]
const IOCTLS: [(u64, &str); 7] = [
    (libc::FIONBIO as u64, "FIONBIO"),
    (libc::FIOCLEX as u64, "FIOCLEX"),
    (libc::FIONCLEX as u64, "FIONCLEX"),
    (libc::FIONREAD as u64, "FIONREAD"),
    (libc::TCGETS as u64, "TCGETS"),
    (libc::TIOCGWINSZ as u64, "TIOCGWINSZ"),
    (libc::TIOCGPGRP as u64, "TIOCGPGRP"),
];

/// `FICLONE` (`_IOW(0x94, 9, int)`): clone a file's extents into another, both already open.
const FICLONE: u64 = 0x4004_9409;

/// The system calls allowed only with given arguments: `socket` and `socketpair` by the
/// profile's families, `prctl` only to name a thread (`PR_SET_NAME`, `PR_GET_NAME`: std names
/// its threads), `ioctl` only with the requests of [`IOCTLS`], the calls that take a pid only
/// with pid 0 or [`SELF_PID`]. A name on the profile's plain list is allowed whatever its
/// arguments (`prctl` where programs are started).
pub fn conditional(profile: SeccompProfile) -> Vec<Conditional> {
    let mut out = Vec::new();
    for call in profile.pid_calls() {
        // A program under the `run` tool shares the process group of the supervisor that ends
        // it at the deadline: `kill(0, ..)` would reach that supervisor too.
        if !(profile == SeccompProfile::RunChild && call == "kill") {
            out.push(cond(call, 0, 0, "pid 0"));
        }
        out.push(cond(call, 0, u64::from(SELF_PID), "pid self"));
    }
    if profile == (SeccompProfile::Brokerd { run_tool: true }) {
        // The `run` tool's child enters a user and network namespace of its own before its
        // sandbox closes (no network at all, even loopback). Exactly these two flags: no mount,
        // pid or other namespace. brokerd itself, being threaded, cannot unshare a user
        // namespace (EINVAL), so the rule gives the daemon nothing.
        out.push(cond(
            "unshare",
            0,
            RUN_NAMESPACES,
            "CLONE_NEWUSER|CLONE_NEWNET",
        ));
    }
    for (family, name) in profile.socket_families() {
        out.push(cond("socket", 0, family as u64, name));
        out.push(cond("socketpair", 0, family as u64, name));
    }
    out.push(cond("prctl", 0, libc::PR_SET_NAME as u64, "PR_SET_NAME"));
    if profile == SeccompProfile::Loopd {
        // A worker at its start, under the monitor's list: no new privileges before its
        // Landlock, and not dumpable.
        out.push(cond(
            "prctl",
            0,
            libc::PR_SET_NO_NEW_PRIVS as u64,
            "PR_SET_NO_NEW_PRIVS",
        ));
        out.push(cond(
            "prctl",
            0,
            libc::PR_SET_DUMPABLE as u64,
            "PR_SET_DUMPABLE",
        ));
    }
    out.push(cond("prctl", 0, libc::PR_GET_NAME as u64, "PR_GET_NAME"));
    for (request, name) in IOCTLS {
        out.push(cond("ioctl", 1, request, name));
    }
    if profile.starts_programs() {
        // What `cp` asks first (a reflink copy, on a file it opened): on file systems that
        // cannot, the kernel says so and it copies by hand.
        out.push(cond("ioctl", 1, FICLONE, "FICLONE"));
    }
    out
}

/// A profile's list as people read it, one entry a line, sorted: a plain name, or a name with
/// its condition (`clone(no CLONE_NEW*)`, `socket(AF_UNIX)`, `ioctl(FIONBIO)`). The pin test
/// compares it with `tests/pinned/<profile>.<arch>.txt`.
pub fn describe(profile: SeccompProfile, arch: Arch) -> Vec<String> {
    let plain = profile.syscalls(arch);
    let mut out: Vec<String> = plain.iter().map(|n| (*n).to_owned()).collect();
    out.push(if profile.threads_only() {
        "clone(CLONE_THREAD, no CLONE_NEW*)".to_owned()
    } else {
        "clone(no CLONE_NEW*)".to_owned()
    });
    for c in conditional(profile) {
        if !plain.contains(c.call) {
            out.push(format!("{}({})", c.call, c.label));
        }
    }
    if profile == SeccompProfile::RunChild {
        out.push("socket(any family) -> EACCES".to_owned());
    }
    if !profile.execs() {
        out.push("mmap/mprotect(PROT_EXEC) -> EACCES".to_owned());
    }
    if profile.inet_stream_only() {
        out.push("socket(AF_INET*, not SOCK_STREAM) -> EACCES".to_owned());
        out.push("sendto/sendmsg/sendmmsg(MSG_FASTOPEN) -> EACCES".to_owned());
    }
    out.sort();
    out
}

/// The rules of a profile as `seccompiler`'s JSON, which resolves the names for `arch` (so a
/// name that does not exist there is an error on any build machine).
pub fn rules_json(profile: SeccompProfile, arch: Arch, mismatch: Mismatch) -> String {
    let mut rules: Vec<String> = profile
        .syscalls(arch)
        .into_iter()
        .map(|name| format!("{{\"syscall\":\"{name}\"}}"))
        .collect();
    if profile.threads_only() {
        // A thread, never a process: CLONE_THREAD set (with no CLONE_NEW* flag), so nothing it
        // starts outlives its end or holds its descriptors past it.
        let thread = libc::CLONE_THREAD as u64;
        rules.push(format!(
            "{{\"syscall\":\"clone\",\"args\":[{{\"index\":0,\"type\":\"qword\",\"op\":{{\"masked_eq\":{CLONE_NEW_MASK}}},\"val\":0}},{{\"index\":0,\"type\":\"qword\",\"op\":{{\"masked_eq\":{thread}}},\"val\":{thread}}}]}}"
        ));
    } else {
        rules.push(format!(
            "{{\"syscall\":\"clone\",\"args\":[{{\"index\":0,\"type\":\"qword\",\"op\":{{\"masked_eq\":{CLONE_NEW_MASK}}},\"val\":0}}]}}"
        ));
    }
    let plain = profile.syscalls(arch);
    for c in conditional(profile) {
        if plain.contains(c.call) {
            continue; // allowed whatever its arguments
        }
        rules.push(format!(
            "{{\"syscall\":\"{}\",\"args\":[{{\"index\":{},\"type\":\"dword\",\"op\":\"eq\",\"val\":{}}}]}}",
            c.call, c.arg, c.value
        ));
    }
    let mismatch = match mismatch {
        Mismatch::KillProcess => "\"kill_process\"".to_owned(),
        Mismatch::LogEperm => format!("{{\"errno\":{}}}", libc::EPERM),
    };
    let refused = refused_rules(profile);
    let refused = if refused.is_empty() {
        String::new()
    } else {
        format!(
            ",\"refused\":{{\"mismatch_action\":\"allow\",\"match_action\":{{\"errno\":{}}},\"filter\":[{}]}}",
            libc::EACCES,
            refused.join(",")
        )
    };
    format!(
        "{{\"main\":{{\"mismatch_action\":{mismatch},\"match_action\":\"allow\",\"filter\":[{}]}},\
         \"clone3\":{{\"mismatch_action\":\"allow\",\"match_action\":{{\"errno\":{}}},\"filter\":[{{\"syscall\":\"clone3\"}}]}}{refused}}}",
        rules.join(","),
        libc::ENOSYS
    )
}

/// The calls that change a file's mode or owner, as `arch` names them: Landlock does not govern
/// them, so a process under a daemon's uid could make the daemon's own files (its audit chain,
/// its directory) open to everyone. [`ChildSandbox::refusing`](crate::ChildSandbox::refusing)
/// refuses them to a child that has no file of its own to change (a declared tool's server).
pub fn mode_changes(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => &[
            "chmod", "fchmod", "fchmodat", "chown", "fchown", "fchownat", "lchown",
        ],
        Arch::Aarch64 => &["fchmod", "fchmodat", "fchown", "fchownat"],
    }
}

/// A filter that refuses `calls` with `EACCES` and lets everything else through (to the next
/// filter), compiled for `arch`.
pub fn refusal(calls: &[&str], arch: Arch) -> Result<BpfProgram, SeccompError> {
    let rules: Vec<String> = calls
        .iter()
        .map(|c| format!("{{\"syscall\":\"{c}\"}}"))
        .collect();
    let json = format!(
        "{{\"refused\":{{\"mismatch_action\":\"allow\",\"match_action\":{{\"errno\":{}}},\"filter\":[{}]}}}}",
        libc::EACCES,
        rules.join(",")
    );
    let mut map = seccompiler::compile_from_json(json.as_bytes(), target(arch))
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    map.remove("refused")
        .ok_or_else(|| SeccompError::Compile("the filter of refused calls is missing".to_owned()))
}

/// Compile a profile's filters for `arch`.
pub fn compile(
    profile: SeccompProfile,
    arch: Arch,
    mismatch: Mismatch,
) -> Result<Filters, SeccompError> {
    let json = rules_json(profile, arch, mismatch);
    let mut map = seccompiler::compile_from_json(json.as_bytes(), target(arch))
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    let (Some(clone3), Some(main)) = (map.remove("clone3"), map.remove("main")) else {
        return Err(SeccompError::Compile("a filter is missing".to_owned()));
    };
    let refused = map.remove("refused");
    if refused.is_none() && !refused_rules(profile).is_empty() {
        return Err(SeccompError::Compile(
            "the filter of refused calls is missing".to_owned(),
        ));
    }
    // Every name on the list, with a condition or without.
    let mut names = profile.syscalls(arch);
    names.insert("clone");
    // The pid calls are conditional on every profile, so no plain name hides their condition.
    debug_assert!(profile.pid_calls().is_disjoint(&names));
    names.extend(conditional(profile).into_iter().map(|c| c.call));
    let syscall_count = names.len();
    Ok(Filters {
        clone3,
        main,
        syscall_count,
        refused,
    })
}

/// Put `pid` where `program` holds [`SELF_PID`]; how many places. No allocation: the child
/// calls it after `fork` on its own copy.
pub fn bind_self(program: &mut [libc::sock_filter], pid: u32) -> usize {
    let mut n = 0;
    for ins in program.iter_mut() {
        if ins.k == SELF_PID {
            ins.k = pid;
            n += 1;
        }
    }
    n
}

/// How many places of a profile's list hold [`SELF_PID`].
pub fn self_pid_places(profile: SeccompProfile) -> usize {
    profile.pid_calls().len()
}

/// A compiled program as the kernel's `struct sock_filter` (the same layout; `Copy`, so a child
/// can copy it onto its stack without allocating).
pub fn to_kernel(program: &BpfProgram) -> Vec<libc::sock_filter> {
    program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const libc::sock_filter,
}

/// Install one filter on the calling thread only, with no allocation: for a child between
/// `fork` and `execve`. `PR_SET_NO_NEW_PRIVS` must be set first.
pub fn install_here(program: &[libc::sock_filter], log: bool) -> std::io::Result<()> {
    let prog = SockFprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_ptr(),
    };
    let flags: libc::c_ulong = if log {
        libc::SECCOMP_FILTER_FLAG_LOG
    } else {
        0
    };
    // SAFETY: as in `install`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &prog as *const SockFprog,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn install(program: &[libc::sock_filter], log: bool) -> Result<(), SeccompError> {
    let prog = SockFprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_ptr(),
    };
    let mut flags = libc::SECCOMP_FILTER_FLAG_TSYNC;
    if log {
        flags |= libc::SECCOMP_FILTER_FLAG_LOG;
    }
    // SAFETY: the kernel copies the program from `prog`, which points into `program`, alive for
    // the call; the flags are valid for SECCOMP_SET_MODE_FILTER.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &prog as *const SockFprog,
        )
    };
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(SeccompError::Sync(rc)),
        _ => Err(SeccompError::Install(std::io::Error::last_os_error())),
    }
}

/// Install a profile's two filters on every thread of the process. `PR_SET_NO_NEW_PRIVS` must be
/// set already (Landlock's step sets it). Returns how many system calls the list names.
pub fn apply(profile: SeccompProfile, mismatch: Mismatch) -> Result<usize, SeccompError> {
    let arch = Arch::current().ok_or(SeccompError::Arch)?;
    let filters = compile(profile, arch, mismatch)?;
    let log = mismatch == Mismatch::LogEperm;
    let mut main = to_kernel(&filters.main);
    let wanted = self_pid_places(profile);
    let found = bind_self(&mut main, std::process::id());
    if found != wanted {
        return Err(SeccompError::SelfPid { found, wanted });
    }
    install(&to_kernel(&filters.clone3), log)?;
    if let Some(refused) = &filters.refused {
        install(&to_kernel(refused), log)?;
    }
    install(&main, log)?;
    Ok(filters.syscall_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_compiles_on_every_architecture() {
        for profile in SeccompProfile::ALL {
            for arch in Arch::ALL {
                for mismatch in [Mismatch::KillProcess, Mismatch::LogEperm] {
                    let f = compile(profile, arch, mismatch)
                        .unwrap_or_else(|e| panic!("{profile} on {}: {e}", arch.name()));
                    assert!(!f.main.is_empty());
                    assert!(!f.clone3.is_empty());
                }
            }
        }
    }

    #[test]
    fn the_self_pid_stands_only_where_a_pid_call_needs_it() {
        for profile in SeccompProfile::ALL {
            for arch in Arch::ALL {
                let f = compile(profile, arch, Mismatch::KillProcess).unwrap();
                let mut main = to_kernel(&f.main);
                assert_eq!(
                    bind_self(&mut main, 4242),
                    self_pid_places(profile),
                    "{profile} on {}",
                    arch.name()
                );
                assert!(main.iter().all(|i| i.k != SELF_PID));
                let mut clone3 = to_kernel(&f.clone3);
                assert_eq!(bind_self(&mut clone3, 4242), 0);
            }
        }
    }

    #[test]
    fn an_unknown_name_does_not_compile() {
        let e = seccompiler::compile_from_json(
            &b"{\"m\":{\"mismatch_action\":\"allow\",\"match_action\":\"allow\",\"filter\":[{\"syscall\":\"open\"}]}}"[..],
            TargetArch::aarch64,
        )
        .unwrap_err();
        assert!(e.to_string().contains("open"), "{e}");
    }

    #[test]
    fn the_clone_mask_holds_every_namespace_flag() {
        for flag in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            assert_eq!(CLONE_NEW_MASK & flag as u64, flag as u64);
        }
        let thread = libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID;
        assert_eq!(CLONE_NEW_MASK & thread as u64, 0, "threads stay allowed");
        assert_eq!(
            CLONE_NEW_MASK & libc::SIGCHLD as u64,
            0,
            "fork stays allowed"
        );
    }
}
