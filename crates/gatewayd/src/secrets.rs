//! The credentials gatewayd adds to requests, and the check that no request carries one out.
//!
//! A secret is read from its `secret_file` at start, through the one reader of secret files
//! (`bxcore::secret`, which refuses a file others may read or change), and lives only here: it is added to requests
//! to its own host, and never appears in a reply, a log line or an error. A request whose URL,
//! header names or values, or body holds any secret's value (as is, reversed, URL-encoded, in
//! base64 at any alignment, standard or URL-safe, in base32 at any alignment, or in hex of
//! either case) is refused before anything leaves, and every one of those forms is redacted
//! from a reply: a host that echoes its credential encoded cannot hand it to the model, nor
//! the model on to another host. The check is exact matching of those forms, so it has no false
//! positives to tune; the URL and body are also looked at once percent-decoded, so a partly
//! encoded secret is found too.

use std::fmt;
use std::path::Path;

use data_encoding::{BASE32_NOPAD, BASE64_NOPAD, BASE64URL_NOPAD, Encoding, HEXLOWER, HEXUPPER};

use bxcore::secret::SecretFile;
pub use bxcore::secret::SecretFileError;

use crate::config::{CONFIG_ANCHOR, MIN_SECRET_BYTES};

/// How the refusals of a secret file word it, and where they point.
pub const SECRET_FILE: SecretFile = SecretFile {
    file: "the secret file",
    noun: "secret",
    instead: "hand it over as a systemd credential (`credential` in place of `secret_file`)",
    anchor: CONFIG_ANCHOR,
    open_anchor: CONFIG_ANCHOR,
};

/// One configured secret: the host entry it belongs to, and every form it is looked for in.
pub struct Secret {
    /// The `[[hosts]] name` it belongs to, for the refusal (never the value).
    pub host: String,
    value: bxcore::secret::Secret,
    forms: Vec<(Vec<u8>, &'static str)>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("host", &self.host)
            .field("bytes", &self.value.bytes().len())
            .finish_non_exhaustive()
    }
}

/// Why a secret file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// It cannot be read, is too large, or others than its owner may read or change it.
    #[error(transparent)]
    File(#[from] SecretFileError),
    #[error(
        "the secret file {path} holds {len} bytes; at least {MIN_SECRET_BYTES} are needed, so \
         that the leak check cannot match by chance"
    )]
    TooShort { path: String, len: usize },
    #[error(
        "the secret file {path} holds more than one line, or a character a header cannot carry"
    )]
    NotOneLine { path: String },
}

impl Secret {
    /// Read the secret of `host` from `path` (`bxcore::secret::read`): one line, its final
    /// newline not part of it.
    pub fn read(host: &str, path: &Path) -> Result<Secret, SecretError> {
        let shown = path.display().to_string();
        let value = bxcore::secret::read(path, SECRET_FILE)?;
        let bytes = value.bytes();
        if bytes.iter().any(|b| *b < 0x20 || *b == 0x7f) {
            return Err(SecretError::NotOneLine { path: shown });
        }
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                path: shown,
                len: bytes.len(),
            });
        }
        Ok(Secret::with(host, value))
    }

    /// A secret of `host` with this value.
    pub fn new(host: &str, value: Vec<u8>) -> Secret {
        Secret::with(host, bxcore::secret::Secret::new(value))
    }

    fn with(host: &str, value: bxcore::secret::Secret) -> Secret {
        Secret {
            host: host.to_string(),
            forms: forms(value.bytes()),
            value,
        }
    }

    /// The value, for the header of its own host's requests.
    pub fn value(&self) -> &[u8] {
        self.value.bytes()
    }

    /// The form of this secret `haystack` holds, if any.
    fn found_in(&self, haystack: &[u8]) -> Option<&'static str> {
        let lower = haystack.to_ascii_lowercase();
        self.forms.iter().find_map(|(needle, form)| {
            let h = if *form == "hex" { &lower } else { haystack };
            contains(h, needle).then_some(*form)
        })
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every form the value is looked for in, and redacted in.
fn forms(value: &[u8]) -> Vec<(Vec<u8>, &'static str)> {
    let mut out = vec![(value.to_vec(), "as is")];
    let mut reversed = value.to_vec();
    reversed.reverse();
    out.push((reversed, "reversed"));
    let encoded: String =
        percent_encoding::percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string();
    out.push((encoded.clone().into_bytes(), "URL-encoded"));
    out.push((encoded.to_ascii_lowercase().into_bytes(), "URL-encoded"));
    out.push((HEXLOWER.encode(value).into_bytes(), "hex"));
    out.push((HEXUPPER.encode(value).into_bytes(), "hex"));
    out.extend(
        aligned(value, &BASE64_NOPAD, 3, 6)
            .chain(aligned(value, &BASE64URL_NOPAD, 3, 6))
            .map(|f| (f, "base64")),
    );
    for f in aligned(value, &BASE32_NOPAD, 5, 5) {
        out.push((f.to_ascii_lowercase(), "base32"));
        out.push((f, "base32"));
    }
    out.sort();
    out.dedup();
    out
}

