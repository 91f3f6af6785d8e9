//! Filing through the real daemons: memoryd takes turns on its socket and asks the real brokerd
//! for each session's state (brokerd's own state files, as its ledger writes them), then files
//! the turn by the default routes into the embedded store.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bxcore::{DataClass, MemoryRoute, Message};
use bxtest::OutputBounded;
use support::*;

#[test]
fn turns_from_private_untrusted_and_secret_sessions_land_in_main_quarantine_and_local() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let _m = memoryd(&h, "");
    h.set_state("priv", "private", false);
    h.set_state("untr", "private", true);
    h.set_state("sec", "secret", false);
    h.set_state("both", "secret", true);
    // "fresh" has no state file: brokerd answers private and trusted.
    for s in ["priv", "untr", "sec", "both", "fresh"] {
        hand_over(&h, &record(s, 1, &format!("hello from {s}"), "noted"));
    }
    wait_drained(&h);
    let routed = |route| -> BTreeSet<String> {
        recent(&h, Some(route))
            .into_iter()
            .map(|m| m.session.to_string())
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(routed(MemoryRoute::Main), set(&["priv", "fresh"]));
    assert_eq!(routed(MemoryRoute::Quarantine), set(&["untr"]));
    assert_eq!(routed(MemoryRoute::Local), set(&["sec", "both"]));
    let all = recent(&h, None);
    let both = all.iter().find(|m| m.session.as_str() == "both").unwrap();
    assert_eq!((both.class, both.untrusted), (DataClass::Secret, true));
    assert_eq!(both.text, "user: hello from both\nassistant: noted");
}

#[test]
fn an_unanswered_state_question_leaves_the_turn_undecided_until_brokerd_answers() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let m = memoryd(&h, "[limits]\nbackoff_ms = 50\nmax_backoff_ms = 200\n");
    h.set_state("s1", "private", true);
    hand_over(&h, &record("s1", 1, "read that page", "done"));
    wait_until("memoryd to log that brokerd did not answer", || {
        m.log_text()
            .contains("see docs/runbook.md#broker-state-unavailable")
    });
    assert_eq!(h.outbox_depth(), 1, "the turn waits, undecided");
    assert!(recent(&h, None).is_empty(), "nothing was filed by a guess");
    let _b = brokerd(&h, &bin);
    wait_drained(&h);
    let filed = recent(&h, None);
    assert_eq!(filed.len(), 1);
    assert_eq!(filed[0].route, MemoryRoute::Quarantine);
    wait_until("memoryd to say it files again", || {
        m.log_text().contains("memoryd: files turns again")
    });
    let outage_lines = m.log_text().matches("broker-state-unavailable").count();
    assert_eq!(outage_lines, 1, "one line per outage: {}", m.log_text());
}

#[test]
fn a_damaged_state_file_files_nothing_and_the_turn_waits() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let m = memoryd(&h, "[limits]\nbackoff_ms = 50\nmax_backoff_ms = 200\n");
    let dir = h.home.join("broker/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("s1.json"), "{not json").unwrap();
    hand_over(&h, &record("s1", 1, "hello", "hi"));
    wait_until("memoryd to log the unanswered question", || {
        m.log_text()
            .contains("see docs/runbook.md#broker-state-unavailable")
    });
    assert_eq!(h.outbox_depth(), 1);
    assert!(recent(&h, None).is_empty());
    h.set_state("s1", "secret", false);
    wait_drained(&h);
    assert_eq!(recent(&h, None)[0].route, MemoryRoute::Local);
}

#[test]
fn a_turn_handed_over_twice_is_filed_once() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let _m = memoryd(&h, "");
    let r = record("s1", 1, "hello", "hi");
    hand_over(&h, &r);
    wait_drained(&h);
    hand_over(&h, &r);
    wait_drained(&h);
    assert_eq!(recent(&h, None).len(), 1);
}

/// loopd's side of the hand-off, as its outbox does it: send until `turn_filed`.
fn deliver(h: &Home, r: &bxcore::TurnRecord) {
    wait_until("a turn_filed for the turn", || {
        matches!(
            call(&h.memory_sock(), Message::TurnRecord(r.clone())),
            Ok(Message::TurnFiled(_))
        )
    });
}

