//! The dev box's users, as root: one per daemon and per box, as the device has one per daemon.
//! A box's users are `bx-dev-<box>-<role>` (`bx-dev-k3f9q2-loop`, `bx-dev-k3f9q2-broker`, ...),
//! where `<box>` is the short id `dev up` drew for the home and `<role>` the device's user
//! without its `bx-` (`bxcore::layout::DAEMONS`). Users are per box, not shared between boxes:
//! a socket's peer check and its file mode both name a uid, so a uid two boxes shared would
//! reach both boxes' sockets (docs/devbox.md, docs/threat-model.md).
//!
//! Two `dev up` may run at once (the end-to-end tests do). Drawing a box id, creating and
//! removing users are serialised by one machine-wide lock, and a user is looked up only after
//! `useradd` has finished under that lock: the uid a directory is given to is the uid its daemon
//! drops to. A user that exists already is taken (create-or-take), never made twice.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, lchown};
use std::path::{Path, PathBuf};
use std::process::Command;

use bxcore::layout;
use nix::fcntl::{Flock, FlockArg};
use nix::unistd::User;

/// The lock every `dev up` and `dev down` holds while it draws a box id, creates or removes
/// users.
pub const USERS_LOCK: &str = "/run/lock/boxmaker-dev-users.lock";

/// What every dev box user's name starts with (`.ci/fresh` removes these).
pub const PREFIX: &str = "bx-dev-";

/// How many characters a box id has: 36^6 ids, and `bx-dev-<id>-gateway` stays far below the
/// 32 characters `useradd` takes.
pub const BOX_ID_LEN: usize = 6;

/// An unprivileged user a daemon of the dev box runs as, or a socket belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Why the dev box's users could not be made, taken or removed.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// `useradd` could not be run or refused.
    #[error("cannot create the user {name}: {why}")]
    Create { name: String, why: String },
    /// The user exists but is root (uid 0): the daemons would not drop anything.
    #[error("the user {0} has uid 0; the dev box needs unprivileged users (remove {0})")]
    IsRoot(String),
    /// A directory above the home keeps the users out.
    #[error(
        "the user {user} cannot reach the home: {} is mode {mode:04o}; choose a home \
         under a directory others may enter, such as /tmp or /var/tmp (--home DIR)",
        dir.display()
    )]
    Unreachable {
        user: String,
        dir: PathBuf,
        mode: u32,
    },
    /// Giving a directory to its user failed.
    #[error("cannot give {} to its user: {error}", path.display())]
    Chown { path: PathBuf, error: io::Error },
    /// The lock that serialises user creation could not be taken.
    #[error(
        "cannot take the lock {} that keeps two `dev up` from creating users at once: {error}",
        path.display()
    )]
    Lock { path: PathBuf, error: io::Error },
    /// No box id could be drawn.
    #[error("cannot draw a box id from /dev/urandom: {0}")]
    Random(io::Error),
    /// A box id in a marker that is not one `dev up` draws.
    #[error("the marker's box id {0:?} is not {BOX_ID_LEN} lowercase letters and digits")]
    BadBoxId(String),
}

impl bxcore::runbook::Anchored for UserError {
    fn anchor(&self) -> &str {
        super::REFUSED_ANCHOR
    }
}

/// The user of `daemon` (a name in `bxcore::layout::DAEMONS`) in the box `box_id`.
pub fn name(box_id: &str, daemon: &str) -> Option<String> {
    let spec = layout::daemon(daemon)?;
    let role = spec.user.strip_prefix("bx-").unwrap_or(spec.user);
    Some(format!("{PREFIX}{box_id}-{role}"))
}

/// Whether `id` is a box id `dev up` draws.
pub fn valid_box_id(id: &str) -> bool {
    id.len() == BOX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn lookup(name: &str) -> Option<DevUser> {
    User::from_name(name).ok().flatten().map(|u| DevUser {
        name: name.to_string(),
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    })
}

/// The machine-wide lock for creating and removing users, held until the returned value is
/// dropped.
fn lock_users() -> Result<Flock<fs::File>, UserError> {
    lock_users_within(LOCK_WAIT)
}

/// How long a `dev up` or `dev down` waits for another one to finish with the users: making a
/// box's five users takes seconds; a lock held longer is held by something stuck.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// [`lock_users`], waiting at most `wait` for whoever holds it.
pub fn lock_users_within(wait: std::time::Duration) -> Result<Flock<fs::File>, UserError> {
    let path = Path::new(USERS_LOCK);
    let err = |error| UserError::Lock {
        path: path.to_path_buf(),
        error,
    };
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(err)?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(err)?;
    let until = std::time::Instant::now() + wait;
    let mut file = file;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < until => {
                file = back;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "another `bxctl dev up` or `dev down` has held it for {wait:?} (see who \
                         with `fuser {USERS_LOCK}`)"
                    ),
                )));
            }
            Err((_, e)) => return Err(err(io::Error::from(e))),
        }
    }
}

/// A new box id: random, and no user of any daemon of the layout has it yet (under the lock,
/// so a concurrent `dev up` cannot draw the same id and take this box's users).
pub fn draw_box_id() -> Result<String, UserError> {
    let _lock = lock_users()?;
    loop {
        let id = random_id(BOX_ID_LEN).map_err(UserError::Random)?;
        let taken = layout::DAEMONS
            .iter()
            .filter_map(|d| name(&id, d.name))
            .any(|n| lookup(&n).is_some());
        if !taken {
            return Ok(id);
        }
    }
}

