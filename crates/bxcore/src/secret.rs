//! The one reader of a secret file: a model API key, a bearer token, a host credential.
//!
//! Every daemon that holds a secret reads it once at start, before the sandbox closes, through
//! [`read`]: the file opened once, its mode checked on what was opened (so it cannot change
//! between the check and the read), a size bound, the final newline taken off. A file its group
//! or others may read or change is refused, as OpenSSH refuses an open private key: the secret
//! may already have leaked, or been put there by someone else. Its owner is not checked: a
//! daemon started as root reads its secret before it drops to its own user, who may own the
//! file. What differs between the readers (what the file is called, the systemd credential to
//! use instead, the runbook entries) is a [`SecretFile`].
//!
//! [`Secret`] has no `Display`, its `Debug` never shows its bytes, and they are overwritten when
//! it is dropped.

use std::fmt;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::runbook::Anchored;

/// The largest secret file read, in bytes: a key or a token is a few hundred at most, so a
/// larger file holds something else.
pub const MAX_SECRET_FILE: u64 = 16 * 1024;

/// A secret's bytes. No `Display`; `Debug` shows only its length; zeroed on drop.
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes, redacted)", self.0.len())
    }
}

impl Secret {
    /// A secret holding `bytes`.
    pub fn new(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    /// The bytes, for the one place that sends them.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// A secret of the bytes of `self` that `keep` selects (a trimmed part of it); the rest is
    /// zeroed with `self`.
    pub fn slice(&self, keep: impl FnOnce(&[u8]) -> &[u8]) -> Secret {
        Secret(keep(&self.0).to_vec())
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Overwrite the bytes before the allocation is freed, so a later allocation cannot
        // read the secret back. Volatile writes: the compiler may not drop them as dead stores.
        for b in self.0.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a byte of the vector.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// What differs between the readers of secret files: how the refusals word them and which
/// runbook entries they point at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretFile {
    /// The file, as the refusals name it: `the API key file`.
    pub file: &'static str,
    /// What it holds, in one word: `key`, `token`, `secret`.
    pub noun: &'static str,
    /// The safe way the refusal of an open file offers beside `chmod 600`: `pass it as the
    /// systemd credential `api_key``.
    pub instead: &'static str,
    /// The runbook entry of a file that cannot be read or is too large.
    pub anchor: &'static str,
    /// The runbook entry of a file others may read or change.
    pub open_anchor: &'static str,
}

/// Why a secret file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("cannot read {} {}: {error}", .words.file, .path.display())]
    Unreadable {
        words: SecretFile,
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error(
        "{} {} has mode {mode:04o}: its group or others may read or change it, so the {} is \
         refused (allow its owner only: chmod 600, or {})",
        .words.file, .path.display(), .words.noun, .words.instead
    )]
    Open {
        words: SecretFile,
        path: PathBuf,
        mode: u32,
    },
    #[error(
        "{} {} is over {MAX_SECRET_FILE} bytes: it holds something else than a {}",
        .words.file, .path.display(), .words.noun
    )]
    TooLong { words: SecretFile, path: PathBuf },
}

impl Anchored for SecretFileError {
    fn anchor(&self) -> &str {
        match self {
            SecretFileError::Open { words, .. } => words.open_anchor,
            SecretFileError::Unreadable { words, .. } | SecretFileError::TooLong { words, .. } => {
                words.anchor
            }
        }
    }
}

