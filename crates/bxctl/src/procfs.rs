//! What `/proc/<pid>/status` says about a daemon's sandbox: its uid and gid, its seccomp mode,
//! `no_new_privs` and its capability sets, for every thread (Landlock and credentials are per
//! thread, so one thread that escaped would show here).

use std::fs;
use std::path::Path;

use serde::Serialize;

/// The sandbox of one process as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sandbox {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub threads: usize,
    /// The lowest `Seccomp:` of any thread (2 = a filter).
    pub seccomp: u32,
    /// Whether every thread has `NoNewPrivs: 1`.
    pub no_new_privs: bool,
    /// Whether every capability set of every thread is empty.
    pub no_capabilities: bool,
}

impl Sandbox {
    /// Whether it is as confined as a daemon must be.
    pub fn confined(&self) -> bool {
        self.seccomp == 2 && self.no_new_privs && self.no_capabilities
    }
}

struct Status {
    uid: u32,
    gid: u32,
    seccomp: u32,
    no_new_privs: bool,
    no_capabilities: bool,
}

fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
}

fn parse(text: &str) -> Option<Status> {
    let first = |name| field(text, name)?.split_whitespace().next()?.parse().ok();
    let caps = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
    Some(Status {
        uid: first("Uid")?,
        gid: first("Gid")?,
        seccomp: first("Seccomp")?,
        no_new_privs: field(text, "NoNewPrivs")? == "1",
        no_capabilities: caps
            .iter()
            .all(|c| field(text, c).is_some_and(|v| v.chars().all(|ch| ch == '0'))),
    })
}

/// The sandbox of process `pid`, from every thread's status; `None` when it is gone or hidden.
pub fn sandbox(pid: u32) -> Option<Sandbox> {
    let main = parse(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)?;
    let mut s = Sandbox {
        pid,
        uid: main.uid,
        gid: main.gid,
        threads: 0,
        seccomp: main.seccomp,
        no_new_privs: main.no_new_privs,
        no_capabilities: main.no_capabilities,
    };
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let Some(t) = fs::read_to_string(task.path().join("status"))
            .ok()
            .and_then(|text| parse(&text))
        else {
            continue;
        };
        s.threads += 1;
        s.seccomp = s.seccomp.min(t.seccomp);
        s.no_new_privs &= t.no_new_privs;
        s.no_capabilities &= t.no_capabilities;
    }
    Some(s)
}

/// The pids of processes whose executable's name is `name`.
pub fn pids_named(name: &str) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
                && Path::new(&format!("/proc/{pid}/task")).is_dir()
        })
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFINED: &str = "Name:\tbrokerd\nUid:\t990\t990\t990\t990\nGid:\t985\t985\t985\t985\n\
        CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
        CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";

    #[test]
    fn a_confined_status_parses() {
        let s = parse(CONFINED).unwrap();
        assert_eq!((s.uid, s.gid, s.seccomp), (990, 985, 2));
        assert!(s.no_new_privs && s.no_capabilities);
    }

    #[test]
    fn any_capability_or_a_missing_filter_shows() {
        let s = parse(&CONFINED.replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff"))
            .unwrap();
        assert!(!s.no_capabilities);
        let s = parse(&CONFINED.replace("Seccomp:\t2", "Seccomp:\t0")).unwrap();
        assert_eq!(s.seccomp, 0);
        let s = parse(&CONFINED.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")).unwrap();
        assert!(!s.no_new_privs);
    }

    #[test]
    fn this_test_process_is_not_confined() {
        let me = sandbox(std::process::id()).unwrap();
        assert!(me.threads >= 1);
        assert_ne!(me.seccomp, 2, "the test harness runs without a filter");
    }
}