#[test]
fn killing_memoryd_mid_batch_loses_no_turn_and_duplicates_none() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    h.set_state("a", "private", false);
    h.set_state("b", "private", true);
    let mut m = memoryd(&h, "[limits]\nbackoff_ms = 20\nmax_backoff_ms = 100\n");
    const TURNS: u64 = 40;
    let sent = Arc::new(AtomicBool::new(false));
    let sender = {
        let sent = Arc::clone(&sent);
        let home = h.home.clone();
        std::thread::spawn(move || {
            let h = Home {
                dir: tempfile::TempDir::new().unwrap(),
                home,
            };
            for n in 1..=TURNS {
                for s in ["a", "b"] {
                    deliver(&h, &record(s, n, &format!("turn {n} of {s}"), "ok"));
                }
            }
            sent.store(true, Ordering::SeqCst);
        })
    };
    // Kill memoryd twice while turns arrive and the filer files them, and start it again.
    for _ in 0..2 {
        wait_until("some turns to be filed", || {
            !recent(&h, None).is_empty() && h.outbox_depth() > 0 || sent.load(Ordering::SeqCst)
        });
        m.kill();
        m = memoryd(&h, "[limits]\nbackoff_ms = 20\nmax_backoff_ms = 100\n");
    }
    bxtest::join(sender, "the thread handing over turns");
    wait_drained(&h);
    let filed = recent(&h, None);
    let keys: BTreeSet<(String, u64)> = filed
        .iter()
        .map(|m| (m.session.to_string(), m.turn))
        .collect();
    assert_eq!(keys.len(), filed.len(), "no turn filed twice");
    assert_eq!(filed.len() as u64, 2 * TURNS, "no turn lost");
    for m in &filed {
        let want = if m.session.as_str() == "a" {
            MemoryRoute::Main
        } else {
            MemoryRoute::Quarantine
        };
        assert_eq!(m.route, want, "{m:?}");
    }
}

#[test]
fn forget_deletes_the_sessions_turns_and_those_still_waiting() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let mut b = brokerd(&h, &bin);
    let _m = memoryd(&h, "[limits]\nbackoff_ms = 50\nmax_backoff_ms = 200\n");
    hand_over(&h, &record("s1", 1, "first", "ok"));
    hand_over(&h, &record("s2", 1, "other", "ok"));
    wait_drained(&h);
    b.kill();
    hand_over(&h, &record("s1", 2, "second, still waiting", "ok"));
    assert_eq!(h.outbox_depth(), 1);
    let got = call(
        &h.memories_sock(),
        Message::MemoryForget(bxcore::MemoryForget {
            session: session("s1"),
        }),
    );
    match got {
        Ok(Message::MemoryForgotten(f)) => {
            assert_eq!((f.turns, f.queued), (2, false));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.outbox_depth(), 0);
    let left: Vec<String> = recent(&h, None)
        .into_iter()
        .map(|m| m.session.to_string())
        .collect();
    assert_eq!(left, vec!["s2".to_string()]);
    let db = std::fs::read(h.store_file()).unwrap();
    assert!(
        !db.windows(5).any(|w| w == b"first"),
        "the forgotten text is overwritten in the file, not just unlinked"
    );
}

#[test]
fn a_forgotten_sessions_later_turn_is_let_go_and_filed_nowhere_even_after_a_restart() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let config = "[limits]\nbackoff_ms = 50\nmax_backoff_ms = 200\n";
    let mut m = memoryd(&h, config);
    hand_over(&h, &record("s1", 1, "first", "ok"));
    wait_drained(&h);
    match call(
        &h.memories_sock(),
        Message::MemoryForget(bxcore::MemoryForget {
            session: session("s1"),
        }),
    ) {
        Ok(Message::MemoryForgotten(f)) => assert_eq!(f.turns, 1),
        other => panic!("{other:?}"),
    }
    // A turn that waited in loopd's own outbox meanwhile comes now: it is answered, so loopd
    // lets go of it, and it is filed nowhere.
    hand_over(&h, &record("s1", 2, "waited in loopd's outbox", "ok"));
    assert_eq!(h.outbox_depth(), 0);
    m.wait_log("turn 2 of session s1 filed nowhere: the owner forgot the session");
    hand_over(&h, &record("s2", 1, "another session", "ok"));
    wait_drained(&h);
    let sessions = |h: &Home| -> Vec<String> {
        recent(h, None)
            .into_iter()
            .map(|m| m.session.to_string())
            .collect()
    };
    assert_eq!(sessions(&h), vec!["s2".to_string()]);
    // The forget outlives memoryd.
    m.kill();
    let _m = memoryd(&h, config);
    hand_over(&h, &record("s1", 3, "after the restart", "ok"));
    assert_eq!(h.outbox_depth(), 0);
    assert_eq!(sessions(&h), vec!["s2".to_string()]);
    let db = std::fs::read(h.store_file()).unwrap();
    assert!(!db.windows(7).any(|w| w == b"waited "), "never written");
}

