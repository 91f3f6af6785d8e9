//! Session logs: create with O_EXCL, open, a torn tail cut off, damage elsewhere refused, call
//! ids that go on from the log, races from two connections.

mod support;

use std::cell::RefCell;
use std::sync::Arc;

use bxcore::{CallId, ChatMessage, Outcome, ToolCall, Usage};
use loopd::session::{INTERRUPTED, Record, Session, SessionError};
use serde_json::json;
use support::sid;

fn quiet(_: &str) {}

fn new_session(dir: &std::path::Path, id: &str) -> Session {
    Session::create(dir, &sid(id), "main", "you are the box").unwrap()
}

fn tool_turn(s: &mut Session, turn: u64) {
    let first = s.next_call();
    s.append(&Record::User {
        turn,
        text: "hi".into(),
        key: None,
    })
    .unwrap();
    s.append(&Record::Assistant {
        text: String::new(),
        tool_calls: vec![
            ToolCall {
                call: first,
                tool: "time_now".into(),
                args: json!({}),
            },
            ToolCall {
                call: CallId(first.0 + 1),
                tool: "time_now".into(),
                args: json!({}),
            },
        ],
    })
    .unwrap();
    for c in [first.0, first.0 + 1] {
        s.append(&Record::Tool {
            call: CallId(c),
            tool: "time_now".into(),
            outcome: Outcome::Result,
            text: "now".into(),
        })
        .unwrap();
    }
    s.append(&Record::TurnEnd {
        turn,
        usage: Usage::default(),
        at: bxcore::Timestamp::now(),
        error: None,
    })
    .unwrap();
    s.sync().unwrap();
}

#[test]
fn a_created_session_opens_with_its_slot_baseline_and_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = new_session(dir.path(), "s1");
    tool_turn(&mut s, 1);
    drop(s);
    let s = Session::open(dir.path(), &sid("s1"), &quiet).unwrap();
    assert_eq!(s.slot(), "main");
    assert_eq!(s.turns(), 1);
    assert_eq!(s.records(), 6);
    assert_eq!(s.next_call(), CallId(3));
    assert_eq!(
        s.messages()[0],
        ChatMessage::System {
            text: "you are the box".into()
        }
    );
    assert_eq!(s.messages().len(), 5);
    assert_eq!(
        s.bytes(),
        std::fs::metadata(dir.path().join("s1.jsonl"))
            .unwrap()
            .len()
    );
}

#[test]
fn create_refuses_an_existing_log_and_leaves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = new_session(dir.path(), "s1");
    tool_turn(&mut s, 1);
    let before = std::fs::read(dir.path().join("s1.jsonl")).unwrap();
    let e = Session::create(dir.path(), &sid("s1"), "other", "x").unwrap_err();
    assert!(matches!(e, SessionError::Exists(ref id) if id.as_str() == "s1"));
    assert_eq!(std::fs::read(dir.path().join("s1.jsonl")).unwrap(), before);
}

#[test]
fn open_refuses_a_session_with_no_log() {
    let dir = tempfile::tempdir().unwrap();
    let e = Session::open(dir.path(), &sid("nope"), &quiet).unwrap_err();
    assert!(matches!(e, SessionError::NotFound(_)));
    assert!(!dir.path().join("nope.jsonl").exists());
}

#[test]
fn a_torn_last_record_is_cut_off_and_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = new_session(dir.path(), "s1");
    tool_turn(&mut s, 1);
    drop(s);
    let path = dir.path().join("s1.jsonl");
    let whole = std::fs::read(&path).unwrap();
    let mut torn = whole.clone();
    torn.extend_from_slice(br#"{"type":"user","turn":2,"text":"half"#);
    std::fs::write(&path, &torn).unwrap();
    let lines = RefCell::new(Vec::new());
    let s = Session::open(dir.path(), &sid("s1"), &|l| {
        lines.borrow_mut().push(l.to_string())
    })
    .unwrap();
    assert_eq!(lines.borrow().len(), 1);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        whole,
        "cut back to the last whole line"
    );
    assert_eq!(s.records(), 6);
    drop(s);
    // Opening again finds nothing to cut.
    let lines = RefCell::new(Vec::new());
    Session::open(dir.path(), &sid("s1"), &|l| {
        lines.borrow_mut().push(l.to_string())
    })
    .unwrap();
    assert!(lines.borrow().is_empty());
}

