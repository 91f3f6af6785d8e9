//! Approvals in the chat. A `tool_pending` of a turn from a room is posted to that room, and
//! only to it, with what the owner needs to decide: the tool, the arguments summarised and
//! escaped, their size and digest, the session, the rule and why it asks, and the expiry. The
//! owner answers with a reaction on that message (✅ or 👍 to approve, ❌ or 👎 to deny) or a
//! reply to it (`yes` / `no`); only a paired owner counts, and the answer is bound to that one
//! approval by the message it relates to. The decision goes to brokerd on decide.sock with the
//! owner's Matrix id as the approver, never through loopd.
//!
//! An answer is taken once: the approval leaves the table before brokerd is asked, so a second
//! reaction, a replayed event or an answer after the expiry is refused (the owner is told, and
//! nothing is decided). A stranger's reaction or reply does nothing at all.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bxcore::visible::Mode;
use bxcore::{ApprovalDecision, ApprovalId, ApprovalShow, Message, Timestamp, client};

use crate::channel::{Channel, lock};
use crate::render;
use crate::turn::{args_summary, txn_digest};

/// The runbook anchor of an approval the channel could not show or decide.
pub const APPROVAL_ANCHOR: &str = "channel-approval-failed";

/// How long brokerd has to answer on decide.sock.
const DECIDE_WITHIN: Duration = Duration::from_secs(10);

/// How many answered approvals are remembered, to tell the owner a late or second answer was
/// refused.
const DONE_MAX: usize = 256;

/// One approval posted to a room.
#[derive(Debug, Clone)]
pub struct Posted {
    pub approval: ApprovalId,
    pub room: String,
    pub expires: Timestamp,
    /// The code shown with it: 6 hex digits of the sha256 of the approval's id and digest.
    pub code: String,
}

#[derive(Debug, Default)]
struct Table {
    /// By the event id of the message that asks.
    pending: BTreeMap<String, Posted>,
    /// The messages whose approval was answered or ran out, and how.
    done: VecDeque<(String, &'static str)>,
}

/// The approvals the channel asked in its rooms.
#[derive(Debug, Default)]
pub struct Approvals {
    table: std::sync::Mutex<Table>,
}

impl Approvals {
    /// How many are waiting for the owner.
    pub fn waiting(&self) -> usize {
        lock(&self.table).pending.len()
    }

    fn finish(&self, event: &str, how: &'static str) -> Option<Posted> {
        let mut t = lock(&self.table);
        let p = t.pending.remove(event);
        if p.is_some() {
            t.done.push_back((event.to_string(), how));
            while t.done.len() > DONE_MAX {
                t.done.pop_front();
            }
        }
        p
    }

    /// Move the approvals whose time ran out to the answered ones (as past their expiry), so the
    /// table holds at most what brokerd still has pending.
    fn forget_expired(&self) {
        let now = Timestamp::now();
        let gone: Vec<String> = lock(&self.table)
            .pending
            .iter()
            .filter(|(_, p)| p.expires <= now)
            .map(|(e, _)| e.clone())
            .collect();
        for e in gone {
            self.finish(&e, "past its expiry");
        }
    }

    fn done(&self, event: &str) -> Option<&'static str> {
        lock(&self.table)
            .done
            .iter()
            .find(|(e, _)| e == event)
            .map(|(_, how)| *how)
    }
}

fn when(t: Timestamp) -> String {
    let secs = t.0 / 1000;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let left = t.0.saturating_sub(Timestamp::now().0) / 1000;
    format!(
        "{h:02}:{m:02}:{s:02} UTC, in {} min {} s",
        left / 60,
        left % 60
    )
}

