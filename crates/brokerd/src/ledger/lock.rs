//! The audit lock, `<home>/broker/audit/lock`: one brokerd per home. An exclusive `flock` held
//! for the life of the process (the kernel drops it when the process dies, however it dies).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bxcore::runbook::Anchored;

/// The runbook anchor of a second brokerd on one home.
pub const RUNNING_ANCHOR: &str = "broker-already-running";

/// Why the lock was not taken. Its runbook entry is [`RUNNING_ANCHOR`].
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another brokerd holds the audit lock {} (one brokerd per home)",
        .0.display()
    )]
    Held(PathBuf),
    #[error("the audit lock {} cannot be taken: {}", .0.display(), .1)]
    Io(PathBuf, #[source] std::io::Error),
}

impl Anchored for LockError {
    fn anchor(&self) -> &str {
        RUNNING_ANCHOR
    }
}

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct AuditLock {
    _file: File,
}

impl AuditLock {
    /// Take the lock without waiting.
    pub fn take(path: &Path) -> Result<AuditLock, LockError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| LockError::Io(path.to_path_buf(), e))?;
        // SAFETY: flock on a descriptor this function owns, with integer flags.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                LockError::Held(path.to_path_buf())
            } else {
                LockError::Io(path.to_path_buf(), e)
            });
        }
        Ok(AuditLock { _file: file })
    }
}
