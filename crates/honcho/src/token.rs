//! The bearer token Honcho is asked with when its auth is on: read once at start (before the
//! sandbox closes) from a key file or the systemd credential [`CREDENTIAL`] through the one reader
//! of secret files (`bxcore::secret`, which refuses a file others may read or change), and never
//! shown.
//!
//! [`Token`] has no `Display`, its `Debug` prints `Token(redacted)`, and its bytes are zeroed when
//! it is dropped.

use std::fmt;
use std::path::{Path, PathBuf};

use bxcore::secret::{self, Secret, SecretFile, SecretFileError};

/// The systemd credential (`LoadCredential=honcho_key:…`) read when no key file is named.
pub const CREDENTIAL: &str = "honcho_key";

/// The runbook anchor of a token that cannot be read, is empty or cannot be a header value.
pub const TOKEN_ANCHOR: &str = "honcho-key-missing";

/// The runbook anchor of a key file others may read or change.
pub const TOKEN_OPEN_ANCHOR: &str = "honcho-key-open";

/// How the refusals of the key file word it, and where they point.
pub const KEY_FILE: SecretFile = SecretFile {
    file: "the Honcho key file",
    noun: "token",
    instead: "pass it as the systemd credential `honcho_key`",
    anchor: TOKEN_ANCHOR,
    open_anchor: TOKEN_OPEN_ANCHOR,
};

/// A bearer token for Honcho: printable ASCII without spaces.
pub struct Token(Secret);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(redacted)")
    }
}

/// Why the token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read, is over `bxcore::secret::MAX_SECRET_FILE` bytes (a Honcho JWT
    /// is a few hundred), or others than its owner may read or change it.
    #[error(transparent)]
    File(#[from] SecretFileError),
    #[error("the Honcho key file {} is empty", .0.display())]
    Empty(PathBuf),
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
            TokenError::File(e) => bxcore::runbook::Anchored::anchor(e),
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

    /// Read the token from `path` (`bxcore::secret::read`), surrounding whitespace trimmed.
    pub fn read(path: &Path) -> Result<Token, TokenError> {
        Token::from_secret(path, &secret::read(path, KEY_FILE)?)
    }

    fn from_secret(path: &Path, raw: &Secret) -> Result<Token, TokenError> {
        let t = raw.slice(<[u8]>::trim_ascii);
        if t.bytes().is_empty() {
            return Err(TokenError::Empty(path.into()));
        }
        if !t.bytes().iter().all(|b| (0x21..0x7f).contains(b)) {
            return Err(TokenError::NotAHeaderValue(path.into()));
        }
        Ok(Token(t))
    }

    #[cfg(test)]
    fn from_text(path: &Path, text: &str) -> Result<Token, TokenError> {
        Token::from_secret(path, &Secret::new(text.as_bytes().to_vec()))
    }

    /// `Bearer <token>`, for the `Authorization` header and nothing else.
    pub(crate) fn header_value(&self) -> String {
        // Printable ASCII, checked when it was read.
        format!("Bearer {}", String::from_utf8_lossy(self.0.bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::runbook::Anchored;
    use std::os::unix::fs::PermissionsExt;

    fn key_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join("honcho.key");
        // A fresh file each time: the last one may be 0400, which only root could write again
        // (the package's check phase runs as an unprivileged build user).
        let _ = std::fs::remove_file(&p);
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
            assert!(
                matches!(e, TokenError::File(SecretFileError::Open { mode: m, .. }) if m == mode),
                "{e}"
            );
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
        assert!(
            matches!(e, TokenError::File(SecretFileError::Unreadable { .. })),
            "{e}"
        );
        assert_eq!(e.anchor(), "honcho-key-missing");
        let e = Token::read(&key_file(d.path(), &"a".repeat(20_000), 0o600)).unwrap_err();
        assert!(
            matches!(e, TokenError::File(SecretFileError::TooLong { .. })),
            "{e}"
        );
        assert!(
            e.to_string()
                .ends_with("is over 16384 bytes: it holds something else than a token"),
            "{e}"
        );
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
