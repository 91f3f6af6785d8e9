//! One `admin.sock` connection: the owner lists pending approvals (summaries), shows one whole,
//! decides one (with a lease for the calls like it, when asked), lists or revokes leases, or asks
//! for the audit chain to be verified, or lists and clears the marks of what untrusted sessions
//! wrote. Only the owner's account may connect
//! (the socket's owner and the peer check), so only the owner approves.

use std::os::unix::net::UnixStream;

use bxcore::layout::AdminRequest;
use bxcore::runbook::Anchored;
use bxcore::{
    Approval, ApprovalAck, ApprovalDecision, Approvals, AuditHead, AuditReport, ErrorCode, Lease,
    LeaseRef, Leases, MarkCleared, MarkRef, Message, WireError,
};
use serde_json::json;

use crate::approvals::{By, Verdict};
use crate::broker::{Broker, Redecision, send};
use crate::leases::Covers;
use crate::ledger::chain;
use crate::ledger::record::{Draft, Event};
use crate::policy::AskRule;

/// The socket's name in the lines brokerd logs and the errors it sends.
pub const SOCKET: &str = "admin.sock";

/// Serve one `admin.sock` request (a kind its table accepts): one final answer.
pub fn handle(mut stream: UnixStream, id: u64, request: AdminRequest, broker: &Broker) {
    let response = match request {
        AdminRequest::ApprovalsList => Message::Approvals(Approvals {
            pending: broker.approvals().list(),
        }),
        AdminRequest::ApprovalShow(s) => match broker.approvals().get(&s.approval) {
            Ok(a) => Message::Approval(a),
            Err(e) => Message::Error(WireError {
                code: ErrorCode::Forbidden,
                detail: e.to_string(),
            }),
        },
        AdminRequest::ApprovalDecision(d) => {
            let uid = bxharden::peers::peer_uid(&stream).unwrap_or(u32::MAX);
            let by = By {
                uid,
                approver: d.approver.clone(),
            };
            decide(broker, d, by)
        }
        AdminRequest::AuditVerify => verify(broker, None),
        AdminRequest::AuditVerifyHead(h) => verify(broker, Some(h)),
        AdminRequest::LeasesList => Message::Leases(Leases {
            leases: broker.leases().list(),
        }),
        AdminRequest::LeaseRevoke(r) => {
            let by = bxharden::peers::peer_uid(&stream).unwrap_or(u32::MAX);
            revoke(broker, r, by)
        }
        AdminRequest::MarksList => marks(broker),
        AdminRequest::MarkClear(r) => {
            let by = bxharden::peers::peer_uid(&stream).unwrap_or(u32::MAX);
            clear(broker, &r, by)
        }
    };
    let _ = send(&mut stream, id, true, response);
}

/// The owner's decision. An approval is decided again against the session's state now: a call
/// the policy denies since it asked is denied, and the answer says why.
pub(crate) fn decide(broker: &Broker, d: ApprovalDecision, by: By) -> Message {
    let forbidden = |detail: String| {
        Message::Error(WireError {
            code: ErrorCode::Forbidden,
            detail,
        })
    };
    let mut failed = None;
    let mut again = None;
    // A lease asked with the approval is granted first, so that one that cannot be (a full
    // table) leaves the approval pending for the owner to answer without it.
    let lease = match (d.allow && d.lease, broker.approvals().pending(&d.approval)) {
        (true, Some(a)) => match grant(broker, &a, &by) {
            Ok(l) => Some(l),
            Err((why, anchor)) => {
                return forbidden(format!(
                    "the approval {} was not decided: the lease could not be granted ({why}); \
                     approve it without a lease, or revoke a lease first; {}",
                    d.approval,
                    bxcore::runbook::pointer(&anchor)
                ));
            }
        },
        _ => None,
    };
    let verdict = if !d.allow {
        Verdict::Denied { by, reason: None }
    } else {
        let now = broker.approvals().pending(&d.approval).map(|a| {
            let asked = AskRule::from_name(&a.rule).unwrap_or(AskRule::Always);
            broker.redecide(&a.session, &a.tool, &a.args, asked)
        });
        match now {
            Some(Redecision::Denied(reason)) => Verdict::Denied {
                by,
                reason: Some(reason),
            },
            Some(Redecision::Unreadable(e)) => Verdict::Denied {
                by,
                reason: Some(e.to_string()),
            },
            // A call that can no longer be carried out fails in its own thread, which raises
            // the session by what the failure tells; the owner is told here.
            Some(Redecision::Failed(reason, _)) => {
                failed = Some(reason);
                Verdict::Approved { by }
            }
            // The call's own thread opens the new approval, which says why.
            Some(Redecision::AskAgain { reason, .. }) => {
                again = Some(reason);
                Verdict::Approved { by }
            }
            Some(Redecision::Runs(_)) | None => Verdict::Approved { by },
        }
    };
    let refused = match &verdict {
        Verdict::Denied {
            reason: Some(r), ..
        } => Some(r.clone()),
        _ => None,
    };
    let decided = broker.approvals().decide(&d.approval, verdict);
    if let (Some(l), true) = (&lease, decided.is_err() || refused.is_some()) {
        // The approval this lease came with was not carried out: neither is the lease.
        broker.leases().revoke(&l.lease);
    }
    match decided {
        Ok(_) => match (refused, failed) {
            (Some(reason), _) => forbidden(format!(
                "the approval {} was not carried out: the policy, asked again, now denies the \
                 call ({reason}); the call was denied",
                d.approval
            )),
            (None, Some(reason)) => forbidden(format!(
                "the approval {} was not carried out: the call can no longer be made \
                 ({reason}); it failed",
                d.approval
            )),
            (None, None) if again.is_some() => forbidden(format!(
                "the approval {} was not carried out: the policy, asked again, puts the call \
                 to the owner for another reason ({}); a new approval is pending: bxctl \
                 approvals; {}",
                d.approval,
                again.unwrap_or_default(),
                bxcore::runbook::pointer(crate::broker::ASKED_AGAIN_ANCHOR)
            )),
            (None, None) => Message::ApprovalAck(ApprovalAck {
                approval: d.approval,
            }),
        },
        Err(e) => forbidden(e.to_string()),
    }
}

