//! brokerd's own directories under `<home>/broker`: made at 0700 when missing, tightened when
//! wider (with a line), refused when another user owns them. On the device the NixOS module makes
//! them; off it (dev box, tests) brokerd does.

use std::fmt;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bxharden::Owner;

/// The runbook anchor of a directory brokerd cannot use.
pub const DIR_ANCHOR: &str = "broker-home-unusable";

#[derive(Debug)]
pub struct DirError {
    pub path: PathBuf,
    pub why: String,
}

impl fmt::Display for DirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}; see docs/runbook.md#{DIR_ANCHOR}",
            self.path.display(),
            self.why
        )
    }
}

impl std::error::Error for DirError {}

/// Make `path` (and missing parents inside it) a 0700 directory of this process's user, or of
/// `owner` when running as root before the drop.
pub fn ensure(path: &Path, owner: Option<Owner>) -> Result<(), DirError> {
    let err = |why: String| DirError {
        path: path.to_path_buf(),
        why,
    };
    match fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .create(path)
                .map_err(|e| err(format!("cannot be made: {e}")))?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o700))
                .map_err(|e| err(format!("cannot be made 0700: {e}")))?;
        }
        Err(e) => return Err(err(format!("cannot be looked at: {e}"))),
    }
    let meta = fs::symlink_metadata(path).map_err(|e| err(format!("cannot be looked at: {e}")))?;
    if !meta.file_type().is_dir() {
        return Err(err(
            "is not a directory (a symlink or a file is there)".to_string()
        ));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if let Some(o) = owner {
        if meta.uid() != o.uid || meta.gid() != o.gid {
            nix::unistd::chown(
                path,
                Some(nix::unistd::Uid::from_raw(o.uid)),
                Some(nix::unistd::Gid::from_raw(o.gid)),
            )
            .map_err(|e| err(format!("cannot be given to uid {}: {e}", o.uid)))?;
        }
    } else if meta.uid() != euid {
        return Err(err(format!(
            "belongs to uid {}, not to uid {euid} that brokerd runs as",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))
            .map_err(|e| err(format!("cannot be tightened to 0700: {e}")))?;
        bxharden::log::notice(&format!(
            "tightened {} from {mode:04o} to 0700",
            path.display()
        ));
    }
    Ok(())
}

/// Give a file brokerd made as root to `owner`, so the dropped daemon and the owner's tools can
/// use it.
pub fn give(path: &Path, owner: Option<Owner>) -> Result<(), DirError> {
    let Some(o) = owner else { return Ok(()) };
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(o.uid)),
        Some(nix::unistd::Gid::from_raw(o.gid)),
    )
    .map_err(|e| DirError {
        path: path.to_path_buf(),
        why: format!("cannot be given to uid {}: {e}", o.uid),
    })
}