/// `len` random lowercase letters and digits, from `/dev/urandom`.
pub fn random_id(len: usize) -> io::Result<String> {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = vec![0u8; len];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect())
}

/// The users of box `box_id`, one per daemon of the layout (those without a dev box daemon
/// yet too: they are some socket's client, as `bx-memory` is on the device), each created as a
/// system user with no shell and no home when it does not exist, or taken when it does. All
/// under [`USERS_LOCK`], so a concurrent `dev up` either made a user completely before this
/// looks, or finds the user this one made.
pub fn create_or_take_all(box_id: &str) -> Result<BTreeMap<&'static str, DevUser>, UserError> {
    if !valid_box_id(box_id) {
        return Err(UserError::BadBoxId(box_id.to_string()));
    }
    let _lock = lock_users()?;
    let mut users = BTreeMap::new();
    for d in layout::DAEMONS {
        let Some(n) = name(box_id, d.name) else {
            continue;
        };
        users.insert(d.name, create_or_take_locked(&n)?);
    }
    Ok(users)
}

fn create_or_take_locked(name: &str) -> Result<DevUser, UserError> {
    if let Some(u) = lookup(name) {
        return checked(u);
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--user-group",
            "--comment",
            "boxmaker dev box",
            name,
        ])
        .output()
        .map_err(|e| UserError::Create {
            name: name.to_string(),
            why: format!("useradd: {e}"),
        })?;
    // A `dev up` of another version (without the lock) may have made it in the meantime:
    // taking it is as good.
    match lookup(name) {
        Some(u) => checked(u),
        None => Err(UserError::Create {
            name: name.to_string(),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }),
    }
}

/// Each user `remove_all` looked at: removed, or kept with why.
pub type Removed = Vec<(String, Result<(), String>)>;

/// Remove the users of box `box_id` (under the lock). Each one `userdel` refuses (a process
/// still runs as it) is kept and named with why.
pub fn remove_all(box_id: &str) -> Result<Removed, UserError> {
    if !valid_box_id(box_id) {
        return Err(UserError::BadBoxId(box_id.to_string()));
    }
    let _lock = lock_users()?;
    let mut done = Vec::new();
    for d in layout::DAEMONS {
        let Some(n) = name(box_id, d.name) else {
            continue;
        };
        if lookup(&n).is_none() {
            continue;
        }
        let result = match Command::new("userdel").arg(&n).output() {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            Err(e) => Err(format!("userdel: {e}")),
        };
        done.push((n, result));
    }
    Ok(done)
}

fn checked(u: DevUser) -> Result<DevUser, UserError> {
    if u.uid == 0 {
        Err(UserError::IsRoot(u.name))
    } else {
        Ok(u)
    }
}

/// Check that `user` can walk from `/` to `home`: every directory above it lets others (or the
/// user, as owner) enter.
pub fn check_reachable(home: &Path, user: &DevUser) -> Result<(), UserError> {
    for dir in home.ancestors().skip(1) {
        let Ok(meta) = fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode() & 0o7777;
        let enters = if meta.uid() == user.uid {
            mode & 0o100 != 0
        } else if meta.gid() == user.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !enters {
            return Err(UserError::Unreachable {
                user: user.name.clone(),
                dir: dir.to_path_buf(),
                mode,
            });
        }
    }
    Ok(())
}

/// Give `path` and everything under it to `uid:gid`, never following a symbolic link. A
/// missing `path` is left missing.
pub fn give(path: &Path, uid: u32, gid: u32) -> Result<(), UserError> {
    let err = |error| UserError::Chown {
        path: path.to_path_buf(),
        error,
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    lchown(path, Some(uid), Some(gid)).map_err(err)?;
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(err)? {
            give(&entry.map_err(err)?.path(), uid, gid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_name_holds_the_box_id_and_the_devices_role() {
        assert_eq!(
            name("k3f9q2", "loopd").as_deref(),
            Some("bx-dev-k3f9q2-loop")
        );
        assert_eq!(
            name("k3f9q2", "gatewayd").as_deref(),
            Some("bx-dev-k3f9q2-gateway")
        );
        assert_eq!(name("k3f9q2", "nosuchd"), None);
        for d in layout::DAEMONS {
            let n = name("k3f9q2", d.name).unwrap();
            assert!(n.len() <= 32, "{n} is too long for useradd");
        }
    }

    #[test]
    fn a_users_lock_held_past_the_wait_is_an_answer_not_a_stall() {
        if !nix::unistd::Uid::effective().is_root() {
            bxtest::skip("the users' lock lives in /run/lock (root)");
            return;
        }
        let held = lock_users().unwrap();
        match lock_users_within(std::time::Duration::from_millis(200)) {
            Err(e @ UserError::Lock { .. }) => {
                let text = e.to_string();
                assert!(text.contains("has held it for 200ms"), "{text}");
                assert!(text.contains(USERS_LOCK), "{text}");
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("the lock was taken twice"),
        }
        drop(held);
        drop(lock_users_within(std::time::Duration::from_secs(60)).unwrap());
    }

    #[test]
    fn only_ids_dev_up_draws_are_valid() {
        assert!(valid_box_id("k3f9q2"));
        for bad in ["", "K3F9Q2", "k3f9q", "k3f9q2x", "k3-9q2", "../../x"] {
            assert!(!valid_box_id(bad), "{bad}");
        }
    }
}