#[test]
fn a_whole_last_record_that_parses_is_not_a_torn_tail_but_a_damaged_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    new_session(dir.path(), "s1");
    let path = dir.path().join("s1.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"type\":\"nonsense\"}\n");
    std::fs::write(&path, &text).unwrap();
    let e = Session::open(dir.path(), &sid("s1"), &quiet).unwrap_err();
    assert!(matches!(e, SessionError::Torn { line: 2, .. }), "{e}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "nothing changed"
    );
}

#[test]
fn damage_in_the_middle_is_refused_with_its_path_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = new_session(dir.path(), "s1");
    tool_turn(&mut s, 1);
    drop(s);
    let path = dir.path().join("s1.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines[3] = lines[3].replace("tool", "t\u{0}ol");
    let text = lines.join("\n") + "\n";
    std::fs::write(&path, &text).unwrap();
    let e = Session::open(dir.path(), &sid("s1"), &quiet).unwrap_err();
    let shown = loopd::turn::TurnError::Session(e).line();
    assert!(
        shown.starts_with(&format!("{}:4: ", path.display())),
        "{shown}"
    );
    assert!(shown.ends_with("; see docs/runbook.md#session-log-damaged"));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "nothing changed"
    );
}

#[test]
fn a_log_that_does_not_start_with_its_start_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // An empty log is a session never begun (loopd's monitor makes a new session's log before
    // its worker writes the start record): there is no such session, and it can be begun.
    std::fs::write(dir.path().join("empty.jsonl"), "").unwrap();
    let e = Session::open(dir.path(), &sid("empty"), &quiet).unwrap_err();
    assert!(matches!(e, SessionError::NotFound(_)), "{e}");
    new_session(dir.path(), "empty");
    for (name, text) in [
        (
            "nostart",
            "{\"type\":\"user\",\"turn\":1,\"text\":\"x\"}\n".to_string(),
        ),
        (
            "other",
            "{\"type\":\"start\",\"session\":\"someone\",\"slot\":\"main\",\"system\":\"\",\"created\":1}\n"
                .to_string(),
        ),
    ] {
        std::fs::write(dir.path().join(format!("{name}.jsonl")), &text).unwrap();
        let e = Session::open(dir.path(), &sid(name), &quiet).unwrap_err();
        assert!(matches!(e, SessionError::Torn { line: 1, .. }), "{name}: {e}");
    }
    // A second start record further down.
    let mut s = new_session(dir.path(), "twice");
    s.append(&Record::Start {
        session: sid("twice"),
        slot: "main".into(),
        system: String::new(),
        created: bxcore::Timestamp(1),
    })
    .unwrap();
    drop(s);
    let e = Session::open(dir.path(), &sid("twice"), &quiet).unwrap_err();
    assert!(matches!(e, SessionError::Torn { line: 2, .. }), "{e}");
}

#[test]
fn call_ids_go_on_from_the_largest_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = new_session(dir.path(), "s1");
    assert_eq!(s.next_call(), CallId(1));
    tool_turn(&mut s, 1);
    tool_turn(&mut s, 2);
    assert_eq!(s.next_call(), CallId(5));
    drop(s);
    let s = Session::open(dir.path(), &sid("s1"), &quiet).unwrap();
    assert_eq!(s.next_call(), CallId(5));
    assert_eq!(s.turns(), 2);
}

#[test]
fn calls_a_crash_left_unanswered_are_shown_as_interrupted_and_their_ids_stay_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = new_session(dir.path(), "s1");
    s.append(&Record::User {
        turn: 1,
        text: "hi".into(),
        key: None,
    })
    .unwrap();
    s.append(&Record::Assistant {
        text: String::new(),
        tool_calls: vec![ToolCall {
            call: CallId(9),
            tool: "workspace_read".into(),
            args: json!({}),
        }],
    })
    .unwrap();
    drop(s); // loopd stopped during the call
    let mut s = Session::open(dir.path(), &sid("s1"), &quiet).unwrap();
    assert_eq!(s.next_call(), CallId(10));
    assert_eq!(s.turns(), 1);
    s.append(&Record::User {
        turn: 2,
        text: "again".into(),
        key: None,
    })
    .unwrap();
    let m = s.messages();
    assert_eq!(
        m[m.len() - 2],
        ChatMessage::Tool {
            call: CallId(9),
            text: INTERRUPTED.into()
        }
    );
    assert_eq!(
        m[m.len() - 1],
        ChatMessage::User {
            text: "again".into()
        }
    );
}

