//! One `admin.sock` connection: the owner lists pending approvals (summaries), shows one whole,
//! decides one, or asks for the audit chain to be verified. Only the owner's account may connect
//! (the socket's owner and the peer check), so only the owner approves.

use std::os::unix::net::UnixStream;

use bxcore::{
    ApprovalAck, ApprovalDecision, Approvals, AuditHead, AuditReport, Envelope, ErrorCode, Message,
    WireError,
};

use crate::approvals::{By, Verdict};
use crate::broker::{Broker, Redecision, send};
use crate::ledger::chain;

/// The socket's name in the lines brokerd logs and the errors it sends.
pub const SOCKET: &str = "admin.sock";

/// Serve one `admin.sock` request (a kind its table accepts): one final answer.
pub fn handle(mut stream: UnixStream, envelope: Envelope, broker: &Broker) {
    let id = envelope.id;
    let response = match envelope.msg {
        Message::ApprovalsList {} => Message::Approvals(Approvals {
            pending: broker.approvals().list(),
        }),
        Message::ApprovalShow(s) => match broker.approvals().get(&s.approval) {
            Ok(a) => Message::Approval(a),
            Err(e) => Message::Error(WireError {
                code: ErrorCode::Forbidden,
                detail: e.to_string(),
            }),
        },
        Message::ApprovalDecision(d) => {
            let uid = bxharden::peers::peer_uid(&stream).unwrap_or(u32::MAX);
            let by = By {
                uid,
                approver: d.approver.clone(),
            };
            decide(broker, d, by)
        }
        Message::AuditVerify {} => verify(broker, None),
        Message::AuditVerifyHead(h) => verify(broker, Some(h)),
        other => {
            bxharden::serve::unhandled(&mut stream, id, &other);
            return;
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
    let verdict = if !d.allow {
        Verdict::Denied { by, reason: None }
    } else {
        let now = broker
            .approvals()
            .pending(&d.approval)
            .map(|a| broker.redecide(&a.session, &a.tool, &a.args));
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
            Some(Redecision::Runs(_)) | None => Verdict::Approved { by },
        }
    };
    let refused = match &verdict {
        Verdict::Denied {
            reason: Some(r), ..
        } => Some(r.clone()),
        _ => None,
    };
    match broker.approvals().decide(&d.approval, verdict) {
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
            (None, None) => Message::ApprovalAck(ApprovalAck {
                approval: d.approval,
            }),
        },
        Err(e) => forbidden(e.to_string()),
    }
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
