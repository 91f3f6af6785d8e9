//! What `/proc/<pid>/task/*/status` says about a process's sandbox, thread by thread: how
//! `bxctl status` shows a daemon's sandbox, and how the daemons' tests check theirs.

use std::collections::BTreeMap;
use std::fmt;
use std::io;

/// The sandbox fields of one thread's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStatus {
    /// The thread id.
    pub tid: u32,
    /// `Seccomp:` 0 none, 1 strict, 2 filter.
    pub seccomp: u32,
    /// `NoNewPrivs:`.
    pub no_new_privs: bool,
    /// `CapInh`, `CapPrm`, `CapEff`, `CapBnd`, `CapAmb`, as masks.
    pub caps: [(&'static str, u64); 5],
    /// `Uid:` real, effective, saved, filesystem.
    pub uids: [u32; 4],
    /// `Gid:` real, effective, saved, filesystem.
    pub gids: [u32; 4],
    /// `Groups:`.
    pub groups: Vec<u32>,
}

const CAPS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];

impl ThreadStatus {
    /// Parse one `status` file's text.
    pub fn parse(tid: u32, text: &str) -> Result<ThreadStatus, String> {
        let fields: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k, v.trim()))
            .collect();
        let get = |k: &str| fields.get(k).copied().ok_or(format!("no {k} line"));
        let ids = |k: &str| -> Result<[u32; 4], String> {
            let v: Vec<u32> = get(k)?
                .split_whitespace()
                .map(|x| x.parse().map_err(|_| format!("{k}: {x}")))
                .collect::<Result<_, _>>()?;
            v.try_into().map_err(|_| format!("{k}: not four ids"))
        };
        let mut caps = [("", 0u64); 5];
        for (i, name) in CAPS.iter().enumerate() {
            let v = u64::from_str_radix(get(name)?, 16).map_err(|e| format!("{name}: {e}"))?;
            caps[i] = (name, v);
        }
        Ok(ThreadStatus {
            tid,
            seccomp: get("Seccomp")?.parse().map_err(|_| "Seccomp".to_owned())?,
            no_new_privs: get("NoNewPrivs")? == "1",
            caps,
            uids: ids("Uid")?,
            gids: ids("Gid")?,
            groups: get("Groups")?
                .split_whitespace()
                .map(|x| x.parse().map_err(|_| format!("Groups: {x}")))
                .collect::<Result<_, _>>()?,
        })
    }

    /// What is wrong with this thread's sandbox, against the expected uid and gid: `Seccomp`
    /// not 2, `NoNewPrivs` not 1, a capability left, another id, a supplementary group.
    pub fn problems(&self, uid: u32, gid: u32) -> Vec<String> {
        let mut out = Vec::new();
        if self.seccomp != 2 {
            out.push(format!("Seccomp: {} (not 2: no filter)", self.seccomp));
        }
        if !self.no_new_privs {
            out.push("NoNewPrivs: 0".to_owned());
        }
        for (name, mask) in self.caps {
            if mask != 0 {
                out.push(format!("{name}: {mask:016x}"));
            }
        }
        if self.uids != [uid; 4] {
            out.push(format!("Uid: {:?}, not {uid}", self.uids));
        }
        if self.gids != [gid; 4] {
            out.push(format!("Gid: {:?}, not {gid}", self.gids));
        }
        if self.groups.iter().any(|g| *g != gid) {
            out.push(format!("Groups: {:?}", self.groups));
        }
        out
    }
}

impl fmt::Display for ThreadStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let caps_zero = self.caps.iter().all(|(_, m)| *m == 0);
        write!(
            f,
            "thread {}: uid {} gid {}, Seccomp {}, NoNewPrivs {}, capabilities {}",
            self.tid,
            self.uids[1],
            self.gids[1],
            self.seccomp,
            u8::from(self.no_new_privs),
            if caps_zero { "none" } else { "SOME" }
        )
    }
}

/// Every thread of process `pid`, from `/proc/<pid>/task/*/status`.
pub fn threads(pid: u32) -> io::Result<Vec<ThreadStatus>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let entry = entry?;
        let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let text = match std::fs::read_to_string(entry.path().join("status")) {
            Ok(t) => t,
            // The thread ended between the listing and the read: the kernel says ENOENT or
            // ESRCH, depending on how far its exit had gone.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        out.push(
            ThreadStatus::parse(tid, &text)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
        );
    }
    out.sort_by_key(|t| t.tid);
    Ok(out)
}

/// The processes whose parent is `parent` and whose first argument is `command`, each with
/// the value of its `--session` option: loopd's session workers (`loopd worker --session ID`),
/// for `bxctl status`, the tests and the benchmarks alike. Sorted by pid.
pub fn children_running(parent: u32, command: &str) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.get(1).map(String::as_str) != Some(command) {
            continue;
        }
        let session = args
            .iter()
            .position(|a| a == "--session")
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_default();
        out.push((pid, session));
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SANDBOXED: &str = "Name:\tbrokerd\nUid:\t990\t990\t990\t990\nGid:\t990\t990\t990\t990\n\
        Groups:\t\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
        CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n\
        NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t2\n";

    #[test]
    fn a_sandboxed_thread_has_no_problems() {
        let t = ThreadStatus::parse(7, SANDBOXED).unwrap();
        assert_eq!(t.problems(990, 990), Vec::<String>::new());
        assert_eq!(
            t.to_string(),
            "thread 7: uid 990 gid 990, Seccomp 2, NoNewPrivs 1, capabilities none"
        );
    }

    #[test]
    fn each_gap_is_named() {
        let text = SANDBOXED
            .replace("Seccomp:\t2", "Seccomp:\t0")
            .replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")
            .replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff")
            .replace("Groups:\t", "Groups:\t0");
        let t = ThreadStatus::parse(7, &text).unwrap();
        let p = t.problems(990, 990);
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p.contains(&"CapBnd: 000001ffffffffff".to_owned()));
        assert_eq!(t.problems(991, 990).len(), 5);
    }

    #[test]
    fn this_test_process_is_not_sandboxed() {
        let me = threads(std::process::id()).unwrap();
        assert!(!me.is_empty());
        assert!(me.iter().all(|t| t.seccomp == 0 || t.seccomp == 2));
    }

    #[test]
    fn threads_that_end_while_they_are_read_are_left_out_not_an_error() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let churn = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let short: Vec<_> = (0..8).map(|_| std::thread::spawn(|| {})).collect();
                    for t in short {
                        t.join().unwrap(); // bounded: each thread ends at once
                    }
                }
            })
        };
        let reads: Vec<_> = (0..2000).map(|_| threads(std::process::id())).collect();
        stop.store(true, Ordering::SeqCst);
        churn.join().unwrap(); // bounded: it ends once `stop` is set
        for r in reads {
            assert!(!r.unwrap().is_empty());
        }
    }

    #[test]
    fn a_truncated_status_is_an_error() {
        assert!(ThreadStatus::parse(1, "Name:\tx\nUid:\t1\t1\n").is_err());
    }
}
