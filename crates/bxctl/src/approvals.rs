//! `bxctl approvals [--watch]`, `bxctl approve ID`, `bxctl deny ID`: what the owner sees is what
//! the owner approves, so the whole arguments are shown with their digest, the session's taint
//! and trust, the rule that asked and the time left.

use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown};
use bxcore::{Approval, ApprovalDecision, ApprovalId, Message, Timestamp};
use serde_json::json;

use crate::Outcome;
use crate::cli::Context;
use crate::output::{failed, json_line, time_left};

fn fetch(ctx: &Context) -> Result<Vec<Approval>, ClientError> {
    match client::call(
        &ctx.admin,
        ctx.timeout,
        1,
        Message::ApprovalsList {},
        |_| {},
    )? {
        Message::Approvals(a) => Ok(a.pending),
        other => Err(ClientError::Unexpected(other.kind())),
    }
}

/// One approval, for a person.
pub fn show(a: &Approval, now: Timestamp) -> String {
    let left = i128::from(a.expires.0) - i128::from(now.0);
    let args = serde_json::to_string_pretty(&a.args).unwrap_or_else(|_| a.args.to_string());
    let mut s = format!(
        "approval {}  ({} left)\n  tool     {} (call {} of session {})\n  session  taint {}, {}\n  rule     {}: {}\n  digest   sha256 {}\n  args\n",
        a.approval,
        time_left(left),
        Shown(&a.tool, Mode::Line),
        a.call,
        a.session,
        a.taint,
        if a.untrusted {
            "untrusted (it has read third-party content)"
        } else {
            "trusted"
        },
        Shown(&a.rule, Mode::Line),
        Shown(&a.reason, Mode::Line),
        a.digest,
    );
    for line in args.lines() {
        s.push_str("    ");
        // JSON escapes C0 controls, `"` and `\`; the rest (C1, DEL, bidi, zero-width) here.
        s.push_str(&Shown(line, Mode::Line).to_string());
        s.push('\n');
    }
    s.push_str(&format!(
        "  bxctl approve {0}   |   bxctl deny {0}\n",
        a.approval
    ));
    s
}

fn print(ctx: &Context, pending: &[Approval]) {
    if ctx.json {
        json_line(&json!({ "pending": pending }));
        return;
    }
    if pending.is_empty() {
        println!("no approvals pending");
        return;
    }
    let now = Timestamp::now();
    for a in pending {
        println!("{}", show(a, now));
    }
}

/// `bxctl approvals`: the list once, or with `--watch` again on every change.
pub fn list(ctx: &Context, watch: bool) -> Outcome {
    let mut last: Option<Vec<ApprovalId>> = None;
    loop {
        let pending = match fetch(ctx) {
            Ok(p) => p,
            Err(e) => return failed(ctx, "cannot list the approvals", &e),
        };
        let ids: Vec<ApprovalId> = pending.iter().map(|a| a.approval.clone()).collect();
        if last.as_ref() != Some(&ids) {
            print(ctx, &pending);
            last = Some(ids);
        }
        if !watch {
            return Outcome::Done;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `bxctl approve ID` / `bxctl deny ID`.
pub fn decide(ctx: &Context, id: &str, allow: bool) -> Outcome {
    let approval = match ApprovalId::new(id) {
        Ok(a) => a,
        Err(e) => {
            if ctx.json {
                json_line(&json!({"error": {"code": "usage", "detail": e.to_string()}}));
            } else {
                eprintln!("bxctl: {e}");
            }
            return Outcome::Failed;
        }
    };
    let msg = Message::ApprovalDecision(ApprovalDecision {
        approval: approval.clone(),
        allow,
    });
    let verb = if allow { "approved" } else { "denied" };
    match client::call(&ctx.admin, ctx.timeout, 1, msg, |_| {}) {
        Ok(Message::ApprovalAck(ack)) => {
            if ctx.json {
                json_line(&json!({"approval": ack.approval, "allow": allow}));
            } else {
                println!("{verb} {}", ack.approval);
            }
            Outcome::Done
        }
        Ok(other) => failed(
            ctx,
            &format!("cannot decide {approval}"),
            &ClientError::Unexpected(other.kind()),
        ),
        Err(e) => failed(ctx, &format!("cannot decide {approval}"), &e),
    }
}
