//! The bearer token Honcho is asked with when its auth is on: read once at start (before the
//! sandbox closes) from a key file or the systemd credential [`CREDENTIAL`], and never shown.
//!
//! [`Token`] has no `Display`, its `Debug` prints `Token(redacted)`, and its bytes are zeroed when
//! it is dropped. A key file its group or others may read or change is refused, as inferproxy
//! refuses an open model key: the token may already have leaked to them.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The systemd credential (`LoadCredential=honcho_key:…`) read when no key file is named.
pub const CREDENTIAL: &str = "honcho_key";

/// The runbook anchor of a token that cannot be read, is empty or cannot be a header value.
pub const TOKEN_ANCHOR: &str = "honcho-key-missing";

/// The runbook anchor of a key file others may read or change.
pub const TOKEN_OPEN_ANCHOR: &str = "honcho-key-open";

/// The longest token read, in bytes (a Honcho JWT is a few hundred).
const MAX_TOKEN: u64 = 16 * 1024;

/// A bearer token for Honcho.
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(redacted)")
    }
}

/// Why the token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the Honcho key file {}: {}", .0.display(), .1)]
    Unreadable(PathBuf, #[source] std::io::Error),
    #[error("the Honcho key file {} is empty", .0.display())]
    Empty(PathBuf),
    #[error("the Honcho key file {} is over {MAX_TOKEN} bytes: it holds something else than a token", .0.display())]
    TooLong(PathBuf),
    #[error(
        "the Honcho key file {} has mode {:04o}: its group or others may read or change it, so \
         the token is refused (allow its owner only: chmod 600, or pass it as the systemd \
         credential `{CREDENTIAL}`)",
        .0.display(),
        .1
    )]
    Open(PathBuf, u32),
    #[error(
        "the Honcho token in {} holds a character an HTTP header cannot carry (only printable \
         ASCII is allowed)",
        .0.display()
    )]
    NotAHeaderValue(PathBuf),
}

impl bxcore::runbook::Anchored for TokenError {
    fn anchor(&self) -> &str {
        match self {
            TokenError::Open(..) => TOKEN_OPEN_ANCHOR,
            _ => TOKEN_ANCHOR,
        }
    }
}

impl Token {
    /// Where the token is read from: `key_file` when set, else the credential [`CREDENTIAL`] in
    /// `credentials_directory` (`$CREDENTIALS_DIRECTORY`) when systemd passed it; `None` when
    /// neither (Honcho with its auth off).
    pub fn source(
        key_file: Option<&Path>,
        credentials_directory: Option<&Path>,
    ) -> Option<PathBuf> {
        match (key_file, credentials_directory) {
            (Some(p), _) => Some(p.to_path_buf()),
            (None, Some(dir)) if !dir.as_os_str().is_empty() => {
                let p = dir.join(CREDENTIAL);
                p.exists().then_some(p)
            }
            _ => None,
        }
    }

    /// Read the token from `path`, surrounding whitespace trimmed. The mode checked is that of
    /// the file opened, so it cannot change between the check and the read.
    pub fn read(path: &Path) -> Result<Token, TokenError> {
        let unreadable = |e| TokenError::Unreadable(path.into(), e);
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let mode = file.metadata().map_err(unreadable)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(TokenError::Open(path.into(), mode));
        }
        let mut text = String::new();
        file.take(MAX_TOKEN + 1)
            .read_to_string(&mut text)
            .map_err(unreadable)?;
        if text.len() as u64 > MAX_TOKEN {
            return Err(TokenError::TooLong(path.into()));
        }
        Token::from_text(path, &text)
    }

    fn from_text(path: &Path, text: &str) -> Result<Token, TokenError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(TokenError::Empty(path.into()));
        }
        if !t.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err(TokenError::NotAHeaderValue(path.into()));
        }
        Ok(Token(t.to_string()))
    }

    /// `Bearer <token>`, for the `Authorization` header and nothing else.
    pub(crate) fn header_value(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        // Overwrite the bytes before the allocation is freed, so a later allocation cannot read
        // the token back. Volatile writes: the compiler may not drop them as dead stores.
        // SAFETY: every byte becomes 0, which keeps the string valid UTF-8, and the pointer stays
        // within the string's length.
        unsafe {
            for b in self.0.as_bytes_mut().iter_mut() {
                std::ptr::write_volatile(b, 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::runbook::Anchored;
    use std::os::unix::fs::PermissionsExt;

    fn key_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join("honcho.key");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn debug_never_shows_the_token() {
        let t = Token::from_text(Path::new("k"), "eyJ.abc.def\n").unwrap();
        assert_eq!(format!("{t:?}"), "Token(redacted)");
        assert_eq!(t.header_value(), "Bearer eyJ.abc.def");
    }

    #[test]
    fn a_key_file_others_may_read_is_refused_without_reading_it() {
        let d = tempfile::tempdir().unwrap();
        for mode in [0o640, 0o604, 0o620, 0o666] {
            let p = key_file(d.path(), "secret-token", mode);
            let e = Token::read(&p).unwrap_err();
            assert!(matches!(e, TokenError::Open(_, m) if m == mode), "{e}");
            assert_eq!(e.anchor(), "honcho-key-open");
            assert!(e.to_string().contains("chmod 600"), "{e}");
            assert!(!e.to_string().contains("secret-token"));
        }
    }

    #[test]
    fn an_owner_only_key_file_is_read_and_trimmed() {
        let d = tempfile::tempdir().unwrap();
        let p = key_file(d.path(), "  tok-123 \n", 0o600);
        assert_eq!(Token::read(&p).unwrap().header_value(), "Bearer tok-123");
    }

    #[test]
    fn an_empty_missing_or_header_splitting_token_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let e = Token::read(&key_file(d.path(), " \n", 0o600)).unwrap_err();
        assert!(matches!(e, TokenError::Empty(_)), "{e}");
        let e = Token::read(&key_file(d.path(), "a\r\nX-Evil: 1", 0o400)).unwrap_err();
        assert!(matches!(e, TokenError::NotAHeaderValue(_)), "{e}");
        assert!(!e.to_string().contains("X-Evil"));
        let e = Token::read(&d.path().join("absent")).unwrap_err();
        assert!(matches!(e, TokenError::Unreadable(..)), "{e}");
        assert_eq!(e.anchor(), "honcho-key-missing");
        let e = Token::read(&key_file(d.path(), &"a".repeat(20_000), 0o600)).unwrap_err();
        assert!(matches!(e, TokenError::TooLong(_)), "{e}");
    }

    #[test]
    fn the_key_file_wins_over_the_credential_and_no_source_means_no_token() {
        let d = tempfile::tempdir().unwrap();
        let f = Path::new("/etc/k");
        assert_eq!(Token::source(Some(f), Some(d.path())), Some(f.into()));
        assert_eq!(Token::source(None, Some(d.path())), None);
        std::fs::write(d.path().join(CREDENTIAL), "t").unwrap();
        assert_eq!(
            Token::source(None, Some(d.path())),
            Some(d.path().join(CREDENTIAL))
        );
        assert_eq!(Token::source(None, None), None);
    }
}
