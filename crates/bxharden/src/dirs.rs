//! A daemon's own directories: its state directory, its sockets' directories. Off the device
//! (the dev box, tests) a daemon makes them itself; on the device the NixOS module's tmpfiles
//! rules do, and this only checks them. Either way a daemon writes only into a directory that is
//! its own and that nobody else can list.
//!
//! The rules, one place for every daemon:
//! - missing parents are made 0711 (enter, not list), the directory itself 0700;
//! - a symbolic link or a file in its place is refused, never followed;
//! - it must belong to the uid the daemon runs as once the sandbox is applied (`owner` when root
//!   will drop to it, else the running uid). Root may take one that belongs to root (it made it
//!   before the drop, or a previous start did) and gives it to `owner`; a directory of any other
//!   user is refused: it may be another daemon's;
//! - a wider mode is tightened to 0700, with a line saying so.

use bxcore::runbook::Anchored;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid, chown};

use crate::identity::Owner;

/// The runbook entry for a directory a daemon refuses or cannot make.
pub const STATE_DIR_ANCHOR: &str = "state-dir-refused";

/// Why a directory is not the daemon's to use. Its `Display` names the directory; its runbook
/// entry is [`STATE_DIR_ANCHOR`].
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A file or a symbolic link is where the directory should be.
    #[error("{}: not a directory (a file or a symbolic link is in its place)", .0.display())]
    NotADirectory(PathBuf),
    /// It belongs to `uid`, not to `want`.
    #[error(
        "{}: belongs to uid {uid}, not to uid {want} that the daemon runs as",
        path.display()
    )]
    Foreign { path: PathBuf, uid: u32, want: u32 },
    /// A system call failed.
    #[error("{}: cannot {what}: {error}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        error: io::Error,
    },
}

impl Anchored for DirError {
    fn anchor(&self) -> &str {
        STATE_DIR_ANCHOR
    }
}

/// Make `dir` a 0700 directory of the daemon's own (the rules above). `owner` is the identity
/// root will drop to (`Identity::owner`), `None` when no drop is due.
pub fn own_dir(dir: &Path, owner: Option<Owner>) -> Result<(), DirError> {
    let io_err = |what| {
        move |error| DirError::Io {
            path: dir.to_path_buf(),
            what,
            error,
        }
    };
    if let Some(parent) = dir.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(parent)
                .map_err(io_err("make its parent"))?;
        }
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("make it")(e)),
    }
    let meta = fs::symlink_metadata(dir).map_err(io_err("look at it"))?;
    if !meta.file_type().is_dir() {
        return Err(DirError::NotADirectory(dir.to_path_buf()));
    }
    let me = Uid::effective().as_raw();
    let want = owner.map_or(me, |o| o.uid);
    let root_takes_it = me == 0 && meta.uid() == 0;
    if meta.uid() != want && !root_takes_it {
        return Err(DirError::Foreign {
            path: dir.to_path_buf(),
            uid: meta.uid(),
            want,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err("make it 0700"))?;
        crate::log::notice(&format!(
            "{}: the directory was {mode:04o}, made 0700",
            dir.display()
        ));
    }
    if let Some(o) = owner {
        if meta.uid() != o.uid || meta.gid() != o.gid {
            chown(dir, Some(Uid::from_raw(o.uid)), Some(Gid::from_raw(o.gid)))
                .map_err(|e| io_err("give it to its owner")(io::Error::from(e)))?;
        }
    }
    Ok(())
}
