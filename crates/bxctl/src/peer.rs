//! Talking to a socket as its client. A socket of the box lets in one uid, its client's (the
//! file mode and the server's peer check both say so), so root, to check a socket whose client
//! is a daemon, takes the client's effective ids for that one exchange (`SO_PEERCRED` and the
//! file modes both see them). The device check does so with the users of `device.json`; a dev
//! box made as root with the users `dev up` made for it; everything else talks as itself.

use std::io;

use nix::unistd::{User, geteuid};

use bxcore::layout::{self, SocketSpec};

use crate::check::manifest::Ids;
use crate::dev::{DevHome, user};
use crate::target::Target;

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

/// The ids root takes to talk to `spec`'s socket of the dev box at `home`: its client's user,
/// when the box was made as root and the client is a daemon; `None` (as itself) otherwise.
pub fn dev_client(home: &DevHome, spec: &SocketSpec) -> Option<Ids> {
    if !geteuid().is_root() || spec.client == layout::OWNER {
        return None;
    }
    let box_id = home.read_marker().ok()??.box_id?;
    let name = user::name(&box_id, spec.client)?;
    let u = User::from_name(&name).ok()??;
    Some(Ids {
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    })
}

/// `f` as the client of `spec`'s socket of `target` (see [`dev_client`]), else as this process;
/// `Err` says why the client's ids could not be taken.
pub fn as_client<T>(
    target: &Target,
    spec: &SocketSpec,
    f: impl FnOnce() -> T,
) -> Result<T, String> {
    let ids = target
        .is_dev_box()
        .then(|| DevHome::new(target.home()).ok())
        .flatten()
        .and_then(|h| dev_client(&h, spec));
    match ids {
        Some(ids) => as_ids(ids, f),
        None => Ok(f()),
    }
}
