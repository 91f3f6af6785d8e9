//! The fingerprints of what brokerd released from secret roots, so that a secret cannot change
//! sessions: session A reads a secret file (A becomes secret and may not send), and session B,
//! fresh and private, is handed the same text by a compromised loopd and asked to send it out.
//! Every egress or write-down argument is looked up here, in the forms a model reaches for; a
//! hit is `denied` with reason `leak`.
//!
//! **What is fingerprinted.** Only what came from the root (`toolkit::Output::released`): a
//! file's text, a directory's names, a program's stdout and stderr; never the box's own words (a
//! write's confirmation, the `run` framing) and never a root's own path (`pwd`), which are cut
//! out before hashing. The text is first brought to a canonical form ([`canonical`]): NFKD with
//! its marks dropped (fullwidth, ligatures, accents), lookalike letters of other scripts mapped
//! to Latin, case folded, and everything but letters and digits dropped (white space, format
//! characters such as U+200B, punctuation, separators). A fingerprint is a keyed rolling hash of
//! one 16-byte window of that form; windows with fewer than 4 distinct bytes (runs of one byte,
//! repeated patterns) are skipped; a content whose canonical form is shorter than 16 bytes, down
//! to 4, is fingerprinted whole (a PIN).
//!
//! **What is looked for.** Each argument string as it is, then decoded a bounded number of
//! layers ([`LAYERS`]): percent-encoding, HTML entities, base64 of either alphabet (split by
//! white space too), base32, hex with or without separators, Ascii85 and gzip inside base64;
//! each form canonical, and canonical reversed and in rot13. The decoders are scanners, not
//! codecs: they decode every run of their alphabet at every alignment and never fail, and keep
//! only what decodes to text; a run too short to decode to anything that could hold a content of
//! the store is passed by ([`Inner::decoded_floor`]). The first layer reads the text as it is,
//! reversed and in rot13, so an encoding turned before it was sent is decoded turned back.
//!
//! **Bounded, and never open.** A release adds at most [`PER_RELEASE`] fingerprints (a longer
//! content is sampled at a stride). Nothing is ever evicted: when the store cannot hold a release
//! whole it is *full*, durably, and every egress and write-down is denied until the owner acts
//! (the runbook entry `broker-fingerprints-full`), rather than forget a secret to make room for
//! bulk. The store is `<home>/broker/fingerprints.bin`, replaced atomically before the content it
//! fingerprints is answered, so a restart forgets nothing that was released.

use std::collections::HashSet;
use std::fs;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bxcore::runbook::Anchored;
use serde_json::Value;

/// The runbook anchor of a call denied as a leak.
pub const LEAK_ANCHOR: &str = "broker-leak-denied";
/// The runbook anchor of a store that cannot be read or written.
pub const STORE_ANCHOR: &str = "broker-fingerprints-damaged";
/// The runbook anchor of a store that is full: egress and write-down are denied.
pub const FULL_ANCHOR: &str = "broker-fingerprints-full";
/// The runbook anchor of a release whose fingerprint will deny ordinary text (a short secret, a
/// host name): shown to the owner, since a model may plant one on purpose.
pub const WEAK_ANCHOR: &str = "broker-fingerprint-weak";

/// The window a fingerprint covers, in bytes of the canonical form.
pub const WINDOW: usize = 16;
/// The shortest content fingerprinted whole; shorter text cannot be told from ordinary words.
pub const SHORT_MIN: usize = 4;
/// The most fingerprints kept: 24 bytes of memory each, 8 on disk.
pub const MAX_ENTRIES: usize = 65_536;
/// The most fingerprints one release adds: a longer content is sampled at a stride, so a leak of
/// it is caught from `WINDOW + stride - 1` consecutive canonical bytes on.
pub const PER_RELEASE: usize = 2_048;
/// A window with fewer distinct bytes is not fingerprinted: `0000000000000000`, `abababab...`.
pub const MIN_DISTINCT: usize = 4;
/// How many layers of encoding are taken off an argument.
pub const LAYERS: usize = 3;

const MAGIC: &[u8; 8] = b"BXFP2\n\0\0";
/// The first format: windows of the raw bytes, which this one cannot look up.
const OLD_MAGIC: &[u8; 8] = b"BXFP1\n\0\0";
const HEAD: usize = 24;
const FLAG_FULL: u64 = 1;
const FLAG_OLD: u64 = 2;
/// Every content released was ASCII once canonical (see [`Inner::decoded_floor`]). A store
/// written before this flag was kept reads as not narrow, which only makes the check look at
/// more.
const FLAG_NARROW: u64 = 4;
/// The most canonical bytes of ASCII one byte of UTF-8 becomes: `㎯` (three bytes) is `rads2`.
/// `the_canonical_form_of_ascii_is_at_most_five_thirds_of_the_bytes` holds the canonical form
/// to it, over every character.
const EXPANSION: (usize, usize) = (5, 3);
/// The prefilter's size: one bit per 2^-20 of the fingerprints' space (128 KiB, allocated with
/// the first fingerprint).
const FILTER_BITS: u32 = 20;

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

/// Why the store holds no more: every egress and write-down is denied while it is so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    #[error(
        "the leak check's fingerprint store is full ({MAX_ENTRIES} fingerprints) and could not \
         hold a release from a secret root whole"
    )]
    Capacity,
    #[error(
        "the leak check's fingerprint store holds fingerprints of an older format, which this \
         brokerd cannot look up"
    )]
    OldFormat,
}

/// A fingerprint is already a hash: the set takes it as its own, spread by one multiplication.
#[derive(Debug, Default, Clone, Copy)]
struct Ident(u64);

impl Hasher for Ident {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Set = HashSet<u64, BuildHasherDefault<Ident>>;

#[derive(Debug)]
struct Inner {
    /// The hash's key: an odd multiplier.
    base: u64,
    set: Set,
    /// One bit per slice of the fingerprints' space; empty while the set is.
    filter: Vec<u64>,
    /// Bit `n` set: a content of `n` canonical bytes (`SHORT_MIN..WINDOW`) was fingerprinted
    /// whole.
    short: u16,
    /// Every content released was ASCII once canonical.
    narrow: bool,
    full: Option<Full>,
}

/// The fingerprints, behind one lock.
#[derive(Debug)]
pub struct Fingerprints {
    path: PathBuf,
    inner: Mutex<Inner>,
}

/// How a leaked window was carried: the last layer taken off, or the transformation it was
/// found under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Plain,
    UrlEncoded,
    HtmlEntities,
    Base64,
    Base32,
    Base85,
    Hex,
    Gzip,
    Reversed,
    Rot13,
    /// Decodes to more than the check reads (a compression bomb, layers of encodings): what it
    /// hides cannot be seen, so it is taken as a leak.
    TooLarge,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Plain => "plain",
            Encoding::UrlEncoded => "url-encoded",
            Encoding::HtmlEntities => "html-entities",
            Encoding::Base64 => "base64",
            Encoding::Base32 => "base32",
            Encoding::Base85 => "base85",
            Encoding::Hex => "hex",
            Encoding::Gzip => "gzip",
            Encoding::Reversed => "reversed",
            Encoding::Rot13 => "rot13",
            Encoding::TooLarge => "decodes to more than the check reads",
        }
    }
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Released {
    /// Fingerprints added.
    pub added: usize,
    /// The store became full with this release.
    pub filled: bool,
    /// The release will deny ordinary text: the owner is told.
    pub weak: Option<Weak>,
}

