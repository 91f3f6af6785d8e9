//! One test per answer memoryd's sockets give that is not the happy one, and for each: bad input
//! changes nothing (no record in the outbox, nothing filed), and the daemon serves on.

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use bxcore::client::ClientError;
use bxcore::{
    ChatMessage, ErrorCode, MemoryForget, MemoryRecent, MemorySearch, Message, TurnRecord,
};
use support::*;

fn code_of(got: Result<Message, ClientError>) -> (ErrorCode, String) {
    match got {
        Err(ClientError::Remote(e)) => (e.code, e.detail),
        other => panic!("expected an error frame, got {other:?}"),
    }
}

/// memoryd still serves, and holds nothing.
fn unchanged(h: &Home) {
    assert_eq!(h.outbox_depth(), 0);
    assert!(client_ok(h));
}

fn client_ok(h: &Home) -> bool {
    bxcore::client::ping(&h.memory_sock(), WAIT).is_ok()
        && bxcore::client::ping(&h.memories_sock(), WAIT).is_ok()
}

#[test]
fn a_turn_numbered_zero_is_bad_message_and_nothing_is_written() {
    let h = Home::new();
    let _m = memoryd(&h, "");
    let (code, detail) = code_of(call(
        &h.memory_sock(),
        Message::TurnRecord(record("s1", 0, "hi", "hello")),
    ));
    assert_eq!(code, ErrorCode::BadMessage);
    assert!(detail.contains("numbered from 1"), "{detail}");
    unchanged(&h);
}

#[test]
fn a_turn_without_messages_is_bad_message_and_nothing_is_written() {
    let h = Home::new();
    let _m = memoryd(&h, "");
    let r = TurnRecord {
        session: session("s1"),
        turn: 1,
        messages: vec![],
    };
    let (code, detail) = code_of(call(&h.memory_sock(), Message::TurnRecord(r)));
    assert_eq!(code, ErrorCode::BadMessage);
    assert!(detail.contains("empty"), "{detail}");
    unchanged(&h);
}

#[test]
fn a_turn_that_does_not_start_with_the_users_text_is_bad_message() {
    let h = Home::new();
    let _m = memoryd(&h, "");
    let r = TurnRecord {
        session: session("s1"),
        turn: 1,
        messages: vec![ChatMessage::Assistant {
            text: "I decided on my own".into(),
            tool_calls: vec![],
        }],
    };
    let (code, _) = code_of(call(&h.memory_sock(), Message::TurnRecord(r)));
    assert_eq!(code, ErrorCode::BadMessage);
    unchanged(&h);
}

#[test]
fn a_full_outbox_answers_unavailable_and_takes_nothing_more() {
    let h = Home::new();
    // No brokerd: nothing drains.
    let m = memoryd(&h, "[limits]\nmax_outbox = 1\n");
    hand_over(&h, &record("s1", 1, "one", "ok"));
    let (code, detail) = code_of(call(
        &h.memory_sock(),
        Message::TurnRecord(record("s1", 2, "two", "ok")),
    ));
    assert_eq!(code, ErrorCode::Unavailable);
    assert!(
        detail.ends_with("see docs/runbook.md#memoryd-outbox-full"),
        "{detail}"
    );
    assert_eq!(h.outbox_depth(), 1);
    // The same turn again is taken: it is already held.
    hand_over(&h, &record("s1", 1, "one", "ok"));
    assert!(m.log_text().contains("memoryd-outbox-full"));
}

#[test]
fn an_outbox_write_that_fails_answers_internal_and_the_turn_is_not_acknowledged() {
    let h = Home::new();
    let _m = memoryd(&h, "");
    // The temp file's name taken by a directory: the write cannot happen, even as root.
    fs::create_dir(
        h.outbox()
            .join(".00000000000000000001.s1.00000000000000000001.json.tmp"),
    )
    .unwrap();
    let (code, detail) = code_of(call(
        &h.memory_sock(),
        Message::TurnRecord(record("s1", 1, "hi", "ok")),
    ));
    assert_eq!(code, ErrorCode::Internal);
    assert!(
        detail.ends_with("see docs/runbook.md#memoryd-outbox-unwritable"),
        "{detail}"
    );
    assert_eq!(h.outbox_depth(), 0);
}

