//! The one escape for text shown to a person: each hostile sequence of the review is shown as
//! text and never reaches a terminal as a control; ordinary text passes unchanged.

use bxcore::visible::{Mode, Shown, escape, is_hazard};
use proptest::prelude::*;

/// Each sequence a terminal would obey, or that hides or reorders text, and how it is shown.
const HOSTILE: &[(&str, &str, &str)] = &[
    (
        "OSC 52 writes the clipboard",
        "\u{1b}]52;c;ZWNobyBwd25lZA==\u{7}",
        "\\u{1b}]52;c;ZWNobyBwd25lZA==\\u{7}",
    ),
    (
        "OSC 8 makes a link",
        "\u{1b}]8;;https://evil.example/\u{1b}\\click\u{1b}]8;;\u{1b}\\",
        "\\u{1b}]8;;https://evil.example/\\u{1b}\\click\\u{1b}]8;;\\u{1b}\\",
    ),
    (
        "OSC 0 retitles the window",
        "\u{1b}]0;owned\u{7}",
        "\\u{1b}]0;owned\\u{7}",
    ),
    (
        "SGR 8 conceals what follows",
        "\u{1b}[8mhidden\u{1b}[0m",
        "\\u{1b}[8mhidden\\u{1b}[0m",
    ),
    ("clear-screen", "\u{1b}[2J\u{1b}[H", "\\u{1b}[2J\\u{1b}[H"),
    ("a C1 CSI", "\u{9b}31m", "\\u{9b}31m"),
    ("DEL", "a\u{7f}b", "a\\u{7f}b"),
    ("backspace", "ab\u{8}\u{8}cd", "ab\\u{8}\\u{8}cd"),
    (
        "a right-to-left override",
        "notes/\u{202e}txt.tsil-gnippohs",
        "notes/\\u{202e}txt.tsil-gnippohs",
    ),
    (
        "isolates",
        "\u{2066}a\u{2067}b\u{2068}c\u{2069}",
        "\\u{2066}a\\u{2067}b\\u{2068}c\\u{2069}",
    ),
    (
        "marks and embeddings",
        "\u{200e}\u{200f}\u{202a}\u{202b}\u{202c}\u{202d}\u{61c}",
        "\\u{200e}\\u{200f}\\u{202a}\\u{202b}\\u{202c}\\u{202d}\\u{61c}",
    ),
    (
        "zero-width characters",
        "a\u{200b}b\u{200c}c\u{200d}d\u{2060}e\u{feff}",
        "a\\u{200b}b\\u{200c}c\\u{200d}d\\u{2060}e\\u{feff}",
    ),
    (
        "line and paragraph separators",
        "one\u{2028}two\u{2029}",
        "one\\u{2028}two\\u{2029}",
    ),
    (
        "tag characters",
        "x\u{e0041}\u{e0042}",
        "x\\u{e0041}\\u{e0042}",
    ),
    ("a carriage return", "ok\rno", "ok\\u{d}no"),
    ("a NUL", "a\u{0}b", "a\\u{0}b"),
];

#[test]
fn every_hostile_sequence_is_shown_as_text_in_every_mode() {
    for (what, raw, want) in HOSTILE {
        assert_eq!(escape(raw, Mode::Text), *want, "{what}");
        let line = escape(raw, Mode::Line);
        assert!(!line.chars().any(is_hazard), "{what}: {line:?}");
        assert!(!line.contains('\u{1b}'), "{what}");
    }
}

#[test]
fn prose_keeps_its_newlines_tabs_and_backslashes() {
    let s = "line one\n\tline two C:\\x \"q\" ünïcödé 日本語 → ✓";
    assert!(matches!(
        escape(s, Mode::Text),
        std::borrow::Cow::Borrowed(_)
    ));
}

#[test]
fn a_line_shows_its_newlines_tabs_and_returns() {
    assert_eq!(escape("a\nb\tc\rd\\e", Mode::Line), "a\\nb\\tc\\rd\\e");
}

#[test]
fn a_quoted_value_shows_its_backslashes_and_quotes() {
    assert_eq!(
        escape("a\\u{202e}\"b\u{202e}", Mode::Quoted),
        "a\\\\u{202e}\\\"b\\u{202e}"
    );
    assert_eq!(
        Shown("x\u{1b}", Mode::Quoted).to_string(),
        "x\\u{1b}".to_string()
    );
}

/// Undo `Mode::Quoted`: each shown value maps back to exactly one string.
fn unquote(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('u') => {
                assert_eq!(it.next(), Some('{'));
                let hex: String = it.by_ref().take_while(|&c| c != '}').collect();
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
            }
            other => panic!("a stray escape {other:?} in {s:?}"),
        }
    }
    out
}

proptest! {
    #[test]
    fn no_escaped_text_holds_a_control_or_an_invisible_character(s in any::<String>()) {
        for mode in [Mode::Text, Mode::Line, Mode::Quoted] {
            let shown = escape(&s, mode);
            prop_assert!(!shown.chars().any(is_hazard), "{:?} {:?}", mode, shown);
            if mode != Mode::Text {
                prop_assert!(!shown.contains('\n') && !shown.contains('\t'));
            }
        }
    }

    #[test]
    fn a_quoted_value_maps_back_to_the_value(s in any::<String>()) {
        prop_assert_eq!(unquote(&escape(&s, Mode::Quoted)), s);
    }
}
