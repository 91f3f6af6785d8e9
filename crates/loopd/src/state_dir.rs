//! loopd's own directories (`<home>/loop`, `sessions/`, `outbox/`): made at 0700 when missing,
//! tightened when wider, refused when another user owns them.
//!
//! Session logs hold everything the owner said; a directory someone else owns or can list is not
//! a place to write them.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bxharden::Owner;
use bxharden::log::notice;

/// The runbook entry for a state directory loopd cannot use.
pub const STATE_DIR_ANCHOR: &str = "loopd-state-dir-refused";

/// Why a state directory cannot be used.
#[derive(Debug)]
pub enum StateDirError {
    NotADirectory(PathBuf),
    Foreign { path: PathBuf, uid: u32, want: u32 },
    Io(PathBuf, io::Error),
}

impl fmt::Display for StateDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateDirError::NotADirectory(p) => {
                write!(f, "{}: not a directory (a file or a symlink)", p.display())
            }
            StateDirError::Foreign { path, uid, want } => write!(
                f,
                "{}: owned by uid {uid}, not by loopd's uid {want}",
                path.display()
            ),
            StateDirError::Io(p, e) => write!(f, "{}: {e}", p.display()),
        }?;
        write!(f, "; see docs/runbook.md#{STATE_DIR_ANCHOR}")
    }
}

impl std::error::Error for StateDirError {}

/// Make `path` a 0700 directory owned by `uid` (`owner`: give a new one to it, when root before
/// the drop).
pub fn ensure(path: &Path, uid: u32, owner: Option<Owner>) -> Result<(), StateDirError> {
    let io_err = |e| StateDirError::Io(path.to_path_buf(), e);
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {
            if let Some(o) = owner {
                std::os::unix::fs::chown(path, Some(o.uid), Some(o.gid)).map_err(io_err)?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(e)),
    }
    let meta = fs::symlink_metadata(path).map_err(io_err)?;
    if !meta.file_type().is_dir() {
        return Err(StateDirError::NotADirectory(path.to_path_buf()));
    }
    if meta.uid() != uid {
        return Err(StateDirError::Foreign {
            path: path.to_path_buf(),
            uid: meta.uid(),
            want: uid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(io_err)?;
        notice(&format!(
            "{}: was {mode:04o}, tightened to 0700",
            path.display()
        ));
    }
    Ok(())
}
