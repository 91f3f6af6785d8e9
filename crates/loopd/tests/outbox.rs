//! The memory hand-off: finished turns wait durably in the outbox and reach memoryd once each,
//! in order, whenever it is there; its absence never blocks or fails a turn.

mod support;

use bxcore::{ChatMessage, Message, TurnRecord};
use loopd::outbox::Outbox;
use support::daemon::{Layout, Loopd, config};
use support::infer::ScriptedInfer;
use support::memory::FakeMemory;
use support::{last_msg, sid, turn, wait_until};

fn record(session: &str, turn: u64) -> TurnRecord {
    TurnRecord {
        session: sid(session),
        turn,
        messages: vec![ChatMessage::User {
            text: format!("turn {turn}"),
        }],
    }
}

#[test]
fn records_are_numbered_in_order_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let o = Outbox::open(&dir.path().join("outbox"), 100).unwrap();
    o.put(&record("a", 1)).unwrap();
    o.put(&record("b", 1)).unwrap();
    o.put(&record("a", 2)).unwrap();
    drop(o);
    let o = Outbox::open(&dir.path().join("outbox"), 100).unwrap();
    o.put(&record("b", 2)).unwrap();
    let got: Vec<(String, u64)> = o
        .pending()
        .unwrap()
        .into_iter()
        .map(|e| (e.record.session.to_string(), e.record.turn))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".to_string(), 1),
            ("b".to_string(), 1),
            ("a".to_string(), 2),
            ("b".to_string(), 2)
        ]
    );
}

#[test]
fn a_record_of_the_older_layout_is_carried_over_in_order_and_a_damaged_one_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox");
    std::fs::create_dir_all(&path).unwrap();
    std::fs::write(path.join(".00000000000000000001.tmp"), "{half").unwrap();
    std::fs::write(path.join("00000000000000000002.json"), "{not a record").unwrap();
    for (n, r) in [(4, record("b", 1)), (3, record("a", 1))] {
        let body = serde_json::to_vec(&r).unwrap();
        std::fs::write(path.join(format!("{n:020}.json")), body).unwrap();
    }
    let o = Outbox::open(&path, 100).unwrap();
    assert!(!path.join(".00000000000000000001.tmp").exists());
    assert!(path.join("00000000000000000002.damaged").exists());
    o.put(&record("a", 2)).unwrap();
    let got: Vec<TurnRecord> = o.pending().unwrap().into_iter().map(|e| e.record).collect();
    assert_eq!(got, vec![record("a", 1), record("b", 1), record("a", 2)]);
    // Nothing of the older layout is left.
    let left: Vec<String> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() == "00000000000000000003.json".len())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_full_outbox_refuses_the_turn_with_loopd_s_own_anchor() {
    use bxcore::runbook::Anchored;
    let dir = tempfile::tempdir().unwrap();
    let o = Outbox::open(&dir.path().join("outbox"), 1).unwrap();
    o.put(&record("a", 1)).unwrap();
    let e = o.put(&record("a", 2)).unwrap_err();
    assert_eq!(e.anchor(), "loopd-outbox-full");
    assert_eq!(o.pending().unwrap().len(), 1);
}

#[test]
fn a_turn_the_outbox_cannot_write_is_refused_with_loopd_s_own_anchor() {
    use bxcore::runbook::Anchored;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox");
    let o = Outbox::open(&path, 100).unwrap();
    // The directory gone, and a file where it was: no write can land (root or not).
    std::fs::remove_dir_all(&path).unwrap();
    std::fs::write(&path, "not a directory").unwrap();
    let e = o.put(&record("a", 1)).unwrap_err();
    assert_eq!(e.anchor(), "loopd-outbox-unwritable", "{e}");
    assert!(e.to_string().contains("outbox"), "{e}");
}

#[test]
fn a_record_is_deleted_only_when_memoryd_files_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = Outbox::open(&dir.path().join("outbox"), 100).unwrap();
    o.put(&record("a", 1)).unwrap();
    let absent = dir.path().join("memory.sock");
    let e = Outbox::send(&absent, support::WAIT, &record("a", 1)).unwrap_err();
    assert!(e.contains("cannot connect"), "{e}");
    assert_eq!(o.pending().unwrap().len(), 1);
    let memory = FakeMemory::start(&absent);
    Outbox::send(&memory.path, support::WAIT, &record("a", 1)).unwrap();
    assert_eq!(memory.filed(), vec![record("a", 1)]);
}

