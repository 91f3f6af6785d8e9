//! One `admin.sock` connection: the owner lists pending approvals, decides one, or asks for the
//! audit chain to be verified. Only the owner's account may connect (the socket's owner and the
//! peer check), so only the owner approves.

use std::os::unix::net::UnixStream;

use bxcore::{ApprovalAck, Approvals, AuditReport, Envelope, ErrorCode, Message, WireError};

use crate::broker::{Broker, send};
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
        Message::ApprovalDecision(d) => match broker.approvals().decide(&d.approval, d.allow) {
            Ok(_) => Message::ApprovalAck(ApprovalAck {
                approval: d.approval,
            }),
            Err(e) => Message::Error(WireError {
                code: ErrorCode::Forbidden,
                detail: e.to_string(),
            }),
        },
        Message::AuditVerify {} => verify(broker),
        other => {
            bxharden::serve::unhandled(&mut stream, id, &other);
            return;
        }
    };
    let _ = send(&mut stream, id, true, response);
}

/// Verify the chain as far as it is written whole, while calls go on appending.
fn verify(broker: &Broker) -> Message {
    let audit = broker.ledger().audit();
    match chain::read_prefix(audit.path(), audit.written_len()) {
        Ok(bytes) => {
            let r = chain::report(&bytes);
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
