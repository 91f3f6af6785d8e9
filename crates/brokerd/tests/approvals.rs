//! The owner's approvals on a real brokerd: granted, denied, expired, decided too late, unknown,
//! two at once, and what a restart does to those still pending.

mod support;

use std::fs;
use std::os::unix::net::UnixStream;
use std::thread;

use bxcore::{
    Approval, ApprovalDecision, ApprovalId, ApprovalShow, ApprovalSummary, CallId, DataClass,
    Envelope, ErrorCode, Message, SessionId, ToolRequest, ToolResponse, write_frame,
};
use serde_json::json;
use support::*;

/// A call that will wait for the owner (its session is untrusted): the open connection and the
/// pending frame's approval id.
fn pending_write(h: &Home, session: &str, id: u64, file: &str) -> (UnixStream, ApprovalId) {
    let (s, first) = untrusted_write(h, session, id, file, "approved text");
    assert_eq!(first.id, id);
    assert!(!first.last);
    match first.msg {
        Message::ToolResponse(ToolResponse::PendingApproval { approval, .. }) => (s, approval),
        other => panic!("{other:?}"),
    }
}

fn decide(h: &Home, id: &ApprovalId, allow: bool) -> Message {
    let r = request(
        &h.admin_sock(),
        5,
        Message::ApprovalDecision(ApprovalDecision {
            approval: id.clone(),
            allow,
            lease: false,
            approver: None,
        }),
    );
    r[0].msg.clone()
}

fn pending(h: &Home) -> Vec<ApprovalSummary> {
    pending_approvals(h)
}

/// One pending approval whole.
fn whole(h: &Home, id: &ApprovalId) -> Approval {
    let msg = Message::ApprovalShow(ApprovalShow {
        approval: id.clone(),
    });
    match &request(&h.admin_sock(), 1, msg)[0].msg {
        Message::Approval(a) => a.clone(),
        o => panic!("{o:?}"),
    }
}

fn final_of(s: &UnixStream) -> ToolResponse {
    let r = read_all(s);
    assert!(r.last().unwrap().last);
    match &r.last().unwrap().msg {
        Message::ToolResponse(t) => t.clone(),
        o => panic!("{o:?}"),
    }
}

#[test]
fn the_owner_sees_what_the_owner_approves() {
    let h = Home::with_notes("");
    let _b = Brokerd::start(&h);
    let (_s, id) = pending_write(&h, "s", 4, "a.txt");
    let list = pending(&h);
    assert_eq!(list.len(), 1);
    let a = &whole(&h, &list[0].approval);
    assert_eq!(list[0], a.summary());
    assert_eq!(a.approval, id);
    assert_eq!(a.session.as_str(), "s");
    assert_eq!(a.call, CallId(4));
    assert_eq!(a.tool, "workspace_write");
    assert_eq!(a.args["content"], "approved text");
    assert_eq!(a.digest, bxcore::canonical::digest(&a.args));
    assert_eq!(a.taint, DataClass::Private);
    assert!(a.untrusted);
    assert_eq!(a.rule, "untrusted-effect");
    assert_eq!(a.expires.0 - a.requested.0, 600_000);
}

#[test]
fn an_approved_call_runs_and_is_recorded() {
    let h = Home::with_notes("");
    let _b = Brokerd::start(&h);
    let (s, id) = pending_write(&h, "s", 1, "a.txt");
    assert_eq!(
        decide(&h, &id, true),
        Message::ApprovalAck(bxcore::ApprovalAck {
            approval: id.clone()
        })
    );
    assert!(matches!(final_of(&s), ToolResponse::Result { .. }));
    assert_eq!(
        fs::read_to_string(h.home.join("notes/a.txt")).unwrap(),
        "approved text"
    );
    assert_eq!(
        events(&h, "s", 1),
        ["requested", "pending", "approved", "result"]
    );
    assert!(pending(&h).is_empty());
    // Used once.
    assert!(matches!(decide(&h, &id, true), Message::Error(e) if e.code == ErrorCode::Forbidden));
}

