//! Pending approvals: held in memory only (a restart denies them, and the chain records it),
//! each bound to one waiting call. The owner's decision and the expiry race for the entry under
//! one lock, so exactly one of them wins.
//!
//! The table is bounded so the owner's view stays alive whatever the model asks: arguments
//! larger than the view holds, more pending than one session may have, or more than all may
//! have, are refused at the door (the call is denied with the reason and a runbook pointer),
//! never queued.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bxcore::runbook::Anchored;
use bxcore::{Approval, ApprovalId, ApprovalSummary, SessionId, Timestamp};

#[derive(Debug)]
struct Slot {
    approval: Approval,
    summary: ApprovalSummary,
    tx: SyncSender<Verdict>,
}

/// How much the table holds (`[approvals]` in brokerd.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest arguments (canonical JSON, bytes) put to the owner.
    pub max_args_bytes: usize,
    /// The most approvals pending at once for one session.
    pub max_per_session: usize,
    /// The most approvals pending at once in all.
    pub max_pending: usize,
}

impl Default for Limits {
    /// The bounds of brokerd.toml's `[approvals]` when it says none: sized for one owner.
    fn default() -> Limits {
        Limits {
            max_args_bytes: 256 * 1024,
            max_per_session: 8,
            max_pending: 64,
        }
    }
}

/// The pending approvals.
#[derive(Debug)]
pub struct Approvals {
    slots: Mutex<BTreeMap<ApprovalId, Slot>>,
    limits: Limits,
}

/// Why a call was not put to the owner: the table's bounds. The call is denied with this text
/// and its pointer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The arguments are larger than the owner's view holds.
    #[error(
        "the arguments are {bytes} bytes, more than the {max} an approval may show the owner; the \
         call was not put to the owner"
    )]
    TooLarge { bytes: usize, max: usize },
    /// The session has as many approvals pending as it may.
    #[error(
        "session {session} already has {max} approvals waiting for the owner; the call was not \
         put to the owner"
    )]
    SessionFull { session: SessionId, max: usize },
    /// As many approvals are pending as the box holds.
    #[error("{max} approvals are already waiting for the owner; the call was not put to the owner")]
    Full { max: usize },
}

/// The runbook entry of arguments too large for the owner's view.
pub const TOO_LARGE_ANCHOR: &str = "approval-too-large";

/// The runbook entry of a full approvals table.
pub const FULL_ANCHOR: &str = "approvals-full";

impl Anchored for Refused {
    /// The runbook entry that explains it.
    fn anchor(&self) -> &str {
        match self {
            Refused::TooLarge { .. } => TOO_LARGE_ANCHOR,
            Refused::SessionFull { .. } | Refused::Full { .. } => FULL_ANCHOR,
        }
    }
}

/// Who decided: the uid of the account that connected, and, through a channel (decide.sock),
/// the approver the channel names (a Matrix user id). The audit chain records both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct By {
    pub uid: u32,
    pub approver: Option<String>,
}

impl By {
    /// The account `uid`, deciding itself (admin.sock).
    pub fn uid(uid: u32) -> By {
        By {
            uid,
            approver: None,
        }
    }

    /// Who decided, for a person and a lease: the approver when there is one (a Matrix id),
    /// else `uid N`.
    pub fn name(&self) -> String {
        match &self.approver {
            Some(a) => a.clone(),
            None => format!("uid {}", self.uid),
        }
    }

    /// `fields` (an object) with `by` and, when there is one, `approver` added.
    pub fn record(&self, mut fields: serde_json::Value) -> serde_json::Value {
        if let Some(o) = fields.as_object_mut() {
            o.insert("by".into(), self.uid.into());
            if let Some(a) = &self.approver {
                o.insert("approver".into(), a.clone().into());
            }
        }
        fields
    }
}

/// How a pending approval ended; `by` is who decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Approved {
        by: By,
    },
    /// The owner denied it, or approved it while the policy, asked again, denied it (`reason`).
    Denied {
        by: By,
        reason: Option<String>,
    },
    Expired,
    /// The requester cancelled, or went away, before the decision.
    Withdrawn,
}

/// The runbook entry of a decision on an approval that no longer waits.
pub const NOT_PENDING_ANCHOR: &str = "approval-not-pending";

/// Why a decision was refused (`error forbidden`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// Not pending: never was, decided already, or its call is over.
    #[error(
        "no such pending approval: {0} (answered already, expired, withdrawn when its turn \
         ended, or never asked; `bxctl approvals` lists those that wait); {pointer}",
        pointer = bxcore::runbook::pointer(NOT_PENDING_ANCHOR)
    )]
    NotPending(ApprovalId),
    /// Its time ran out before the decision came.
    #[error(
        "the approval {0} expired before the decision came; the call was denied; {pointer}",
        pointer = bxcore::runbook::pointer(NOT_PENDING_ANCHOR)
    )]
    Expired(ApprovalId),
}