#[test]
fn a_damaged_list_of_forgotten_sessions_stops_memoryd_with_its_pointer() {
    let h = Home::new();
    let dir = h.home.join("memory");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("forgotten.json"), b"{\"v\":1,\"sessions\":[").unwrap();
    let config = h.memoryd_config("");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memoryd"))
        .args(["serve", "--config"])
        .arg(&config)
        .output_bounded()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("forgotten.json"), "{err}");
    assert!(
        err.contains("see docs/runbook.md#memoryd-forgotten-unreadable"),
        "{err}"
    );
}

#[test]
fn a_turn_over_the_bound_is_kept_cut_with_a_note_and_its_tool_traffic_not_at_all() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let _m = memoryd(&h, "[limits]\nmax_turn_bytes = 4096\n");
    let mut r = record("big", 1, &"q".repeat(900 * 1024), "a short answer");
    r.messages.insert(
        1,
        bxcore::ChatMessage::Tool {
            call: bxcore::CallId(1),
            text: "tool output".repeat(1000),
        },
    );
    hand_over(&h, &r);
    wait_drained(&h);
    let filed = recent(&h, None);
    assert_eq!(filed.len(), 1);
    let text = &filed[0].text;
    assert!(text.len() <= 4096 + 64, "{} bytes", text.len());
    assert!(text.contains("[cut by memoryd: "), "{text}");
    assert!(text.ends_with("assistant: a short answer"), "{text}");
    assert!(!text.contains("tool output"), "{text}");
}

#[test]
fn a_store_at_its_bound_keeps_the_turn_waiting_and_files_it_once_there_is_room() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let m = memoryd(
        &h,
        "[limits]\nbackoff_ms = 50\nmax_backoff_ms = 200\nmax_turn_bytes = 65536\n\
         max_store_bytes = 1048576\nmax_session_bytes = 1048576\n",
    );
    // Words that do not repeat, so the full-text index grows with the text.
    let words = |seed: u64| -> String {
        (0..6000)
            .map(|i| format!("w{seed}x{i} "))
            .collect::<String>()
    };
    let mut turn = 0;
    while h.outbox_depth() == 0 || !m.log_text().contains("memory-store-full") {
        turn += 1;
        assert!(turn < 200, "the store never filled");
        hand_over(&h, &record("fill", turn, &words(turn), "ok"));
        if h.outbox_depth() == 0 {
            continue;
        }
        wait_until("the turn to file or the store to say it is full", || {
            h.outbox_depth() == 0 || m.log_text().contains("memory-store-full")
        });
    }
    let line = m.wait_log("see docs/runbook.md#memory-store-full");
    assert!(line.contains("max_store_bytes"), "{line}");
    hand_over(
        &h,
        &record("later", 1, "a turn after the store filled", "ok"),
    );
    assert!(h.outbox_depth() >= 1, "it waits");
    // The owner makes room: the waiting turns are filed, none lost.
    match call(
        &h.memories_sock(),
        Message::MemoryForget(bxcore::MemoryForget {
            session: session("fill"),
        }),
    ) {
        Ok(Message::MemoryForgotten(_)) => {}
        other => panic!("{other:?}"),
    }
    wait_drained(&h);
    let left: Vec<String> = recent(&h, None)
        .into_iter()
        .map(|m| m.session.to_string())
        .collect();
    assert_eq!(left, vec!["later".to_string()]);
}

