//! Keeping the model API key out of everything inferproxy logs or forwards.
//!
//! A provider may echo the key back: in an error body, as JSON (`"sk-…"`, or escaped as
//! `"\u0073\u006b-…"`), or in a stream, split across two events. So the key is looked for in
//! what is *shown*, after JSON strings are decoded: [`Redactor::text`] decodes JSON escapes in a
//! raw excerpt before it looks, the reply's strings are redacted after they were parsed, and
//! [`Stream`] holds back the end of the forwarded text while it could be the start of the key, so
//! no two deltas carry its halves.

use bxcore::{ChatMessage, InferReply};
use serde_json::Value;

/// What stands where the key was.
pub const REDACTED: &str = "[redacted]";

/// Redacts one key; it borrows the key and never shows it.
#[derive(Clone, Copy)]
pub struct Redactor<'k> {
    key: &'k str,
}

impl std::fmt::Debug for Redactor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Redactor(redacted)")
    }
}

impl<'k> Redactor<'k> {
    pub(crate) fn new(key: &'k str) -> Redactor<'k> {
        Redactor { key }
    }

    /// `text` with every copy of the key replaced by [`REDACTED`]. When the key appears only
    /// once JSON escapes are decoded (`\u0073k-…`, `\/`), the decoded text is what comes back,
    /// redacted: a person would decode it too.
    pub fn text(&self, text: &str) -> String {
        if self.key.is_empty() {
            return text.to_string();
        }
        let plain = if text.contains(self.key) {
            text.replace(self.key, REDACTED)
        } else {
            text.to_string()
        };
        if plain.contains('\\') {
            let decoded = unescape(&plain);
            if decoded.contains(self.key) {
                return decoded.replace(self.key, REDACTED);
            }
        }
        plain
    }

    /// Every string in `v`, keys included, redacted (after serde decoded them).
    pub fn value(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if s.contains(self.key) || s.contains('\\') {
                    *s = self.text(s);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.value(x)),
            Value::Object(m) => {
                let old = std::mem::take(m);
                for (k, mut x) in old {
                    self.value(&mut x);
                    m.insert(self.text(&k), x);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// A reply with every string in it redacted: its text, its tools' names and arguments.
    pub fn reply(&self, mut reply: InferReply) -> InferReply {
        if let ChatMessage::Assistant { text, tool_calls } = &mut reply.message {
            *text = self.text(text);
            for call in tool_calls {
                call.tool = self.text(&call.tool);
                self.value(&mut call.args);
            }
        }
        reply
    }

    /// A redactor for text that is forwarded in pieces.
    pub fn stream(&self) -> Stream<'k> {
        Stream {
            redactor: *self,
            held: String::new(),
        }
    }
}

/// Text forwarded in pieces, redacted as a whole: the end of what came so far is held back for as
/// long as it could be the beginning of the key, and let go when the next piece shows it is not
/// (or when the text ends).
#[derive(Debug)]
pub struct Stream<'k> {
    redactor: Redactor<'k>,
    held: String,
}

impl Stream<'_> {
    /// Take the next piece; what may be forwarded now (possibly nothing).
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        let key = self.redactor.key;
        if key.is_empty() {
            return std::mem::take(&mut self.held);
        }
        let mut out = String::new();
        while let Some(at) = self.held.find(key) {
            out.push_str(&self.held[..at]);
            out.push_str(REDACTED);
            self.held.drain(..at + key.len());
        }
        let keep = partial_key_suffix(&self.held, key);
        let cut = self.held.len() - keep;
        out.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        out
    }

    /// The text has ended: what was held back (it was not the key).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// The length of the longest end of `text` that is a beginning of `key` but not all of it.
fn partial_key_suffix(text: &str, key: &str) -> usize {
    let most = key.len().saturating_sub(1).min(text.len());
    (1..=most)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && key
                    .as_bytes()
                    .starts_with(&text.as_bytes()[text.len() - n..])
        })
        .unwrap_or(0)
}

/// `text` with JSON string escapes decoded where they are well formed (`\uXXXX`, surrogate
/// pairs, `\n`, `\/`, ...) and kept as they are where not: a lenient view of raw provider output
/// that may hold a JSON document or a piece of one.
pub fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let (decoded, used) = escape_at(rest);
        match decoded {
            Some(c) => out.push(c),
            None => out.push_str(&rest[..used]),
        }
        rest = &rest[used..];
    }
    out.push_str(rest);
    out
}