/// Read the secret file at `path`, as `words` name it: refused if its group or others may read
/// or change it (mode & 077), if neither root nor this process's effective user owns it, or if
/// it is over [`MAX_SECRET_FILE`] bytes; its final newline (`\n` or `\r\n`) is not part of the
/// secret. What the secret must look like beyond that is the caller's to check.
pub fn read(path: &Path, words: SecretFile) -> Result<Secret, SecretFileError> {
    let unreadable = |error| SecretFileError::Unreadable {
        words,
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Open {
            words,
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut raw = Secret(Vec::new());
    file.take(MAX_SECRET_FILE + 1)
        .read_to_end(&mut raw.0)
        .map_err(unreadable)?;
    if raw.0.len() as u64 > MAX_SECRET_FILE {
        return Err(SecretFileError::TooLong {
            words,
            path: path.to_path_buf(),
        });
    }
    Ok(raw.slice(|b| match b.strip_suffix(b"\n") {
        Some(v) => v.strip_suffix(b"\r").unwrap_or(v),
        None => b,
    }))
}

/// The model API key file inferproxy reads at start, and `bxctl dev up` checks the same way
/// before it writes anything (so a key inferproxy would refuse never makes a box that fails).
pub const MODEL_KEY: SecretFile = SecretFile {
    file: "the API key file",
    noun: "key",
    instead: "pass it as the systemd credential `api_key`",
    anchor: "inferproxy-key-missing",
    open_anchor: "inferproxy-key-open",
};

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: SecretFile = SecretFile {
        file: "the example key file",
        noun: "key",
        instead: "pass it as the systemd credential `example_key`",
        anchor: "example-key-missing",
        open_anchor: "example-key-open",
    };

    fn file(dir: &Path, bytes: &[u8], mode: u32) -> PathBuf {
        let p = dir.join("key");
        // A fresh file each time: the last one may be 0400, which only root could write again
        // (the package's check phase runs as an unprivileged build user).
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn an_owner_only_file_is_read_without_its_final_newline() {
        let d = tempfile::tempdir().unwrap();
        for (text, want) in [
            (&b"k-123\n"[..], &b"k-123"[..]),
            (b"k-123\r\n", b"k-123"),
            (b"k-123", b"k-123"),
            (b" k 1 \n\n", b" k 1 \n"),
        ] {
            for mode in [0o600, 0o400] {
                let s = read(&file(d.path(), text, mode), WORDS).unwrap();
                assert_eq!(s.bytes(), want, "{text:?} {mode:o}");
            }
        }
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let s = Secret::new(b"k-SECRET".to_vec());
        assert_eq!(format!("{s:?}"), "Secret(8 bytes, redacted)");
    }

    #[test]
    fn a_file_its_group_or_others_may_read_or_change_is_refused_with_the_open_anchor() {
        let d = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666] {
            let p = file(d.path(), b"k-open\n", mode);
            let e = read(&p, WORDS).unwrap_err();
            assert!(
                matches!(e, SecretFileError::Open { mode: m, .. } if m == mode),
                "{e}"
            );
            assert_eq!(e.anchor(), "example-key-open");
            assert_eq!(
                e.to_string(),
                format!(
                    "the example key file {} has mode {mode:04o}: its group or others may read \
                     or change it, so the key is refused (allow its owner only: chmod 600, or \
                     pass it as the systemd credential `example_key`)",
                    p.display()
                )
            );
        }
    }

    #[test]
    fn a_missing_file_is_refused_with_its_path_and_anchor() {
        let e = read(Path::new("/nonexistent/example/key"), WORDS).unwrap_err();
        assert!(matches!(e, SecretFileError::Unreadable { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("cannot read the example key file /nonexistent/example/key: "),
            "{e}"
        );
        assert_eq!(e.anchor(), "example-key-missing");
    }

    #[test]
    fn a_file_over_the_bound_is_refused_without_being_read_whole() {
        let d = tempfile::tempdir().unwrap();
        let max = MAX_SECRET_FILE as usize;
        assert_eq!(
            read(&file(d.path(), &vec![b'a'; max], 0o600), WORDS)
                .unwrap()
                .bytes()
                .len(),
            max
        );
        let p = file(d.path(), &vec![b'a'; max + 1], 0o600);
        let e = read(&p, WORDS).unwrap_err();
        assert!(matches!(e, SecretFileError::TooLong { .. }), "{e}");
        assert_eq!(e.anchor(), "example-key-missing");
        assert_eq!(
            e.to_string(),
            format!(
                "the example key file {} is over 16384 bytes: it holds something else than a key",
                p.display()
            )
        );
    }
}