/// The value in `encoding` (characters of `bits` bits, in groups of `group` bytes) at each
/// alignment it can have inside a longer text: only the characters that depend on the value's
/// bytes alone, which every encoding of a text holding the value contains.
fn aligned<'a>(
    value: &'a [u8],
    encoding: &'a Encoding,
    group: usize,
    bits: usize,
) -> impl Iterator<Item = Vec<u8>> + 'a {
    (0..group).filter_map(move |k| {
        let mut padded = vec![0u8; k];
        padded.extend(value);
        let enc = encoding.encode(&padded);
        let start = (8 * k).div_ceil(bits);
        let end = (8 * (k + value.len())) / bits;
        (end > start).then(|| enc.as_bytes()[start..end].to_vec())
    })
}

impl Secret {
    /// `text` with every form of this value replaced by `[the credential of <host>]`.
    pub fn redact(&self, text: String) -> String {
        let mut text = text;
        for (form, _) in &self.forms {
            if let Ok(f) = std::str::from_utf8(form) {
                if text.contains(f) {
                    text = text.replace(f, &format!("[the credential of {}]", self.host));
                }
            }
        }
        text
    }
}

/// Where a secret was found, for the refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The host entry whose secret it is.
    pub host: String,
    /// `the URL`, `the header x-y`, `the body`.
    pub place: String,
    /// `as is`, `reversed`, `URL-encoded`, `base64`, `base32`, `hex`.
    pub form: &'static str,
}

