//! What memoryd takes of a turn: the owner's words and the box's answers, at most
//! `[limits] max_turn_bytes` of them. A turn record may be as large as a frame (4 MiB) and comes
//! from loopd's uid; what the stores keep of it is the user's and the assistant's text alone
//! (`store::turn_text`, Honcho's messages), so that is all the outbox holds: tool calls and tool
//! results are not kept, and a turn over the bound has its longest texts cut to a common length,
//! each with a note that says so. The outbox then holds at most `max_outbox` times the bound,
//! and one turn cannot grow a store by more than the bound.

use bxcore::{ChatMessage, TurnRecord};

/// What a cut text ends with, before the count of bytes not kept.
pub const CUT_NOTE: &str = "\n[cut by memoryd: ";

/// The room a note takes, at most (its text, escaped, with a count of up to 20 digits).
const NOTE_ROOM: usize = 96;

/// `record` as memoryd keeps it: its user and assistant texts, within `max` bytes as the
/// outbox holds them (JSON-escaped: a control character counts six). Empty texts are not kept
/// (but for the first, the user's, which a record starts with). Past `max / (2 * NOTE_ROOM)`
/// messages the rest are dropped, with a note on the last kept; then the longest texts are cut
/// to one common length, each with its note, so the whole stays within `max`.
pub fn taken(record: &TurnRecord, max: usize) -> TurnRecord {
    let mut messages: Vec<ChatMessage> = Vec::new();
    for (i, m) in record.messages.iter().enumerate() {
        match m {
            ChatMessage::User { text } if i == 0 || !text.is_empty() => {
                messages.push(ChatMessage::User { text: text.clone() })
            }
            ChatMessage::Assistant { text, .. } if !text.is_empty() => {
                messages.push(ChatMessage::Assistant {
                    text: text.clone(),
                    tool_calls: Vec::new(),
                })
            }
            _ => {}
        }
    }
    let most = (max / (2 * NOTE_ROOM)).max(1);
    let dropped = messages.len().saturating_sub(most);
    messages.truncate(most);
    let lengths: Vec<usize> = messages.iter().map(|m| escaped_len(text(m))).collect();
    let notes = NOTE_ROOM * (lengths.len() + usize::from(dropped > 0));
    if dropped > 0 || lengths.iter().sum::<usize>() > max {
        let cap = common_length(&lengths, max.saturating_sub(notes));
        for m in &mut messages {
            cut(text_mut(m), cap);
        }
    }
    if dropped > 0 {
        if let Some(last) = messages.last_mut() {
            text_mut(last).push_str(&format!(
                "{CUT_NOTE}{dropped} more messages not kept, [limits] max_turn_bytes]"
            ));
        }
    }
    TurnRecord {
        session: record.session.clone(),
        turn: record.turn,
        messages,
    }
}

fn text(m: &ChatMessage) -> &str {
    match m {
        ChatMessage::User { text } | ChatMessage::Assistant { text, .. } => text,
        ChatMessage::System { text } | ChatMessage::Tool { text, .. } => text,
    }
}

fn text_mut(m: &mut ChatMessage) -> &mut String {
    match m {
        ChatMessage::User { text } | ChatMessage::Assistant { text, .. } => text,
        ChatMessage::System { text } | ChatMessage::Tool { text, .. } => text,
    }
}

