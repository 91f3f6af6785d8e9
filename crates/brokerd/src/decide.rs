//! One `decide.sock` connection: the channel daemon (channeld, on the device `bx-channel`)
//! shows and decides the approvals of its own sessions, naming who decided (`approver`, the
//! owner's Matrix id), which the audit chain records beside the peer's uid.
//!
//! The right is narrower than admin.sock's: no list of every pending approval, no audit, and
//! only approvals whose session is the channel's ([`channel_may_decide`]); any other is
//! refused `forbidden` exactly as an approval that is not pending, so the channel learns nothing
//! of the owner's other sessions. The socket belongs to the channel's user alone (its directory
//! and the peer check), so no other account holds this right.

use std::os::unix::net::UnixStream;

use bxcore::layout::DecideRequest;
use bxcore::{ApprovalDecision, ErrorCode, Message, SessionId, WireError};

use crate::approvals::{By, DecideError};
use crate::broker::{Broker, send};
use crate::config::Config;

/// The socket's name in the lines brokerd logs and the errors it sends.
pub const SOCKET: &str = "decide.sock";

/// The runbook entry of a decision decide.sock refuses.
pub const DECIDE_ANCHOR: &str = "decide-refused";

/// Whether the channel may decide the approvals of `session`.
///
/// The one place the right is checked. For now a channel's sessions are known by their name
/// (`[decide] session_prefix`, which loopd's `[bridge]` enforces on every turn the channel runs);
/// once brokerd mints sessions itself, this becomes a question of the session's provenance
/// (which socket created it) and nothing else changes. `docs/channels.md` says what the name rule
/// does not cover.
pub fn channel_may_decide(cfg: &Config, session: &SessionId) -> bool {
    session.as_str().starts_with(&cfg.decide.session_prefix)
}

/// Serve one `decide.sock` request (a kind its table accepts): one final answer.
pub fn handle(mut stream: UnixStream, id: u64, request: DecideRequest, broker: &Broker) {
    let response = match request {
        DecideRequest::ApprovalShow(s) => match broker.approvals().get(&s.approval) {
            Ok(a) if channel_may_decide(broker.cfg(), &a.session) => Message::Approval(a),
            Ok(_) => refused(&format!(
                "no such pending approval of the channel's sessions: {}",
                s.approval
            )),
            Err(e) => forbidden(e.to_string()),
        },
        DecideRequest::ApprovalDecision(d) => {
            let uid = bxharden::peers::peer_uid(&stream).unwrap_or(u32::MAX);
            decide(broker, d, uid)
        }
    };
    let _ = send(&mut stream, id, true, response);
}

fn forbidden(detail: String) -> Message {
    Message::Error(WireError {
        code: ErrorCode::Forbidden,
        detail,
    })
}

/// A refusal of the channel's right, logged with its pointer (the approval's id only: neither
/// the tool nor the arguments of another session are told).
fn refused(why: &str) -> Message {
    let pointer = bxcore::runbook::pointer(DECIDE_ANCHOR);
    bxharden::log::line(
        DECIDE_ANCHOR,
        &format!("brokerd: {SOCKET}: {why}; {pointer}"),
    );
    forbidden(format!("{why}; {pointer}"))
}

fn decide(broker: &Broker, d: ApprovalDecision, uid: u32) -> Message {
    let approver = match &d.approver {
        Some(a) if valid_approver(a) => a.clone(),
        Some(_) => {
            return refused(&format!(
                "the decision on {} names an approver that is not a user id (at most {} bytes, \
                 no control characters)",
                d.approval,
                bxcore::APPROVER_MAX
            ));
        }
        None => {
            return refused(&format!(
                "the decision on {} names no approver: decide.sock records who decided",
                d.approval
            ));
        }
    };
    match broker.approvals().pending(&d.approval) {
        Some(a) if channel_may_decide(broker.cfg(), &a.session) => {}
        Some(_) => {
            return refused(&format!(
                "no such pending approval of the channel's sessions: {}",
                d.approval
            ));
        }
        None => return forbidden(DecideError::NotPending(d.approval).to_string()),
    }
    let by = By {
        uid,
        approver: Some(approver),
    };
    crate::admin::decide(broker, d, by)
}

/// A name the chain may carry: 1 to [`bxcore::APPROVER_MAX`] bytes, no control character.
fn valid_approver(a: &str) -> bool {
    !a.is_empty() && a.len() <= bxcore::APPROVER_MAX && !a.chars().any(char::is_control)
}
