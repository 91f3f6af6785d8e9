//! The fingerprints of what brokerd released from secret roots, so that a secret cannot change
//! sessions: session A reads a secret file (A becomes secret and may not send), and session B,
//! fresh and private, is handed the same text by a compromised loopd and asked to send it out.
//! Every egress or write-down argument is looked up here, plain and in the encodings a model
//! reaches for (URL-encoded, base64, hex); a hit is `denied` with reason `leak`.
//!
//! A fingerprint is a keyed Rabin-Karp hash of one 16-byte window of released content (of the
//! whole content when it is shorter, down to 8 bytes). The store is bounded (oldest out first),
//! kept in `<home>/broker/fingerprints.bin` and replaced atomically before the content it
//! fingerprints is answered, so a restart forgets nothing that was released. The decoders below
//! are scanners, not codecs: they decode every run of the alphabet at every alignment and never
//! fail, which no codec crate offers.

use std::collections::{HashSet, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bxcore::runbook::Anchored;
use serde_json::Value;

/// The runbook anchor of a call denied as a leak.
pub const LEAK_ANCHOR: &str = "broker-leak-denied";
/// The runbook anchor of a store that cannot be read or written.
pub const STORE_ANCHOR: &str = "broker-fingerprints-damaged";

/// The window a fingerprint covers.
pub const WINDOW: usize = 16;
/// The shortest content fingerprinted whole; shorter text cannot be told from ordinary words.
pub const SHORT_MIN: usize = 8;
/// The most fingerprints kept.
pub const MAX_ENTRIES: usize = 65_536;
/// The most fingerprints one release adds: a longer content is sampled at a stride, so a leak of
/// it is caught from `WINDOW + stride - 1` consecutive bytes on.
pub const PER_RELEASE: usize = 16_384;

const MAGIC: &[u8; 8] = b"BXFP1\n\0\0";
/// The Mersenne prime 2^61 - 1, the hash's modulus.
const P: u64 = (1 << 61) - 1;

fn mulmod(a: u64, b: u64) -> u64 {
    ((u128::from(a) * u128::from(b)) % u128::from(P)) as u64
}

/// A store that cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[error("the fingerprint store {}: {why}", path.display())]
pub struct StoreError {
    pub path: PathBuf,
    pub why: String,
}

impl Anchored for StoreError {
    fn anchor(&self) -> &str {
        STORE_ANCHOR
    }
}

#[derive(Debug)]
struct Inner {
    base: u64,
    order: VecDeque<u64>,
    set: HashSet<u64>,
    /// Bit `n` set: a content of `n` bytes (`SHORT_MIN..WINDOW`) was fingerprinted whole.
    short: u16,
}

/// The fingerprints, behind one lock.
#[derive(Debug)]
pub struct Fingerprints {
    path: PathBuf,
    inner: Mutex<Inner>,
}

/// How a leaked window was carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Plain,
    UrlEncoded,
    Base64,
    Hex,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Plain => "plain",
            Encoding::UrlEncoded => "url-encoded",
            Encoding::Base64 => "base64",
            Encoding::Hex => "hex",
        }
    }
}

impl Fingerprints {
    /// The store in `dir`: read whole when it exists (a damaged file is an error, never an empty
    /// store), a new key when it does not.
    pub fn open(dir: &Path) -> Result<Fingerprints, StoreError> {
        let path = dir.join("fingerprints.bin");
        let fail = |why: String| StoreError {
            path: path.clone(),
            why,
        };
        let inner = match fs::read(&path) {
            Ok(bytes) => {
                if bytes.len() < 16 || &bytes[..8] != MAGIC || (bytes.len() - 16) % 8 != 0 {
                    return Err(fail("is not a fingerprint store (or is cut short)".into()));
                }
                let word = |at: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&bytes[at..at + 8]);
                    u64::from_le_bytes(w)
                };
                let base = word(8);
                if !(256..P).contains(&base) {
                    return Err(fail("holds a key out of range".into()));
                }
                let n = (bytes.len() - 16) / 8;
                let mut inner = Inner {
                    base,
                    order: VecDeque::with_capacity(n),
                    set: HashSet::with_capacity(n),
                    short: 0,
                };
                for i in 0..n {
                    let fp = word(16 + 8 * i);
                    if inner.set.insert(fp) {
                        inner.order.push_back(fp);
                    }
                    if let Some(len) = short_len(fp) {
                        inner.short |= 1 << len;
                    }
                }
                inner
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut key = [0u8; 8];
                getrandom::fill(&mut key).map_err(|e| fail(format!("no key: {e}")))?;
                Inner {
                    base: 256 + u64::from_le_bytes(key) % (P - 256),
                    order: VecDeque::new(),
                    set: HashSet::new(),
                    short: 0,
                }
            }
            Err(e) => return Err(fail(format!("cannot be read: {e}"))),
        };
        Ok(Fingerprints {
            path,
            inner: Mutex::new(inner),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many fingerprints are kept.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fingerprint `content`, released from a secret root, and make the store durable: before
    /// the content is answered.
    pub fn release(&self, content: &[u8]) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let base = inner.base;
        let mut added = Vec::new();
        let trimmed = content.trim_ascii();
        if content.len() >= WINDOW {
            let windows = content.len() - WINDOW + 1;
            let stride = windows.div_ceil(PER_RELEASE).max(1);
            rolling(content, WINDOW, base, |i, fp| {
                if i % stride == 0 {
                    added.push(fp);
                }
                false
            });
        } else if trimmed.len() >= SHORT_MIN {
            added.push(tag(hash(trimmed, base), trimmed.len()));
            inner.short |= 1 << trimmed.len();
        }
        let mut changed = false;
        for fp in added {
            if inner.set.insert(fp) {
                inner.order.push_back(fp);
                changed = true;
            }
        }
        while inner.order.len() > MAX_ENTRIES {
            if let Some(old) = inner.order.pop_front() {
                inner.set.remove(&old);
            }
        }
        if changed {
            self.write(&inner)?;
        }
        Ok(())
    }

    /// Whether any string in `args` carries a released window, and how.
    pub fn leak(&self, args: &Value) -> Option<Encoding> {
        crate::policy::Leaks::leak(self, args)
    }
}

