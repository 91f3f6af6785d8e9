//! One line of the chain as the scan reads it: what the scan needs of the record, borrowed from
//! the file, and whether the record's hash is its own.
//!
//! A line is read by the first of three readers that takes it, each taking a subset of what the
//! next takes:
//!
//! 1. `plain`, by hand: the exact form brokerd writes (canonical, no escape, integers only).
//! 2. serde_json into borrowed fields (`Line`): any record whose strings have no escape, its
//!    `detail` checked as `serde_json::Value` checks it, without a tree being built.
//! 3. serde_json into a `Record`, as the scan always read a line: every other line.
//!
//! The first two take a line only when it hashes as written (sha256 of `prev` and the line
//! without its `"hash":"...",`, fed to SHA-256 in three pieces); any other goes to the third,
//! which also recomputes the canonical form. What the first two take, `Record` takes too, with
//! the same values, so a line gets the same answer whichever reads it (the tests below hold
//! each to the scan's reading as it was before, kept there verbatim).

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use bxcore::{CallId, SessionId, Timestamp, canonical};
use memchr::memmem::Finder;
use serde::Deserialize;
use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::record::{self, Event, Record};

/// What the scan needs of one record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry<'a> {
    pub seq: u64,
    pub prev: Cow<'a, str>,
    pub hash: Cow<'a, str>,
    /// A valid session id (`SessionId` refused any other), kept as text: sessions repeat from
    /// record to record, and only a pending approval needs one made.
    pub session: Option<Cow<'a, str>>,
    pub call: Option<CallId>,
    pub tool: Option<Cow<'a, str>>,
    pub event: Event,
    pub marks: Marks<'a>,
}

/// The keys of `detail` the scan follows, each where it has the type the scan reads it as:
/// `approval` and `accepts` a string, `at` an unsigned integer (`Value::as_str`, `as_u64`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Marks<'a> {
    pub approval: Option<Cow<'a, str>>,
    pub at: Option<u64>,
    pub accepts: Option<Cow<'a, str>>,
}

/// A line read, whether its hash is its own; or why it is not a record, and the line's own
/// sha256 (the hash the next line is judged against).
pub(crate) type Parsed<'a> = Result<(Entry<'a>, bool), (String, String)>;

/// Reads the lines of one part of the file.
pub(crate) struct Reader<'a> {
    /// Finds `"hash":"` in a line.
    key: Finder<'static>,
    /// The last session id found valid in a plain line.
    session: Cell<Option<&'a str>>,
}

const KEY: &[u8] = b"\"hash\":\"";

