//! The bounds that keep the owner's view alive, on a real brokerd: arguments too large to show,
//! a session with its share pending, a full table; the list as summaries that always fit in a
//! frame, one approval fetched whole; and the configuration's limits.

mod support;

use std::os::unix::net::UnixStream;
use std::path::Path;

use brokerd::config::Config;
use bxcore::{ApprovalId, ApprovalShow, Envelope, ErrorCode, Message, ToolResponse};
use support::*;

/// A `workspace_write` from an untrusted session: the connection and the first frame brokerd
/// sent (`pending_approval`, or a final answer).
fn write_call(h: &Home, session: &str, id: u64, content: &str) -> (UnixStream, Envelope) {
    untrusted_write(h, session, id, &format!("{session}-{id}.txt"), content)
}

fn is_pending(e: &Envelope) -> bool {
    !e.last
        && matches!(
            e.msg,
            Message::ToolResponse(ToolResponse::PendingApproval { .. })
        )
}

fn denied_reason(e: &Envelope) -> String {
    assert!(e.last, "{e:?}");
    match &e.msg {
        Message::ToolResponse(ToolResponse::Denied { reason }) => reason.clone(),
        other => panic!("{other:?}"),
    }
}

fn show(h: &Home, id: &ApprovalId) -> Message {
    request(
        &h.admin_sock(),
        2,
        Message::ApprovalShow(ApprovalShow {
            approval: id.clone(),
        }),
    )[0]
    .msg
    .clone()
}

#[test]
fn arguments_larger_than_the_view_holds_are_denied_with_the_runbook_line() {
    let h = Home::with_notes("[approvals]\nmax_args_bytes = 1024\n");
    let _b = Brokerd::start(&h);
    let (_s, first) = write_call(&h, "s1", 3, &"x".repeat(2000));
    let reason = denied_reason(&first);
    assert!(
        reason.contains("more than the 1024 an approval may show")
            && reason.ends_with("see docs/runbook.md#approval-too-large"),
        "{reason}"
    );
    assert!(
        pending_approvals(&h).is_empty(),
        "nothing was put to the owner"
    );
    assert!(!h.home.join("notes/s1-3.txt").exists(), "nothing ran");
    assert_eq!(events(&h, "s1", 3), ["requested", "denied"]);
    // Just under the bound is asked as before.
    let (_s, first) = write_call(&h, "s1", 4, &"x".repeat(900));
    assert!(is_pending(&first), "{first:?}");
}

#[test]
fn a_session_with_its_share_pending_is_denied_and_another_session_still_asks() {
    let h = Home::with_notes("[approvals]\nmax_pending_per_session = 2\n");
    let _b = Brokerd::start(&h);
    let (_a, first) = write_call(&h, "s1", 1, "one");
    assert!(is_pending(&first));
    let (_b2, first) = write_call(&h, "s1", 2, "two");
    assert!(is_pending(&first));
    let (_c, first) = write_call(&h, "s1", 3, "three");
    let reason = denied_reason(&first);
    assert!(
        reason.contains("session s1 already has 2 approvals waiting")
            && reason.ends_with("see docs/runbook.md#approvals-full"),
        "{reason}"
    );
    let (_d, first) = write_call(&h, "s2", 1, "other");
    assert!(
        is_pending(&first),
        "another session still reaches the owner"
    );
    assert_eq!(pending_approvals(&h).len(), 3);
}

#[test]
fn a_full_table_denies_every_session() {
    let h = Home::with_notes("[approvals]\nmax_pending = 2\nmax_pending_per_session = 1\n");
    let _b = Brokerd::start(&h);
    let (_a, first) = write_call(&h, "s1", 1, "one");
    assert!(is_pending(&first));
    let (_b2, first) = write_call(&h, "s2", 1, "two");
    assert!(is_pending(&first));
    let (_c, first) = write_call(&h, "s3", 1, "three");
    let reason = denied_reason(&first);
    assert!(
        reason.contains("2 approvals are already waiting")
            && reason.ends_with("see docs/runbook.md#approvals-full"),
        "{reason}"
    );
    assert_eq!(events(&h, "s3", 1), ["requested", "denied"]);
}

#[test]
fn the_list_is_summaries_that_fit_in_a_frame_and_each_approval_comes_whole() {
    // The largest arguments allowed, several at once: together far more than a frame.
    let max = brokerd::config::MAX_ARGS_BYTES;
    let h = Home::with_notes(&format!(
        "[approvals]\nmax_args_bytes = {max}\nmax_pending_per_session = 8\n"
    ));
    let _b = Brokerd::start(&h);
    let big = "y".repeat(max - 512);
    let mut conns = Vec::new();
    for i in 1..=4 {
        let (s, first) = write_call(&h, &format!("s{i}"), 1, &big);
        assert!(is_pending(&first), "{first:?}");
        conns.push(s);
    }
    let list = pending_approvals(&h);
    assert_eq!(list.len(), 4);
    for s in &list {
        assert!(s.args_bytes as usize > max - 512, "{s:?}");
        match show(&h, &s.approval) {
            Message::Approval(a) => {
                assert_eq!(a.args["content"], big.as_str());
                assert_eq!(a.digest, s.digest);
                assert_eq!(a.digest, bxcore::canonical::digest(&a.args));
                assert_eq!(
                    bxcore::canonical::to_string(&a.args).len() as u64,
                    s.args_bytes
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // One that is not pending: forbidden, with the reason.
    match show(&h, &ApprovalId::new("0123456789abcdef").unwrap()) {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(e.detail.contains("no such pending approval"), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
}

fn parse(text: &str) -> Result<Config, String> {
    bxharden::daemon::parse::<Config>(Path::new("brokerd.toml"), text).map_err(|e| e.to_string())
}

#[test]
fn the_bounds_default_and_are_checked() {
    let c = parse("[paths]\nhome = \"/h\"\n").unwrap();
    assert_eq!(c.approvals.max_args_bytes, 256 * 1024);
    assert_eq!(c.approvals.max_pending_per_session, 8);
    assert_eq!(c.approvals.max_pending, 64);
    for (bad, says) in [
        (
            "max_args_bytes = 0",
            "max_args_bytes = 0 is not between 1 and",
        ),
        (
            "max_args_bytes = 600000",
            "max_args_bytes = 600000 is not between 1 and",
        ),
        (
            "max_pending = 0",
            "max_pending = 0 is not between 1 and 256",
        ),
        (
            "max_pending = 257",
            "max_pending = 257 is not between 1 and 256",
        ),
        (
            "max_pending = 4\nmax_pending_per_session = 5",
            "max_pending_per_session = 5 is not between 1 and max_pending (4)",
        ),
        (
            "max_pending_per_session = 0",
            "max_pending_per_session = 0 is not between 1",
        ),
    ] {
        let e = parse(&format!("[paths]\nhome = \"/h\"\n[approvals]\n{bad}\n")).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