#[test]
fn a_denied_call_does_not_run() {
    let h = Home::with_notes("");
    let _b = Brokerd::start(&h);
    let (s, id) = pending_write(&h, "s", 1, "a.txt");
    assert!(matches!(decide(&h, &id, false), Message::ApprovalAck(_)));
    assert_eq!(
        final_of(&s),
        ToolResponse::Denied {
            reason: "the owner denied it".into()
        }
    );
    assert!(!h.home.join("notes/a.txt").exists());
    assert_eq!(events(&h, "s", 1), ["requested", "pending", "denied"]);
}

#[test]
fn an_approval_that_expires_is_denied_and_a_late_decision_is_forbidden() {
    let h = Home::with_notes("[approvals]\nttl_ms = 300\n");
    let _b = Brokerd::start(&h);
    let (s, id) = pending_write(&h, "s", 1, "a.txt");
    assert_eq!(
        final_of(&s),
        ToolResponse::Denied {
            reason: "the approval expired".into()
        }
    );
    match decide(&h, &id, true) {
        Message::Error(e) => assert_eq!(e.code, ErrorCode::Forbidden),
        o => panic!("{o:?}"),
    }
    assert!(!h.home.join("notes/a.txt").exists());
    assert_eq!(events(&h, "s", 1), ["requested", "pending", "expired"]);
}