impl<'a> Reader<'a> {
    pub fn new() -> Reader<'a> {
        Reader {
            key: Finder::new(KEY),
            session: Cell::new(None),
        }
    }

    /// Read one line (without its newline).
    pub fn parse(&self, line: &'a [u8]) -> Parsed<'a> {
        if let Some(e) = self.plain(line) {
            if self.hashes_as_written(line, &e.prev, &e.hash) {
                return Ok((e, true));
            }
        } else if let Ok(l) = serde_json::from_slice::<Line>(line) {
            if self.hashes_as_written(line, l.prev, l.hash) {
                return Ok((l.into_entry(), true));
            }
        }
        self.parse_as_record(line)
    }

    /// The reading by `Record`: every line the other two do not take.
    fn parse_as_record(&self, line: &'a [u8]) -> Parsed<'a> {
        let rec: Record = serde_json::from_slice(line).map_err(|e| {
            let why = if serde_json::from_slice::<Value>(line).is_ok() {
                format!("the line is not an audit record: {e}")
            } else {
                format!("the line does not parse: {e}")
            };
            (why, canonical::sha256_hex(line))
        })?;
        // A line brokerd wrote is canonical already: without its `"hash":"...",` it is exactly
        // the bytes that were hashed. Anything else is judged by recomputing the canonical form.
        let own =
            self.hashes_as_written(line, &rec.prev, &rec.hash) || rec.computed_hash() == rec.hash;
        Ok((Entry::from_record(rec), own))
    }

    /// Whether sha256 of `prev` and the line without its first `"hash":"<64 characters>",` is
    /// `hash`.
    fn hashes_as_written(&self, line: &[u8], prev: &str, hash: &str) -> bool {
        let Some(at) = self.key.find(line) else {
            return false;
        };
        let end = at + KEY.len() + 64 + 2; // the hash, its closing quote and the comma after it
        if end > line.len() || &line[end - 2..end] != b"\"," {
            return false;
        }
        let digest = record::digest(&[prev.as_bytes(), &line[..at], &line[end..]]);
        canonical::hex(&digest).as_slice() == hash.as_bytes()
    }
}

impl<'a> Reader<'a> {
    /// A line in the plain form brokerd writes, read by hand: the record's keys in canonical
    /// order, no whitespace, no escape and no control character anywhere, integers of at most
    /// 18 digits in `detail` (19 for `seq`, `time` and `call`), no fraction or exponent,
    /// `detail` nested at most 32 deep, and valid UTF-8. Every such line is one `Record`
    /// accepts (valid JSON, each field once and of its type, every number in range, well inside
    /// serde_json's depth limit), and this reads the values `Record` and `Value` would hold.
    /// `None` for anything else, which is then read by serde_json.
    fn plain(&self, line: &'a [u8]) -> Option<Entry<'a>> {
        // No control character and no backslash: so no whitespace and no escape, and a string
        // ends at its next quote.
        let odd = line
            .iter()
            .fold(false, |odd, &b| odd | (b < 0x20) | (b == b'\\'));
        if odd {
            return None;
        }
        let text = std::str::from_utf8(line).ok()?;
        let mut c = Cursor { text, at: 0 };
        c.lit("{\"call\":")?;
        let call = c.null_or(Cursor::unsigned)?.map(CallId);
        c.lit(",\"detail\":")?;
        let marks = c.detail()?;
        c.lit(",\"event\":")?;
        let event = c.string()?;
        let event =
            Event::deserialize(BorrowedStrDeserializer::<de::value::Error>::new(event)).ok()?;
        c.lit(",\"hash\":")?;
        let hash = c.string()?;
        c.lit(",\"prev\":")?;
        let prev = c.string()?;
        c.lit(",\"seq\":")?;
        let seq = c.unsigned()?;
        c.lit(",\"session\":")?;
        let session = c.null_or(Cursor::string)?;
        // A session id is checked as `SessionId` checks it, once while it repeats.
        if let Some(s) = session {
            if Some(s) != self.session.get() {
                SessionId::new(s).ok()?;
                self.session.set(Some(s));
            }
        }
        c.lit(",\"time\":")?;
        c.unsigned()?;
        c.lit(",\"tool\":")?;
        let tool = c.null_or(Cursor::string)?;
        c.lit("}")?;
        if c.at != line.len() {
            return None;
        }
        Some(Entry {
            seq,
            prev: Cow::Borrowed(prev),
            hash: Cow::Borrowed(hash),
            session: session.map(Cow::Borrowed),
            call,
            tool: tool.map(Cow::Borrowed),
            event,
            marks,
        })
    }
}

/// How deep `detail` may nest in the plain form.
const PLAIN_DEPTH: usize = 32;

struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    #[inline(always)]
    fn rest(&self) -> &'a [u8] {
        &self.text.as_bytes()[self.at..]
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.rest().first().copied()
    }

    // Inlined, so that each literal is compared as the constant it is, not through memcmp.
    #[inline(always)]
    fn lit(&mut self, s: &str) -> Option<()> {
        self.rest()
            .starts_with(s.as_bytes())
            .then(|| self.at += s.len())
    }

    #[inline(always)]
    fn null_or<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.lit("null").is_some() {
            Some(None)
        } else {
            f(self).map(Some)
        }
    }

    /// A string (the line has no backslash, so no escape): its text.
    fn string(&mut self) -> Option<&'a str> {
        self.lit("\"")?;
        let len = memchr::memchr(b'"', self.rest())?;
        let s = &self.text[self.at..self.at + len];
        self.at += len + 1;
        Some(s)
    }

    /// Digits with no leading zero (but `0`), at most `max`: their value.
    fn digits(&mut self, max: usize) -> Option<u64> {
        let len = self
            .rest()
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if len == 0 || len > max || (len > 1 && self.peek() == Some(b'0')) {
            return None;
        }
        let n = self.rest()[..len]
            .iter()
            .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        // A fraction or an exponent after the digits is refused by what must follow a number
        // in the plain form (`,`, `}` or `]`).
        self.at += len;
        Some(n)
    }

    /// A `u64` field: at most 19 digits, so in range.
    fn unsigned(&mut self) -> Option<u64> {
        self.digits(19)
    }

    /// A value inside `detail`, `depth` levels down: what `Scalar` would make of it.
    fn value(&mut self, depth: usize) -> Option<Scalar<'a>> {
        match self.peek()? {
            b'"' => self.string().map(|s| Scalar::Text(Cow::Borrowed(s))),
            b'-' => {
                self.at += 1;
                self.digits(18).map(|_| Scalar::Other)
            }
            b'0'..=b'9' => self.digits(18).map(Scalar::Unsigned),
            b't' => self.lit("true").map(|_| Scalar::Other),
            b'f' => self.lit("false").map(|_| Scalar::Other),
            b'n' => self.lit("null").map(|_| Scalar::Other),
            b'[' if depth < PLAIN_DEPTH => {
                self.at += 1;
                if self.lit("]").is_none() {
                    loop {
                        self.value(depth + 1)?;
                        if self.lit(",").is_none() {
                            self.lit("]")?;
                            break;
                        }
                    }
                }
                Some(Scalar::Other)
            }
            b'{' if depth < PLAIN_DEPTH => {
                self.object(depth, |_, _| {})?;
                Some(Scalar::Other)
            }
            _ => None,
        }
    }

    /// An object `depth` levels down, each key and value given to `each`.
    fn object(&mut self, depth: usize, mut each: impl FnMut(&'a str, Scalar<'a>)) -> Option<()> {
        self.lit("{")?;
        if self.lit("}").is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.lit(":")?;
            let v = self.value(depth + 1)?;
            each(key, v);
            if self.lit(",").is_none() {
                return self.lit("}");
            }
        }
    }

    /// `detail`: any plain value; from an object, the keys the scan follows (the last of a key
    /// given twice, as in `Value`'s map).
    fn detail(&mut self) -> Option<Marks<'a>> {
        if self.peek()? != b'{' {
            return self.value(1).map(|_| Marks::default());
        }
        let mut m = Marks::default();
        self.object(1, |key, v| match key {
            "approval" => m.approval = v.text(),
            "accepts" => m.accepts = v.text(),
            "at" => m.at = v.unsigned(),
            _ => {}
        })?;
        Some(m)
    }
}

