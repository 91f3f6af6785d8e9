//! Canonical JSON, for digests and the audit chain: UTF-8, no whitespace, object keys sorted by
//! their bytes, numbers and strings as serde_json writes them. Written here rather than left to
//! `serde_json::to_string`, whose key order depends on a crate feature any dependency may turn on.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical JSON text of `value`.
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write(&mut out, value);
    out
}

fn write(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
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
        // Scalars have one serde_json form: no whitespace to remove, no keys to sort.
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Lowercase hex sha256 of the canonical JSON of `value`: an approval's `digest`.
pub fn digest(value: &Value) -> String {
    sha256_hex(to_string(value).as_bytes())
}
