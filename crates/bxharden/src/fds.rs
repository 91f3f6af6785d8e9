//! The jailer's first step: a daemon starts with the descriptors it expects and no others.
//! Landlock and seccomp confine what a process may open and call, not what it holds already: a
//! descriptor inherited from whoever started the daemon (a directory of another's state, a
//! socket to another daemon, a file opened for writing) would pass through both. So before
//! anything else, every descriptor but stdin, stdout, stderr (the journal stream under systemd)
//! and the listeners systemd activated (`LISTEN_PID` this process, `LISTEN_FDS` from 3) is
//! closed, and each is logged once the logger is up.

use std::os::fd::RawFd;

/// The most activated listeners believed: more than any daemon declares sockets.
const MAX_ACTIVATED: RawFd = 64;

/// The runbook entry of a closed descriptor.
pub const INHERITED_ANCHOR: &str = "descriptor-inherited";

/// The first activated descriptor (`SD_LISTEN_FDS_START`).
const FIRST_ACTIVATED: RawFd = 3;

/// One descriptor closed: its number and what it was (`pipe:[123]`, a path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    pub fd: RawFd,
    pub what: String,
}

/// The descriptors kept: 0 to 2, and `3..3+LISTEN_FDS` when `LISTEN_PID` is this process.
fn kept(fd: RawFd) -> bool {
    if fd <= 2 {
        return true;
    }
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        == Some(std::process::id());
    let n = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.trim().parse::<RawFd>().ok())
        .unwrap_or(0)
        .clamp(0, MAX_ACTIVATED);
    ours && (FIRST_ACTIVATED..FIRST_ACTIVATED + n).contains(&fd)
}

/// Close every descriptor [`kept`] does not keep; what was closed. Call it first in `main`,
/// before anything opens a descriptor of its own.
pub fn close_inherited() -> Vec<Closed> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let open: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // The directory's own descriptor is closed now; it is in `open`, and no longer resolves.
    let mut closed = Vec::new();
    for fd in open.into_iter().filter(|fd| !kept(*fd)) {
        let Ok(what) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
            continue;
        };
        // SAFETY: `fd` is open in this process (it resolved just above) and nothing in it uses
        // it: nothing has run yet but this function, and the descriptor was inherited.
        if unsafe { libc::close(fd) } == 0 {
            closed.push(Closed {
                fd,
                what: what.display().to_string(),
            });
        }
    }
    closed
}

/// Log each closed descriptor (after the logger is up).
pub fn log_closed(closed: &[Closed]) {
    for c in closed {
        crate::runbook!(
            INHERITED_ANCHOR,
            "closed descriptor {} ({}), inherited from whoever started this daemon: a daemon \
             keeps only stdin, stdout, stderr and its activated sockets",
            c.fd,
            c.what
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdio_is_kept_and_a_descriptor_past_the_listeners_is_not() {
        assert!(kept(0) && kept(1) && kept(2));
        // No LISTEN_PID for this test process: nothing from 3 up is kept.
        if std::env::var_os("LISTEN_PID").is_none() {
            assert!(!kept(3) && !kept(40));
        }
    }
}