/// A line read into borrowed fields: `Record`'s fields, in its order, with its types and rules
/// (`deny_unknown_fields`, the `Option`s optional, a session id validated), except that a string
/// must have no escape (it is borrowed from the line) and `detail` is checked, not built.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    seq: u64,
    #[serde(rename = "time")]
    _time: Timestamp,
    prev: &'a str,
    hash: &'a str,
    session: Option<SessionId>,
    call: Option<CallId>,
    #[serde(borrow)]
    tool: Option<&'a str>,
    event: Event,
    #[serde(borrow)]
    detail: Marks<'a>,
}

impl<'a> Line<'a> {
    fn into_entry(self) -> Entry<'a> {
        Entry {
            seq: self.seq,
            prev: Cow::Borrowed(self.prev),
            hash: Cow::Borrowed(self.hash),
            session: self.session.map(|s| Cow::Owned(s.into())),
            call: self.call,
            tool: self.tool.map(Cow::Borrowed),
            event: self.event,
            marks: self.detail,
        }
    }
}

impl Entry<'static> {
    fn from_record(rec: Record) -> Entry<'static> {
        let text = |key| {
            rec.detail
                .get(key)
                .and_then(Value::as_str)
                .map(|s| Cow::Owned(s.to_string()))
        };
        let marks = Marks {
            approval: text("approval"),
            at: rec.detail.get("at").and_then(Value::as_u64),
            accepts: text("accepts"),
        };
        Entry {
            seq: rec.seq,
            prev: Cow::Owned(rec.prev),
            hash: Cow::Owned(rec.hash),
            session: rec.session.map(|s| Cow::Owned(s.into())),
            call: rec.call,
            tool: rec.tool.map(Cow::Owned),
            event: rec.event,
            marks,
        }
    }
}