/// A release whose fingerprint matches text that is not secret-looking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Weak {
    #[error(
        "a content of {0} characters was fingerprinted whole: any egress or write-down that \
         carries those characters in a row is denied"
    )]
    Short(usize),
    #[error(
        "a content that is a host name was fingerprinted: a write that names that host is \
         denied (a fetch to it is not: the allow-listed part of a URL's host is not checked)"
    )]
    HostName,
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
        let fresh = |full: Option<Full>| -> Result<Inner, StoreError> {
            let mut key = [0u8; 8];
            getrandom::fill(&mut key).map_err(|e| fail(format!("no key: {e}")))?;
            Ok(Inner {
                base: u64::from_le_bytes(key) | 1,
                set: Set::default(),
                filter: Vec::new(),
                short: 0,
                narrow: true,
                full,
            })
        };
        let inner = match fs::read(&path) {
            Ok(bytes) if bytes.len() >= 16 && &bytes[..8] == OLD_MAGIC => {
                // Nothing of it can be looked up now: a store that held something is full
                // until the owner acts; an empty one is simply replaced.
                fresh((bytes.len() > 16).then_some(Full::OldFormat))?
            }
            Ok(bytes) => {
                if bytes.len() < HEAD || &bytes[..8] != MAGIC || (bytes.len() - HEAD) % 8 != 0 {
                    return Err(fail("is not a fingerprint store (or is cut short)".into()));
                }
                let word = |at: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&bytes[at..at + 8]);
                    u64::from_le_bytes(w)
                };
                let base = word(8);
                if base & 1 == 0 {
                    return Err(fail("holds a key out of range".into()));
                }
                let flags = word(16);
                let short = (flags >> 16) as u16;
                let full = if flags & FLAG_OLD != 0 {
                    Some(Full::OldFormat)
                } else if flags & FLAG_FULL != 0 {
                    Some(Full::Capacity)
                } else {
                    None
                };
                let n = (bytes.len() - HEAD) / 8;
                let mut inner = Inner {
                    base,
                    set: Set::with_capacity_and_hasher(n, Default::default()),
                    filter: Vec::new(),
                    short,
                    narrow: flags & FLAG_NARROW != 0,
                    full,
                };
                for i in 0..n {
                    inner.insert(word(HEAD + 8 * i), None);
                }
                inner
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => fresh(None)?,
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
        self.lock().set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the store is full, and why: every egress and write-down is denied while it is.
    pub fn full(&self) -> Option<Full> {
        self.lock().full
    }

    /// Fingerprint what a call released from a secret root (`parts`: each piece that came from
    /// the root, on its own), with every occurrence of `cut` (the roots' own paths) taken out,
    /// and make the store durable: before the content is answered. A release the store cannot
    /// hold whole makes it full, never evicts.
    pub fn release(&self, parts: &[&str], cut: &[&str]) -> Result<Released, StoreError> {
        let mut inner = self.lock();
        let base = inner.base;
        let mut segments: Vec<Vec<u8>> = Vec::new();
        for part in parts {
            for piece in cut_out(part, cut) {
                let mut c = Vec::new();
                canonical(piece.as_bytes(), &mut c);
                if !c.is_empty() {
                    segments.push(c);
                }
            }
        }
        let total: usize = segments.iter().map(Vec::len).sum();
        let narrow = segments.iter().all(|s| s.is_ascii());
        let mut out = Released::default();
        let mut fps = Vec::new();
        let mut short = None;
        if total < WINDOW {
            let whole = segments.concat();
            if whole.len() >= SHORT_MIN {
                fps.push(tag(hash(&whole, base), whole.len()));
                short = Some(whole.len());
                out.weak = Some(Weak::Short(whole.len()));
            }
        } else {
            let windows: usize = segments
                .iter()
                .map(|s| (s.len() + 1).saturating_sub(WINDOW))
                .sum();
            let stride = windows.div_ceil(PER_RELEASE).max(1);
            let mut at = 0usize;
            for s in &segments {
                rolling(s, WINDOW, base, |i, fp| {
                    if (at + i) % stride == 0 && distinct(&s[i..i + WINDOW]) >= MIN_DISTINCT {
                        fps.push(fp);
                    }
                    false
                });
                at += (s.len() + 1).saturating_sub(WINDOW);
            }
        }
        if out.weak.is_none() && parts.iter().any(|p| host_like(p.trim())) {
            out.weak = Some(Weak::HostName);
        }
        fps.sort_unstable();
        fps.dedup();
        fps.retain(|fp| !inner.set.contains(fp));
        let room = MAX_ENTRIES.saturating_sub(inner.set.len());
        if fps.len() > room && inner.full.is_none() {
            inner.full = Some(Full::Capacity);
            out.filled = true;
        }
        fps.truncate(room);
        out.added = fps.len();
        if out.added > 0 && !narrow {
            inner.narrow = false;
        }
        for fp in fps {
            inner.insert(fp, short);
        }
        if out.added > 0 || out.filled {
            self.write(&inner)?;
        }
        Ok(out)
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
        let mut scratch = Scratch::default();
        strings(args, &mut |s| {
            if found.is_none() {
                found = inner.scan(s.as_bytes(), &mut scratch);
            }
        });
        found
    }

    fn full(&self) -> Option<Full> {
        Fingerprints::full(self)
    }
}

impl Fingerprints {
    /// Replace the file durably (`bxcore::durable`).
    fn write(&self, inner: &Inner) -> Result<(), StoreError> {
        let mut body = Vec::with_capacity(HEAD + 8 * inner.set.len());
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&inner.base.to_le_bytes());
        let flags = match inner.full {
            None => 0,
            Some(Full::Capacity) => FLAG_FULL,
            Some(Full::OldFormat) => FLAG_FULL | FLAG_OLD,
        } | if inner.narrow { FLAG_NARROW } else { 0 }
            | u64::from(inner.short) << 16;
        body.extend_from_slice(&flags.to_le_bytes());
        for fp in &inner.set {
            body.extend_from_slice(&fp.to_le_bytes());
        }
        bxcore::durable::replace(&self.path, &body).map_err(|e| StoreError {
            path: self.path.clone(),
            why: e.to_string(),
        })
    }
}

/// Buffers reused across one leak check.
#[derive(Default)]
struct Scratch {
    canon: Vec<u8>,
    bounds: Vec<bool>,
}

impl Inner {
    /// Keep `fp`, a short content's of `short` bytes when it is one.
    fn insert(&mut self, fp: u64, short: Option<usize>) {
        if self.filter.is_empty() {
            self.filter = vec![0; 1 << (FILTER_BITS - 6)];
        }
        if let Some(len) = short {
            self.short |= 1 << len;
        }
        let slot = filter_slot(fp);
        self.filter[slot >> 6] |= 1 << (slot & 63);
        self.set.insert(fp);
    }

    /// The fewest decoded bytes that can hold a content of the store, so that a run too short
    /// to decode to as many is not decoded at all. While every content is ASCII once canonical,
    /// a decoded form holds one only if its canonical form has as many bytes of ASCII as the
    /// shortest content ([`WINDOW`], or a short content's length), and no byte becomes more than
    /// [`EXPANSION`] of them. Once a content of other scripts is in (Hangul: a syllable of three
    /// bytes is up to nine), [`SHORT_MIN`], what the decoders always kept.
    fn decoded_floor(&self) -> usize {
        if !self.narrow {
            return SHORT_MIN;
        }
        let shortest = if self.short == 0 {
            WINDOW
        } else {
            self.short.trailing_zeros() as usize
        };
        (shortest * EXPANSION.1).div_ceil(EXPANSION.0)
    }

    fn contains(&self, fp: u64) -> bool {
        let slot = filter_slot(fp);
        self.filter[slot >> 6] & (1 << (slot & 63)) != 0 && self.set.contains(&fp)
    }

    /// `bytes` as it is, then with up to [`LAYERS`] layers of encoding taken off, each form
    /// checked canonical, reversed and in rot13. What is decoded is bounded by the input's size.
    fn scan(&self, bytes: &[u8], s: &mut Scratch) -> Option<Encoding> {
        if let Some(e) = self.check(bytes, Encoding::Plain, s) {
            return Some(e);
        }
        // What the decoders may produce in all: four times the text for each of its three
        // turns, enough for every layer of an ordinary encoded text (base64 decoded at its four
        // alignments is three times its length), never a compression bomb's.
        let mut budget = 12 * bytes.len() + 4096;
        // An encoding turned before it is decoded (base64 reversed, or in rot13) is decoded
        // turned back: the first layer decodes the text as it is, reversed and in rot13.
        let mut layer = vec![(bytes.to_vec(), None)];
        let mut turns: &[Turn] = &[Turn::Not, Turn::Reversed, Turn::Rot13];
        for _ in 0..LAYERS {
            let mut next = Vec::new();
            for (text, turned) in &layer {
                for (decoded, how, turn) in decodings(text, self.decoded_floor(), turns) {
                    // Fail closed: what the check cannot read whole may hide anything.
                    if how == Encoding::TooLarge || decoded.len() > budget {
                        return Some(Encoding::TooLarge);
                    }
                    let turned = turned.or(turn.encoding());
                    let how = turned.unwrap_or(how);
                    budget -= decoded.len();
                    if let Some(e) = self.check(&decoded, how, s) {
                        return Some(e);
                    }
                    next.push((decoded, turned));
                }
            }
            turns = &[Turn::Not];
            if next.is_empty() {
                break;
            }
            layer = next;
        }
        None
    }

