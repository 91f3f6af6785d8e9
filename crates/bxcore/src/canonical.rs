//! Canonical JSON, for digests and the audit chain: UTF-8, no whitespace, object keys sorted by
//! their bytes, numbers and strings as serde_json writes them. Written here rather than left to
//! `serde_json::to_string`, whose key order depends on a crate feature any dependency may turn on.
//!
//! Everything is written into one `String`: no key is cloned and no scalar gets a string of its
//! own (the audit chain writes and hashes every record with these).

use std::fmt::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical JSON text of `value`.
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write(&mut out, value);
    out
}

/// Append the canonical JSON text of `value` to `out`.
pub fn write(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                write(out, v);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(out, v);
            }
            out.push(']');
        }
        Value::String(s) => write_str(out, s),
        // A number's `Display` is serde_json's own writer (itoa for integers, its shortest
        // round-trip form for floats); writing into a `String` cannot fail.
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Null => out.push_str("null"),
    }
}

/// Append `s` as a JSON string, quoted and escaped exactly as serde_json escapes it: `"` and `\`
/// with a backslash, the control characters U+0000 to U+001F as `\b \t \n \f \r` or `\u00xx`
/// (lowercase hex), and nothing else (not `/`, not DEL, not non-ASCII).
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        // Most bytes are written as they are: one test for them.
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0c => "\\f",
            b'\r' => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `i` is at an ASCII byte, so both slices end on character boundaries.
        out.push_str(&s[run..i]);
        if esc.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(esc);
        }
        run = i + 1;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The two lowercase hex digits of every byte.
const HEX_PAIRS: [[u8; 2]; 256] = {
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    t
};

/// The 64 lowercase hex digits of a sha256 digest, on the stack: for comparing with a hash
/// kept as text without making a `String`.
pub fn hex(digest: &[u8; 32]) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (pair, &b) in out.chunks_exact_mut(2).zip(digest) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
    }
    out
}

/// The lowercase hex of a sha256 digest, as a `String`.
pub fn hex_string(digest: &[u8; 32]) -> String {
    hex(digest).iter().map(|&b| char::from(b)).collect()
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex_string(&Sha256::digest(bytes).into())
}

/// Lowercase hex sha256 of the canonical JSON of `value`: an approval's `digest`.
pub fn digest(value: &Value) -> String {
    sha256_hex(to_string(value).as_bytes())
}