// `detail` is read as `Value` reads any JSON, through `deserialize_any` at every level (so
// numbers are parsed, strings unescaped and checked, depth limited, exactly as for `Value`),
// but nothing is kept beyond `Marks`. Keys are read as strings, as `Value` reads them. A key
// given twice counts as its last value, as in `Value`'s map.

impl<'de: 'a, 'a> Deserialize<'de> for Marks<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Marks<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Marks<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Marks<'de>, E> {
                Ok(Marks::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Marks<'de>, E> {
                Ok(Marks::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Marks<'de>, E> {
                Ok(Marks::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Marks<'de>, E> {
                Ok(Marks::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Marks<'de>, E> {
                Ok(Marks::default())
            }
            fn visit_unit<E>(self) -> Result<Marks<'de>, E> {
                Ok(Marks::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Marks<'de>, A::Error> {
                check_seq(seq).map(|_| Marks::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Marks<'de>, A::Error> {
                let mut m = Marks::default();
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    match key.0.as_ref() {
                        "approval" => m.approval = map.next_value::<Scalar<'de>>()?.text(),
                        "accepts" => m.accepts = map.next_value::<Scalar<'de>>()?.text(),
                        "at" => m.at = map.next_value::<Scalar<'de>>()?.unsigned(),
                        _ => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(m)
            }
        }
        d.deserialize_any(V)
    }
}

/// A key of `detail`, borrowed unless it had an escape.
struct Key<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The value of a followed key: a string, an integer that `Value::as_u64` gives, or anything
/// else (checked like the rest).
enum Scalar<'a> {
    Text(Cow<'a, str>),
    Unsigned(u64),
    Other,
}

impl<'a> Scalar<'a> {
    fn text(self) -> Option<Cow<'a, str>> {
        match self {
            Scalar::Text(s) => Some(s),
            _ => None,
        }
    }
    fn unsigned(self) -> Option<u64> {
        match self {
            Scalar::Unsigned(n) => Some(n),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Other)
            }
            // `Value` keeps a non-negative i64 as an unsigned number (serde_json gives only
            // negative integers as i64, and `-0` as a float).
            fn visit_i64<E>(self, n: i64) -> Result<Scalar<'de>, E> {
                Ok(u64::try_from(n).map_or(Scalar::Other, Scalar::Unsigned))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Unsigned(n))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Other)
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Text(Cow::Owned(s.to_string())))
            }
            fn visit_unit<E>(self) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar<'de>, A::Error> {
                check_seq(seq).map(|_| Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar<'de>, A::Error> {
                check_map(map).map(|_| Scalar::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// Any JSON value, checked as `Value` checks it and not kept.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Checked;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_unit<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Checked, A::Error> {
                check_seq(seq)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Checked, A::Error> {
                check_map(map)
            }
        }
        d.deserialize_any(V)
    }
}

fn check_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Checked, A::Error> {
    while seq.next_element::<Checked>()?.is_some() {}
    Ok(Checked)
}

fn check_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Checked, A::Error> {
    // A key is read as a string (serde_json's map keys are strings whatever is asked for).
    while map.next_key::<IgnoredAny>()?.is_some() {
        map.next_value::<Checked>()?;
    }
    Ok(Checked)
}

