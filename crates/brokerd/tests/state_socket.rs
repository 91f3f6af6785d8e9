//! state.sock, row by row: memoryd's question about a session's state, answered from the state
//! files the ledger writes, changing nothing; every error an error frame.

mod support;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use bxcore::SessionQuery as StateQuestion;
use bxcore::{DataClass, Envelope, ErrorCode, Message, SessionId, write_frame};
use serde_json::json;
use support::*;

fn ask(home: &Home, session: &str) -> Message {
    let q = Message::SessionState(StateQuestion {
        session: SessionId::new(session).unwrap(),
    });
    let r = request(&home.state_sock(), 9, q);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].id, 9);
    assert!(r[0].last);
    r[0].msg.clone()
}

fn reply(class: DataClass, untrusted: bool) -> Message {
    Message::SessionStateReply(bxcore::Label { class, untrusted })
}

/// A home with a private and a secret root, one untrusted each way.
fn home_with_roots() -> Home {
    let h = Home::new("");
    for d in ["priv", "privu", "sec", "secu"] {
        fs::write(h.dir(d).join("f.txt"), d).unwrap();
    }
    let root = |name: &str, class: &str, untrusted: bool| {
        format!(
            "[[workspace.roots]]\npath = {:?}\nclass = {class:?}\nuntrusted = {untrusted}\n",
            h.home.join(name).display().to_string()
        )
    };
    h.write_config(&format!(
        "{}{}{}{}",
        root("priv", "private", false),
        root("privu", "private", true),
        root("sec", "secret", false),
        root("secu", "secret", true)
    ));
    h
}

fn read_call(h: &Home, session: &str, path: &str) -> Message {
    let r = request(
        &h.broker_sock(),
        1,
        Message::ToolRequest(bxcore::ToolRequest {
            session: SessionId::new(session).unwrap(),
            call: bxcore::CallId(1),
            tool: "workspace_read".into(),
            args: json!({ "path": h.home.join(path).display().to_string() }),
        }),
    );
    r.last().unwrap().msg.clone()
}

#[test]
fn the_answer_is_the_stored_class_and_flag() {
    let h = home_with_roots();
    let _b = Brokerd::start(&h);
    for (session, dir, class, untrusted) in [
        ("a", "priv", DataClass::Private, false),
        ("b", "privu", DataClass::Private, true),
        ("c", "sec", DataClass::Secret, false),
        ("d", "secu", DataClass::Secret, true),
    ] {
        let m = read_call(&h, session, &format!("{dir}/f.txt"));
        assert!(
            matches!(
                m,
                Message::ToolResponse(bxcore::ToolResponse::Result { .. })
            ),
            "{m:?}"
        );
        assert_eq!(ask(&h, session), reply(class, untrusted), "{session}");
    }
}

#[test]
fn a_state_file_the_owner_wrote_is_answered_as_it_says() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    fs::write(
        h.state_file("hand"),
        r#"{"taint": "secret", "untrusted": true}"#,
    )
    .unwrap();
    assert_eq!(ask(&h, "hand"), reply(DataClass::Secret, true));
}