/// The waiting side of one approval.
#[derive(Debug)]
pub struct Waiter {
    id: ApprovalId,
    rx: Receiver<Verdict>,
    until: Instant,
}

impl Default for Approvals {
    /// An empty table with the default bounds of brokerd.toml.
    fn default() -> Approvals {
        Approvals::new(Limits::default())
    }
}

impl Approvals {
    /// An empty table with these bounds.
    pub fn new(limits: Limits) -> Approvals {
        Approvals {
            slots: Mutex::new(BTreeMap::new()),
            limits,
        }
    }

    fn slots(&self) -> MutexGuard<'_, BTreeMap<ApprovalId, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hold `approval` until the owner decides or `ttl` passes, if the table's bounds allow it.
    pub fn open(&self, approval: Approval, ttl: Duration) -> Result<Waiter, Refused> {
        let summary = approval.summary();
        let bytes = summary.args_bytes as usize;
        if bytes > self.limits.max_args_bytes {
            return Err(Refused::TooLarge {
                bytes,
                max: self.limits.max_args_bytes,
            });
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let id = approval.approval.clone();
        let mut slots = self.slots();
        // An expired slot whose waiter has not woken yet still counts: it is still pending.
        if slots.len() >= self.limits.max_pending {
            return Err(Refused::Full {
                max: self.limits.max_pending,
            });
        }
        let mine = slots
            .values()
            .filter(|s| s.approval.session == approval.session)
            .count();
        if mine >= self.limits.max_per_session {
            return Err(Refused::SessionFull {
                session: approval.session.clone(),
                max: self.limits.max_per_session,
            });
        }
        slots.insert(
            id.clone(),
            Slot {
                approval,
                summary,
                tx,
            },
        );
        Ok(Waiter {
            id,
            rx,
            until: Instant::now() + ttl,
        })
    }

    /// What the owner sees first: a summary of each, oldest first.
    pub fn list(&self) -> Vec<ApprovalSummary> {
        let now = Timestamp::now();
        let mut v: Vec<ApprovalSummary> = self
            .slots()
            .values()
            .filter(|s| s.approval.expires > now)
            .map(|s| s.summary.clone())
            .collect();
        v.sort_by_key(|a| a.requested);
        v
    }

    /// One pending approval whole.
    pub fn get(&self, id: &ApprovalId) -> Result<Approval, DecideError> {
        let slots = self.slots();
        match slots.get(id) {
            Some(s) if s.approval.expires > Timestamp::now() => Ok(s.approval.clone()),
            Some(_) => Err(DecideError::Expired(id.clone())),
            None => Err(DecideError::NotPending(id.clone())),
        }
    }

    /// The approval `id` while it is pending.
    pub fn pending(&self, id: &ApprovalId) -> Option<Approval> {
        self.slots().get(id).map(|s| s.approval.clone())
    }

    /// The decision on `id`.
    pub fn decide(&self, id: &ApprovalId, verdict: Verdict) -> Result<Approval, DecideError> {
        let mut slots = self.slots();
        let Some(slot) = slots.get(id) else {
            return Err(DecideError::NotPending(id.clone()));
        };
        if Timestamp::now() >= slot.approval.expires {
            return Err(DecideError::Expired(id.clone()));
        }
        let slot = slots
            .remove(id)
            .ok_or_else(|| DecideError::NotPending(id.clone()))?;
        // The waiter holds the receiver until it removed the slot itself, so this cannot fail
        // while the slot was still in the table.
        let _ = slot.tx.send(verdict);
        Ok(slot.approval)
    }

    /// The requester of `id` cancelled or went away: the approval is no longer pending, and
    /// its waiter ends with `Withdrawn`. False when it was not pending (decided or expired).
    pub fn withdraw(&self, id: &ApprovalId) -> bool {
        match self.slots().remove(id) {
            Some(slot) => {
                let _ = slot.tx.send(Verdict::Withdrawn);
                true
            }
            None => false,
        }
    }

    /// Wait for the decision on `w`, at most until its expiry.
    pub fn wait(&self, w: Waiter) -> Verdict {
        let left = w.until.saturating_duration_since(Instant::now());
        match w.rx.recv_timeout(left) {
            Ok(v) => return v,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        // Out of time: whoever removes the slot first wins. If the owner's decision took it
        // first, its answer is in the channel.
        if self.slots().remove(&w.id).is_some() {
            return Verdict::Expired;
        }
        w.rx.try_recv().unwrap_or(Verdict::Denied {
            by: By::uid(0),
            reason: Some("the approval ended without a decision".to_string()),
        })
    }

    /// Drop `w` without a verdict (the call could not be recorded as pending).
    pub fn abandon(&self, w: Waiter) {
        self.slots().remove(&w.id);
    }
}