    /// `text`'s canonical form, as it is, reversed and in rot13.
    fn check(&self, text: &[u8], how: Encoding, s: &mut Scratch) -> Option<Encoding> {
        // Token bounds matter only to short contents.
        if self.short == 0 {
            canonical(text, &mut s.canon);
        } else {
            canonical_bounded(text, &mut s.canon, &mut s.bounds);
        }
        let turned = |t: Turn| t.encoding().unwrap_or(how);
        if let Some(t) = self.windows(&s.canon, WINDOW, None) {
            return Some(turned(t));
        }
        // A short content whole, between two token bounds: a PIN `4711` is found in
        // `pin=4711`, `4 7 1 1` and `x4711`, not inside `1247113`.
        (SHORT_MIN..WINDOW)
            .filter(|len| self.short & (1 << len) != 0)
            .find_map(|len| self.windows(&s.canon, len, Some(&s.bounds)))
            .map(turned)
    }

    /// Whether a window of `len` bytes of `canon` is in the store, as it is, reversed or in
    /// rot13 (starting and ending on a token bound, when `bounds` are given). One pass: the
    /// reversed window's hash rolls beside the window's own, by the key's inverse.
    fn windows(&self, canon: &[u8], len: usize, bounds: Option<&[bool]>) -> Option<Turn> {
        if canon.len() < len || len == 0 {
            return None;
        }
        let b = self.base;
        let inv = inverse(b);
        let top = (1..len).fold(1u64, |p, _| p.wrapping_mul(b));
        let k = tag(0, len);
        let w = &canon[..len];
        let mut fwd = hash(w, b);
        let mut rev = w
            .iter()
            .rev()
            .fold(0u64, |h, &c| h.wrapping_mul(b).wrapping_add(u64::from(c)));
        let mut rot = w.iter().fold(0u64, |h, &c| {
            h.wrapping_mul(b)
                .wrapping_add(u64::from(ROT13[usize::from(c)]))
        });
        for i in 0..=canon.len() - len {
            if i > 0 {
                let (out, inn) = (u64::from(canon[i - 1]), u64::from(canon[i + len - 1]));
                fwd = fwd
                    .wrapping_sub(out.wrapping_mul(top))
                    .wrapping_mul(b)
                    .wrapping_add(inn);
                rev = rev
                    .wrapping_sub(out)
                    .wrapping_mul(inv)
                    .wrapping_add(inn.wrapping_mul(top));
                let (ro, ri) = (
                    u64::from(ROT13[canon[i - 1] as usize]),
                    u64::from(ROT13[canon[i + len - 1] as usize]),
                );
                rot = rot
                    .wrapping_sub(ro.wrapping_mul(top))
                    .wrapping_mul(b)
                    .wrapping_add(ri);
            }
            if bounds.is_some_and(|bd| !(bd[i] && bd[i + len])) {
                continue;
            }
            if self.contains(fwd ^ k) {
                return Some(Turn::Not);
            }
            if self.contains(rev ^ k) {
                return Some(Turn::Reversed);
            }
            if self.contains(rot ^ k) {
                return Some(Turn::Rot13);
            }
        }
        None
    }
}

/// How a window was found, or how a text is read before it is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Not,
    Reversed,
    Rot13,
}

impl Turn {
    /// The encoding a leak found under this turn is reported as; `None` as it is.
    fn encoding(self) -> Option<Encoding> {
        match self {
            Turn::Not => None,
            Turn::Reversed => Some(Encoding::Reversed),
            Turn::Rot13 => Some(Encoding::Rot13),
        }
    }
}

/// Each byte in rot13: letters turned by 13, everything else as it is.
static ROT13: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = match c {
            b'a'..=b'm' | b'A'..=b'M' => c + 13,
            b'n'..=b'z' | b'N'..=b'Z' => c - 13,
            _ => c,
        };
        i += 1;
    }
    t
};

/// What each byte can be part of, one bit a class, so that the decoders' scanners read one table.
const C_PCT: u16 = 1;
const C_AMP: u16 = 1 << 1;
const C_UPPER: u16 = 1 << 2;
const C_DIGIT: u16 = 1 << 3;
const C_PUNCT: u16 = 1 << 4;
/// Base64 of either alphabet.
const C_B64: u16 = 1 << 5;
const C_ALNUM: u16 = 1 << 6;
/// Ascii85's alphabet and its `z`.
const C_A85: u16 = 1 << 7;
/// What a run of hex may hold: digits, `0x`/`\x` and the separators between pairs.
const C_HEXISH: u16 = 1 << 8;
const C_HEX: u16 = 1 << 9;
const C_SPACE: u16 = 1 << 10;
static CLASS: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let mut c = 0;
        if b == b'%' {
            c |= C_PCT;
        }
        if b == b'&' {
            c |= C_AMP;
        }
        if b.is_ascii_uppercase() {
            c |= C_UPPER;
        }
        if b.is_ascii_digit() {
            c |= C_DIGIT;
        }
        if matches!(b, b'!'..=b'/' | b':'..=b'@' | b'['..=b'`') {
            c |= C_PUNCT;
        }
        if b.is_ascii_alphanumeric() {
            c |= C_ALNUM | C_B64;
        }
        if matches!(b, b'+' | b'/' | b'-' | b'_') {
            c |= C_B64;
        }
        if matches!(b, b'!'..=b'u' | b'z') {
            c |= C_A85;
        }
        if b.is_ascii_hexdigit() {
            c |= C_HEX | C_HEXISH;
        }
        if matches!(b, b'x' | b'X' | b'\\' | b':' | b'-' | b',' | b'.' | b';')
            || b.is_ascii_whitespace()
        {
            c |= C_HEXISH;
        }
        if b.is_ascii_whitespace() {
            c |= C_SPACE;
        }
        t[i] = c;
        i += 1;
    }
    t
};

fn class(b: u8) -> u16 {
    CLASS[usize::from(b)]
}

/// The inverse of an odd word in the ring of 64-bit words (Newton's iteration).
fn inverse(b: u64) -> u64 {
    let mut x = b;
    for _ in 0..5 {
        x = x.wrapping_mul(2u64.wrapping_sub(b.wrapping_mul(x)));
    }
    x
}

/// A fingerprint's bit in the prefilter: its top bits, which every byte of the window reaches.
fn filter_slot(fp: u64) -> usize {
    (fp >> (64 - FILTER_BITS)) as usize
}

/// `text` with every occurrence of each `cut` taken out: the pieces between them.
fn cut_out<'a>(text: &'a str, cut: &[&str]) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    loop {
        let next = cut
            .iter()
            .filter(|c| !c.is_empty())
            .filter_map(|c| rest.find(c).map(|at| (at, c.len())))
            .min();
        match next {
            Some((at, len)) => {
                pieces.push(&rest[..at]);
                rest = &rest[at + len..];
            }
            None => {
                pieces.push(rest);
                return pieces;
            }
        }
    }
}