#[test]
fn memoryd_absent_then_present_gets_every_turn_once_in_order() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    let extra = format!(
        "[memory]\nsocket = {:?}\n",
        layout.memory.display().to_string()
    );
    let d = Loopd::start(home.path(), &config(home.path(), &extra));
    // memoryd is not there: turns still finish, and wait in the outbox.
    for (i, (session, resume)) in [("m1", false), ("m2", false), ("m1", true), ("m1", true)]
        .into_iter()
        .enumerate()
    {
        let frames = turn(&d.socket, i as u64, session, resume, &format!("text {i}"));
        assert!(
            matches!(last_msg(&frames), Message::TurnDone(_)),
            "{:?}",
            last_msg(&frames)
        );
    }
    // Each session's worker keeps its own outbox, in its own directory.
    let waiting = || {
        ["m1", "m2"]
            .iter()
            .map(|s| {
                let outbox = home.path().join(format!("loop/workers/{s}/outbox"));
                std::fs::read_dir(&outbox)
                    .unwrap()
                    .filter(|e| {
                        e.as_ref()
                            .unwrap()
                            .file_name()
                            .to_string_lossy()
                            .ends_with(".json")
                    })
                    .count()
            })
            .sum::<usize>()
    };
    assert_eq!(waiting(), 4);
    wait_until("the outage line", || {
        d.log_text()
            .contains("see docs/runbook.md#memory-unavailable")
    });
    // memoryd comes up: everything is delivered, once each, in order, and the outbox drains.
    let memory = FakeMemory::start(&layout.memory);
    wait_until("the outbox to drain", || waiting() == 0);
    let filed: Vec<(String, u64, String)> = memory
        .filed()
        .into_iter()
        .map(|r| {
            let first = match &r.messages[0] {
                ChatMessage::User { text } => text.clone(),
                other => panic!("the first message is the user's: {other:?}"),
            };
            (r.session.to_string(), r.turn, first)
        })
        .collect();
    // In order within each session; the two sessions' workers send side by side.
    let of = |s: &str| -> Vec<(String, u64, String)> {
        filed.iter().filter(|f| f.0 == s).cloned().collect()
    };
    assert_eq!(filed.len(), 4, "{filed:?}");
    assert_eq!(
        of("m1"),
        vec![
            ("m1".to_string(), 1, "text 0".to_string()),
            ("m1".to_string(), 2, "text 2".to_string()),
            ("m1".to_string(), 3, "text 3".to_string()),
        ]
    );
    assert_eq!(of("m2"), vec![("m2".to_string(), 1, "text 1".to_string())]);
    // The next turn goes straight through.
    let frames = turn(&d.socket, 9, "m2", true, "later");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    wait_until("the next record", || memory.filed().len() == 5);
    assert_eq!(memory.filed()[4].turn, 2);
    assert_eq!(
        d.log_text()
            .matches("see docs/runbook.md#memory-unavailable")
            .count(),
        2,
        "one line per outage in each session's worker that had a turn to send"
    );
}

#[test]
fn a_damaged_record_in_the_outbox_is_set_aside_with_its_pointer_and_the_next_one_delivered() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    let outbox = home.path().join("loop/outbox");
    std::fs::create_dir_all(&outbox).unwrap();
    // A torn record first, a whole one after it: the first is never guessed at, the second
    // goes on.
    std::fs::write(
        outbox.join("00000000000000000001.d1.00000000000000000001.json"),
        "{\"session\":\"d1\",\"tu",
    )
    .unwrap();
    Outbox::open(&outbox, 100)
        .unwrap()
        .put(&record("d2", 1))
        .unwrap();
    let memory = FakeMemory::start(&layout.memory);
    let extra = format!(
        "[memory]\nsocket = {:?}\n",
        layout.memory.display().to_string()
    );
    let d = Loopd::start(home.path(), &config(home.path(), &extra));
    wait_until("the whole record to be filed", || {
        !memory.filed().is_empty()
    });
    assert_eq!(memory.filed(), vec![record("d2", 1)]);
    let log = d.log_text();
    assert!(
        log.contains("see docs/runbook.md#loopd-outbox-damaged"),
        "{log}"
    );
    assert!(
        outbox
            .join("00000000000000000001.d1.00000000000000000001.damaged")
            .exists()
    );
}

#[test]
fn a_turn_after_a_call_left_unanswered_reaches_memory_from_the_owners_text() {
    use loopd::session::{Record, Session};
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    // What a worker ended mid-call leaves: a call asked for, and no result.
    let dir = home.path().join("loop/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let mut s = Session::create(&dir, &sid("cut"), "main", "you are the box").unwrap();
    s.append(&Record::User {
        turn: 1,
        text: "note the meeting".into(),
        key: None,
    })
    .unwrap();
    s.append(&Record::Assistant {
        text: String::new(),
        tool_calls: vec![bxcore::ToolCall {
            call: bxcore::CallId(1),
            tool: "workspace_write".into(),
            args: serde_json::json!({"path": "/notes.txt", "content": "x"}),
        }],
    })
    .unwrap();
    s.sync().unwrap();
    drop(s);
    let memory = FakeMemory::start(&layout.memory);
    let extra = format!(
        "[memory]\nsocket = {:?}\nrecall_tokens = 0\n",
        layout.memory.display().to_string()
    );
    let d = Loopd::start(home.path(), &config(home.path(), &extra));
    let frames = turn(&d.socket, 1, "cut", true, "what time is it?");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{frames:?}"
    );
    wait_until("the turn in memory", || !memory.filed().is_empty());
    let filed = memory.filed();
    assert_eq!(filed[0].turn, 2);
    assert_eq!(
        filed[0].messages[0],
        ChatMessage::User {
            text: "what time is it?".into()
        },
        "the interrupted call's answer belongs to the turn before: {filed:?}"
    );
}