#[test]
fn a_decision_for_an_unknown_id_is_forbidden() {
    let h = Home::with_notes("");
    let _b = Brokerd::start(&h);
    match decide(&h, &ApprovalId::new("0123456789abcdef").unwrap(), true) {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(
                e.detail
                    .starts_with("no such pending approval: 0123456789abcdef (answered already")
                    && e.detail
                        .ends_with("see docs/runbook.md#approval-not-pending"),
                "{}",
                e.detail
            );
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn two_sessions_wait_at_once_and_each_decision_reaches_its_own_call() {
    let h = Home::with_notes("");
    let _b = Brokerd::start(&h);
    let (s1, id1) = pending_write(&h, "one", 1, "one.txt");
    let (s2, id2) = pending_write(&h, "two", 1, "two.txt");
    assert_ne!(id1, id2);
    assert_eq!(pending(&h).len(), 2);
    let t2 = thread::spawn(move || final_of(&s2));
    assert!(matches!(decide(&h, &id2, false), Message::ApprovalAck(_)));
    assert!(matches!(
        bxtest::join(t2, "the second session's call"),
        ToolResponse::Denied { .. }
    ));
    assert_eq!(pending(&h).len(), 1);
    assert!(matches!(decide(&h, &id1, true), Message::ApprovalAck(_)));
    assert!(matches!(final_of(&s1), ToolResponse::Result { .. }));
    assert!(h.home.join("notes/one.txt").exists());
    assert!(!h.home.join("notes/two.txt").exists());
}

#[test]
fn a_restart_denies_what_was_pending_and_records_it() {
    let h = Home::with_notes("");
    let mut b = Brokerd::start(&h);
    let (_s, id) = pending_write(&h, "s", 1, "a.txt");
    b.kill();
    let b2 = Brokerd::start(&h);
    assert!(pending(&h).is_empty());
    assert!(matches!(decide(&h, &id, true), Message::Error(e) if e.code == ErrorCode::Forbidden));
    let expired = records(&h)
        .into_iter()
        .find(|r| r["event"] == "expired")
        .expect("an expired record");
    assert_eq!(expired["detail"]["approval"], id.as_str());
    assert_eq!(expired["detail"]["why"], "expired at restart");
    assert_eq!(expired["session"], "s");
    assert_eq!(expired["call"], 1);
    b2.wait_log("recorded as expired at restart");
    assert!(!h.home.join("notes/a.txt").exists());
}

#[test]
fn a_requester_gone_before_its_pending_frame_is_recorded_withdrawn_as_one_gone_after_it() {
    // The requester closes at once: brokerd finds it gone when it sends the pending frame. That
    // was recorded `denied` while a requester gone a moment later was `withdrawn`, so which one
    // a channel hanging up got was timing (docs/policy.md: a requester that goes away while
    // its approval is pending is `withdrawn`).
    let h = Home::with_notes("");
    let _b = Brokerd::start(&h);
    fs::write(
        h.state_file("gone"),
        r#"{"taint":"private","untrusted":true}"#,
    )
    .unwrap();
    let mut s = UnixStream::connect(h.broker_sock()).unwrap();
    let args = json!({
        "path": h.home.join("notes/gone.txt").display().to_string(),
        "content": "never written",
    });
    let call = Message::ToolRequest(ToolRequest {
        session: SessionId::new("gone").unwrap(),
        call: CallId(1),
        tool: "workspace_write".into(),
        args,
    });
    write_frame(&mut s, &Envelope::new(1, true, call)).unwrap();
    drop(s);
    wait_until("the approval to be closed", || {
        events(&h, "gone", 1).len() >= 3
    });
    assert_eq!(
        events(&h, "gone", 1),
        vec!["requested", "pending", "withdrawn"]
    );
    assert!(pending(&h).is_empty());
    assert!(!h.home.join("notes/gone.txt").exists());
}

/// A decision on decide.sock, the channel's socket, naming `approver`.
fn decide_as_channel(h: &Home, id: &ApprovalId, allow: bool, approver: Option<&str>) -> Message {
    let r = request(
        &h.decide_sock(),
        6,
        Message::ApprovalDecision(ApprovalDecision {
            approval: id.clone(),
            allow,
            lease: false,
            approver: approver.map(str::to_string),
        }),
    );
    r[0].msg.clone()
}

fn show_as_channel(h: &Home, id: &ApprovalId) -> Message {
    let msg = Message::ApprovalShow(ApprovalShow {
        approval: id.clone(),
    });
    request(&h.decide_sock(), 7, msg)[0].msg.clone()
}

#[test]
fn the_channel_decides_its_own_sessions_approvals_and_the_chain_names_the_approver() {
    let h = Home::with_notes("");
    let _b = Brokerd::start(&h);
    let (s, id) = pending_write(&h, "matrix-0123456789abcdef", 1, "m.txt");
    match show_as_channel(&h, &id) {
        Message::Approval(a) => assert_eq!(a.tool, "workspace_write"),
        o => panic!("{o:?}"),
    }
    assert!(matches!(
        decide_as_channel(&h, &id, true, Some("@owner:example.org")),
        Message::ApprovalAck(_)
    ));
    assert!(matches!(final_of(&s), ToolResponse::Result { .. }));
    let approved = records(&h)
        .into_iter()
        .find(|r| r["event"] == "approved")
        .expect("an approved record");
    assert_eq!(approved["detail"]["approver"], "@owner:example.org");
    assert!(approved["detail"]["by"].is_u64());
}

#[test]
fn the_channel_may_not_show_or_decide_another_sessions_approval_nor_decide_unnamed() {
    let h = Home::with_notes("");
    let b = Brokerd::start(&h);
    let (_s, id) = pending_write(&h, "s1", 1, "a.txt");
    for got in [
        show_as_channel(&h, &id),
        decide_as_channel(&h, &id, true, Some("@owner:example.org")),
    ] {
        match got {
            Message::Error(e) => {
                assert_eq!(e.code, ErrorCode::Forbidden);
                assert!(
                    e.detail.starts_with(&format!(
                        "no such pending approval of the channel's sessions: {id}"
                    )),
                    "{}",
                    e.detail
                );
                assert!(e.detail.ends_with("see docs/runbook.md#decide-refused"));
                assert!(!e.detail.contains("workspace_write"), "{}", e.detail);
            }
            o => panic!("{o:?}"),
        }
    }
    b.wait_log("runbook.md#decide-refused");
    // Still pending for the owner, who decides it on admin.sock.
    assert_eq!(pending(&h).len(), 1);
    let (_s2, mine) = pending_write(&h, "matrix-aa", 2, "b.txt");
    for approver in [None, Some(""), Some("@a\nb:x")] {
        assert!(matches!(
            decide_as_channel(&h, &mine, true, approver),
            Message::Error(e) if e.code == ErrorCode::Forbidden
        ));
    }
    assert_eq!(pending(&h).len(), 2);
    // The channel has no list of approvals and no audit.
    for msg in [Message::ApprovalsList {}, Message::AuditVerify {}] {
        assert!(matches!(
            &request(&h.decide_sock(), 8, msg)[0].msg,
            Message::Error(e) if e.code == ErrorCode::Forbidden
        ));
    }
}

#[test]
fn an_approval_given_for_one_reason_is_asked_again_when_the_policy_now_asks_for_another() {
    let h = Home::with_notes("[tools.workspace_write]\napproval = \"always\"\n");
    let _b = Brokerd::start(&h);
    // A trusted session's write asks because the tool always asks.
    fs::write(
        h.state_file("s"),
        r#"{"taint":"private","untrusted":false}"#,
    )
    .unwrap();
    let mut s = UnixStream::connect(h.broker_sock()).unwrap();
    let path = h.home.join("notes/a.txt").display().to_string();
    let call = Message::ToolRequest(ToolRequest {
        session: SessionId::new("s").unwrap(),
        call: CallId(1),
        tool: "workspace_write".into(),
        args: json!({"path": path, "content": "text"}),
    });
    write_frame(&mut s, &Envelope::new(1, true, call)).unwrap();
    bxtest::wait_for("the write to ask", WAIT, || !pending(&h).is_empty());
    let asked = pending(&h).remove(0);
    assert_eq!(asked.rule, "approval-always");
    // While it waits, the session reads third-party content: the policy would now ask because
    // of that, which the owner was never asked about.
    fs::write(h.state_file("s"), r#"{"taint":"private","untrusted":true}"#).unwrap();
    match decide(&h, &asked.approval, true) {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(
                e.detail.contains("a new approval is pending"),
                "{}",
                e.detail
            );
            assert!(
                e.detail
                    .ends_with("see docs/runbook.md#broker-approval-asked-again"),
                "{}",
                e.detail
            );
        }
        o => panic!("{o:?}"),
    }
    bxtest::wait_for("the call to be asked again", WAIT, || {
        pending(&h).iter().any(|p| p.approval != asked.approval)
    });
    let again = pending(&h).remove(0);
    assert_eq!(again.rule, "untrusted-effect");
    assert!(!h.home.join("notes/a.txt").exists());
    assert!(matches!(
        decide(&h, &again.approval, true),
        Message::ApprovalAck(_)
    ));
    assert!(matches!(final_of(&s), ToolResponse::Result { .. }));
    assert_eq!(
        events(&h, "s", 1),
        [
            "requested",
            "pending",
            "withdrawn",
            "pending",
            "approved",
            "result"
        ]
    );
}

#[test]
fn a_lease_the_table_has_no_room_for_leaves_the_approval_pending_and_says_why() {
    let h = Home::with_notes("[approvals]\nmax_leases = 1\nmax_leases_per_session = 1\n");
    let _b = Brokerd::start(&h);
    let with_lease = |id: &ApprovalId| {
        request(
            &h.admin_sock(),
            6,
            Message::ApprovalDecision(ApprovalDecision {
                approval: id.clone(),
                allow: true,
                lease: true,
                approver: None,
            }),
        )[0]
        .msg
        .clone()
    };
    let (s1, first) = pending_write(&h, "s1", 4, "a.txt");
    assert!(matches!(with_lease(&first), Message::ApprovalAck(_)));
    assert!(matches!(final_of(&s1), ToolResponse::Result { .. }));
    let (s2, second) = pending_write(&h, "s2", 5, "b.txt");
    match with_lease(&second) {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(
                e.detail.contains("1 leases are held already"),
                "{}",
                e.detail
            );
            assert!(
                e.detail.ends_with("see docs/runbook.md#leases-full"),
                "{}",
                e.detail
            );
        }
        other => panic!("{other:?}"),
    }
    // Nothing was decided: the approval waits, and is answered without a lease.
    assert_eq!(pending(&h).len(), 1);
    assert!(matches!(decide(&h, &second, true), Message::ApprovalAck(_)));
    assert!(matches!(final_of(&s2), ToolResponse::Result { .. }));
}
