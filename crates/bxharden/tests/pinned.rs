//! The seccomp lists are pinned: each profile's list on each architecture is compared with its
//! checked-in copy in `tests/pinned/<profile>.<arch>.txt`, so a change to a list shows in review
//! as a change to that file. After changing a list on purpose, regenerate them with
//! `BXH_PIN_UPDATE=1 cargo test -p bxharden --test pinned` and commit both.

use std::path::PathBuf;

use bxharden::seccomp::describe;
use bxharden::{Arch, SeccompProfile};

fn pinned(profile: SeccompProfile, arch: Arch) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/pinned")
        .join(format!("{}.{}.txt", profile.name(), arch.name()))
}

#[test]
fn every_seccomp_list_matches_its_pinned_copy() {
    let update = std::env::var_os("BXH_PIN_UPDATE").is_some();
    let mut changed = Vec::new();
    for profile in SeccompProfile::ALL {
        for arch in Arch::ALL {
            let list = describe(profile, arch).join("\n") + "\n";
            let path = pinned(profile, arch);
            println!("{}:\n{list}", path.display());
            let old = std::fs::read_to_string(&path).unwrap_or_default();
            if old != list {
                if update {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(&path, &list).unwrap();
                } else {
                    changed.push(path.display().to_string());
                }
            }
        }
    }
    assert!(
        changed.is_empty(),
        "these lists differ from their pinned copies (review the change, then run with \
         BXH_PIN_UPDATE=1 and commit): {changed:?}"
    );
}

/// What no daemon may ever call, whatever its list says.
const NEVER: [&str; 16] = [
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "bpf",
    "keyctl",
    "add_key",
    "userfaultfd",
    "perf_event_open",
    "kexec_load",
    "init_module",
    "finit_module",
    "unshare",
    "setns",
];

#[test]
fn no_list_has_a_forbidden_call() {
    for profile in SeccompProfile::ALL {
        for arch in Arch::ALL {
            let list = profile.syscalls(arch);
            for name in NEVER {
                assert!(!list.contains(name), "{profile} on {}: {name}", arch.name());
            }
            // loopd's monitor starts its own binary as each session's worker.
            let execs = matches!(
                profile,
                SeccompProfile::Brokerd { run_tool: true }
                    | SeccompProfile::RunChild
                    | SeccompProfile::Loopd
            );
            assert_eq!(profile.execs(), execs, "{profile}");
            for name in ["execve", "execveat"] {
                assert_eq!(
                    list.contains(name),
                    execs && name == "execve",
                    "{profile} on {}: {name}",
                    arch.name()
                );
            }
            // Only brokerd with the run tool and loopd's monitor install a sandbox after their
            // own: the run tool's child's, and each worker's, which passes the monitor's list.
            let installs = matches!(
                profile,
                SeccompProfile::Brokerd { run_tool: true } | SeccompProfile::Loopd
            );
            for name in [
                "seccomp",
                "landlock_create_ruleset",
                "landlock_add_rule",
                "landlock_restrict_self",
            ] {
                assert_eq!(list.contains(name), installs, "{profile}: {name}");
            }
            assert!(
                list.contains("clone3"),
                "{profile}: clone3 stays allowed in the main list"
            );
            assert!(
                !list.contains("clone"),
                "{profile}: clone only with its flag check"
            );
            assert!(!list.contains("socket"), "{profile}: socket only by family");
        }
    }
}

#[test]
fn a_session_worker_makes_no_socket_and_connects_to_none() {
    for arch in Arch::ALL {
        let list = SeccompProfile::LoopWorker.syscalls(arch);
        for name in [
            "socket",
            "socketpair",
            "connect",
            "accept",
            "accept4",
            "bind",
            "listen",
        ] {
            assert!(!list.contains(name), "{}: {name}", arch.name());
        }
        let d = describe(SeccompProfile::LoopWorker, arch);
        assert!(
            !d.iter().any(|l| l.starts_with("socket")),
            "{}: {d:?}",
            arch.name()
        );
        assert!(d.contains(&"mmap/mprotect(PROT_EXEC) -> EACCES".to_owned()));
        for name in ["recvmsg", "sendmsg"] {
            assert!(list.contains(name), "its channel, with SCM_RIGHTS: {name}");
        }
        // Filters stack: what a worker calls passes the monitor's list too.
        let monitor = SeccompProfile::Loopd.syscalls(arch);
        let missing: Vec<_> = list.difference(&monitor).collect();
        assert!(missing.is_empty(), "{}: {missing:?}", arch.name());
    }
}

/// Every call that acts on a process named by its pid.
const TAKES_A_PID: [&str; 21] = [
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_send_signal",
    "pidfd_open",
    "pidfd_getfd",
    "prlimit64",
    "sched_setaffinity",
    "sched_setparam",
    "sched_setscheduler",
    "sched_setattr",
    "setpriority",
    "ioprio_set",
    "process_madvise",
    "process_mrelease",
    "migrate_pages",
    "move_pages",
    "kcmp",
    "getpriority",
];