#[cfg(test)]
mod tests {
    //! The quick reading against the reading by `Record` alone, as the scan did it before (kept
    //! here verbatim as the reference): for any line, the same answer.

    use super::*;
    use crate::ledger::record::{Draft, GENESIS};
    use proptest::prelude::*;
    use serde_json::json;

    /// The scan's reading of a line before the quick one, verbatim.
    fn reference(line: &[u8]) -> Result<(Record, bool), String> {
        let rec: Record = serde_json::from_slice(line).map_err(|e| {
            if serde_json::from_slice::<Value>(line).is_ok() {
                format!("the line is not an audit record: {e}")
            } else {
                format!("the line does not parse: {e}")
            }
        })?;
        let own = reference_hashes_as_written(line, &rec) || rec.computed_hash() == rec.hash;
        Ok((rec, own))
    }

    fn reference_hashes_as_written(line: &[u8], rec: &Record) -> bool {
        const KEY: &[u8] = b"\"hash\":\"";
        let Some(at) = line.windows(KEY.len()).position(|w| w == KEY) else {
            return false;
        };
        let end = at + KEY.len() + 64 + 2;
        if end > line.len() || &line[end - 2..end] != b"\"," {
            return false;
        }
        let mut bytes = Vec::with_capacity(rec.prev.len() + line.len());
        bytes.extend_from_slice(rec.prev.as_bytes());
        bytes.extend_from_slice(&line[..at]);
        bytes.extend_from_slice(&line[end..]);
        canonical::sha256_hex(&bytes) == rec.hash
    }

    /// The same answer for `line` both ways; whether the quick reading gave it.
    fn same(line: &[u8]) -> Result<bool, TestCaseError> {
        same_by(&Reader::new(), line)
    }

