//! The privilege drop, in the design's order: bounding, ambient and inheritable capabilities
//! first (dropping the bounding set needs `CAP_SETPCAP`, gone after `setuid`), then the supplementary
//! groups, gid and uid, then effective and permitted, then checks that nothing is left and that
//! the way back is closed.

use caps::CapSet;
use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};

use crate::identity::Identity;

/// What failed during the drop; the daemon refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DropError {
    /// A step failed; the text names it.
    #[error("cannot {0}: {1}")]
    Step(&'static str, String),
    /// A check after the drop found something left.
    #[error("after the privilege drop {0}")]
    Left(String),
}

const ALL_SETS: [(CapSet, &str); 5] = [
    (CapSet::Bounding, "bounding"),
    (CapSet::Ambient, "ambient"),
    (CapSet::Inheritable, "inheritable"),
    (CapSet::Effective, "effective"),
    (CapSet::Permitted, "permitted"),
];

/// Drop from root to `id` (its `drops` is true). Refused from a thread other than the first or
/// beside another thread: credentials and capabilities are per thread, and a thread left behind
/// would keep root.
pub fn drop_to(id: &Identity) -> Result<(), DropError> {
    crate::threads::alone().map_err(|why| DropError::Step("drop privileges", why))?;
    let step =
        |what: &'static str| move |e: caps::errors::CapsError| DropError::Step(what, e.to_string());
    caps::clear(None, CapSet::Bounding).map_err(step("clear the bounding capability set"))?;
    caps::clear(None, CapSet::Ambient).map_err(step("clear the ambient capability set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(step("clear the inheritable capability set"))?;

    let nstep = |what: &'static str| move |e: nix::Error| DropError::Step(what, e.to_string());
    setgroups(&[]).map_err(nstep("clear the supplementary groups"))?;
    let gid = Gid::from_raw(id.gid);
    setresgid(gid, gid, gid).map_err(nstep("set the gid"))?;
    let uid = Uid::from_raw(id.uid);
    setresuid(uid, uid, uid).map_err(nstep("set the uid"))?;

    caps::clear(None, CapSet::Effective).map_err(step("clear the effective capability set"))?;
    caps::clear(None, CapSet::Permitted).map_err(step("clear the permitted capability set"))?;
    check_dropped(id)
}

/// Clear the sets an unprivileged process may clear on its own (ambient, inheritable): used
/// when no drop is due, so a child never inherits a capability.
///
/// Each set is cleared only when it holds something: under its systemd unit a daemon starts
/// unprivileged with empty sets and `SystemCallFilter=~@privileged`, which kills a process that
/// calls `capset`, even to clear what is already empty.
pub fn clear_inheritable() -> Result<(), DropError> {
    let step =
        |what: &'static str| move |e: caps::errors::CapsError| DropError::Step(what, e.to_string());
    for (set, read, clear) in [
        (
            CapSet::Ambient,
            "read the ambient capability set",
            "clear the ambient capability set",
        ),
        (
            CapSet::Inheritable,
            "read the inheritable capability set",
            "clear the inheritable capability set",
        ),
    ] {
        if !caps::read(None, set).map_err(step(read))?.is_empty() {
            caps::clear(None, set).map_err(step(clear))?;
        }
    }
    Ok(())
}

/// Every capability set empty, the uid and gid the target in all three slots, no supplementary
/// group, and `setresuid(0, ..)` refused.
pub fn check_dropped(id: &Identity) -> Result<(), DropError> {
    for (set, name) in ALL_SETS {
        let held = caps::read(None, set)
            .map_err(|e| DropError::Step("read the capability sets", e.to_string()))?;
        if !held.is_empty() {
            let mut names: Vec<String> = held.iter().map(|c| c.to_string()).collect();
            names.sort();
            return Err(DropError::Left(format!(
                "the {name} capability set still holds {}",
                names.join(", ")
            )));
        }
    }
    let r = nix::unistd::getresuid().map_err(|e| DropError::Step("read the uid", e.to_string()))?;
    if [r.real, r.effective, r.saved] != [Uid::from_raw(id.uid); 3] {
        return Err(DropError::Left(format!(
            "the uids are {}/{}/{}, not {}",
            r.real, r.effective, r.saved, id.uid
        )));
    }
    let g = nix::unistd::getresgid().map_err(|e| DropError::Step("read the gid", e.to_string()))?;
    if [g.real, g.effective, g.saved] != [Gid::from_raw(id.gid); 3] {
        return Err(DropError::Left(format!(
            "the gids are {}/{}/{}, not {}",
            g.real, g.effective, g.saved, id.gid
        )));
    }
    let groups =
        nix::unistd::getgroups().map_err(|e| DropError::Step("read the groups", e.to_string()))?;
    if groups.iter().any(|g| g.as_raw() != id.gid) {
        return Err(DropError::Left(format!(
            "supplementary groups remain: {groups:?}"
        )));
    }
    let root = Uid::from_raw(0);
    if setresuid(root, root, root).is_ok() {
        return Err(DropError::Left(
            "setresuid(0, 0, 0) still succeeds".to_owned(),
        ));
    }
    Ok(())
}
