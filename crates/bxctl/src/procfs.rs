//! A daemon's sandbox as the kernel reports it, summed up over every thread for `bxctl status`
//! (Landlock and credentials are per thread, so one thread that escaped would show here). The
//! parsing is bxharden's `proc_status`, the same the daemons' own tests check themselves with.

use bxharden::proc_status;
use serde::Serialize;

/// The sandbox of one process, over all its threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sandbox {
    pub pid: u32,
    /// The effective uid and gid of the first thread.
    pub uid: u32,
    pub gid: u32,
    pub threads: usize,
    /// The lowest `Seccomp:` of any thread (2 = a filter).
    pub seccomp: u32,
    /// Whether every thread has `NoNewPrivs: 1`.
    pub no_new_privs: bool,
    /// Whether no thread holds or can gain a capability: every set empty, the bounding set
    /// too unless the thread has NoNewPrivs and no root uid.
    pub no_capabilities: bool,
}

impl Sandbox {
    /// Whether it is as confined as a daemon must be.
    pub fn confined(&self) -> bool {
        self.seccomp == 2 && self.no_new_privs && self.no_capabilities
    }
}

/// The sandbox of process `pid`; `None` when it is gone or hidden from the caller.
pub fn sandbox(pid: u32) -> Option<Sandbox> {
    let threads = proc_status::threads(pid).ok()?;
    let first = threads.first()?;
    Some(Sandbox {
        pid,
        uid: first.uids[1],
        gid: first.gids[1],
        threads: threads.len(),
        seccomp: threads.iter().map(|t| t.seccomp).min().unwrap_or(0),
        no_new_privs: threads.iter().all(|t| t.no_new_privs),
        no_capabilities: threads.iter().all(|t| {
            t.caps.iter().all(|(name, mask)| {
                // The bounding set only limits what could be gained: with NoNewPrivs and a uid
                // that is not root nothing can be (no setuid, no file capabilities), so a
                // daemon a normal user started (which cannot empty it) holds none.
                *mask == 0
                    || (*name == "CapBnd" && t.no_new_privs && t.uids.iter().all(|u| *u != 0))
            })
        }),
    })
}

/// loopd's session workers, each with the session it serves, by pid.
pub fn workers_of(monitor: u32) -> Vec<(u32, String)> {
    proc_status::children_running(monitor, "worker")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_process_is_not_confined() {
        let me = sandbox(std::process::id()).unwrap();
        assert!(me.threads >= 1);
        assert_ne!(me.seccomp, 2, "the test harness runs without a filter");
        assert!(!me.confined());
    }

    #[test]
    fn a_process_that_is_gone_has_no_sandbox() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap(); // bounded: `true` ends at once
        assert_eq!(sandbox(pid), None);
    }
}
