//! `bxctl approvals [--watch]`, `bxctl approvals show ID`, `bxctl approve ID`, `bxctl deny ID`:
//! what the owner sees is what the owner approves, and nothing the model wrote can change how it
//! looks. Every text is escaped (`bxcore::visible`); a URL's host is shown on a line of its own;
//! a long argument is shown as its first bytes, its length and its digest, and `approvals show`
//! prints one approval whole. The list comes as summaries and each approval is fetched alone, so
//! one huge or broken approval cannot hide another.

use std::time::Duration;

use bxcore::canonical;
use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown};
use bxcore::{
    Approval, ApprovalDecision, ApprovalId, ApprovalShow, ApprovalSummary, Lease, LeaseId,
    LeaseRef, Message, Timestamp,
};
use serde_json::{Value, json};

use crate::context::Context;
use crate::done::{Done, Ended};
use crate::output::{failed, json_line, refused_value, time_left};

/// The bytes of an argument shown in the list; the rest is its length and digest.
pub const SHOWN_BYTES: usize = 160;

fn fetch(ctx: &Context) -> Result<Vec<ApprovalSummary>, ClientError> {
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

fn fetch_one(ctx: &Context, id: &ApprovalId) -> Result<Approval, ClientError> {
    let msg = Message::ApprovalShow(ApprovalShow {
        approval: id.clone(),
    });
    match client::call(&ctx.admin, ctx.timeout, 1, msg, |_| {})? {
        Message::Approval(a) => Ok(a),
        other => Err(ClientError::Unexpected(other.kind())),
    }
}

/// `"…"` with everything escaped: the exact value, one line.
fn quoted(s: &str) -> String {
    format!("\"{}\"", Shown(s, Mode::Quoted))
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn head(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A URL's host (with its port) and the user information before an `@`, if `s` is an http(s)
/// URL: `https://bank.example@evil.example/` goes to `evil.example`.
pub fn url_host(s: &str) -> Option<(&str, Option<&str>)> {
    let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
    let rest = if lower.starts_with("https://") {
        &s[8..]
    } else if lower.starts_with("http://") {
        &s[7..]
    } else {
        return None;
    };
    let end = rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    let authority = &rest[..end];
    Some(match authority.rfind('@') {
        Some(at) => (&authority[at + 1..], Some(&authority[..at])),
        None => (authority, None),
    })
}

/// One argument's value for the view: whole when short, else its first bytes, its length and
/// its digest; a URL's host on the next line.
fn value_lines(v: &Value, id: &ApprovalId, whole: bool) -> Vec<String> {
    let (text, is_string) = match v {
        Value::String(s) => (s.clone(), true),
        other => (other.to_string(), false),
    };
    let mut lines = Vec::new();
    let show = |s: &str| {
        if is_string {
            quoted(s)
        } else {
            Shown(s, Mode::Line).to_string()
        }
    };
    if whole || text.len() <= SHOWN_BYTES {
        lines.push(show(&text));
    } else {
        lines.push(format!(
            "{}… ({} bytes, sha256 {}; whole: bxctl approvals show {id})",
            show(head(&text, SHOWN_BYTES)),
            text.len(),
            canonical::sha256_hex(text.as_bytes())
        ));
    }
    if let (true, Some((host, user))) = (is_string, url_host(&text)) {
        lines.push(format!("host {}", quoted(host)));
        if let Some(user) = user {
            lines.push(format!("user info {} (not the host)", quoted(user)));
        }
    }
    lines
}

fn args_lines(a: &Approval, whole: bool) -> Vec<String> {
    let mut out = Vec::new();
    let entries: Vec<(String, &Value)> = match &a.args {
        Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
        other => vec![(String::new(), other)],
    };
    let width = entries
        .iter()
        .map(|(k, _)| Shown(k, Mode::Line).to_string().chars().count())
        .max()
        .unwrap_or(0);
    for (k, v) in entries {
        let key = Shown(&k, Mode::Line).to_string();
        let pad = " ".repeat(width - key.chars().count());
        for (i, line) in value_lines(v, &a.approval, whole).into_iter().enumerate() {
            if i == 0 {
                out.push(format!("    {key}{pad}  {line}"));
            } else {
                out.push(format!("    {}  {line}", " ".repeat(width)));
            }
        }
    }
    out
}

fn header(s: &ApprovalSummary, now: Timestamp) -> String {
    let left = i128::from(s.expires.0) - i128::from(now.0);
    format!(
        "approval {}  ({} left)\n  tool     {} (call {} of session {})\n  session  taint {}, {}\n  rule     {}: {}\n  digest   sha256 {} ({} bytes of arguments)\n  lease    {}\n",
        s.approval,
        time_left(left),
        Shown(&s.tool, Mode::Line),
        s.call,
        s.session,
        s.taint,
        if s.untrusted {
            "untrusted (it has read third-party content)"
        } else {
            "trusted"
        },
        Shown(&s.rule, Mode::Line),
        Shown(&s.reason, Mode::Line),
        s.digest,
        s.args_bytes,
        Shown(&s.lease_scope, Mode::Line),
    )
}

/// One approval, for a person: long arguments cut (`whole` false) or every byte (`whole`).
pub fn show(a: &Approval, now: Timestamp, whole: bool) -> String {
    let mut s = header(&a.summary(), now);
    s.push_str("  args\n");
    for line in args_lines(a, whole) {
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str(&format!(
        "  bxctl approve {0}{1}   |   bxctl approve --lease {0}{1}   |   bxctl deny {0}{1}\n",
        a.approval,
        crate::output::hint_home()
    ));
    s
}

fn print(ctx: &Context, pending: &[ApprovalSummary]) {
    if ctx.json {
        // Each approval whole, its arguments included, as the view shows them; one decided
        // since the list came is left out, one that could not be fetched is its summary.
        let whole: Vec<Value> = pending
            .iter()
            .filter_map(|s| match fetch_one(ctx, &s.approval) {
                Ok(a) => serde_json::to_value(a).ok(),
                Err(ClientError::Remote(_)) => None,
                Err(_) => serde_json::to_value(s).ok(),
            })
            .collect();
        json_line(&json!({ "pending": whole }));
        return;
    }
    if pending.is_empty() {
        println!("no approvals pending");
        return;
    }
    let now = Timestamp::now();
    for s in pending {
        match fetch_one(ctx, &s.approval) {
            Ok(a) => println!("{}", show(&a, now, false)),
            // Decided or expired since the list came: it is not pending any more.
            Err(ClientError::Remote(_)) => {}
            Err(e) => println!(
                "{}  (its arguments could not be fetched: {}; bxctl approvals show {})\n",
                header(s, now),
                Shown(&e.to_string(), Mode::Line),
                s.approval
            ),
        }
    }
}

/// `bxctl approvals`: the list once, or with `--watch` again on every change.
pub fn list(ctx: &Context, watch: bool) -> Ended {
    let mut last: Option<Vec<ApprovalId>> = None;
    loop {
        let pending = fetch(ctx).map_err(|e| failed(ctx, "cannot list the approvals", &e))?;
        let ids: Vec<ApprovalId> = pending.iter().map(|a| a.approval.clone()).collect();
        if last.as_ref() != Some(&ids) {
            print(ctx, &pending);
            last = Some(ids);
        }
        if !watch {
            return Ok(Done);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `bxctl approvals show ID`: one approval with every argument whole.
pub fn show_one(ctx: &Context, id: &str) -> Ended {
    let approval = ApprovalId::new(id).map_err(|e| refused_value(ctx.json, &e))?;
    let a = fetch_one(ctx, &approval)
        .map_err(|e| failed(ctx, &format!("cannot show {approval}"), &e))?;
    if ctx.json {
        json_line(&a);
    } else {
        println!("{}", show(&a, Timestamp::now(), true));
    }
    Ok(Done)
}

/// What the owner answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Run it; with `lease`, also the calls like it for the lease's time in this session.
    Allow {
        lease: bool,
    },
    Deny,
}

impl Answer {
    /// The decision on `approval`.
    pub fn decision(self, approval: &ApprovalId) -> ApprovalDecision {
        ApprovalDecision {
            approval: approval.clone(),
            allow: matches!(self, Answer::Allow { .. }),
            lease: matches!(self, Answer::Allow { lease: true }),
            approver: None,
        }
    }
}

/// `bxctl approve ID [--lease]` / `bxctl deny ID`.
pub fn decide(ctx: &Context, id: &str, answer: Answer) -> Ended {
    let approval = ApprovalId::new(id).map_err(|e| refused_value(ctx.json, &e))?;
    let d = answer.decision(&approval);
    let (allow, lease) = (d.allow, d.lease);
    let msg = Message::ApprovalDecision(d);
    let verb = match answer {
        Answer::Allow { lease: true } => "approved, with a lease for the calls like it,",
        Answer::Allow { lease: false } => "approved",
        Answer::Deny => "denied",
    };
    let what = format!("cannot decide {approval}");
    match client::call(&ctx.admin, ctx.timeout, 1, msg, |_| {}) {
        Ok(Message::ApprovalAck(ack)) => {
            if ctx.json {
                json_line(&json!({"approval": ack.approval, "allow": allow, "lease": lease}));
            } else {
                println!("{verb} {}", ack.approval);
            }
            Ok(Done)
        }
        Ok(other) => Err(failed(ctx, &what, &ClientError::Unexpected(other.kind()))),
        Err(e) => Err(failed(ctx, &what, &e)),
    }
}

/// `bxctl approvals --leases`: every live lease.
pub fn leases(ctx: &Context) -> Ended {
    let what = "cannot list the leases";
    let got = match client::call(&ctx.admin, ctx.timeout, 1, Message::LeasesList {}, |_| {}) {
        Ok(Message::Leases(l)) => l.leases,
        Ok(other) => return Err(failed(ctx, what, &ClientError::Unexpected(other.kind()))),
        Err(e) => return Err(failed(ctx, what, &e)),
    };
    if ctx.json {
        json_line(&json!({ "leases": got }));
        return Ok(Done);
    }
    if got.is_empty() {
        println!("no leases");
    }
    let now = Timestamp::now();
    for l in &got {
        println!("{}", lease_text(l, now));
    }
    Ok(Done)
}

/// One lease, for a person.
pub fn lease_text(l: &Lease, now: Timestamp) -> String {
    let left = i128::from(l.expires.0) - i128::from(now.0);
    format!(
        "lease {}  ({} left)\n  session  {}\n  allows   {} calls in {} (rule {})\n  by       {}\n  bxctl approvals revoke {}{}\n",
        l.lease,
        time_left(left),
        l.session,
        Shown(&l.tool, Mode::Line),
        Shown(&l.scope, Mode::Line),
        Shown(&l.rule, Mode::Line),
        Shown(&l.by, Mode::Line),
        l.lease,
        crate::output::hint_home()
    )
}

/// `bxctl approvals revoke LEASE`.
pub fn revoke(ctx: &Context, id: &str) -> Ended {
    let lease = LeaseId::new(id).map_err(|e| refused_value(ctx.json, &e))?;
    let msg = Message::LeaseRevoke(LeaseRef {
        lease: lease.clone(),
    });
    let what = format!("cannot revoke {lease}");
    match client::call(&ctx.admin, ctx.timeout, 1, msg, |_| {}) {
        Ok(Message::LeaseRevoked(r)) => {
            if ctx.json {
                json_line(&json!({"revoked": r.lease}));
            } else {
                println!("revoked {}", r.lease);
            }
            Ok(Done)
        }
        Ok(other) => Err(failed(ctx, &what, &ClientError::Unexpected(other.kind()))),
        Err(e) => Err(failed(ctx, &what, &e)),
    }
}