/// The bytes `c` takes in a JSON string.
fn escaped(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// The bytes `text` takes in a JSON string, quotes left out.
fn escaped_len(text: &str) -> usize {
    text.chars().map(escaped).sum()
}

/// The largest length `c` such that every text cut to `c` fits in `budget` together: the
/// shorter texts whole, the longer ones to `c`.
fn common_length(lengths: &[usize], budget: usize) -> usize {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let mut left = budget;
    for (i, &len) in sorted.iter().enumerate() {
        let rest = sorted.len() - i;
        if len.saturating_mul(rest) > left {
            return left / rest;
        }
        left -= len;
    }
    usize::MAX
}

/// `text` cut to at most `cap` escaped bytes (on a character boundary), and its note, if it
/// is longer.
fn cut(text: &mut String, cap: usize) {
    let total = escaped_len(text);
    if total <= cap {
        return;
    }
    let mut kept = 0;
    let mut at = 0;
    for (i, c) in text.char_indices() {
        if kept + escaped(c) > cap {
            break;
        }
        kept += escaped(c);
        at = i + c.len_utf8();
    }
    let dropped = text.len() - at;
    text.truncate(at);
    text.push_str(&format!(
        "{CUT_NOTE}{dropped} more bytes not kept, [limits] max_turn_bytes]"
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::{CallId, SessionId, ToolCall};

    fn record(messages: Vec<ChatMessage>) -> TurnRecord {
        TurnRecord {
            session: SessionId::new("s").unwrap(),
            turn: 1,
            messages,
        }
    }

    fn user(t: &str) -> ChatMessage {
        ChatMessage::User { text: t.into() }
    }

    #[test]
    fn tool_calls_and_results_are_not_taken_and_the_texts_are_whole_within_the_bound() {
        let r = record(vec![
            user("note this"),
            ChatMessage::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    call: CallId(1),
                    tool: "workspace_write".into(),
                    args: serde_json::json!({"content": "x".repeat(100_000)}),
                }],
            },
            ChatMessage::Tool {
                call: CallId(1),
                text: "y".repeat(100_000),
            },
            ChatMessage::Assistant {
                text: "noted".into(),
                tool_calls: vec![],
            },
        ]);
        let t = taken(&r, 1024);
        assert_eq!(
            t.messages,
            vec![
                user("note this"),
                ChatMessage::Assistant {
                    text: "noted".into(),
                    tool_calls: vec![]
                }
            ]
        );
    }

    #[test]
    fn a_turn_over_the_bound_has_its_longest_texts_cut_to_one_length_each_with_a_note() {
        let long = "é".repeat(50_000);
        let r = record(vec![
            user("short question"),
            ChatMessage::Assistant {
                text: long.clone(),
                tool_calls: vec![],
            },
            user(&long),
        ]);
        let max = 8192;
        let t = taken(&r, max);
        let texts: Vec<&str> = t.messages.iter().map(text).collect();
        assert_eq!(texts[0], "short question", "a short text is kept whole");
        for cut in &texts[1..] {
            assert!(cut.contains(CUT_NOTE), "{cut}");
            assert!(cut.ends_with("more bytes not kept, [limits] max_turn_bytes]"));
        }
        assert_eq!(texts[1], texts[2], "one common length");
        assert!(texts.iter().map(|t| t.len()).sum::<usize>() <= max);
    }

    /// The record's size as the outbox holds it.
    fn held(r: &TurnRecord) -> usize {
        serde_json::to_vec(r).unwrap().len()
    }

    #[test]
    fn many_messages_or_control_characters_cannot_make_the_record_larger_than_the_bound() {
        let max = 65_536;
        let many: Vec<ChatMessage> = (0..40_000).map(|_| user("ab")).collect();
        let empty: Vec<ChatMessage> = (0..40_000).map(|_| user("")).collect();
        let control = vec![
            user(&"\u{1}".repeat(500_000)),
            user(&"\u{1}".repeat(500_000)),
        ];
        for (what, messages) in [("many", many), ("empty", empty), ("control", control)] {
            let r = record(messages);
            let t = taken(&r, max);
            // The messages' texts within the bound; the record's framing (a few bytes a
            // message, at most max / 192 messages) besides.
            assert!(
                held(&t) <= max + 64 * t.messages.len() + 256,
                "{what}: {}",
                held(&t)
            );
            assert!(held(&t) < 2 * max, "{what}: {}", held(&t));
            assert!(matches!(t.messages[0], ChatMessage::User { .. }), "{what}");
        }
        let t = taken(&record((0..40_000).map(|_| user("ab")).collect()), max);
        let last = text(t.messages.last().unwrap());
        assert!(last.contains("more messages not kept"), "{last}");
    }

    #[test]
    fn the_common_length_fills_the_budget() {
        assert_eq!(common_length(&[10, 10], 100), usize::MAX);
        assert_eq!(common_length(&[10, 100, 100], 110), 50);
        assert_eq!(common_length(&[100, 100], 10), 5);
        assert_eq!(common_length(&[], 10), usize::MAX);
    }
}