#[test]
fn two_connections_racing_to_create_and_open_one_session_leave_one_whole_log() {
    use support::daemon::{Layout, Loopd, config};
    use support::infer::ScriptedInfer;
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    // A resume of the session that does not exist yet once held it busy while it failed, and a
    // create racing with it was refused as busy: under load both creates could fail.
    for round in 0..20 {
        let session = format!("race{round}");
        let barrier = Arc::new(bxtest::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let socket = d.socket.clone();
                let barrier = Arc::clone(&barrier);
                let session = session.clone();
                std::thread::spawn(move || {
                    barrier.wait("the four connections");
                    let frames = support::turn(&socket, i, &session, i % 2 == 1, "go");
                    support::last_msg(&frames).clone()
                })
            })
            .collect();
        let answers: Vec<bxcore::Message> = handles
            .into_iter()
            .map(|h| bxtest::join(h, "a racing connection's turn"))
            .collect();
        let created = answers
            .iter()
            .enumerate()
            .filter(|(i, m)| i % 2 == 0 && matches!(m, bxcore::Message::TurnDone(_)))
            .count();
        assert_eq!(created, 1, "round {round}: {answers:?}");
        for (i, m) in answers.iter().enumerate() {
            match m {
                bxcore::Message::TurnDone(_) => {}
                bxcore::Message::Error(e) => assert!(
                    matches!(
                        e.code,
                        bxcore::ErrorCode::SessionBusy
                            | bxcore::ErrorCode::SessionExists
                            | bxcore::ErrorCode::NoSuchSession
                    ),
                    "round {round}, connection {i}: {e}"
                ),
                other => panic!("{other:?}"),
            }
        }
        let s = Session::open(&home.path().join("loop/sessions"), &sid(&session), &|l| {
            panic!("{l}")
        })
        .unwrap();
        let done = answers
            .iter()
            .filter(|m| matches!(m, bxcore::Message::TurnDone(_)))
            .count() as u64;
        assert_eq!(s.turns(), done, "round {round}");
    }
}

#[test]
fn any_one_damaged_byte_is_refused_or_cut_or_read_as_written_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = new_session(dir.path(), "orig");
    tool_turn(&mut s, 1);
    drop(s);
    let good = std::fs::read(dir.path().join("orig.jsonl")).unwrap();
    let path = dir.path().join("x.jsonl");
    for i in 0..good.len() {
        for b in [b'\n', b'{', 0u8, 0xff, b'"'] {
            if good[i] == b {
                continue;
            }
            let mut bad = good.clone();
            bad[i] = b;
            // The session id in the start record is "orig": rename the log so only the damage
            // under test can be wrong.
            let bad = String::from_utf8_lossy(&bad).replace("\"orig\"", "\"x\"");
            std::fs::write(&path, bad.as_bytes()).unwrap();
            let cut = std::cell::Cell::new(false);
            match Session::open(dir.path(), &sid("x"), &|_| cut.set(true)) {
                Err(SessionError::Torn { .. }) => {
                    assert_eq!(
                        std::fs::read(&path).unwrap(),
                        bad.as_bytes(),
                        "byte {i}: a refused log is left as it was"
                    );
                }
                Err(other) => panic!("byte {i} = {b}: {other}"),
                Ok(opened) => {
                    // Opened: either the damage still parses as the same kinds of records (a
                    // changed letter inside a text), or only a torn tail was cut.
                    let now = std::fs::read(&path).unwrap();
                    if cut.get() {
                        assert!(bad.as_bytes().starts_with(&now), "byte {i}");
                        assert!(now.ends_with(b"\n"));
                    } else {
                        assert_eq!(now, bad.as_bytes(), "byte {i}");
                    }
                    assert!(opened.records() >= 1);
                }
            }
        }
    }
}