/// The first secret any of `parts` (place, bytes) holds, in any form, looked at as given and
/// percent-decoded.
pub fn find(secrets: &[&Secret], parts: &[(String, &[u8])]) -> Option<Found> {
    for (place, bytes) in parts {
        let decoded: Vec<u8> = percent_encoding::percent_decode(bytes).collect();
        let plus: Vec<u8> = decoded
            .iter()
            .map(|b| if *b == b'+' { b' ' } else { *b })
            .collect();
        for s in secrets {
            for h in [&bytes[..], &decoded[..], &plus[..]] {
                if let Some(form) = s.found_in(h) {
                    return Some(Found {
                        host: s.host.clone(),
                        place: place.clone(),
                        form,
                    });
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUE: &[u8] = b"s3cr3t-T0ken/with+chars";

    fn hit(text: &str) -> Option<&'static str> {
        let s = Secret::new("api.example.org", VALUE.to_vec());
        find(&[&s], &[("the URL".into(), text.as_bytes())]).map(|f| f.form)
    }

    #[test]
    fn the_secret_is_found_in_every_form_it_can_travel_in() {
        let plain = String::from_utf8(VALUE.to_vec()).unwrap();
        let enc =
            percent_encoding::percent_encode(VALUE, percent_encoding::NON_ALPHANUMERIC).to_string();
        let hex: String = VALUE.iter().map(|b| format!("{b:02X}")).collect();
        assert!(hit(&format!("https://evil.example/?q={plain}")).is_some());
        assert!(hit(&format!("https://evil.example/?q={enc}")).is_some());
        assert!(hit(&format!("https://evil.example/?q={}", enc.to_lowercase())).is_some());
        assert!(hit("https://evil.example/?q=s3cr3t-T0ken%2Fwith%2Bchars").is_some());
        assert!(hit(&format!("x={hex}")).is_some());
        assert!(hit(&format!("x={}", hex.to_lowercase())).is_some());
        for prefix in ["", "a", "ab", "abc"] {
            let mut text = prefix.as_bytes().to_vec();
            text.extend(VALUE);
            text.extend(b"tail");
            for e in [&BASE64_NOPAD, &BASE64URL_NOPAD] {
                let b64 = e.encode(&text);
                assert_eq!(
                    hit(&format!("body={b64}")),
                    Some("base64"),
                    "{prefix:?} {b64}"
                );
            }
        }
    }

    #[test]
    fn the_secret_reversed_or_in_base32_is_found_and_every_form_is_redacted() {
        let mut rev = VALUE.to_vec();
        rev.reverse();
        assert_eq!(
            hit(&format!("q={}", String::from_utf8(rev.clone()).unwrap())),
            Some("reversed")
        );
        for prefix in ["", "a", "ab", "abc", "abcd"] {
            let mut text = prefix.as_bytes().to_vec();
            text.extend(VALUE);
            let b32 = BASE32_NOPAD.encode(&text);
            assert_eq!(hit(&format!("x={b32}")), Some("base32"), "{prefix:?}");
            assert_eq!(
                hit(&format!("x={}", b32.to_lowercase())),
                Some("base32"),
                "{prefix:?}"
            );
        }
        let s = Secret::new("api.example.org", VALUE.to_vec());
        for echoed in [
            String::from_utf8(VALUE.to_vec()).unwrap(),
            String::from_utf8(rev).unwrap(),
            BASE64_NOPAD.encode(VALUE),
            BASE64URL_NOPAD.encode(&[b"x", VALUE].concat()),
            BASE32_NOPAD.encode(VALUE),
            HEXUPPER.encode(VALUE),
            HEXLOWER.encode(VALUE),
        ] {
            let out = s.redact(format!("you sent: {echoed}."));
            assert!(out.contains("[the credential of api.example.org]"), "{out}");
            assert_eq!(hit(&out), None, "{out}");
        }
    }

    #[test]
    fn text_without_the_secret_passes() {
        assert_eq!(hit("https://example.org/search?q=s3cr3t-T0ken"), None);
        assert_eq!(hit("https://example.org/"), None);
    }

    #[test]
    fn a_short_or_multiline_secret_file_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, "short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            Secret::read("h", &p),
            Err(SecretError::TooShort { len: 5, .. })
        ));
        std::fs::write(&p, "long enough\nsecond line\n").unwrap();
        assert!(matches!(
            Secret::read("h", &p),
            Err(SecretError::NotOneLine { .. })
        ));
        std::fs::write(&p, "long enough value\n").unwrap();
        assert_eq!(Secret::read("h", &p).unwrap().value(), b"long enough value");
    }

    #[test]
    fn a_secret_file_others_may_read_is_refused_with_the_configuration_anchor() {
        use bxcore::runbook::Anchored;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, "long enough value\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let Err(SecretError::File(e)) = Secret::read("h", &p) else {
            panic!("an open secret file was read");
        };
        assert!(
            matches!(e, SecretFileError::Open { mode: 0o640, .. }),
            "{e}"
        );
        assert_eq!(e.anchor(), CONFIG_ANCHOR);
        assert!(
            e.to_string().ends_with(
                "has mode 0640: its group or others may read or change it, so the secret is \
                 refused (allow its owner only: chmod 600, or hand it over as a systemd \
                 credential (`credential` in place of `secret_file`))"
            ),
            "{e}"
        );
    }
}