#[test]
fn a_session_at_its_bound_keeps_what_it_holds_and_its_later_turns_are_let_go() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let m = memoryd(
        &h,
        "[limits]\nmax_turn_bytes = 16384\nmax_session_bytes = 65536\n",
    );
    // The owner's own turn of the session, filed first.
    hand_over(
        &h,
        &record("big", 1, "the owner's first words mark1word", "ok"),
    );
    // Then twelve turns of about 10 KB each: 120 KB into a session bound to 64 KiB.
    let text = |turn: u64| format!("turn {turn} mark{turn}word {}", "x".repeat(10_000));
    for turn in 2..=13 {
        hand_over(&h, &record("big", turn, &text(turn), "ok"));
    }
    hand_over(&h, &record("other", 1, "a turn of another session", "kept"));
    wait_drained(&h);
    let all = recent(&h, None);
    let big: Vec<u64> = all
        .iter()
        .filter(|t| t.session.as_str() == "big")
        .map(|t| t.turn)
        .collect();
    let held: usize = all
        .iter()
        .filter(|t| t.session.as_str() == "big")
        .map(|t| t.text.len())
        .sum();
    assert!(held <= 65536, "{held} bytes held");
    assert!(big.contains(&1), "no turn pushes an older one out: {big:?}");
    assert!(
        !big.contains(&13),
        "the turn past the bound is let go: {big:?}"
    );
    assert!(big.len() >= 6, "as many as fit are kept: {big:?}");
    assert!(
        all.iter().any(|t| t.session.as_str() == "other"),
        "another session is filed as ever"
    );
    let line = m.wait_log("see docs/runbook.md#memory-session-full");
    assert!(
        line.contains("memoryd: session big") && line.contains("max_session_bytes = 65536"),
        "{line}"
    );
    assert_eq!(
        m.log_text().matches("memory-session-full").count(),
        1,
        "one line for the session, not one per turn"
    );
    let found = |word: &str| match recall(&h, "asker", word, 4096) {
        Ok(Message::Memories(m)) => m.memories.len(),
        other => panic!("{other:?}"),
    };
    assert_eq!(found("mark1word"), 1);
    assert_eq!(found("mark13word"), 0);
}

#[test]
fn turns_older_than_keep_days_are_pruned_when_memoryd_starts_and_newer_ones_kept() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let mut m = memoryd(&h, "");
    hand_over(&h, &record("old", 1, "filed three days ago", "ok"));
    hand_over(&h, &record("new", 1, "filed just now", "ok"));
    wait_drained(&h);
    m.kill();
    // Three days pass for the first turn.
    let db = rusqlite::Connection::open(h.store_file()).unwrap();
    db.execute(
        "UPDATE turns SET filed = filed - ?1 WHERE session = 'old'",
        [3 * 24 * 3600 * 1000_i64],
    )
    .unwrap();
    drop(db);
    let m = memoryd(&h, "[limits]\nkeep_days = 2\n");
    let line = m.wait_log("see docs/runbook.md#memory-pruned");
    assert!(
        line.contains("memoryd: pruned 1 turns") && line.contains("keep_days = 2"),
        "{line}"
    );
    assert!(!line.contains("memoryd: memoryd:"), "{line}");
    let left: Vec<String> = recent(&h, None)
        .into_iter()
        .map(|t| t.session.to_string())
        .collect();
    assert_eq!(left, vec!["new".to_string()]);
}

#[test]
fn a_store_of_the_first_schema_has_its_sessions_counted_when_opened_and_their_bounds_hold() {
    let Some(bin) = brokerd_bin() else { return };
    let h = Home::new();
    let _b = brokerd(&h, &bin);
    let text = |turn: u64| format!("turn {turn} {}", "y".repeat(15_000));
    let mut m = memoryd(&h, "[limits]\nmax_turn_bytes = 16384\n");
    for turn in 1..=4 {
        hand_over(&h, &record("old", turn, &text(turn), "ok"));
    }
    wait_drained(&h);
    m.kill();
    // The store as the first schema wrote it: no byte counts.
    let db = rusqlite::Connection::open(h.store_file()).unwrap();
    db.execute_batch(
        "DROP TRIGGER session_bytes_added; DROP TRIGGER session_bytes_deleted;
         DROP TABLE session_bytes; PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(db);
    // About 60 KB held: a fifth turn passes a bound of 64 KiB, and is let go.
    let m = memoryd(
        &h,
        "[limits]\nmax_turn_bytes = 16384\nmax_session_bytes = 65536\n",
    );
    hand_over(&h, &record("old", 5, &text(5), "ok"));
    m.wait_log("see docs/runbook.md#memory-session-full");
    wait_drained(&h);
    let turns: Vec<u64> = recent(&h, None)
        .into_iter()
        .filter(|t| t.session.as_str() == "old")
        .map(|t| t.turn)
        .collect();
    assert_eq!(turns.len(), 4, "{turns:?}");
    assert!(!turns.contains(&5));
    let db = rusqlite::Connection::open(h.store_file()).unwrap();
    let version: i64 = db
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 2);
}
