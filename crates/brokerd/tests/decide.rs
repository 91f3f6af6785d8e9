//! The decision in process: the steps' order when more than one applies, and the approvals
//! table's race between the owner and the clock.

use std::collections::BTreeMap;
use std::time::Duration;

use brokerd::approvals::{Approvals, By, DecideError, Verdict};
use brokerd::fingerprints::Encoding;
use brokerd::policy::{AskRule, Decision, Leaks, NoLeaks, decide};
use bxcore::{Approval, ApprovalId, CallId, DataClass, Label, SessionId, Timestamp};
use serde_json::json;
use toolkit::{ApprovalRule, Env, Registry, Root, Roots, Tightening};

fn state(taint: DataClass, untrusted: bool) -> Label {
    Label::new(taint, untrusted)
}

fn env(dir: &std::path::Path) -> Env {
    Env {
        roots: Roots::new(vec![Root {
            path: dir.to_path_buf(),
            name: None,
            class: DataClass::Private,
            writable: true,
            untrusted: false,
        }])
        .unwrap(),
        gateway: None,
        run: None,
        servers: Default::default(),
    }
}

fn tightened(tool: &str, approval: ApprovalRule) -> Registry {
    Registry::new(&BTreeMap::from([(
        tool.to_string(),
        Tightening {
            approval: Some(approval),
            ..Default::default()
        },
    )]))
    .unwrap()
}

#[test]
fn an_unknown_tool_is_denied_before_its_arguments_are_looked_at() {
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let d = decide(
        &reg,
        &Env::default(),
        &NoLeaks,
        "nope",
        &json!(7),
        Label::FRESH,
    );
    assert!(matches!(d, Decision::Denied(r) if r.reason == "no such tool: \"nope\""));
}

#[test]
fn bad_arguments_fail_before_the_flow_rules() {
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let d = decide(
        &reg,
        &Env::default(),
        &NoLeaks,
        "web_fetch",
        &json!({"url": 1}),
        state(DataClass::Secret, true),
    );
    assert!(
        matches!(d, Decision::Failed { message: m, touched: None } if m.contains("web_fetch's schema"))
    );
}

#[test]
fn the_flow_rule_wins_over_approval_rules() {
    let reg = tightened("web_fetch", ApprovalRule::Always);
    let d = decide(
        &reg,
        &Env::default(),
        &NoLeaks,
        "web_fetch",
        &json!({"url": "https://example.org/"}),
        state(DataClass::Secret, true),
    );
    assert!(matches!(d, Decision::Denied(r) if r.reason.contains("no approval can allow this")));
}

#[test]
fn write_down_is_denied_and_a_write_at_the_same_class_is_not() {
    let dir = tempfile::TempDir::new().unwrap();
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let args = json!({"path": dir.path().join("x").display().to_string(), "content": "c"});
    let secret = decide(
        &reg,
        &env(dir.path()),
        &NoLeaks,
        "workspace_write",
        &args,
        state(DataClass::Secret, false),
    );
    assert!(
        matches!(secret, Decision::Denied(r) if r.reason.contains("would write into a private place"))
    );
    let private = decide(
        &reg,
        &env(dir.path()),
        &NoLeaks,
        "workspace_write",
        &args,
        Label::FRESH,
    );
    assert!(matches!(private, Decision::Allow { .. }));
}

/// A leak check that finds every argument released from a secret root.
struct EverythingLeaks;

impl Leaks for EverythingLeaks {
    fn leak(&self, _args: &serde_json::Value) -> Option<Encoding> {
        Some(Encoding::Base64)
    }
}

#[test]
fn the_leak_check_is_step_three_before_any_ask_and_only_for_what_goes_out_or_down() {
    let dir = tempfile::TempDir::new().unwrap();
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    // An untrusted session's fetch would ask (step 4); a leak denies it first, whatever asks.
    let d = decide(
        &reg,
        &Env::default(),
        &EverythingLeaks,
        "web_fetch",
        &json!({"url": "https://example.org/"}),
        state(DataClass::Private, true),
    );
    match d {
        Decision::Denied(r) => {
            assert_eq!(r.leak, Some(Encoding::Base64));
            assert!(r.reason.starts_with("leak: "), "{}", r.reason);
        }
        other => panic!("{other:?}"),
    }
    // A read sends nothing anywhere: the leak check does not look at it.
    let read = decide(
        &reg,
        &env(dir.path()),
        &EverythingLeaks,
        "workspace_list",
        &json!({"path": dir.path().display().to_string()}),
        Label::FRESH,
    );
    assert!(matches!(read, Decision::Allow { .. }), "{read:?}");
}

