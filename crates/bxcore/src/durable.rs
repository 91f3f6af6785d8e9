//! The one durable write: a file replaced whole or not at all, and still there after a crash
//! once [`replace`] returns. A temporary file beside it is written and fsync'd, renamed over
//! the file, and the directory fsync'd (the rename is only durable once the directory is): a
//! reader, or the daemon after a crash, sees the old file or the new one, never a torn one.
//!
//! Every state file and queue record of the box is written so: loopd's and memoryd's outboxes,
//! brokerd's session states and fingerprints, the dev box's pid files and its copy of a key.
//! The temporary file is `.<name>.tmp`: the outboxes pass over (and clear at start) the names
//! that begin with a dot and end in `.tmp`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Which step of a durable write failed, and why; nothing was replaced.
#[derive(Debug, thiserror::Error)]
#[error("cannot be written ({step}): {source}")]
pub struct WriteError {
    /// `create`, `write`, `fsync`, `rename` or `fsync the directory`.
    pub step: &'static str,
    #[source]
    pub source: io::Error,
}

impl From<WriteError> for io::Error {
    fn from(e: WriteError) -> io::Error {
        io::Error::new(e.source.kind(), e.to_string())
    }
}

/// The temporary file [`replace`] writes `path` through: `.<name>.tmp` beside it.
pub fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp"))
}

/// Replace `path` with `body` durably (a new file is made `0600`). Whatever stands at the
/// temporary name (left by a crash, or put there by whoever else may write in the directory: a
/// link, a pipe) is removed, not opened, and the temporary file is created anew (`O_EXCL`, which
/// follows no link); a rename then replaces `path` itself, never writing through a link there.
/// One this call made is removed when a step before the rename fails.
pub fn replace(path: &Path, body: &[u8]) -> Result<(), WriteError> {
    replace_as(path, body, None)
}

/// [`replace`] for a file someone else reads, an owner's configuration: the new file has the
/// old one's mode, owner and group (set before the rename, so no reader ever finds it
/// otherwise); `path` must exist.
pub fn replace_keeping(path: &Path, body: &[u8]) -> Result<(), WriteError> {
    use std::os::unix::fs::MetadataExt;
    let old = fs::metadata(path).map_err(|source| WriteError {
        step: "create",
        source,
    })?;
    replace_as(
        path,
        body,
        Some((old.mode() & 0o7777, old.uid(), old.gid())),
    )
}

fn replace_as(path: &Path, body: &[u8], like: Option<(u32, u32, u32)>) -> Result<(), WriteError> {
    let tmp = temporary(path);
    let step = |step: &'static str| move |source: io::Error| WriteError { step, source };
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(step("create")(e)),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(step("create"))?;
    let kept = match like {
        Some((mode, uid, gid)) => std::os::unix::fs::fchown(&f, Some(uid), Some(gid))
            .and_then(|()| f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode)))
            .map_err(step("create")),
        None => Ok(()),
    };
    let written = kept
        .and_then(|()| f.write_all(body).map_err(step("write")))
        .and_then(|()| f.sync_all().map_err(step("fsync")))
        .and_then(|()| fs::rename(&tmp, path).map_err(step("rename")));
    drop(f);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(step("fsync the directory"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_file_is_written_whole_and_private() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        replace(&p, b"{\"a\":1}").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"{\"a\":1}");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!temporary(&p).exists());
    }

    #[test]
    fn a_file_replaced_keeping_is_written_whole_with_the_old_ones_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("brokerd.toml");
        fs::write(&p, "old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        replace_keeping(&p, b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert!(!temporary(&p).exists());
        // A file that is not there is not made: there is no mode to keep.
        let e = replace_keeping(&d.path().join("absent.toml"), b"x").unwrap_err();
        assert_eq!(e.step, "create");
        assert!(!d.path().join("absent.toml").exists());
    }

    #[test]
    fn an_old_file_is_replaced_and_a_stale_temporary_file_written_over() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        fs::write(&p, "old and longer").unwrap();
        fs::write(temporary(&p), "left by a crash, and longer still").unwrap();
        replace(&p, b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert!(!temporary(&p).exists());
    }

    #[test]
    fn a_failed_write_names_its_step_and_leaves_the_old_file() {
        let d = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: the rename fails, after the temporary file.
        let p = d.path().join("state.json");
        fs::create_dir(&p).unwrap();
        fs::write(p.join("inside"), "x").unwrap();
        let e = replace(&p, b"new").unwrap_err();
        assert_eq!(e.step, "rename");
        assert!(
            e.to_string().starts_with("cannot be written (rename): "),
            "{e}"
        );
        assert!(p.join("inside").exists());
        assert!(!temporary(&p).exists(), "the temporary file is removed");
        // No directory to write in: the first step fails.
        let e = replace(&d.path().join("absent/state.json"), b"x").unwrap_err();
        assert_eq!(e.step, "create");
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_link_or_a_pipe_at_the_temporary_name_is_removed_not_written_through() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        let elsewhere = d.path().join("elsewhere");
        fs::write(&elsewhere, "untouched").unwrap();
        std::os::unix::fs::symlink(&elsewhere, temporary(&p)).unwrap();
        replace(&p, b"new").unwrap();
        assert_eq!(fs::read(&elsewhere).unwrap(), b"untouched");
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert!(!fs::symlink_metadata(&p).unwrap().file_type().is_symlink());

        fs::hard_link(&elsewhere, temporary(&p)).unwrap();
        replace(&p, b"newer").unwrap();
        assert_eq!(fs::read(&elsewhere).unwrap(), b"untouched");
        assert_eq!(fs::read(&p).unwrap(), b"newer");

        // A pipe would block an open for writing until someone reads it.
        let fifo =
            std::ffi::CString::new(temporary(&p).into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        replace(&p, b"newest").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"newest");
    }
}