#[test]
fn a_session_brokerd_has_not_seen_is_private_and_trusted() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    assert_eq!(ask(&h, "never-seen"), reply(DataClass::Private, false));
    assert!(!h.state_file("never-seen").exists());
    assert_eq!(
        fs::read_dir(h.home.join("broker/sessions"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn asking_changes_nothing() {
    let h = home_with_roots();
    let b = Brokerd::start(&h);
    read_call(&h, "s", "sec/f.txt");
    let state = fs::read(h.state_file("s")).unwrap();
    let chain = fs::read(h.chain()).unwrap();
    let log = b.stderr();
    for _ in 0..3 {
        assert_eq!(ask(&h, "s"), reply(DataClass::Secret, false));
        ask(&h, "other");
    }
    assert_eq!(fs::read(h.state_file("s")).unwrap(), state);
    assert_eq!(fs::read(h.chain()).unwrap(), chain);
    assert!(!h.state_file("other").exists());
    assert_eq!(b.stderr(), log);
}

#[test]
fn a_damaged_state_is_an_error_never_an_answer() {
    let h = Home::new("");
    let b = Brokerd::start(&h);
    fs::write(h.state_file("bad"), "{not json").unwrap();
    fs::create_dir(h.state_file("dir")).unwrap();
    fs::write(
        h.state_file("pub"),
        r#"{"taint":"public","untrusted":false}"#,
    )
    .unwrap();
    fs::write(
        h.state_file("extra"),
        r#"{"taint":"private","untrusted":false,"x":1}"#,
    )
    .unwrap();
    for s in ["bad", "dir", "pub", "extra"] {
        match ask(&h, s) {
            Message::Error(e) => {
                assert_eq!(e.code, ErrorCode::Internal);
                assert!(
                    e.detail.starts_with(&h.state_file(s).display().to_string()),
                    "{e:?}"
                );
                assert!(
                    e.detail
                        .ends_with("see docs/runbook.md#broker-state-damaged"),
                    "{e:?}"
                );
                let line = format!("brokerd: {}", e.detail);
                let log = b.wait_log(&line);
                assert_eq!(log.matches(&line).count(), 1, "{log}");
            }
            other => panic!("{s}: {other:?}"),
        }
    }
}

#[test]
fn every_other_kind_is_forbidden_and_logged() {
    let h = Home::new("");
    let b = Brokerd::start(&h);
    let kinds = [
        Message::ToolsList {},
        Message::ApprovalsList {},
        Message::AuditVerify {},
        Message::SessionStateReply(bxcore::Label {
            class: DataClass::Private,
            untrusted: false,
        }),
        Message::ToolRequest(bxcore::ToolRequest {
            session: SessionId::new("s").unwrap(),
            call: bxcore::CallId(3),
            tool: "workspace_read".into(),
            args: json!({}),
        }),
    ];
    for k in kinds {
        let kind = k.kind();
        let r = request(&h.state_sock(), 4, k);
        match &r[0].msg {
            Message::Error(e) => {
                assert_eq!(r[0].id, 4);
                assert_eq!(e.code, ErrorCode::Forbidden);
                assert_eq!(e.detail, format!("{kind} is not accepted on state.sock"));
            }
            other => panic!("{other:?}"),
        }
        b.wait_log(&format!(
            "brokerd: refused the message kind {kind} on state.sock; see docs/runbook.md#socket-forbidden"
        ));
    }
}

#[test]
fn a_malformed_frame_is_answered_with_an_error() {
    let h = Home::new("");
    let b = Brokerd::start(&h);
    let log = b.stderr();
    let cases: [(&[u8], ErrorCode); 5] = [
        (b"not json", ErrorCode::BadMessage),
        (
            br#"{"v":1,"id":5,"final":true,"msg":{"kind":"session_state","session":"../etc"}}"#,
            ErrorCode::BadMessage,
        ),
        (
            br#"{"v":1,"id":5,"final":true,"msg":{"kind":"session_state","session":"s","x":1}}"#,
            ErrorCode::BadMessage,
        ),
        (
            br#"{"v":2,"id":5,"final":true,"msg":{"kind":"session_state","session":"s"}}"#,
            ErrorCode::BadVersion,
        ),
        (b"\xff\xfe", ErrorCode::BadFrame),
    ];
    for (body, code) in cases {
        let r = raw(&h.state_sock(), &frame(body));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].id, 0);
        match &r[0].msg {
            Message::Error(e) => assert_eq!(e.code, code, "{e:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(!h.home.join("etc.json").exists());
    assert_eq!(b.stderr(), log, "a malformed frame is answered, not logged");
}

#[test]
fn a_second_question_on_one_connection_is_not_answered() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    let mut s = UnixStream::connect(h.state_sock()).unwrap();
    let q = |id| {
        Envelope::new(
            id,
            true,
            Message::SessionState(StateQuestion {
                session: SessionId::new("s").unwrap(),
            }),
        )
    };
    write_frame(&mut s, &q(1)).unwrap();
    let _ = write_frame(&mut s, &q(2));
    let r = read_all(&s);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].id, 1);
    // Then the close (or a reset, the second frame being unread).
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut rest = Vec::new();
    // bounded: the read timeout above
    match s.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty()),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let _ = s.write_all(b"");
}
