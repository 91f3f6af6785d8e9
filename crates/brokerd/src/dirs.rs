//! brokerd's own files under `<home>/broker`. Its directories are made and checked by
//! `bxharden::own_dir`, by the rules every daemon shares; the files it makes there as root before
//! the drop (the audit lock, the chain) are given to the user it drops to.

use std::io;
use std::path::Path;

use bxharden::{DirError, Owner};

/// Give a file brokerd made as root to `owner`, so the dropped daemon and the owner's tools can
/// use it.
pub fn give(path: &Path, owner: Option<Owner>) -> Result<(), DirError> {
    let Some(o) = owner else { return Ok(()) };
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(o.uid)),
        Some(nix::unistd::Gid::from_raw(o.gid)),
    )
    .map_err(|e| DirError::Io {
        path: path.to_path_buf(),
        what: "give it to the user brokerd runs as",
        error: io::Error::from(e),
    })
}
