//! Single-user mode as root: the dev box's daemons drop to one unprivileged user, which this
//! creates (or takes, when it exists) and gives the home to.
//!
//! Two `dev up` may run at once (the end-to-end tests do). Creating a user is serialised by a
//! machine-wide lock, and the user is looked up only after `useradd` has finished under that
//! lock: the uid the home is given to is the uid the daemons drop to.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, lchown};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{Flock, FlockArg};
use nix::unistd::User;

/// The lock every `dev up` holds while it creates or takes its users.
pub const USERS_LOCK: &str = "/run/lock/boxmaker-dev-users.lock";

/// The user `bxctl dev up` creates when run as root and given no `--user`.
pub const DEFAULT_USER: &str = "bx-dev";

/// An unprivileged user the dev box runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug)]
pub enum UserError {
    /// `useradd` could not be run or refused.
    Create { name: String, why: String },
    /// The user exists but is root (uid 0): the daemons would not drop anything.
    IsRoot(String),
    /// A directory above the home keeps the user out.
    Unreachable {
        user: String,
        dir: PathBuf,
        mode: u32,
    },
    /// Giving the home to the user failed.
    Chown { path: PathBuf, error: io::Error },
    /// The lock that serialises user creation could not be taken.
    Lock { path: PathBuf, error: io::Error },
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserError::Create { name, why } => write!(f, "cannot create the user {name}: {why}"),
            UserError::IsRoot(name) => write!(
                f,
                "the user {name} has uid 0; the dev box needs an unprivileged user (--user NAME)"
            ),
            UserError::Unreachable { user, dir, mode } => write!(
                f,
                "the user {user} cannot reach the home: {} is mode {mode:04o}; choose a home \
                 under a directory others may enter, such as /tmp or /var/tmp (--home DIR)",
                dir.display()
            ),
            UserError::Chown { path, error } => {
                write!(f, "cannot give {} to the dev user: {error}", path.display())
            }
            UserError::Lock { path, error } => write!(
                f,
                "cannot take the lock {} that keeps two `dev up` from creating users at once: {error}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for UserError {}

fn lookup(name: &str) -> Option<DevUser> {
    User::from_name(name).ok().flatten().map(|u| DevUser {
        name: name.to_string(),
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    })
}

/// The machine-wide lock for creating users, held until the returned value is dropped.
fn lock_users() -> Result<Flock<fs::File>, UserError> {
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
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| err(io::Error::from(e)))
}

/// The user `name`, created as a system user with no shell and no home when it does not exist.
/// Creating or taking happens under [`USERS_LOCK`], so a concurrent `dev up` either made the
/// user completely before this looks, or finds the user this one made.
pub fn create_or_take(name: &str) -> Result<DevUser, UserError> {
    let _lock = lock_users()?;
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

/// Give `path` and everything under it to `user`, never following a symbolic link.
pub fn give(path: &Path, user: &DevUser) -> Result<(), UserError> {
    let err = |error| UserError::Chown {
        path: path.to_path_buf(),
        error,
    };
    lchown(path, Some(user.uid), Some(user.gid)).map_err(err)?;
    let meta = fs::symlink_metadata(path).map_err(err)?;
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(err)? {
            give(&entry.map_err(err)?.path(), user)?;
        }
    }
    Ok(())
}
