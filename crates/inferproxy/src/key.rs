//! The model API key: read once at start, before the sandbox closes, through the one reader of
//! secret files (`bxcore::secret`), and never shown.
//!
//! [`ApiKey`] has no `Display`, and its `Debug` prints `ApiKey(redacted)`, so no format string,
//! log line or error can carry the key by accident. The only way to the bytes is
//! [`ApiKey::header_value`], used where the provider's auth header is built. Text that came back
//! from a provider (an error message that echoes the key) goes through [`ApiKey::redact`] before
//! it is logged or sent to loopd.

use std::fmt;
use std::path::{Path, PathBuf};

use bxcore::runbook::Anchored;
use bxcore::secret::{self, Secret, SecretFile, SecretFileError};

use crate::redact::Redactor;

/// The runbook anchor of a key that cannot be read, is empty or cannot be a header value.
pub const KEY_ANCHOR: &str = "inferproxy-key-missing";

/// The runbook anchor of a key file that others than its owner may read or change.
pub const KEY_OPEN_ANCHOR: &str = "inferproxy-key-open";

/// The systemd credential name the key is read from when `api_key_file` is not set.
pub const CREDENTIAL: &str = "api_key";

/// How the refusals of the key file word it, and where they point (the anchors above).
pub const KEY_FILE: SecretFile = bxcore::secret::MODEL_KEY;

/// A model API key: printable ASCII, so also a `str`. Never printed, never compared in a way a
/// caller can observe byte by byte; its bytes are zeroed when it is dropped.
pub struct ApiKey(Secret);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(redacted)")
    }
}

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Neither `[provider] api_key_file` nor `$CREDENTIALS_DIRECTORY` is set.
    #[error(
        "no API key: set [provider] api_key_file, or pass the systemd credential `{CREDENTIAL}` \
         (LoadCredential=)"
    )]
    NotConfigured,
    /// The file could not be read, is too large, or others than its owner may read or change it
    /// (refused as OpenSSH refuses an open private key: the key may already have leaked).
    #[error(transparent)]
    File(#[from] SecretFileError),
    /// The file holds nothing but whitespace.
    #[error("the API key file {} is empty", .0.display())]
    Empty(PathBuf),
    /// The key holds a byte an HTTP header value cannot carry (a control character, a line
    /// break inside it, non-ASCII).
    #[error(
        "the API key in {} holds a character an HTTP header cannot carry (only printable ASCII is \
         allowed)",
        .0.display()
    )]
    NotAHeaderValue(PathBuf),
}

impl Anchored for KeyError {
    fn anchor(&self) -> &str {
        match self {
            KeyError::File(e) => e.anchor(),
            _ => KEY_ANCHOR,
        }
    }
}

impl ApiKey {
    /// Where the key is read from: `api_key_file` when set, else
    /// `$CREDENTIALS_DIRECTORY/api_key` (`credentials_directory` is that variable's value).
    pub fn source(
        api_key_file: Option<&Path>,
        credentials_directory: Option<&Path>,
    ) -> Result<PathBuf, KeyError> {
        match (api_key_file, credentials_directory) {
            (Some(p), _) => Ok(p.to_path_buf()),
            (None, Some(dir)) if !dir.as_os_str().is_empty() => Ok(dir.join(CREDENTIAL)),
            _ => Err(KeyError::NotConfigured),
        }
    }

    /// Read the key from `path` (`bxcore::secret::read`), surrounding whitespace trimmed. An
    /// empty key, or one that is not printable ASCII (it would not survive as a header value, or
    /// could split a header), is refused.
    pub fn read(path: &Path) -> Result<ApiKey, KeyError> {
        ApiKey::from_secret(path, &secret::read(path, KEY_FILE)?)
    }

    fn from_secret(path: &Path, raw: &Secret) -> Result<ApiKey, KeyError> {
        let key = raw.slice(<[u8]>::trim_ascii);
        if key.bytes().is_empty() {
            return Err(KeyError::Empty(path.into()));
        }
        if !key.bytes().iter().all(|b| (0x20..0x7f).contains(b)) {
            return Err(KeyError::NotAHeaderValue(path.into()));
        }
        Ok(ApiKey(key))
    }

    /// No key: for a local server that takes none (`[provider] keyless = true`). No auth
    /// header is sent, and there is nothing to redact.
    pub fn none() -> ApiKey {
        ApiKey(Secret::new(Vec::new()))
    }

    /// Whether this is [`ApiKey::none`].
    pub fn is_none(&self) -> bool {
        self.0.bytes().is_empty()
    }

