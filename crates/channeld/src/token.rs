//! The access token: read once at start, before the sandbox closes, from its 0600 file or the
//! systemd credential `matrix_token`; never logged, never in argv or the environment, sent only
//! in the `Authorization` header to the configured homeserver.

use std::fmt;
use std::path::{Path, PathBuf};

use bxcore::runbook::Anchored;
use bxcore::secret::{self, Secret, SecretFile, SecretFileError};

use crate::config::CREDENTIAL;

/// The runbook anchor of a token that cannot be read or used.
pub const TOKEN_ANCHOR: &str = "channel-token-missing";
/// The runbook anchor of a token file others than its owner may read or change.
pub const TOKEN_OPEN_ANCHOR: &str = "channel-token-open";

/// How the refusals of the token file word it, and where they point.
pub const TOKEN_FILE: SecretFile = SecretFile {
    file: "the Matrix access token file",
    noun: "token",
    instead: "pass it as the systemd credential `matrix_token`",
    anchor: TOKEN_ANCHOR,
    open_anchor: TOKEN_OPEN_ANCHOR,
};

/// The bot's access token. No `Display`; `Debug` never shows it; zeroed when dropped.
pub struct Token(Secret);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(redacted)")
    }
}

/// Why the token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "no token: [matrix] token_file is not set and there is no $CREDENTIALS_DIRECTORY \
         (systemd's LoadCredential= with the name {CREDENTIAL})"
    )]
    NoSource,
    #[error(transparent)]
    File(#[from] SecretFileError),
    #[error("the Matrix access token file {} is empty", .0.display())]
    Empty(PathBuf),
    #[error(
        "the Matrix access token in {} holds a character an HTTP header cannot carry (only \
         printable ASCII)",
        .0.display()
    )]
    NotAHeaderValue(PathBuf),
}

impl Anchored for TokenError {
    fn anchor(&self) -> &str {
        match self {
            TokenError::File(e) => e.anchor(),
            _ => TOKEN_ANCHOR,
        }
    }
}

impl Token {
    /// The file `token_file` names, else `$CREDENTIALS_DIRECTORY/matrix_token`.
    pub fn source(token_file: Option<&Path>) -> Result<PathBuf, TokenError> {
        match token_file {
            Some(p) => Ok(p.to_path_buf()),
            None => std::env::var_os("CREDENTIALS_DIRECTORY")
                .map(|d| PathBuf::from(d).join(CREDENTIAL))
                .ok_or(TokenError::NoSource),
        }
    }

    /// Read the token at `path` (whitespace around it is not part of it).
    pub fn read(path: &Path) -> Result<Token, TokenError> {
        let raw = secret::read(path, TOKEN_FILE)?;
        let s = raw.slice(|b| b.trim_ascii());
        if s.bytes().is_empty() {
            return Err(TokenError::Empty(path.to_path_buf()));
        }
        if !s.bytes().iter().all(u8::is_ascii_graphic) {
            return Err(TokenError::NotAHeaderValue(path.to_path_buf()));
        }
        Ok(Token(s))
    }

    /// `Bearer <token>`, for the one header that carries it.
    pub fn header(&self) -> String {
        // Printable ASCII, checked when read.
        format!("Bearer {}", String::from_utf8_lossy(self.0.bytes()))
    }

    /// The token's bytes, for the redaction of what the homeserver answers.
    pub fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_token_is_read_trimmed_and_an_open_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        std::fs::write(&p, "syt_abc\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = Token::read(&p).unwrap();
        assert_eq!(t.header(), "Bearer syt_abc");
        assert_eq!(format!("{t:?}"), "Token(redacted)");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Token::read(&p).unwrap_err();
        assert_eq!(e.anchor(), "channel-token-open");
        assert!(!e.to_string().contains("syt_abc"));
        std::fs::write(&p, "a b\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            Token::read(&p),
            Err(TokenError::NotAHeaderValue(_))
        ));
    }
}