/// Ask in `room` for the approval `id` of the turn that answers `source`.
pub fn post(ch: &Channel, room: &str, id: &ApprovalId, expires: Timestamp, source: &str) {
    let shown = client::call(
        &ch.cfg.sockets.decide,
        DECIDE_WITHIN,
        1,
        Message::ApprovalShow(ApprovalShow {
            approval: id.clone(),
        }),
        |_| {},
    );
    let text = match shown {
        Ok(Message::Approval(a)) => {
            let code = txn_digest(&format!("{}{}", a.approval, a.digest))[..6].to_string();
            let args_bytes = bxcore::canonical::to_string(&a.args).len();
            let text = format!(
                "Approval needed [{code}]\n\
                 Tool: {tool}\n\
                 Arguments: {args} ({args_bytes} bytes, sha256 {digest}…)\n\
                 Session: {session} (taint {taint}{untrusted})\n\
                 Why: {reason} (rule {rule})\n\
                 Expires: {expires}\n\
                 React ✅ to approve, 🔁 to approve this and the calls like it ({lease}), or ❌ \
                 to deny; or reply yes, always or no to this message.",
                tool = render::shown(&a.tool, Mode::Line),
                lease = render::shown(&a.lease_scope, Mode::Line),
                args = args_summary(&a.args),
                digest = &a.digest[..a.digest.len().min(16)],
                session = a.session,
                taint = a.taint,
                untrusted = if a.untrusted {
                    ", has read third-party text"
                } else {
                    ""
                },
                reason = render::shown(&a.reason, Mode::Line),
                rule = render::shown(&a.rule, Mode::Line),
                expires = when(a.expires),
            );
            Some((text, code, a.expires))
        }
        Ok(other) => {
            fail(&format!(
                "approval_show {id} was answered with {}",
                other.kind()
            ));
            None
        }
        Err(e) => {
            fail(&format!(
                "cannot show the approval {id} on decide.sock: {e}"
            ));
            None
        }
    };
    let Some((text, code, expires)) = text.or_else(|| {
        let note = format!(
            "An approval is pending ({id}), but the channel could not show it. Decide it with \
             bxctl approvals on the device. Expires: {}",
            when(expires)
        );
        Some((note, String::new(), expires))
    }) else {
        return;
    };
    let txn = format!("a-{}-{}", txn_digest(source), id);
    let content = render::plain(&text).content("m.notice");
    let within = Duration::from_millis(ch.cfg.limits.request_ms);
    if let Some(event) = crate::turn::send_retrying(ch, room, &txn, &content, within) {
        if !code.is_empty() {
            ch.approvals.forget_expired();
            lock(&ch.approvals.table).pending.insert(
                event,
                Posted {
                    approval: id.clone(),
                    room: room.to_string(),
                    expires,
                    code,
                },
            );
        }
    }
}

fn fail(line: &str) {
    bxharden::runbook!(APPROVAL_ANCHOR, "{line}");
}

/// What the owner said to an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// Run it; with `lease`, the calls like it too, for the lease's time in this session.
    Allow {
        lease: bool,
    },
    Deny,
}

/// What a reaction's key says: approve, approve with a lease, deny, or nothing.
fn verdict_of_key(key: &str) -> Option<Said> {
    let key = key.trim_end_matches('\u{fe0f}');
    match key {
        "✅" | "👍" | "✔" | "☑" => Some(Said::Allow { lease: false }),
        "🔁" | "♾" => Some(Said::Allow { lease: true }),
        "❌" | "👎" | "✖" | "🚫" => Some(Said::Deny),
        _ => None,
    }
}

/// What a reply's text says (the quoted fallback lines of older clients left out).
fn verdict_of_reply(body: &str) -> Option<Said> {
    let said: String = body
        .lines()
        .filter(|l| !l.starts_with('>'))
        .collect::<Vec<_>>()
        .join(" ");
    let word = said.trim().trim_end_matches(['.', '!']).to_lowercase();
    match word.as_str() {
        "yes" | "y" | "approve" | "approved" | "allow" | "ok" | "✅" | "👍" => {
            Some(Said::Allow { lease: false })
        }
        "always" | "lease" | "for this session" | "🔁" => Some(Said::Allow { lease: true }),
        "no" | "n" | "deny" | "denied" | "refuse" | "❌" | "👎" => Some(Said::Deny),
        _ => None,
    }
}

/// The owner's reaction `key` on the event `target` in `room`.
pub fn reaction(ch: &Channel, room: &str, sender: &str, target: &str, key: &str) {
    if let Some(said) = verdict_of_key(key) {
        answer(ch, room, sender, target, said, &format!("{target}{key}"));
    }
}

