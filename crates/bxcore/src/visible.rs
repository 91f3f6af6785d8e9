//! Text shown to a person, escaped: the one place every channel turns model-, tool- or
//! peer-controlled text into something a terminal shows and never obeys.
//!
//! A terminal interprets what it is given: ESC and CSI sequences set the clipboard (OSC 52),
//! make links (OSC 8), retitle the window (OSC 0), conceal the next line (SGR 8) or clear the
//! screen; bidi overrides and isolates reorder what is read (`notes/\u{202e}txt.tsil-gnippohs`
//! reads as "shopping-list.txt"); zero-width characters and tag characters hide text; U+2028 and
//! U+2029 break lines where no newline is. Every such character is shown as `\u{…}` (lowercase
//! hex, `vis(3)`/`git`-style), so it is seen and never acted on. Everything else passes as is.

use std::borrow::Cow;
use std::fmt;

/// What the text is, which decides what else is escaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Prose that may span lines (assistant text): newlines and tabs stay, backslashes stay.
    Text,
    /// One line (a tool result's first line, an error's detail, an audit record): newlines,
    /// tabs and carriage returns are shown as `\n`, `\t`, `\r`; backslashes stay.
    Line,
    /// An exact value shown between double quotes (an approval's argument): as `Line`, and `\`
    /// and `"` are shown as `\\` and `\"`, so what is shown maps back to one value only.
    Quoted,
}

/// Whether `c` is shown escaped whatever the mode: C0 and C1 controls (but newline and tab,
/// which the mode decides), DEL, and the invisible or reordering characters.
pub fn is_hazard(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        // Soft hyphen, combining grapheme joiner, Arabic letter mark, Hangul fillers,
        // Mongolian vowel separator.
        | '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}'
        // Prefixed format characters that render as nothing or reorder (Arabic, Syriac).
        | '\u{600}'..='\u{605}' | '\u{6dd}' | '\u{70f}' | '\u{890}' | '\u{891}' | '\u{8e2}'
        // Zero-width space, non-joiner, joiner; left-to-right and right-to-left marks.
        | '\u{200b}'..='\u{200f}'
        // Line and paragraph separators; embeddings and overrides (LRE RLE PDF LRO RLO).
        | '\u{2028}'..='\u{202e}'
        // Word joiner, invisible operators, isolates (LRI RLI FSI PDI), deprecated formats.
        | '\u{2060}'..='\u{206f}'
        | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{ffa0}'
        // Interlinear annotation; the object replacement stays visible.
        | '\u{fff9}'..='\u{fffb}'
        | '\u{110bd}' | '\u{110cd}' | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}'
        // Tag characters (invisible ASCII), variation selectors supplement.
        | '\u{e0000}'..='\u{e007f}' | '\u{e0100}'..='\u{e01ef}'
    )
}

fn escaped(c: char, mode: Mode) -> Option<&'static str> {
    match (c, mode) {
        ('\n' | '\t', Mode::Text) => None,
        ('\n', _) => Some("\\n"),
        ('\t', _) => Some("\\t"),
        ('\r', Mode::Line | Mode::Quoted) => Some("\\r"),
        ('\\', Mode::Quoted) => Some("\\\\"),
        ('"', Mode::Quoted) => Some("\\\""),
        _ => None,
    }
}

fn needs(c: char, mode: Mode) -> bool {
    escaped(c, mode).is_some() || is_hazard(c)
}

/// `s` as it is safe to show: every character a terminal would obey, or that hides or reorders
/// text, as `\u{…}`; newlines, tabs, `\` and `"` as [`Mode`] says. Borrows when nothing changes.
pub fn escape(s: &str, mode: Mode) -> Cow<'_, str> {
    if !s.chars().any(|c| needs(c, mode)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if let Some(e) = escaped(c, mode) {
            out.push_str(e);
        } else if is_hazard(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`escape`] as a `Display`, for `format!("{}", Shown(text, Mode::Line))`.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a>(pub &'a str, pub Mode);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape(self.0, self.1))
    }
}