    /// `same`, read by `reader` (which may have read other lines before).
    fn same_by<'a>(reader: &Reader<'a>, line: &'a [u8]) -> Result<bool, TestCaseError> {
        // What the plain form takes, `Record` takes, and holds the same values.
        if let Some(entry) = Reader::new().plain(line) {
            match serde_json::from_slice::<Record>(line) {
                Ok(rec) => prop_assert_eq!(entry, Entry::from_record(rec)),
                Err(e) => prop_assert!(
                    false,
                    "{:?} is plain, but not a record: {e}",
                    String::from_utf8_lossy(line)
                ),
            }
        }
        let mut quick = false;
        match (reader.parse(line), reference(line)) {
            (Ok((entry, own)), Ok((rec, ref_own))) => {
                prop_assert_eq!(own, ref_own);
                // Only the quick reading borrows.
                quick = matches!(entry.prev, Cow::Borrowed(_));
                prop_assert_eq!(entry, Entry::from_record(rec));
            }
            (Err((why, line_hash)), Err(ref_why)) => {
                prop_assert_eq!(why, ref_why);
                prop_assert_eq!(line_hash, canonical::sha256_hex(line));
            }
            (got, want) => prop_assert!(
                false,
                "{:?}: {got:?} but the reference gives {want:?}",
                String::from_utf8_lossy(line)
            ),
        }
        Ok(quick)
    }

    fn check(line: &str) -> bool {
        match same(line.as_bytes()) {
            Ok(quick) => quick,
            Err(e) => panic!("{e}"),
        }
    }

    /// `line` with the hash at its first `"hash":"` made the one it hashes to as written after
    /// `prev`: a line changed and re-hashed, which the quick reading takes if it reads it.
    fn rehash(line: &[u8], prev: &str) -> Vec<u8> {
        let mut b = line.to_vec();
        if let Some(at) = Finder::new(KEY).find(line) {
            let end = at + KEY.len() + 64 + 2;
            if end <= b.len() {
                let digest = record::digest(&[prev.as_bytes(), &line[..at], &line[end..]]);
                b[at + KEY.len()..end - 2].copy_from_slice(&canonical::hex(&digest));
            }
        }
        b
    }

    /// `check` of `line` as it is and re-hashed after GENESIS; whether the quick reading took
    /// the re-hashed one.
    fn check_rehashed(line: &str) -> bool {
        check(line);
        let b = rehash(line.as_bytes(), GENESIS);
        match same(&b) {
            Ok(quick) => quick,
            Err(e) => panic!("{e}"),
        }
    }

    fn sealed(detail: Value, tool: Option<&str>, event: Event) -> String {
        let draft = Draft {
            session: Some(SessionId::new("s-1").unwrap()),
            call: Some(CallId(7)),
            tool: tool.map(str::to_string),
            event,
            detail,
        };
        let r = Record::seal(draft, 3, GENESIS, Timestamp(1_764_489_600_000));
        r.line().trim_end().to_string()
    }

    #[test]
    fn a_line_brokerd_wrote_is_read_quickly_and_the_same() {
        let line = sealed(
            json!({
                "approval": "0123456789abcdef",
                "at": 4,
                "accepts": GENESIS,
                "x": [1, {"y": null}],
            }),
            Some("workspace_read"),
            Event::Pending,
        );
        assert!(check(&line));
        assert!(Reader::new().plain(line.as_bytes()).is_some());
        let (entry, own) = Reader::new().parse(line.as_bytes()).unwrap();
        assert!(own);
        assert!(matches!(entry.prev, Cow::Borrowed(_)));
        assert_eq!(entry.marks.approval.as_deref(), Some("0123456789abcdef"));
        assert_eq!(entry.marks.at, Some(4));
        assert_eq!(entry.marks.accepts.as_deref(), Some(GENESIS));
    }

    #[test]
    fn detail_is_refused_where_value_refuses_it() {
        let base = sealed(json!({"k": "v"}), Some("t"), Event::Result);
        let with = |detail: &str| base.replacen(r#"{"k":"v"}"#, detail, 1);
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for detail in [
            r#"{"x":1e400}"#,
            r#"{"x":-1e400}"#,
            r#"{"x":"\ud800"}"#,
            r#"{"\udc00":1}"#,
            r#"{"x":"\x"}"#,
            "{\"x\":\"a\tb\"}",
            r#"{"x":01}"#,
            r#"{"x":1.}"#,
            r#"{"x":tru}"#,
            r#"{"x":[1,]}"#,
            r#"{"x":{"y":1,}}"#,
            r#"{1:2}"#,
            &nested(200),
        ] {
            assert!(!check_rehashed(&with(detail)), "{detail}");
        }
        assert!(check_rehashed(&with(
            r#"{"x":1e300,"y":"\u00e9\ud83d\ude00"}"#
        )));
        // serde_json's depth limit, wherever it is, is the same both ways.
        let taken: Vec<bool> = (120..135)
            .map(|n| check_rehashed(&with(&nested(n))))
            .collect();
        assert!(taken.contains(&true) && taken.contains(&false));
    }

    #[test]
    fn a_followed_key_counts_as_value_counts_it() {
        let base = sealed(json!({"k": "v"}), Some("t"), Event::Accepted);
        let with = |detail: &str| base.replacen(r#"{"k":"v"}"#, detail, 1);
        for detail in [
            r#"{"at":5,"at":"x"}"#,
            r#"{"at":"x","at":5}"#,
            r#"{"at":-0}"#,
            r#"{"at":-1}"#,
            r#"{"at":1.0}"#,
            r#"{"at":18446744073709551615}"#,
            r#"{"at":18446744073709551616}"#,
            r#"{"at":[5]}"#,
            r#"{"approval":"0123456789abcdef","approval":null}"#,
            r#"{"approval":"\u0030123456789abcdef"}"#,
            r#"{"appro\u0076al":"0123456789abcdef"}"#,
            r#"{"accepts":{"accepts":"x"}}"#,
            r#"["at",5]"#,
            r#""at""#,
            "null",
        ] {
            check_rehashed(&with(detail));
        }
    }

    #[test]
    fn lines_brokerd_did_not_write_are_read_as_records() {
        let base = sealed(json!({"k": "v"}), Some("t"), Event::Result);
        let mut lines = vec![
            sealed(json!({}), Some("tool \"quoted\""), Event::Requested),
            sealed(
                json!({"head_found": {"hash": GENESIS, "seq": 0}}),
                None,
                Event::Started,
            ),
            base.replacen(":", " : ", 3),
            format!("{base} "),
            format!(" {base}"),
            format!("{base}x"),
            format!("{base}{{}}"),
            base.replacen("{", r#"{"extra":1,"#, 1),
            base.replacen(r#""seq":3,"#, r#""seq":3,"seq":3,"#, 1),
            base.replacen(r#""seq":3,"#, "", 1),
            base.replacen(r#""session":"s-1","#, "", 1),
            base.replacen(r#""session":"s-1""#, r#""session":"s 1""#, 1),
            base.replacen(r#""session":"s-1""#, r#""session":"""#, 1),
            base.replacen(r#""session":"s-1""#, r#""session":"s\u002d1""#, 1),
            base.replacen(r#""tool":"t""#, r#""tool":"\u0074""#, 1),
            base.replacen(r#""prev":"0"#, r#""prev":"\u0030"#, 1),
            base.replacen(r#""event":"result""#, r#""event":"nonsense""#, 1),
            base.replacen(r#""call":7"#, r#""call":-7"#, 1),
            base.replacen(r#""seq":3"#, r#""seq":3.0"#, 1),
            base.replacen(r#""time":1764489600000"#, r#""time":"1""#, 1),
            r#"[3,1764489600000,"p","h","s-1",7,"t","result",{}]"#.to_string(),
            String::new(),
            "{".to_string(),
            "not json".to_string(),
        ];
        lines.push(lines[0].replacen("\\\"", "\\u0022", 1));
        for line in &lines {
            assert!(!check(line), "{line}");
            check_rehashed(line);
        }
    }

    #[test]
    fn a_session_id_is_checked_in_every_line_one_reader_reads() {
        let good = sealed(json!({}), Some("t"), Event::Result);
        let long = "s".repeat(65);
        for bad in ["", "s 1", "s/1", "s-é", &long, "s-2"] {
            let other = rehash(
                good.replacen(r#""session":"s-1""#, &format!(r#""session":"{bad}""#), 1)
                    .as_bytes(),
                GENESIS,
            );
            let reader = Reader::new();
            for line in [good.as_bytes(), &other, good.as_bytes(), &other] {
                if let Err(e) = same_by(&reader, line) {
                    panic!("{e}");
                }
            }
        }
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9_-]{0,8}",
            "[\\x00-\\x20\"\\\\/\\x7f-\\u{a0}a-zé😀]{0,8}",
            "[0-9a-f]{16}",
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("approval".to_string()),
            Just("at".to_string()),
            Just("accepts".to_string()),
            Just("hash".to_string()),
            Just("prev".to_string()),
            text(),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(|n| json!(n)),
            any::<i64>().prop_map(|n| json!(n)),
            (0u64..10).prop_map(|n| json!(n)),
            prop::num::f64::NORMAL.prop_map(|f| json!(f)),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn event() -> impl Strategy<Value = Event> {
        prop::sample::select(vec![
            Event::Requested,
            Event::Allowed,
            Event::Denied,
            Event::Pending,
            Event::Approved,
            Event::Expired,
            Event::Withdrawn,
            Event::Result,
            Event::Failed,
            Event::Recovered,
            Event::Accepted,
            Event::Started,
            Event::Leased,
            Event::LeaseRevoked,
        ])
    }

    fn record() -> impl Strategy<Value = Record> {
        (
            any::<u64>(),
            any::<u64>(),
            prop_oneof![Just(GENESIS.to_string()), "[0-9a-f]{64}", text()],
            prop::option::of("[A-Za-z0-9_-]{1,64}"),
            prop::option::of(any::<u64>()),
            prop::option::of(text()),
            event(),
            value(),
        )
            .prop_map(|(seq, time, prev, session, call, tool, event, detail)| {
                let draft = Draft {
                    session: session.map(|s| SessionId::new(s).unwrap()),
                    call: call.map(CallId),
                    tool,
                    event,
                    detail,
                };
                Record::seal(draft, seq, &prev, Timestamp(time))
            })
    }

    /// A change to a line: a byte changed, removed or added, whitespace, an escape, a
    /// duplicated or unknown field.
    fn edit(line: &str, how: u8, at: usize, byte: u8) -> Vec<u8> {
        let mut b = line.as_bytes().to_vec();
        let at = at % (b.len() + 1);
        match how % 10 {
            0 => {}
            1 if at < b.len() => b[at] = byte,
            2 if at < b.len() => {
                b.remove(at);
            }
            3 => b.insert(at, byte),
            4 => b.insert(at, b" \n\t\r"[usize::from(byte % 4)]),
            5 => {
                // The first letter inside a string after `at`, written as a \u escape.
                if let Some(i) = (at..b.len()).find(|&i| b[i].is_ascii_alphanumeric()) {
                    let esc = format!("\\u{:04x}", b[i]);
                    b.splice(i..=i, esc.bytes());
                }
            }
            6 => {
                let dup = [
                    r#""seq":1,"#,
                    r#""x":1,"#,
                    r#""detail":{},"#,
                    r#""tool":null,"#,
                ];
                let i = b.iter().position(|&c| c == b'{').map_or(0, |i| i + 1);
                b.splice(i..i, dup[usize::from(byte % 4)].bytes());
            }
            7 => b.truncate(at),
            8 => {
                // Something number-, string- or structure-like, where a digit was.
                let bits = [
                    "0", "00", ".0", "e1", "E-1", "-", "-0", "1e400", "\"", "{", "}", "[]", ",",
                    ":", "null", "true", "é",
                ];
                if let Some(i) = (at..b.len()).find(|&i| b[i].is_ascii_digit()) {
                    b.splice(i..i, bits[usize::from(byte) % bits.len()].bytes());
                }
            }
            _ => {
                // A value in `detail` replaced by another kind.
                let values = [
                    "1",
                    "-1",
                    "-0",
                    "1.5",
                    "123456789012345678",
                    "1234567890123456789",
                    "[1,[2,{}]]",
                    "{\"at\":2}",
                    "\"x\"",
                    "null",
                    "false",
                ];
                let key = br#""detail":{"#;
                if let Some(i) = b.windows(key.len()).position(|w| w == key) {
                    let v = values[usize::from(byte) % values.len()];
                    b.splice(i + key.len()..i + key.len(), format!("\"at\":{v},").bytes());
                }
            }
        }
        b
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn any_record_brokerd_writes_is_read_the_same(r in record()) {
            let line = r.line();
            same(line.trim_end_matches('\n').as_bytes())?;
        }

        #[test]
        fn any_changed_line_is_read_the_same(
            r in record(),
            how in any::<u8>(),
            at in any::<usize>(),
            byte in any::<u8>(),
        ) {
            let line = r.line();
            let edited = edit(line.trim_end_matches('\n'), how, at, byte);
            same(&edited)?;
            same(&rehash(&edited, &r.prev))?;
        }

        #[test]
        fn lines_read_one_after_another_are_read_the_same(
            lines in prop::collection::vec(
                (record(), any::<u8>(), any::<usize>(), any::<u8>()),
                1..8,
            ),
        ) {
            let lines: Vec<Vec<u8>> = lines
                .iter()
                .map(|(r, how, at, byte)| {
                    rehash(&edit(r.line().trim_end_matches('\n'), *how, *at, *byte), &r.prev)
                })
                .collect();
            let reader = Reader::new();
            for line in &lines {
                same_by(&reader, line)?;
            }
        }

        #[test]
        fn any_bytes_are_read_the_same(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            same(&bytes)?;
        }
    }
}