/// A name such as `api.example.org`: letters, digits, dots and hyphens, with a dot.
fn host_like(s: &str) -> bool {
    s.len() <= 253
        && s.contains('.')
        && s.bytes().any(|b| b.is_ascii_alphabetic())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

/// How many different bytes `w` holds (up to [`MIN_DISTINCT`]).
fn distinct(w: &[u8]) -> usize {
    let mut seen = [0u8; MIN_DISTINCT];
    let mut n = 0;
    for &b in w {
        if !seen[..n].contains(&b) {
            seen[n] = b;
            n += 1;
            if n == MIN_DISTINCT {
                break;
            }
        }
    }
    n
}

/// The canonical form the store hashes: NFKD with combining marks dropped, lookalike letters of
/// other scripts as their Latin twins, lower case, letters and digits only. Fullwidth `ｓｅｃ`,
/// `S E C`, `s\u{200b}e\u{200b}c`, Cyrillic `ѕес` and `Sec` all become `sec`.
pub fn canonical(bytes: &[u8], out: &mut Vec<u8>) {
    if bytes.is_ascii() {
        // The common case in one pass, with no bounds to keep.
        out.clear();
        out.extend(
            bytes
                .iter()
                .filter(|b| b.is_ascii_alphanumeric())
                .map(u8::to_ascii_lowercase),
        );
    } else {
        let mut bounds = Vec::new();
        canonical_bounded(bytes, out, &mut bounds);
    }
}

/// [`canonical`], and where its tokens begin and end: `bounds[i]` is whether a token bound lies
/// before byte `i` of `out` (a dropped character there, or a change between letters and digits);
/// `bounds` is one longer than `out`, true at both ends.
fn canonical_bounded(bytes: &[u8], out: &mut Vec<u8>, bounds: &mut Vec<bool>) {
    out.clear();
    bounds.clear();
    let mut gap = true;
    let mut digit = false;
    let mut push = |out: &mut Vec<u8>, bounds: &mut Vec<bool>, gap: &mut bool, c: &[u8]| {
        let d = c[0].is_ascii_digit();
        let mark = *gap || (!out.is_empty() && d != digit);
        digit = d;
        *gap = false;
        bounds.push(mark);
        // The bytes of a character past its first are never a bound.
        bounds.extend(std::iter::repeat_n(false, c.len() - 1));
        out.extend_from_slice(c);
    };
    if bytes.is_ascii() {
        for &b in bytes {
            if b.is_ascii_alphanumeric() {
                push(out, bounds, &mut gap, &[b.to_ascii_lowercase()]);
            } else {
                gap = true;
            }
        }
    } else {
        let mut buf = [0u8; 4];
        for c in String::from_utf8_lossy(bytes).chars() {
            if c.is_ascii() {
                if c.is_ascii_alphanumeric() {
                    push(out, bounds, &mut gap, &[c.to_ascii_lowercase() as u8]);
                } else {
                    gap = true;
                }
                continue;
            }
            let mut any = false;
            unicode_normalization::char::decompose_compatible(c, |d| {
                if unicode_normalization::char::is_combining_mark(d) {
                    return;
                }
                for l in d.to_lowercase() {
                    let l = lookalike(l);
                    if l.is_alphanumeric() {
                        any = true;
                        push(out, bounds, &mut gap, l.encode_utf8(&mut buf).as_bytes());
                    }
                }
            });
            if !any {
                gap = true;
            }
        }
    }
    bounds.push(true);
}

/// The Latin letter a lower-case Cyrillic or Greek letter is drawn like, if any.
fn lookalike(c: char) -> char {
    match c {
        'а' | 'α' => 'a',
        'в' | 'β' | 'ь' => 'b',
        'с' | 'ς' => 'c',
        'ԁ' => 'd',
        'е' | 'ε' | 'ё' => 'e',
        'һ' | 'н' => 'h',
        'і' | 'ι' | 'ї' => 'i',
        'ј' => 'j',
        'к' | 'κ' => 'k',
        'ӏ' => 'l',
        'м' => 'm',
        'п' | 'η' => 'n',
        'о' | 'ο' | 'σ' => 'o',
        'р' | 'ρ' => 'p',
        'ԛ' => 'q',
        'г' => 'r',
        'ѕ' => 's',
        'т' | 'τ' => 't',
        'υ' | 'μ' => 'u',
        'ν' => 'v',
        'ԝ' | 'ω' | 'ш' => 'w',
        'х' | 'χ' => 'x',
        'у' | 'ү' | 'γ' => 'y',
        'ζ' => 'z',
        c => decimal_digit(c).unwrap_or(c),
    }
}

/// The zero of every block of ten decimal digits Unicode has outside ASCII that compatibility
/// decomposition leaves as they are (Arabic-Indic `٤٧١١`, Devanagari `४७११`, Thai, ...);
/// fullwidth and mathematical digits decompose to ASCII already.
const DIGIT_ZEROS: [u32; 37] = [
    0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6, 0x0D66,
    0x0DE6, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90,
    0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0,
    0x104A0, 0x11066,
];

/// `c` as an ASCII digit when it is a decimal digit of another script.
fn decimal_digit(c: char) -> Option<char> {
    let u = c as u32;
    DIGIT_ZEROS
        .iter()
        .find(|&&z| (z..z + 10).contains(&u))
        .and_then(|z| char::from_digit(u - z, 10))
}

/// The hash of `bytes` under `base` (a polynomial in the ring of 64-bit words).
fn hash(bytes: &[u8], base: u64) -> u64 {
    bytes.iter().fold(0u64, |h, &b| {
        h.wrapping_mul(base).wrapping_add(u64::from(b))
    })
}

/// A window's hash tagged with its length, so that windows of two lengths never collide.
fn tag(h: u64, len: usize) -> u64 {
    h ^ (len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Call `f(i, fingerprint)` for each window of `len` bytes, in order, until it says stop: whether
/// it did.
fn rolling(bytes: &[u8], len: usize, base: u64, mut f: impl FnMut(usize, u64) -> bool) -> bool {
    if bytes.len() < len || len == 0 {
        return false;
    }
    // base^(len-1): what the byte leaving the window weighs.
    let top = (1..len).fold(1u64, |p, _| p.wrapping_mul(base));
    let mut h = hash(&bytes[..len], base);
    if f(0, tag(h, len)) {
        return true;
    }
    for i in 1..=bytes.len() - len {
        h = h
            .wrapping_sub(u64::from(bytes[i - 1]).wrapping_mul(top))
            .wrapping_mul(base)
            .wrapping_add(u64::from(bytes[i + len - 1]));
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

/// One layer of encoding taken off `text`, read under each of `turns` (as it is, reversed, in
/// rot13), every way that applies; only what decodes to text (or to gzip, which is then inflated)
/// of at least `min` bytes is kept. A run of an alphabet too short to decode to `min` bytes is not
/// decoded at all: `min` is the fewest decoded bytes that can hold a content of the store
/// ([`Inner::decoded_floor`]). The text is scanned once for every turn whose runs lie
/// where its own do (reversal moves no byte out of its class, rot13 none out of base64's,
/// base32's or the marks of escapes), and only the runs are turned.
fn decodings(text: &[u8], min: usize, turns: &[Turn]) -> Vec<(Vec<u8>, Encoding, Turn)> {
    let mut out = Vec::new();
    // One pass says which decoders can find anything: a text without digits has no hex, no
    // base32 and (with no upper case either) no base64 of text. Turns keep these classes.
    let seen = text.iter().fold(0, |c, &b| c | class(b));
    let has = |c: u16| seen & c != 0;
    let (upper, digit, punct) = (has(C_UPPER), has(C_DIGIT), has(C_PUNCT));
    // Percent-encoding and entities are decoded in the words that hold them (a URL, a
    // query), not across a whole text that happens to hold a `%02x`.
    let escaped = |w: &[u8]| {
        w.windows(3)
            .any(|e| e[0] == b'%' && e[1].is_ascii_hexdigit() && e[2].is_ascii_hexdigit())
    };
    let entity = |w: &[u8]| {
        w.iter()
            .position(|&b| b == b'&')
            .is_some_and(|at| w[at..].iter().take(12).any(|&b| b == b';'))
    };
    for &t in turns {
        if has(C_PCT) {
            if let Some(d) = in_words(text, t, b'%', escaped, percent_decode) {
                out.push((d, Encoding::UrlEncoded, t));
            }
        }
        if has(C_AMP) {
            if let Some(d) = in_words(text, t, b'&', entity, html_decode) {
                out.push((d, Encoding::HtmlEntities, t));
            }
        }
    }
    if !(upper || digit || punct) {
        return out;
    }
    // Each candidate is turned into one buffer, decoded into another, and copied out only when
    // it is text.
    let (mut run, mut buf) = (Vec::new(), Vec::new());
    let keep = |buf: &Vec<u8>, how, t, out: &mut Vec<(Vec<u8>, Encoding, Turn)>| {
        if texty(buf, min) {
            out.push((buf.clone(), how, t));
        }
    };
    let base64 = base64_runs(text, (8 * min.min(18)).div_ceil(6));
    let b32_min = (8 * min).div_ceil(5).max(8);
    let base32 = runs(text, |b| class(b) & C_ALNUM != 0, b32_min);
    for &t in turns {
        for r in &base64 {
            turn(t, r, &mut run);
            for skip in 0..4.min(run.len()) {
                // Six bits a character; a gzip member is at least 18 bytes.
                if (run.len() - skip) * 6 / 8 < min.min(18) {
                    break;
                }
                base64_decode(&run[skip..], &mut buf);
                match gunzip(&buf, min) {
                    Some(Inflated::Text(inflated)) => out.push((inflated, Encoding::Gzip, t)),
                    Some(Inflated::TooLarge) => out.push((Vec::new(), Encoding::TooLarge, t)),
                    None => keep(&buf, Encoding::Base64, t, &mut out),
                }
            }
        }
        for r in base32.iter().filter(|_| digit) {
            turn(t, r, &mut run);
            let b32 = run
                .iter()
                .all(|&b| b.is_ascii_alphabetic() || (b'2'..=b'7').contains(&b));
            let cased = run.iter().all(|b| !b.is_ascii_lowercase())
                || run.iter().all(|b| !b.is_ascii_uppercase());
            if b32 && cased && run.iter().any(|b| (b'2'..=b'7').contains(b)) {
                for skip in 0..8.min(run.len()) {
                    if (run.len() - skip) * 5 / 8 < min {
                        break;
                    }
                    base32_decode(&run[skip..], &mut buf);
                    keep(&buf, Encoding::Base32, t, &mut out);
                }
            }
        }
    }
    // Hex and Ascii85 hold letters rot13 moves out of (or into) their alphabets: their runs
    // are found again for it.
    let (mut hex_plain, mut a85_plain) = (None, None);
    let hex_min = (2 * min).max(8);
    let a85_min = (5 * min).div_ceil(4).max(10);
    for &t in turns {
        let hexish = match digit {
            true => runs_in_turn(text, t, C_HEXISH, hex_min, &mut hex_plain),
            false => Vec::new(),
        };
        for stretch in hexish {
            // A run lies within a stretch of what a run may hold; one with too few digits is
            // passed by.
            if stretch
                .iter()
                .filter(|&&b| class_in(t, b) & C_HEX != 0)
                .count()
                < hex_min
            {
                continue;
            }
            turn(t, stretch, &mut run);
            for hex in hex_runs(&run, hex_min) {
                for skip in 0..2 {
                    hex_decode(&hex[skip.min(hex.len())..], &mut buf);
                    keep(&buf, Encoding::Hex, t, &mut out);
                }
            }
        }
        let a85 = match punct {
            true => runs_in_turn(text, t, C_A85, a85_min, &mut a85_plain),
            false => Vec::new(),
        };
        for r in a85 {
            if r.iter().all(u8::is_ascii_alphanumeric) {
                continue;
            }
            turn(t, r, &mut run);
            let r = run.strip_prefix(b"<~").unwrap_or(&run);
            for skip in 0..5.min(r.len()) {
                if (r.len() - skip) * 4 / 5 < min {
                    break;
                }
                if ascii85_decode(&r[skip..], &mut buf) {
                    keep(&buf, Encoding::Base85, t, &mut out);
                }
            }
        }
    }
    out
}

/// The runs of bytes of class `c` in `text` read under `t`, at least `min` long; those of the
/// text as it is serve its reversal too, found once into `plain`.
fn runs_in_turn<'a>(
    text: &'a [u8],
    t: Turn,
    c: u16,
    min: usize,
    plain: &mut Option<Vec<&'a [u8]>>,
) -> Vec<&'a [u8]> {
    let scan = || runs(text, |b| class_in(t, b) & c != 0, min);
    match t {
        Turn::Rot13 => scan(),
        _ => plain.get_or_insert_with(scan).clone(),
    }
}

/// The classes of `b` read under `t`: rot13 moves letters between them, reversal nothing.
fn class_in(t: Turn, b: u8) -> u16 {
    match t {
        Turn::Rot13 => class(ROT13[usize::from(b)]),
        _ => class(b),
    }
}

/// `bytes` read under `t` into `out`.
fn turn(t: Turn, bytes: &[u8], out: &mut Vec<u8>) {
    out.clear();
    match t {
        Turn::Not => out.extend_from_slice(bytes),
        Turn::Reversed => out.extend(bytes.iter().rev()),
        Turn::Rot13 => out.extend(bytes.iter().map(|&b| ROT13[usize::from(b)])),
    }
}

/// The words of `text` (parted by white space) that hold `mark`, read under `t` (reversed: the
/// last word first), that `has` holds, each `decode`d, one space apart; `None` when there are
/// none. Only the words around each `mark` are looked at.
fn in_words(
    text: &[u8],
    t: Turn,
    mark: u8,
    has: impl Fn(&[u8]) -> bool,
    decode: impl Fn(&[u8]) -> Vec<u8>,
) -> Option<Vec<u8>> {
    let mut words = Vec::new();
    let mut from = 0;
    while let Some(at) = memchr::memchr(mark, &text[from..]) {
        let at = from + at;
        let start = text[..at]
            .iter()
            .rposition(u8::is_ascii_whitespace)
            .map_or(0, |i| i + 1);
        let end = text[at..]
            .iter()
            .position(u8::is_ascii_whitespace)
            .map_or(text.len(), |i| at + i);
        words.push(&text[start..end]);
        from = end;
    }
    if t == Turn::Reversed {
        words.reverse();
    }
    let mut out = Vec::new();
    let mut word = Vec::new();
    for w in words {
        turn(t, w, &mut word);
        if has(&word) {
            out.extend(decode(&word));
            out.push(b' ');
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether decoded bytes are text: at least `min` of them (and [`SHORT_MIN`]), and three in four
/// printable ASCII or white space, or UTF-8 without control characters. Random bytes (a run that
/// was not an encoding) are neither.
fn texty(d: &[u8], min: usize) -> bool {
    if d.len() < min.max(SHORT_MIN) {
        return false;
    }
    let printable = d.iter().filter(|&&b| printable(b)).count();
    4 * printable >= 3 * d.len()
        || std::str::from_utf8(d).is_ok_and(|s| !s.chars().any(|c| c.is_control() && c > '\r'))
}

/// The maximal runs of bytes `keep` holds, at least `min` long (and one). It reads about one
/// byte in `min` where runs are short: a run of `min` that would start in the `min` bytes from
/// a candidate holds the last of them, so the check starts there and goes back.
fn runs(bytes: &[u8], keep: impl Fn(u8) -> bool, min: usize) -> Vec<&[u8]> {
    let min = min.max(1);
    let mut out = Vec::new();
    // A candidate start: the first byte, or one after a byte not kept.
    let mut i = 0;
    while i + min <= bytes.len() {
        match (i..i + min).rev().find(|&j| !keep(bytes[j])) {
            Some(j) => i = j + 1,
            None => {
                let mut end = i + min;
                while end < bytes.len() && keep(bytes[end]) {
                    end += 1;
                }
                out.push(&bytes[i..end]);
                i = end + 1;
            }
        }
    }
    out
}

/// Runs of base64 (either alphabet) that look like an encoding (an upper-case letter or a digit
/// in them, at least six long: four bytes), and those runs joined when only white space parts
/// them (a base64 text split into pieces); of these, those at least `min` long.
fn base64_runs(text: &[u8], min: usize) -> Vec<Vec<u8>> {
    // Of a run's classes: an upper-case letter, a digit, or `+`/`/` (`-` and `_` are in words).
    // A piece of a split text may be one group of four (`Y29y cmVj`); a run alone is six long.
    let looks = |r: &[u8], seen: u16| {
        r.len() >= 4
            && (seen & (C_UPPER | C_DIGIT) != 0 || r.iter().any(|b| matches!(b, b'+' | b'/')))
    };
    let mut out = Vec::new();
    let mut joined: Vec<u8> = Vec::new();
    let mut pieces = 0;
    let end_group = |joined: &mut Vec<u8>, pieces: &mut usize, out: &mut Vec<Vec<u8>>| {
        if *pieces > 1 && joined.len() >= min {
            out.push(std::mem::take(joined));
        }
        joined.clear();
        *pieces = 0;
    };
    let mut i = 0;
    while i < text.len() {
        let c = class(text[i]);
        if c & C_B64 != 0 {
            let start = i;
            let mut seen = 0;
            while i < text.len() && class(text[i]) & C_B64 != 0 {
                seen |= class(text[i]);
                i += 1;
            }
            let run = &text[start..i];
            if looks(run, seen) {
                if run.len() >= min.max(6) {
                    out.push(run.to_vec());
                }
                joined.extend_from_slice(run);
                pieces += 1;
            } else {
                end_group(&mut joined, &mut pieces, &mut out);
            }
        } else {
            if c & C_SPACE == 0 {
                end_group(&mut joined, &mut pieces, &mut out);
            }
            i += 1;
        }
    }
    end_group(&mut joined, &mut pieces, &mut out);
    out
}

/// Runs of hex digits as their digits only, at least `min` digits with one of them a digit:
/// pairs with up to three separators between them (`:`, `-`, `,`, `.`, `;`, white space) and a
/// `0x` or `\x` before a pair, so `63:6f`, `0x63, 0x6f`, `\x63\x6f`, `od`'s output and one pair a
/// line are each one run.
fn hex_runs(text: &[u8], min: usize) -> Vec<Vec<u8>> {
    let sep = |b: u8| matches!(b, b':' | b'-' | b',' | b'.' | b';') || b.is_ascii_whitespace();
    // The length of a `0x` or `\x` at `i` that stands before a digit.
    let prefix = |i: usize| match (text.get(i), text.get(i + 1), text.get(i + 2)) {
        (Some(b'0'), Some(b'x' | b'X'), Some(h)) | (Some(b'\\'), Some(b'x'), Some(h))
            if h.is_ascii_hexdigit() =>
        {
            2
        }
        _ => 0,
    };
    let mut out = Vec::new();
    let mut run = Vec::new();
    let flush = |run: &mut Vec<u8>, out: &mut Vec<Vec<u8>>| {
        if run.len() >= min && run.iter().any(u8::is_ascii_digit) {
            out.push(std::mem::take(run));
        }
        run.clear();
    };
    let mut i = 0;
    while i < text.len() {
        // At a pair's bound the run goes on past a prefix, or past separators and a prefix.
        if run.len() % 2 == 0 {
            let p = prefix(i);
            if p > 0 {
                i += p;
                continue;
            }
            if !run.is_empty() && sep(text[i]) {
                let mut j = i;
                while j < text.len() && j - i < 3 && sep(text[j]) {
                    j += 1;
                }
                let k = j + prefix(j);
                if text.get(k).is_some_and(u8::is_ascii_hexdigit) {
                    i = k;
                    continue;
                }
            }
        }
        if text[i].is_ascii_hexdigit() {
            run.push(text[i]);
        } else {
            flush(&mut run, &mut out);
        }
        i += 1;
    }
    flush(&mut run, &mut out);
    out
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

/// `&#65;`, `&#x41;` and the named entities of markup's own characters.
fn html_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'&' {
            let end = bytes[i..].iter().take(12).position(|&b| b == b';');
            if let Some(end) = end {
                let name = &bytes[i + 1..i + end];
                let c = match name {
                    b"amp" => Some('&'),
                    b"lt" => Some('<'),
                    b"gt" => Some('>'),
                    b"quot" => Some('"'),
                    b"apos" => Some('\''),
                    b"nbsp" => Some(' '),
                    [b'#', b'x' | b'X', hex @ ..] => std::str::from_utf8(hex)
                        .ok()
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .and_then(char::from_u32),
                    [b'#', dec @ ..] => std::str::from_utf8(dec)
                        .ok()
                        .and_then(|d| d.parse().ok())
                        .and_then(char::from_u32),
                    _ => None,
                };
                if let Some(c) = c {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    i += end + 1;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn hex_val(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Pairs of hex digits as bytes into `out`; a last odd digit is dropped.
fn hex_decode(run: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend(
        run.chunks_exact(2)
            .filter_map(|p| Some(hex_val(p[0])? << 4 | hex_val(p[1])?)),
    );
}

/// Characters of `bits` bits each, packed into bytes into `out`; a last partial byte is dropped.
fn pack(run: &[u8], bits: u32, val: impl Fn(u8) -> u32, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(run.len() * bits as usize / 8);
    let mut acc = 0u32;
    let mut have = 0;
    for &b in run {
        acc = (acc << bits) | val(b);
        have += bits;
        if have >= 8 {
            have -= 8;
            out.push((acc >> have) as u8);
            acc &= (1 << have) - 1;
        }
    }
}

/// Base64 of either alphabet (`+/` or `-_`), without padding.
fn base64_decode(run: &[u8], out: &mut Vec<u8>) {
    let val = |b| match b {
        b'A'..=b'Z' => u32::from(b - b'A'),
        b'a'..=b'z' => u32::from(b - b'a') + 26,
        b'0'..=b'9' => u32::from(b - b'0') + 52,
        b'+' | b'-' => 62,
        _ => 63,
    };
    pack(run, 6, val, out);
}

/// Base32 (RFC 4648), either case, without padding.
fn base32_decode(run: &[u8], out: &mut Vec<u8>) {
    let val = |b| match b {
        b'A'..=b'Z' => u32::from(b - b'A'),
        b'a'..=b'z' => u32::from(b - b'a'),
        _ => u32::from(b.wrapping_sub(b'2')) + 26,
    };
    pack(run, 5, val, out);
}

/// Ascii85 (Adobe's, `z` for four zero bytes), without its `<~ ~>` frame; a last partial group
/// gives the bytes it holds whole. `false` when it stopped early because what it gives cannot be
/// text ([`texty`]): more than a quarter of the most it could give is not printable, and what it
/// gave so far is not UTF-8. Most runs of ordinary text are such, and stop about halfway.
fn ascii85_decode(run: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    out.reserve(run.len() * 4 / 5);
    // The most it gives: four bytes a five characters, and four a `z`.
    let most = run.len() * 4 / 5 + 4 * run.iter().filter(|&&b| b == b'z').count();
    let mut unprintable = 0;
    let mut group = [0u32; 5];
    let mut n = 0;
    for &b in run {
        if b == b'z' && n == 0 {
            out.extend_from_slice(&[0; 4]);
            continue;
        }
        if !(b'!'..=b'u').contains(&b) {
            continue;
        }
        group[n] = u32::from(b - b'!');
        n += 1;
        if n == 5 {
            let v = group.iter().fold(0u64, |a, &d| a * 85 + u64::from(d));
            let bytes = (v as u32).to_be_bytes();
            out.extend_from_slice(&bytes);
            n = 0;
            unprintable += bytes.iter().filter(|&&b| !printable(b)).count();
            if 4 * unprintable > most
                && std::str::from_utf8(out).is_err_and(|e| e.error_len().is_some())
            {
                return false;
            }
        }
    }
    if n > 1 {
        for d in group.iter_mut().skip(n) {
            *d = 84;
        }
        let v = group.iter().fold(0u64, |a, &d| a * 85 + u64::from(d));
        out.extend_from_slice(&(v as u32).to_be_bytes()[..n - 1]);
    }
    true
}

/// Printable ASCII or white space, as [`texty`] counts it.
fn printable(b: u8) -> bool {
    (0x20..0x7f).contains(&b) || matches!(b, b'\t' | b'\n' | b'\r')
}

/// The most a gzip member inflates to here.
const GUNZIP_MAX: usize = 256 * 1024;

/// A gzip member (RFC 1952) inflated, when that is text; [`Inflated::TooLarge`] when it
/// inflates past [`GUNZIP_MAX`]; text shorter than `min` is not kept.
fn gunzip(d: &[u8], min: usize) -> Option<Inflated> {
    if d.len() < 18 || d[0] != 0x1f || d[1] != 0x8b || d[2] != 8 {
        return None;
    }
    let flags = d[3];
    let mut at = 10;
    if flags & 4 != 0 {
        let xlen = usize::from(*d.get(at)?) | usize::from(*d.get(at + 1)?) << 8;
        at += 2 + xlen;
    }
    for bit in [8u8, 16] {
        if flags & bit != 0 {
            at += d.get(at..)?.iter().position(|&b| b == 0)? + 1;
        }
    }
    if flags & 2 != 0 {
        at += 2;
    }
    let body = d.get(at..)?;
    match miniz_oxide::inflate::decompress_to_vec_with_limit(body, GUNZIP_MAX) {
        Ok(text) => texty(&text, min).then_some(Inflated::Text(text)),
        // More than the check reads: what lies past the limit cannot be seen.
        Err(e) if e.status == miniz_oxide::inflate::TINFLStatus::HasMoreOutput => {
            Some(Inflated::TooLarge)
        }
        Err(e) => texty(&e.output, min).then_some(Inflated::Text(e.output)),
    }
}

/// What a gzip member inflates to.
enum Inflated {
    Text(Vec<u8>),
    /// Past [`GUNZIP_MAX`].
    TooLarge,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store(content: &str) -> (tempfile::TempDir, Fingerprints) {
        let d = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        f.release(&[content], &[]).unwrap();
        (d, f)
    }

    fn b64(s: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in s.chunks(3) {
            let n = c.iter().fold(0u32, |a, &b| a << 8 | u32::from(b)) << (8 * (3 - c.len()));
            for i in 0..=c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    fn b32(s: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        let mut out = String::new();
        for c in s.chunks(5) {
            let mut block = [0u8; 5];
            block[..c.len()].copy_from_slice(c);
            let n = block.iter().fold(0u64, |a, &b| a << 8 | u64::from(b));
            for i in 0..(c.len() * 8).div_ceil(5) {
                out.push(A[(n >> (35 - 5 * i) & 31) as usize] as char);
            }
        }
        out
    }

    fn a85(s: &[u8]) -> String {
        let mut out = String::new();
        for c in s.chunks(4) {
            let mut block = [0u8; 4];
            block[..c.len()].copy_from_slice(c);
            let mut v = u32::from_be_bytes(block);
            let mut digits = [0u8; 5];
            for d in digits.iter_mut().rev() {
                *d = (v % 85) as u8 + b'!';
                v /= 85;
            }
            out.push_str(std::str::from_utf8(&digits[..c.len() + 1]).unwrap());
        }
        out
    }

    fn gzip(s: &[u8]) -> Vec<u8> {
        let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
        out.extend(miniz_oxide::deflate::compress_to_vec(s, 6));
        out.extend_from_slice(&[0; 8]);
        out
    }

    const SECRET: &str = "correct horse battery staple 4711";

    #[test]
    fn a_released_window_is_found_plain_url_encoded_base64_and_hex() {
        let (_d, f) = store(SECRET);
        let piece = &SECRET[3..25];
        assert_eq!(f.leak(&json!({"url": piece})), Some(Encoding::Plain));
        let pct: String = piece.bytes().map(|b| format!("%{b:02X}")).collect();
        assert_eq!(f.leak(&json!({"u": pct})), Some(Encoding::UrlEncoded));
        let hex: String = piece.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            f.leak(&json!({"u": format!("id={hex}")})),
            Some(Encoding::Hex)
        );
        for prefix in ["", "a", "ab", "abc"] {
            let b64 = b64(format!("{prefix}{piece}").as_bytes());
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

    #[test]
    fn the_cheap_encodings_of_a_secret_are_found() {
        let (_d, f) = store(SECRET);
        let s = SECRET.as_bytes();
        let spaced: String = SECRET.chars().flat_map(|c| [c, ' ']).collect();
        let zw: String = SECRET.chars().flat_map(|c| [c, '\u{200b}']).collect();
        let fullwidth: String = SECRET
            .chars()
            .map(|c| match c {
                '!'..='~' => char::from_u32(c as u32 - 0x21 + 0xff01).unwrap(),
                c => c,
            })
            .collect();
        let lookalike = SECRET.replace('o', "о").replace('a', "а").replace('e', "е");
        let reversed: String = SECRET.chars().rev().collect();
        let rot13: String = SECRET
            .bytes()
            .map(|b| match b {
                b'a'..=b'm' => (b + 13) as char,
                b'n'..=b'z' => (b - 13) as char,
                b => b as char,
            })
            .collect();
        let twice: String = SECRET
            .bytes()
            .map(|b| format!("%25{b:02X}"))
            .collect::<String>();
        let html: String = SECRET.bytes().map(|b| format!("&#{b};")).collect();
        let colons: Vec<String> = s.iter().map(|b| format!("{b:02X}")).collect();
        let split = b64(s)
            .as_bytes()
            .chunks(8)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(" ");
        for (text, how) in [
            (SECRET.to_uppercase(), Encoding::Plain),
            (spaced, Encoding::Plain),
            (zw, Encoding::Plain),
            (fullwidth, Encoding::Plain),
            (lookalike, Encoding::Plain),
            (reversed, Encoding::Reversed),
            (rot13, Encoding::Rot13),
            (twice.clone(), Encoding::UrlEncoded),
            (html, Encoding::HtmlEntities),
            (colons.join(":"), Encoding::Hex),
            (b32(s), Encoding::Base32),
            (b32(s).to_lowercase(), Encoding::Base32),
            (a85(s), Encoding::Base85),
            (split, Encoding::Base64),
            (b64(&gzip(s)), Encoding::Gzip),
            (b64(s).chars().rev().collect(), Encoding::Reversed),
            (colons.join(":").chars().rev().collect(), Encoding::Reversed),
            (a85(s).chars().rev().collect(), Encoding::Reversed),
            (twice.chars().rev().collect(), Encoding::Reversed),
            (
                s.iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
                    .bytes()
                    .map(|b| ROT13[usize::from(b)] as char)
                    .collect(),
                Encoding::Rot13,
            ),
            (
                a85(s)
                    .bytes()
                    .map(|b| ROT13[usize::from(b)] as char)
                    .collect(),
                Encoding::Rot13,
            ),
            (
                b64(s)
                    .bytes()
                    .map(|b| ROT13[usize::from(b)] as char)
                    .collect(),
                Encoding::Rot13,
            ),
        ] {
            assert_eq!(f.leak(&json!({ "content": text })), Some(how), "{text}");
        }
    }

    /// The naive reading of [`runs`]: every maximal run, kept when long enough.
    fn runs_naive(bytes: &[u8], keep: impl Fn(u8) -> bool, min: usize) -> Vec<&[u8]> {
        bytes
            .split(|&b| !keep(b))
            .filter(|r| r.len() >= min.max(1))
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn runs_skipping_ahead_finds_every_long_run(
            bytes in proptest::collection::vec(
                proptest::sample::select(b"ab c-0\n".to_vec()),
                0..300,
            ),
            min in 0usize..40,
        ) {
            let keep = |b: u8| b != b' ' && b != b'\n';
            proptest::prop_assert_eq!(runs(&bytes, keep, min), runs_naive(&bytes, keep, min));
        }

        #[test]
        fn a_text_read_turned_decodes_as_the_turned_text_does(
            text in "[A-Za-z0-9+/%&#;:=<~!.\\- ]{0,200}",
            min in proptest::sample::select(vec![4usize, 6, 16]),
        ) {
            for t in [Turn::Not, Turn::Reversed, Turn::Rot13] {
                let mut turned = Vec::new();
                turn(t, text.as_bytes(), &mut turned);
                let sorted = |mut v: Vec<(Vec<u8>, Encoding, Turn)>| {
                    let mut v: Vec<_> = v.drain(..).map(|(d, e, _)| (d, e.as_str())).collect();
                    v.sort();
                    v
                };
                proptest::prop_assert_eq!(
                    sorted(decodings(text.as_bytes(), min, &[t])),
                    sorted(decodings(&turned, min, &[Turn::Not])),
                    "{:?}", t
                );
            }
        }
    }

    #[test]
    fn digits_of_another_script_are_the_digits_they_are() {
        let (_d, f) = store("Account 12-3456-7890, PIN 4711.");
        for text in [
            "Account ١٢-٣٤٥٦-٧٨٩٠, PIN ٤٧١١.",
            "account ۱۲۳۴۵۶۷۸۹۰ pin ۴۷۱۱",
            "Account १२-३४५६-७८९०, PIN ४७११",
        ] {
            assert!(f.leak(&json!({ "content": text })).is_some(), "{text}");
        }
        assert_eq!(decimal_digit('٧'), Some('7'));
        assert_eq!(decimal_digit('a'), None);
    }

    #[test]
    fn what_decodes_past_what_the_check_reads_is_taken_as_a_leak() {
        let (_d, f) = store(SECRET);
        // A compression bomb first, then the secret: the budget would be spent on the bomb.
        let bomb = b64(&gzip(&vec![b'a'; 4 * GUNZIP_MAX]));
        let text = format!("{bomb} {}", b64(SECRET.as_bytes()));
        assert_eq!(
            f.leak(&json!({ "content": text })),
            Some(Encoding::TooLarge)
        );
        // A bomb alone hides nothing the check could see either way: refused the same.
        assert_eq!(
            f.leak(&json!({ "content": bomb })),
            Some(Encoding::TooLarge)
        );
        // Ordinary base64 of gzip'd text within the limit is read and passes, and so does a
        // long base64 text (an attachment) of ordinary words.
        let fine = b64(&gzip(b"the meeting moved to thursday at ten"));
        assert_eq!(f.leak(&json!({ "content": fine })), None);
        let words: String = (0..4000)
            .map(|i| format!("word{} ", i * 7919 % 10007))
            .collect();
        for text in [b64(words.as_bytes()), b64(b64(words.as_bytes()).as_bytes())] {
            assert_eq!(f.leak(&json!({ "content": text })), None);
        }
    }

    #[test]
    fn a_short_secret_of_four_characters_is_fingerprinted_whole_and_said_to_be_weak() {
        let d = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        let r = f.release(&["4711\n"], &[]).unwrap();
        assert_eq!(r.weak, Some(Weak::Short(4)));
        assert_eq!(f.leak(&json!({"u": "pin=4711&x=1"})), Some(Encoding::Plain));
        assert_eq!(f.leak(&json!({"u": "pin=4712"})), None);
        for carried in ["4 7 1 1", "x4711", "PIN４７１１", "1174"] {
            assert!(f.leak(&json!({ "u": carried })).is_some(), "{carried}");
        }
        // Inside a longer number or word it is another token: not the PIN.
        for ordinary in ["1247113", "port 14711", "2024-05-14T12:47:31"] {
            assert_eq!(f.leak(&json!({ "u": ordinary })), None, "{ordinary}");
        }
        assert!(f.release(&["abc"], &[]).unwrap().added == 0);
    }

    #[test]
    fn a_host_name_released_is_said_to_be_weak() {
        let d = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        let r = f.release(&["api.example.org\n"], &[]).unwrap();
        assert_eq!(r.weak, Some(Weak::Short(13)));
        let r = f
            .release(&["a-long-name-for-a-host.example.org"], &[])
            .unwrap();
        assert_eq!(r.weak, Some(Weak::HostName));
    }

    #[test]
    fn the_boxs_own_paths_and_low_entropy_windows_are_never_fingerprinted() {
        let d = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        let root = "/srv/home/vault-with-a-long-name";
        let r = f.release(&[&format!("{root}\n"), ""], &[root]).unwrap();
        assert_eq!(r.added, 0);
        let r = f
            .release(&[&format!("{}\n{}", " ".repeat(40), "0".repeat(40))], &[])
            .unwrap();
        assert_eq!(r.added, 0);
        assert_eq!(
            f.leak(&json!({"content": format!("{root}/x\n    indented\n0000000000000000000")})),
            None
        );
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

    fn noise(x: &mut u64, len: usize) -> String {
        (0..len)
            .map(|_| {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                (b'a' + (*x % 26) as u8) as char
            })
            .collect()
    }

    #[test]
    fn a_full_store_forgets_nothing_and_stays_full_across_a_reopen() {
        let d = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        f.release(&[SECRET], &[]).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut filled = false;
        for _ in 0..(MAX_ENTRIES / PER_RELEASE + 2) {
            filled |= f.release(&[&noise(&mut x, 100_000)], &[]).unwrap().filled;
        }
        assert!(filled);
        assert_eq!(f.len(), MAX_ENTRIES);
        assert_eq!(f.full(), Some(Full::Capacity));
        assert_eq!(f.leak(&json!({"u": SECRET})), Some(Encoding::Plain));
        drop(f);
        let again = Fingerprints::open(d.path()).unwrap();
        assert_eq!(again.full(), Some(Full::Capacity));
        assert_eq!(again.leak(&json!({"u": SECRET})), Some(Encoding::Plain));
    }

    #[test]
    fn a_store_of_the_old_format_is_full_until_the_owner_acts() {
        let d = tempfile::TempDir::new().unwrap();
        let mut old = OLD_MAGIC.to_vec();
        old.extend_from_slice(&[7u8; 16]);
        fs::write(d.path().join("fingerprints.bin"), old).unwrap();
        let f = Fingerprints::open(d.path()).unwrap();
        assert_eq!(f.full(), Some(Full::OldFormat));
    }

    /// NFKD splits every Hangul syllable (3 bytes) into 2 or 3 jamo of 3 bytes each, so a piece
    /// of 5 syllables (15 bytes) is 30 to 45 canonical bytes: the decoders' floor is not 16
    /// once such a content is in the store.
    #[test]
    fn a_korean_secret_in_encoded_pieces_under_sixteen_bytes_is_found() {
        let ko = "비밀번호는 초록색 고양이 열한마리 그리고 파란 하늘";
        let (_d, f) = store(ko);
        let hex = |p: &str| p.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        // One piece of three syllables: 9 bytes, 24 canonical.
        assert!(f.leak(&json!({"content": "초록색"})).is_some());
        for text in [b64("초록색".as_bytes()), hex("초록색")] {
            assert!(f.leak(&json!({ "content": text })).is_some(), "{text}");
        }
        // The whole secret, five syllables (15 bytes) to a piece.
        let chars: Vec<char> = ko.chars().collect();
        let pieces: Vec<String> = chars.chunks(5).map(|c| c.iter().collect()).collect();
        let join = |enc: &dyn Fn(&str) -> String, sep: &str| {
            pieces.iter().map(|p| enc(p)).collect::<Vec<_>>().join(sep)
        };
        for text in [
            join(&|p| b64(p.as_bytes()), "."),
            join(&|p| b32(p.as_bytes()), "."),
            join(&|p| hex(p), ";"),
            join(&|p| a85(p.as_bytes()), " "),
        ] {
            assert!(f.leak(&json!({ "content": text })).is_some(), "{text}");
        }
    }

    /// Base64 in groups of four (or five) parted by white space is joined.
    #[test]
    fn base64_in_groups_of_four_parted_by_white_space_is_found() {
        let (_d, f) = store(SECRET);
        for (n, sep) in [(4, " "), (5, " "), (4, "\n")] {
            let text = b64(SECRET.as_bytes())
                .as_bytes()
                .chunks(n)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect::<Vec<_>>()
                .join(sep);
            assert_eq!(
                f.leak(&json!({ "content": text })),
                Some(Encoding::Base64),
                "{text}"
            );
        }
    }

    /// Hex as a C or Python array (`0x63, 0x6f`), with two spaces, or a byte a line is one run.
    #[test]
    fn hex_as_an_array_or_one_line_per_byte_is_found() {
        let (_d, f) = store(SECRET);
        let s = SECRET.as_bytes();
        let each = |fmt: &dyn Fn(&u8) -> String, sep: &str| {
            s.iter().map(fmt).collect::<Vec<_>>().join(sep)
        };
        for text in [
            each(&|b| format!("0x{b:02x}"), ", "),
            each(&|b| format!("{b:02x}"), "  "),
            each(&|b| format!("{b:02x}"), "\n"),
        ] {
            assert_eq!(
                f.leak(&json!({ "content": text })),
                Some(Encoding::Hex),
                "{text}"
            );
        }
    }

    #[test]
    fn the_canonical_form_of_ascii_is_at_most_five_thirds_of_the_bytes() {
        let mut out = Vec::new();
        let mut most = (0, 1, '\0');
        for c in (0x80..=0x10ffff).filter_map(char::from_u32) {
            let mut buf = [0u8; 4];
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            canonical(bytes, &mut out);
            if !out.is_empty() && out.is_ascii() && out.len() * most.1 > most.0 * bytes.len() {
                most = (out.len(), bytes.len(), c);
            }
        }
        assert!(
            most.0 * EXPANSION.1 <= most.1 * EXPANSION.0,
            "{:?} is {} canonical bytes of ASCII from {}",
            most.2,
            most.0,
            most.1
        );
        assert_eq!(
            most.0 * EXPANSION.1,
            most.1 * EXPANSION.0,
            "the bound is tight"
        );
    }

    #[test]
    fn a_store_that_held_other_scripts_stays_so_across_a_reopen() {
        let dir = tempfile::TempDir::new().unwrap();
        let f = Fingerprints::open(dir.path()).unwrap();
        f.release(&[SECRET], &[]).unwrap();
        assert_eq!(f.lock().decoded_floor(), 10);
        f.release(&["비밀번호는 초록색 고양이 열한마리"], &[])
            .unwrap();
        assert_eq!(f.lock().decoded_floor(), SHORT_MIN);
        drop(f);
        let f = Fingerprints::open(dir.path()).unwrap();
        assert_eq!(f.lock().decoded_floor(), SHORT_MIN);
    }
}