#[test]
fn a_recall_for_zero_tokens_or_past_the_limit_is_bad_message() {
    let h = Home::new();
    let _m = memoryd(&h, "[limits]\nmax_recall_tokens = 100\n");
    for n in [0, 101] {
        let (code, detail) = code_of(recall(&h, "s1", "anything", n));
        assert_eq!(code, ErrorCode::BadMessage);
        assert!(detail.contains("max_recall_tokens"), "{detail}");
    }
    unchanged(&h);
}

#[test]
fn a_recall_from_a_damaged_store_answers_unavailable() {
    let h = Home::new();
    let m = memoryd(&h, "");
    // Every page of the file overwritten: SQLite finds no database at the next read.
    let len = fs::metadata(h.store_file()).unwrap().len();
    fs::write(h.store_file(), vec![0x5a; len as usize]).unwrap();
    let (code, detail) = code_of(recall(&h, "s1", "anything", 100));
    assert_eq!(code, ErrorCode::Unavailable);
    assert!(
        detail.ends_with("see docs/runbook.md#memory-store-failed"),
        "{detail}"
    );
    assert!(m.log_text().contains("memory-store-failed"));
    assert!(client_ok(&h));
}

#[test]
fn a_listing_of_zero_or_too_many_turns_is_bad_message() {
    let h = Home::new();
    let _m = memoryd(&h, "");
    for limit in [0, 1001] {
        let (code, _) = code_of(call(
            &h.memories_sock(),
            Message::MemoryRecent(MemoryRecent { route: None, limit }),
        ));
        assert_eq!(code, ErrorCode::BadMessage);
        let (code, _) = code_of(call(
            &h.memories_sock(),
            Message::MemorySearch(MemorySearch {
                query: "x".into(),
                limit,
            }),
        ));
        assert_eq!(code, ErrorCode::BadMessage);
    }
    unchanged(&h);
}

#[test]
fn a_search_with_no_words_is_bad_message() {
    let h = Home::new();
    let _m = memoryd(&h, "");
    let (code, detail) = code_of(call(
        &h.memories_sock(),
        Message::MemorySearch(MemorySearch {
            query: " ?! ".into(),
            limit: 10,
        }),
    ));
    assert_eq!(code, ErrorCode::BadMessage);
    assert!(detail.contains("no words"), "{detail}");
}

#[test]
fn loopd_cannot_forget_and_the_owner_cannot_hand_over_turns() {
    let h = Home::new();
    let m = memoryd(&h, "");
    let (code, detail) = code_of(call(
        &h.memory_sock(),
        Message::MemoryForget(MemoryForget {
            session: session("s1"),
        }),
    ));
    assert_eq!(code, ErrorCode::Forbidden);
    assert_eq!(detail, "memory_forget is not accepted on memory.sock");
    let (code, _) = code_of(call(
        &h.memories_sock(),
        Message::TurnRecord(record("s1", 1, "hi", "ok")),
    ));
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(
        m.log_text()
            .contains("see docs/runbook.md#socket-forbidden")
    );
    unchanged(&h);
}

#[test]
fn a_malformed_frame_is_answered_and_changes_nothing() {
    let h = Home::new();
    let _m = memoryd(&h, "");
    let body = br#"{"v":1,"id":3,"final":true,"msg":{"kind":"turn_record","session":"../x","turn":1,"messages":[]}}"#;
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    let got = raw(&h.memory_sock(), &frame);
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("bad_message"), "{text}");
    unchanged(&h);
}

#[test]
fn a_damaged_outbox_record_is_set_aside_and_the_rest_are_filed() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    fs::create_dir_all(h.outbox()).unwrap();
    fs::set_permissions(h.home.join("memory"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(h.outbox(), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(h.outbox().join("s9.00000000000000000001.json"), "{torn").unwrap();
    let _b = brokerd(&h, &bin);
    let m = memoryd(&h, "");
    hand_over(&h, &record("s1", 1, "fine", "ok"));
    wait_drained(&h);
    assert!(h.outbox().join("s9.00000000000000000001.damaged").exists());
    assert!(
        m.log_text()
            .contains("see docs/runbook.md#memoryd-outbox-damaged")
    );
    assert_eq!(recent(&h, None).len(), 1);
}