/// The owner's reply `body` to the event `target`: whether it was an answer to an approval.
pub fn reply(ch: &Channel, room: &str, sender: &str, target: &str, body: &str) -> bool {
    let known = lock(&ch.approvals.table).pending.contains_key(target)
        || ch.approvals.done(target).is_some();
    if !known {
        return false;
    }
    match verdict_of_reply(body) {
        Some(said) => answer(ch, room, sender, target, said, &format!("{target}{body}")),
        None => {
            ch.notice(
                room,
                &format!("what-{}", txn_digest(&format!("{target}{body}"))),
                "That reply is not an answer: reply yes, always or no, or react ✅, 🔁 or ❌.",
                Duration::from_millis(ch.cfg.limits.request_ms),
            );
        }
    }
    true
}

fn answer(ch: &Channel, room: &str, sender: &str, target: &str, answer: Said, said: &str) {
    let (allow, lease) = match answer {
        Said::Allow { lease } => (true, lease),
        Said::Deny => (false, false),
    };
    let within = Duration::from_millis(ch.cfg.limits.request_ms);
    let txn = format!("d-{}", txn_digest(said));
    let posted = {
        let t = lock(&ch.approvals.table);
        t.pending.get(target).cloned()
    };
    let Some(p) = posted else {
        if let Some(how) = ch.approvals.done(target) {
            ch.notice(
                room,
                &txn,
                &format!("Refused: that approval was {how} already; nothing more was done."),
                within,
            );
        }
        return;
    };
    if p.room != room {
        return;
    }
    if Timestamp::now() >= p.expires {
        ch.approvals.finish(target, "past its expiry");
        ch.notice(
            room,
            &txn,
            &format!(
                "Refused: the approval [{}] expired before this answer; the call was denied.",
                p.code
            ),
            within,
        );
        return;
    }
    // Taken once: a second answer finds it gone.
    let Some(p) = ch.approvals.finish(target, "answered") else {
        return;
    };
    let decided = client::call(
        &ch.cfg.sockets.decide,
        DECIDE_WITHIN,
        2,
        Message::ApprovalDecision(ApprovalDecision {
            approval: p.approval.clone(),
            allow,
            lease,
            approver: Some(sender.to_string()),
        }),
        |_| {},
    );
    let who = render::shown(sender, Mode::Line);
    let text = match decided {
        Ok(Message::ApprovalAck(_)) if lease => format!(
            "Approved [{}] by {who}, with the calls like it for the lease's time in this \
             session (bxctl approvals --leases; bxctl approvals revoke ends it).",
            p.code
        ),
        Ok(Message::ApprovalAck(_)) if allow => format!("Approved [{}] by {who}.", p.code),
        Ok(Message::ApprovalAck(_)) => format!("Denied [{}] by {who}.", p.code),
        Ok(other) => {
            fail(&format!(
                "approval_decision {} was answered with {}",
                p.approval,
                other.kind()
            ));
            format!(
                "The decision on [{}] was not taken: brokerd answered oddly.",
                p.code
            )
        }
        Err(client::ClientError::Remote(e)) => format!(
            "The decision on [{}] was refused: {}",
            p.code,
            render::shown(&e.detail, Mode::Line)
        ),
        Err(e) => {
            fail(&format!(
                "cannot decide the approval {} on decide.sock: {e}",
                p.approval
            ));
            format!(
                "The decision on [{}] could not be delivered ({}); decide it with bxctl approvals.",
                p.code,
                render::shown(&e.to_string(), Mode::Line)
            )
        }
    };
    ch.notice(room, &txn, &text, within);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reactions_and_replies_say_yes_or_no() {
        let yes = Some(Said::Allow { lease: false });
        let always = Some(Said::Allow { lease: true });
        assert_eq!(verdict_of_key("✅"), yes);
        assert_eq!(verdict_of_key("👍\u{fe0f}"), yes);
        assert_eq!(verdict_of_key("🔁"), always);
        assert_eq!(verdict_of_key("❌"), Some(Said::Deny));
        assert_eq!(verdict_of_key("😀"), None);
        assert_eq!(verdict_of_reply("> <@box:x> Approval needed\n\nYes."), yes);
        assert_eq!(verdict_of_reply("Always."), always);
        assert_eq!(verdict_of_reply("no"), Some(Said::Deny));
        assert_eq!(verdict_of_reply("maybe later"), None);
    }
}