impl crate::policy::Leaks for Fingerprints {
    fn leak(&self, args: &Value) -> Option<Encoding> {
        let inner = self.lock();
        if inner.set.is_empty() {
            return None;
        }
        let mut found = None;
        strings(args, &mut |s| {
            if found.is_none() {
                found = inner.scan(s.as_bytes());
            }
        });
        found
    }
}

impl Fingerprints {
    /// Replace the file durably (`bxcore::durable`).
    fn write(&self, inner: &Inner) -> Result<(), StoreError> {
        let mut body = Vec::with_capacity(16 + 8 * inner.order.len());
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&inner.base.to_le_bytes());
        for fp in &inner.order {
            body.extend_from_slice(&fp.to_le_bytes());
        }
        bxcore::durable::replace(&self.path, &body).map_err(|e| StoreError {
            path: self.path.clone(),
            why: e.to_string(),
        })
    }
}

impl Inner {
    /// `bytes` plain and percent-decoded, each as it is and with its base64 and hex runs decoded.
    fn scan(&self, bytes: &[u8]) -> Option<Encoding> {
        if self.hit(bytes) {
            return Some(Encoding::Plain);
        }
        if let Some(e) = self.decoded(bytes) {
            return Some(e);
        }
        if bytes.iter().any(|&b| b == b'%' || b == b'+') {
            let plain = percent_decode(bytes);
            if self.hit(&plain) {
                return Some(Encoding::UrlEncoded);
            }
            return self.decoded(&plain);
        }
        None
    }

    fn decoded(&self, bytes: &[u8]) -> Option<Encoding> {
        let b64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_');
        for run in runs(bytes, b64, WINDOW * 4 / 3) {
            for skip in 0..4 {
                if run.len() > skip && self.hit(&base64_decode(&run[skip..])) {
                    return Some(Encoding::Base64);
                }
            }
        }
        for run in runs(bytes, |b: u8| b.is_ascii_hexdigit(), 2 * SHORT_MIN) {
            for skip in 0..2 {
                if run.len() > skip && self.hit(&hex_decode(&run[skip..])) {
                    return Some(Encoding::Hex);
                }
            }
        }
        None
    }

    /// Whether a window of `bytes` (16 bytes, or a short content's length) is in the store.
    fn hit(&self, bytes: &[u8]) -> bool {
        if rolling(bytes, WINDOW, self.base, |_, fp| self.set.contains(&fp)) {
            return true;
        }
        (SHORT_MIN..WINDOW).any(|len| {
            self.short & (1 << len) != 0
                && rolling(bytes, len, self.base, |_, fp| self.set.contains(&fp))
        })
    }
}

/// The hash of `bytes` under `base`.
fn hash(bytes: &[u8], base: u64) -> u64 {
    bytes
        .iter()
        .fold(0, |h, &b| (mulmod(h, base) + u64::from(b)) % P)
}

/// A hash tagged with its window's length, so that windows of two lengths never collide.
fn tag(h: u64, len: usize) -> u64 {
    h | ((len as u64) << 59)
}

/// The length a short fingerprint was taken over, if it is one.
fn short_len(fp: u64) -> Option<usize> {
    let len = (fp >> 59) as usize;
    (SHORT_MIN..WINDOW).contains(&len).then_some(len)
}

/// Call `f(i, fingerprint)` for each window of `len` bytes, in order, until it says stop: whether
/// it did.
fn rolling(bytes: &[u8], len: usize, base: u64, mut f: impl FnMut(usize, u64) -> bool) -> bool {
    if bytes.len() < len || len == 0 {
        return false;
    }
    // base^(len-1): what the byte leaving the window weighs.
    let top = (1..len).fold(1, |p, _| mulmod(p, base));
    let mut h = hash(&bytes[..len], base);
    if f(0, tag(h, len)) {
        return true;
    }
    for i in 1..=bytes.len() - len {
        let out = mulmod(u64::from(bytes[i - 1]), top);
        h = (h + P - out) % P;
        h = (mulmod(h, base) + u64::from(bytes[i + len - 1])) % P;
        if f(i, tag(h, len)) {
            return true;
        }
    }
    false
}