#[test]
fn untrusted_effect_asks_before_the_tools_own_rule() {
    let dir = tempfile::TempDir::new().unwrap();
    let reg = tightened("workspace_write", ApprovalRule::Always);
    let args = json!({"path": dir.path().join("x").display().to_string(), "content": "c"});
    match decide(
        &reg,
        &env(dir.path()),
        &NoLeaks,
        "workspace_write",
        &args,
        state(DataClass::Private, true),
    ) {
        Decision::Ask { rule, reason, .. } => {
            assert_eq!(rule, AskRule::UntrustedEffect);
            assert!(reason.contains("changes the box"), "{reason}");
        }
        d => panic!("{d:?}"),
    }
    match decide(
        &reg,
        &env(dir.path()),
        &NoLeaks,
        "workspace_write",
        &args,
        Label::FRESH,
    ) {
        Decision::Ask { rule, .. } => assert_eq!(rule, AskRule::Always),
        d => panic!("{d:?}"),
    }
}

#[test]
fn approval_untrusted_asks_only_while_the_session_is_untrusted() {
    let dir = tempfile::TempDir::new().unwrap();
    let reg = tightened("workspace_read", ApprovalRule::Untrusted);
    let args = json!({"path": dir.path().join("x").display().to_string()});
    match decide(
        &reg,
        &env(dir.path()),
        &NoLeaks,
        "workspace_read",
        &args,
        state(DataClass::Private, true),
    ) {
        Decision::Ask { rule, .. } => assert_eq!(rule, AskRule::WhileUntrusted),
        d => panic!("{d:?}"),
    }
    let trusted = decide(
        &reg,
        &env(dir.path()),
        &NoLeaks,
        "workspace_read",
        &args,
        Label::FRESH,
    );
    assert!(matches!(trusted, Decision::Allow { .. }));
}

#[test]
fn an_untrusted_session_may_still_read() {
    let dir = tempfile::TempDir::new().unwrap();
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let args = json!({"path": dir.path().join("x").display().to_string()});
    let d = decide(
        &reg,
        &env(dir.path()),
        &NoLeaks,
        "workspace_read",
        &args,
        state(DataClass::Secret, true),
    );
    assert!(matches!(d, Decision::Allow { .. }));
}

fn approval(ttl_ms: u64) -> Approval {
    let now = Timestamp::now();
    Approval {
        approval: ApprovalId::random(),
        session: SessionId::new("s").unwrap(),
        call: CallId(1),
        tool: "t".into(),
        args: json!({}),
        digest: bxcore::canonical::digest(&json!({})),
        taint: DataClass::Private,
        untrusted: true,
        rule: "untrusted-effect".into(),
        reason: "r".into(),
        lease_scope: "any call of the tool".into(),
        requested: now,
        expires: now.plus_millis(ttl_ms),
    }
}

#[test]
fn a_decision_reaches_its_waiter_once() {
    let table = Approvals::default();
    let a = approval(60_000);
    let id = a.approval.clone();
    let w = table.open(a, Duration::from_secs(60)).unwrap();
    assert_eq!(table.list().len(), 1);
    table
        .decide(&id, Verdict::Approved { by: By::uid(1000) })
        .unwrap();
    assert_eq!(table.wait(w), Verdict::Approved { by: By::uid(1000) });
    assert_eq!(
        table.decide(&id, Verdict::Approved { by: By::uid(1000) }),
        Err(DecideError::NotPending(id))
    );
    assert!(table.list().is_empty());
}

#[test]
fn the_clock_wins_when_nobody_decides_and_a_late_decision_is_refused() {
    let table = Approvals::default();
    let a = approval(1);
    let id = a.approval.clone();
    let w = table.open(a, Duration::from_millis(1)).unwrap();
    assert_eq!(table.wait(w), Verdict::Expired);
    assert!(
        table
            .decide(&id, Verdict::Approved { by: By::uid(1000) })
            .is_err()
    );
    assert!(table.list().is_empty());
}

#[test]
fn a_withdrawn_approval_ends_its_wait_and_cannot_be_decided_any_more() {
    let table = Approvals::default();
    let a = approval(60_000);
    let id = a.approval.clone();
    let w = table.open(a, Duration::from_secs(60)).unwrap();
    assert!(table.withdraw(&id));
    assert!(table.list().is_empty());
    assert_eq!(table.wait(w), Verdict::Withdrawn);
    assert_eq!(
        table.decide(&id, Verdict::Approved { by: By::uid(1000) }),
        Err(DecideError::NotPending(id.clone()))
    );
    assert!(!table.withdraw(&id), "withdrawn once");
}

#[test]
fn a_decision_that_came_first_wins_over_the_withdrawal() {
    let table = Approvals::default();
    let a = approval(60_000);
    let id = a.approval.clone();
    let w = table.open(a, Duration::from_secs(60)).unwrap();
    table
        .decide(
            &id,
            Verdict::Denied {
                by: By::uid(1000),
                reason: None,
            },
        )
        .unwrap();
    assert!(!table.withdraw(&id));
    assert_eq!(
        table.wait(w),
        Verdict::Denied {
            by: By::uid(1000),
            reason: None
        }
    );
}
