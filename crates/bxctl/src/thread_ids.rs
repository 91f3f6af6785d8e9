//! Taking other ids for one exchange: root, to talk to a socket whose client is a daemon, sets
//! this thread's effective uid and gid to the client's, then takes root's back. Only the calling
//! thread changes (the raw system calls, not glibc's process-wide `seteuid`). Used by the device
//! check (`check`), the dev box (`dev`) and every command that talks to a socket (`peer`).

use std::io;

/// A user and group resolved to ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

/// Set this thread's effective uid and gid (the real and saved ones stay), with the raw
/// system calls: glibc's `seteuid` changes every thread of the process, and another thread
/// (a test beside this one, a spinner) must keep its own.
fn set_thread_ids(uid: u32, gid: u32) -> Result<(), String> {
    use nix::libc;
    const KEEP: libc::c_long = u32::MAX as libc::c_long;
    // SAFETY: setresgid/setresuid take three ids by value and touch no memory of ours.
    let g = unsafe { libc::syscall(libc::SYS_setresgid, KEEP, libc::c_long::from(gid), KEEP) };
    if g != 0 {
        return Err(format!(
            "setresgid(-1, {gid}, -1): {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: as above.
    let u = unsafe { libc::syscall(libc::SYS_setresuid, KEEP, libc::c_long::from(uid), KEEP) };
    if u != 0 {
        return Err(format!(
            "setresuid(-1, {uid}, -1): {}",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Run `f` on this thread with the effective uid and gid `ids`, then as root again. Only this
/// thread changes: the others keep running as root meanwhile, and a connection made in `f`
/// keeps the peer ids it was made with (`SO_PEERCRED` records them at `connect`).
pub fn as_ids<T>(ids: Ids, f: impl FnOnce() -> T) -> Result<T, String> {
    if let Err(e) = set_thread_ids(ids.uid, ids.gid) {
        let _ = set_thread_ids(0, 0);
        return Err(e);
    }
    let out = f();
    set_thread_ids(0, 0)?;
    Ok(out)
}