/// Every string in `v`, keys included.
fn strings(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, f)),
        Value::Object(m) => m.iter().for_each(|(k, x)| {
            f(k);
            strings(x, f);
        }),
        _ => {}
    }
}

/// The maximal runs of bytes `keep` holds, at least `min` long.
fn runs(bytes: &[u8], keep: impl Fn(u8) -> bool, min: usize) -> Vec<&[u8]> {
    bytes
        .split(|&b| !keep(b))
        .filter(|r| r.len() >= min)
        .collect()
}

/// `%41` is `A`, `+` is a space; a `%` without two hex digits stays as it is.
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex_val(bytes[i + 1]), hex_val(bytes[i + 2])) {
                (Some(a), Some(b)) => {
                    out.push(a << 4 | b);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

fn hex_val(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Pairs of hex digits as bytes; a last odd digit is dropped.
fn hex_decode(run: &[u8]) -> Vec<u8> {
    run.chunks_exact(2)
        .filter_map(|p| Some(hex_val(p[0])? << 4 | hex_val(p[1])?))
        .collect()
}

/// Base64 of either alphabet (`+/` or `-_`), without padding; a last partial group gives the
/// bytes it holds whole.
fn base64_decode(run: &[u8]) -> Vec<u8> {
    let val = |b: u8| -> u32 {
        match b {
            b'A'..=b'Z' => u32::from(b - b'A'),
            b'a'..=b'z' => u32::from(b - b'a') + 26,
            b'0'..=b'9' => u32::from(b - b'0') + 52,
            b'+' | b'-' => 62,
            _ => 63,
        }
    };
    let mut out = Vec::with_capacity(run.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for &b in run {
        acc = (acc << 6) | val(b);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store(content: &str) -> (tempfile::TempDir, Fingerprints) {
        let d = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        f.release(content.as_bytes()).unwrap();
        (d, f)
    }

    #[test]
    fn a_released_window_is_found_plain_url_encoded_base64_and_hex() {
        let secret = "correct horse battery staple 4711";
        let (_d, f) = store(secret);
        let piece = &secret[3..25];
        assert_eq!(f.leak(&json!({"url": piece})), Some(Encoding::Plain));
        let url = piece.replace(' ', "+");
        assert_eq!(
            f.leak(&json!({"url": format!("https://x/?q={url}")})),
            Some(Encoding::UrlEncoded)
        );
        let pct: String = piece.bytes().map(|b| format!("%{b:02X}")).collect();
        assert_eq!(f.leak(&json!({"u": pct})), Some(Encoding::UrlEncoded));
        let hex: String = piece.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            f.leak(&json!({"u": format!("id={hex}")})),
            Some(Encoding::Hex)
        );
        for prefix in ["", "a", "ab", "abc"] {
            let b64 = b64(&format!("{prefix}{piece}"));
            assert_eq!(
                f.leak(&json!({"u": format!("/p/{b64}")})),
                Some(Encoding::Base64),
                "{prefix}"
            );
        }
        assert_eq!(f.leak(&json!({"u": "correct horse"})), None);
        assert_eq!(
            f.leak(&json!({"u": "nothing of the kind at all here"})),
            None
        );
    }

    fn b64(s: &str) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in s.as_bytes().chunks(3) {
            let n = c.iter().fold(0u32, |a, &b| a << 8 | u32::from(b)) << (8 * (3 - c.len()));
            for i in 0..=c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn a_short_secret_is_fingerprinted_whole() {
        let (_d, f) = store("4711-0815\n");
        assert_eq!(
            f.leak(&json!({"u": "pin=4711-0815&x=1"})),
            Some(Encoding::Plain)
        );
        assert_eq!(f.leak(&json!({"u": "pin=4711-0816"})), None);
    }

    #[test]
    fn the_store_survives_a_reopen_and_a_damaged_one_is_an_error() {
        let (d, f) = store("correct horse battery staple");
        let n = f.len();
        drop(f);
        let again = Fingerprints::open(d.path()).unwrap();
        assert_eq!(again.len(), n);
        assert!(again.leak(&json!(["horse battery staple"])).is_some());
        let path = d.path().join("fingerprints.bin");
        let mut bytes = fs::read(&path).unwrap();
        bytes.pop();
        fs::write(&path, bytes).unwrap();
        assert!(Fingerprints::open(d.path()).is_err());
    }

    #[test]
    fn the_store_is_bounded() {
        let d = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let big: Vec<u8> = (0..600_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for chunk in big.chunks(100_000) {
            f.release(chunk).unwrap();
        }
        assert_eq!(f.len(), MAX_ENTRIES);
    }
}