#[test]
fn a_call_that_takes_a_pid_is_allowed_on_the_caller_only() {
    for profile in SeccompProfile::ALL {
        for arch in Arch::ALL {
            let plain = profile.syscalls(arch);
            let pid_calls = profile.pid_calls();
            for name in TAKES_A_PID.iter().chain(pid_calls.iter()) {
                // loopd's monitor ends its workers with SIGKILL: Landlock scopes its signals to
                // its own domain, which holds its workers and nothing else of loopd's user.
                if profile == SeccompProfile::Loopd && *name == "kill" {
                    continue;
                }
                assert!(
                    !plain.contains(name),
                    "{profile} on {}: {name} with any pid",
                    arch.name()
                );
            }
            let d = describe(profile, arch);
            for name in &pid_calls {
                // Only pid 0 and the caller's own, nothing else; a program under the `run`
                // tool may not even `kill(0, ..)`: its group holds the supervisor that ends it.
                let forms: Vec<&String> = d
                    .iter()
                    .filter(|l| l.split('(').next() == Some(name))
                    .collect();
                let own = format!("{name}(pid self)");
                let zero = format!("{name}(pid 0)");
                let wanted: Vec<&String> = if profile == SeccompProfile::RunChild && *name == "kill"
                {
                    vec![&own]
                } else {
                    vec![&zero, &own]
                };
                assert_eq!(forms, wanted, "{profile} on {}", arch.name());
            }
            for name in TAKES_A_PID {
                let on = d.iter().any(|l| l.split('(').next() == Some(name));
                let monitor_kill = profile == SeccompProfile::Loopd && name == "kill";
                assert_eq!(
                    on,
                    pid_calls.contains(name) || monitor_kill,
                    "{profile}: {name}"
                );
            }
        }
        for name in ["tgkill", "prlimit64"] {
            assert!(profile.pid_calls().contains(name), "{profile}: {name}");
        }
        let starts_programs = matches!(
            profile,
            SeccompProfile::Brokerd { run_tool: true } | SeccompProfile::RunChild
        );
        assert_eq!(
            profile.pid_calls().contains("kill"),
            starts_programs,
            "{profile}"
        );
    }
}

#[test]
fn brokerds_list_with_the_run_tool_holds_the_childs() {
    // Filters stack: what the child may call must pass brokerd's filter too.
    for arch in Arch::ALL {
        let child = SeccompProfile::RunChild.syscalls(arch);
        let parent = SeccompProfile::Brokerd { run_tool: true }.syscalls(arch);
        let missing: Vec<_> = child.difference(&parent).collect();
        assert!(missing.is_empty(), "{}: {missing:?}", arch.name());
        let child = describe(SeccompProfile::RunChild, arch);
        let parent = describe(SeccompProfile::Brokerd { run_tool: true }, arch);
        for c in &child {
            // A refusal with an errno narrows; the parent need not hold it.
            if c.ends_with("-> EACCES") {
                continue;
            }
            let name = c.split('(').next().unwrap();
            assert!(
                parent.contains(c) || parent.iter().any(|p| p == name),
                "{}: {c}",
                arch.name()
            );
        }
    }
}

#[test]
fn only_network_profiles_open_inet_sockets() {
    for profile in SeccompProfile::ALL {
        let d = describe(profile, Arch::X86_64);
        assert_eq!(
            d.contains(&"socket(AF_INET)".to_owned()),
            profile.inet(),
            "{profile}"
        );
        assert_eq!(
            d.contains(&"socket(AF_UNIX)".to_owned()),
            profile != SeccompProfile::LoopWorker,
            "{profile}"
        );
    }
    assert!(SeccompProfile::Gatewayd.inet());
    assert!(SeccompProfile::Inferproxy.inet());
    // Both look names up over TCP: no datagram ever leaves them.
    assert!(SeccompProfile::Inferproxy.inet_stream_only());
    assert!(SeccompProfile::Gatewayd.inet_stream_only());
    assert!(SeccompProfile::Memoryd { remote: true }.inet());
    assert!(!SeccompProfile::Memoryd { remote: false }.inet());
    assert!(!SeccompProfile::Loopd.inet());
    assert!(!SeccompProfile::Brokerd { run_tool: true }.inet());
    // The Matrix channel: TCP to its homeserver only, resolved before the sandbox.
    assert!(SeccompProfile::Channeld.inet());
    assert!(SeccompProfile::Channeld.inet_stream_only());
    let channeld = SeccompProfile::Channeld.syscalls(Arch::X86_64);
    assert!(!channeld.contains("sendmmsg") && !channeld.contains("recvmmsg"));
}