/// The escape at the start of `s` (which starts with a backslash): the character it stands for,
/// or `None` if it is not a well-formed escape, and how many bytes it spans.
fn escape_at(s: &str) -> (Option<char>, usize) {
    let b = s.as_bytes();
    let simple = match b.get(1) {
        Some(b'"') => Some('"'),
        Some(b'\\') => Some('\\'),
        Some(b'/') => Some('/'),
        Some(b'b') => Some('\u{8}'),
        Some(b'f') => Some('\u{c}'),
        Some(b'n') => Some('\n'),
        Some(b'r') => Some('\r'),
        Some(b't') => Some('\t'),
        Some(b'u') => None,
        _ => return (None, 1),
    };
    if let Some(c) = simple {
        return (Some(c), 2);
    }
    let Some(hi) = hex4(s.get(2..6)) else {
        return (None, 1);
    };
    if (0xd800..0xdc00).contains(&hi) {
        if s.get(6..8) == Some("\\u") {
            if let Some(lo) = hex4(s.get(8..12)) {
                if (0xdc00..0xe000).contains(&lo) {
                    let c = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
                    return (char::from_u32(c), 12);
                }
            }
        }
        return (None, 6);
    }
    match char::from_u32(hi) {
        Some(c) => (Some(c), 6),
        None => (None, 6),
    }
}

fn hex4(s: Option<&str>) -> Option<u32> {
    let s = s?;
    if s.len() == 4 && s.bytes().all(|c| c.is_ascii_hexdigit()) {
        u32::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test-0123456789";

    fn escaped(key: &str) -> String {
        key.chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect()
    }

    #[test]
    fn a_plain_copy_is_redacted() {
        let r = Redactor::new(KEY);
        assert_eq!(r.text(&format!("bad key {KEY}!")), "bad key [redacted]!");
    }

    #[test]
    fn a_json_escaped_copy_is_decoded_then_redacted() {
        let r = Redactor::new(KEY);
        let raw = format!(r#"{{"error":"bad key {}"}}"#, escaped(KEY));
        let shown = r.text(&raw);
        assert!(
            !shown.contains(KEY) && !shown.contains(&escaped(KEY)),
            "{shown}"
        );
        assert!(shown.contains(REDACTED), "{shown}");
        let half = format!("{}{}", escaped(&KEY[..4]), &KEY[4..]);
        assert!(!r.text(&half).contains(KEY));
        // Text without the key comes back as it was, escapes and all.
        assert_eq!(r.text(r#"a\u0041\n"#), r#"a\u0041\n"#);
    }

    #[test]
    fn strings_inside_a_value_are_redacted_after_decoding() {
        let r = Redactor::new(KEY);
        let mut v: Value =
            serde_json::from_str(&format!(r#"{{"a":["{}"],"{}":1}}"#, escaped(KEY), KEY)).unwrap();
        r.value(&mut v);
        assert!(!v.to_string().contains(KEY), "{v}");
    }

    #[test]
    fn a_key_split_across_pieces_never_leaves_whole_or_in_halves() {
        let r = Redactor::new(KEY);
        for cut in 1..KEY.len() {
            let mut s = r.stream();
            let mut out = s.push(&format!("before {}", &KEY[..cut]));
            assert_eq!(out, "before ", "cut at {cut}: the first half is held back");
            out.push_str(&s.push(&format!("{} after", &KEY[cut..])));
            out.push_str(&s.finish());
            assert_eq!(out, "before [redacted] after", "cut at {cut}");
        }
    }

    #[test]
    fn text_that_only_looks_like_the_start_of_the_key_is_let_go() {
        let r = Redactor::new(KEY);
        let mut s = r.stream();
        assert_eq!(s.push("ask"), "a");
        assert_eq!(s.push("s"), "sk");
        assert_eq!(s.push("k-te"), "");
        assert_eq!(s.push("x"), "sk-tex");
        assert_eq!(s.push("é s"), "é ");
        assert_eq!(s.finish(), "s");
    }

    #[test]
    fn unescape_is_lenient() {
        assert_eq!(unescape(r#"\u0041\ud83d\ude00\n\/"#), "A😀\n/");
        assert_eq!(unescape(r#"\x \u12 \ud800x \"#), r#"\x \u12 \ud800x \"#);
    }
}