/// The owner ends a lease: recorded, then gone.
fn revoke(broker: &Broker, r: LeaseRef, by: u32) -> Message {
    match broker.leases().revoke(&r.lease) {
        Some(l) => {
            let record = Draft {
                session: Some(l.session.clone()),
                call: None,
                tool: Some(l.tool.clone()),
                event: Event::LeaseRevoked,
                detail: json!({"lease": l.lease, "by": format!("uid {by}")}),
            };
            if let Err(e) = broker.ledger().record(vec![record]) {
                bxharden::log::fail(&e);
            }
            Message::LeaseRevoked(LeaseRef { lease: l.lease })
        }
        None => Message::Error(WireError {
            code: ErrorCode::Forbidden,
            detail: format!(
                "no such lease: {} (expired, revoked, or never granted)",
                r.lease
            ),
        }),
    }
}

/// The marks, oldest first, as many as fit in half a frame.
fn marks(broker: &Broker) -> Message {
    let all = broker.marks().list();
    let mut marks = Vec::new();
    let mut bytes = 0;
    for m in &all {
        let w = m.wire();
        bytes += serde_json::to_vec(&w).map_or(0, |v| v.len()) + 1;
        if bytes > crate::marks::LIST_BYTES {
            break;
        }
        marks.push(w);
    }
    let left_off = (all.len() - marks.len()) as u64;
    Message::Marks(bxcore::Marks {
        marks,
        max: broker.marks().max() as u64,
        left_off,
    })
}

/// The owner clears a mark: recorded in the chain, then gone from the store. A record that
/// cannot be written clears nothing.
fn clear(broker: &Broker, r: &MarkRef, by: u32) -> Message {
    let found = broker.marks().find(&r.path);
    if found.is_empty() {
        return Message::Error(WireError {
            code: ErrorCode::Forbidden,
            detail: format!(
                "no mark names {:?} (bxctl marks lists them by path and by root/path)",
                r.path.chars().take(512).collect::<String>()
            ),
        });
    }
    let record = Draft {
        session: None,
        call: None,
        tool: None,
        event: Event::MarkCleared,
        detail: json!({
            "paths": found.iter().map(|m| m.path.display().to_string()).collect::<Vec<_>>(),
            "by": format!("uid {by}"),
        }),
    };
    if let Err(e) = broker.ledger().record(vec![record]) {
        bxharden::log::fail(&e);
        return Message::Error(WireError {
            code: ErrorCode::Internal,
            detail: e.pointed().to_string(),
        });
    }
    match broker.marks().clear(&r.path) {
        Ok(gone) => Message::MarkCleared(MarkCleared {
            cleared: gone.iter().map(crate::marks::Stored::wire).collect(),
        }),
        Err(e) => {
            bxharden::log::fail(&e);
            Message::Error(WireError {
                code: ErrorCode::Internal,
                detail: e.pointed().to_string(),
            })
        }
    }
}

/// A lease for the calls like `a`, granted by `by` and recorded in the chain before it counts;
/// or why not, and its runbook entry.
fn grant(broker: &Broker, a: &Approval, by: &By) -> Result<Lease, (String, String)> {
    let rule = a.rule.as_str();
    let scope = broker.place(&a.tool, &a.args);
    let covers = Covers {
        session: &a.session,
        tool: &a.tool,
        scope: &scope,
        rule,
    };
    let by = by.name();
    let lease = broker
        .leases()
        .grant(&covers, &by)
        .map_err(|e| (e.to_string(), e.anchor().to_string()))?;
    let record = Draft {
        session: Some(a.session.clone()),
        call: Some(a.call),
        tool: Some(a.tool.clone()),
        event: Event::Leased,
        detail: json!({
            "lease": lease.lease,
            "approval": a.approval,
            "scope": lease.scope,
            "rule": lease.rule,
            "by": lease.by,
            "expires": lease.expires,
        }),
    };
    if let Err(e) = broker.ledger().record(vec![record]) {
        broker.leases().revoke(&lease.lease);
        bxharden::log::fail(&e);
        return Err((e.to_string(), e.anchor().to_string()));
    }
    Ok(lease)
}

/// Verify the chain as far as it is written whole, while calls go on appending.
fn verify(broker: &Broker, head: Option<AuditHead>) -> Message {
    let audit = broker.ledger().audit();
    match chain::read_prefix(audit.path(), audit.written_len()) {
        Ok(bytes) => {
            let r = match head {
                Some(h) => chain::report_head(&bytes, h.seq, &h.hash),
                None => chain::report(&bytes),
            };
            Message::AuditReport(AuditReport {
                records: r.records,
                head: r.head,
                ok: r.ok,
                detail: r.detail,
            })
        }
        Err(e) => Message::Error(WireError {
            code: ErrorCode::Internal,
            detail: e.to_string(),
        }),
    }
}