    #[cfg(test)]
    fn from_text(path: &Path, text: &str) -> Result<ApiKey, KeyError> {
        ApiKey::from_secret(path, &Secret::new(text.as_bytes().to_vec()))
    }

    /// The key, for the provider's auth header and nothing else.
    pub(crate) fn header_value(&self) -> &str {
        // Printable ASCII, checked when it was read.
        std::str::from_utf8(self.0.bytes()).unwrap_or_default()
    }

    /// `text` with every copy of the key replaced by `[redacted]`, also where JSON escapes
    /// hide it (see [`Redactor::text`]): for anything a provider sent back that is logged or
    /// forwarded.
    pub fn redact(&self, text: &str) -> String {
        self.redactor().text(text)
    }

    /// What redacts this key from text, values and streams.
    pub fn redactor(&self) -> Redactor<'_> {
        Redactor::new(self.header_value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_file_points_at_inferproxys_own_entries() {
        assert_eq!(KEY_FILE.anchor, KEY_ANCHOR);
        assert_eq!(KEY_FILE.open_anchor, KEY_OPEN_ANCHOR);
    }

    #[test]
    fn debug_never_shows_the_key() {
        let k = ApiKey::from_text(Path::new("k"), "sk-test-123\n").unwrap();
        assert_eq!(format!("{k:?}"), "ApiKey(redacted)");
        assert_eq!(format!("{:?}", Some(&k)), "Some(ApiKey(redacted))");
        assert_eq!(k.header_value(), "sk-test-123");
    }

    #[test]
    fn surrounding_whitespace_is_trimmed() {
        let k = ApiKey::from_text(Path::new("k"), "  \tsk-abc \r\n\n").unwrap();
        assert_eq!(k.header_value(), "sk-abc");
    }

    #[test]
    fn an_empty_key_is_refused() {
        let e = ApiKey::from_text(Path::new("/run/k"), " \n\t").unwrap_err();
        assert!(matches!(e, KeyError::Empty(_)));
        assert_eq!(
            e.pointed().to_string(),
            format!(
                "the API key file /run/k is empty; {}",
                bxcore::runbook::pointer("inferproxy-key-missing")
            )
        );
    }

    #[test]
    fn a_key_that_could_split_a_header_is_refused_without_showing_it() {
        let e = ApiKey::from_text(Path::new("k"), "sk-a\r\nX-Evil: 1").unwrap_err();
        assert!(matches!(e, KeyError::NotAHeaderValue(_)));
        assert!(!e.to_string().contains("sk-a"), "{e}");
        assert!(ApiKey::from_text(Path::new("k"), "sk-é").is_err());
    }

    #[test]
    fn the_file_wins_over_the_credential_directory() {
        let p = ApiKey::source(Some(Path::new("/a/key")), Some(Path::new("/creds"))).unwrap();
        assert_eq!(p, Path::new("/a/key"));
        let p = ApiKey::source(None, Some(Path::new("/creds"))).unwrap();
        assert_eq!(p, Path::new("/creds/api_key"));
        assert!(matches!(
            ApiKey::source(None, None),
            Err(KeyError::NotConfigured)
        ));
        assert!(matches!(
            ApiKey::source(None, Some(Path::new(""))),
            Err(KeyError::NotConfigured)
        ));
    }

    #[test]
    fn a_missing_file_is_refused_with_its_path() {
        let e = ApiKey::read(Path::new("/nonexistent/inferproxy/key")).unwrap_err();
        let s = e.pointed().to_string();
        assert!(s.starts_with("cannot read the API key file /nonexistent/inferproxy/key"));
        assert!(s.ends_with(&bxcore::runbook::pointer("inferproxy-key-missing")));
    }

    #[test]
    fn a_key_file_its_group_or_others_may_read_is_refused_with_its_pointer() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "sk-open\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = ApiKey::read(&path).unwrap_err();
            assert!(
                matches!(e, KeyError::File(SecretFileError::Open { mode: m, .. }) if m == mode),
                "{mode:o}: {e}"
            );
            let s = e.pointed().to_string();
            assert!(s.contains(&format!("has mode {mode:04o}")), "{s}");
            assert!(
                s.ends_with(&bxcore::runbook::pointer("inferproxy-key-open")),
                "{s}"
            );
            assert!(!s.contains("sk-open"), "{s}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(ApiKey::read(&path).unwrap().header_value(), "sk-open");
        }
    }

    #[test]
    fn redact_removes_every_copy_of_the_key() {
        let k = ApiKey::from_text(Path::new("k"), "sk-SECRET").unwrap();
        assert_eq!(
            k.redact("Incorrect API key provided: sk-SECRET (sk-SECRET)"),
            "Incorrect API key provided: [redacted] ([redacted])"
        );
    }
}
