//! Pending approvals: held in memory only (a restart denies them, and the chain records it),
//! each bound to one waiting call. The owner's decision and the expiry race for the entry under
//! one lock, so exactly one of them wins.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bxcore::{Approval, ApprovalId, Timestamp};

#[derive(Debug)]
struct Slot {
    approval: Approval,
    tx: SyncSender<Verdict>,
}

/// The pending approvals.
#[derive(Debug, Default)]
pub struct Approvals {
    slots: Mutex<BTreeMap<ApprovalId, Slot>>,
}

/// How a pending approval ended; `by` is the uid of the account that decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Approved {
        by: u32,
    },
    /// The owner denied it, or approved it while the policy, asked again, denied it (`reason`).
    Denied {
        by: u32,
        reason: Option<String>,
    },
    Expired,
}

/// Why a decision was refused (`error forbidden`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideError {
    /// Not pending: never was, decided already, or its call is over.
    NotPending(ApprovalId),
    /// Its time ran out before the decision came.
    Expired(ApprovalId),
}

impl fmt::Display for DecideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecideError::NotPending(id) => write!(f, "no such pending approval: {id}"),
            DecideError::Expired(id) => write!(
                f,
                "the approval {id} expired before the decision came; the call was denied"
            ),
        }
    }
}

impl std::error::Error for DecideError {}

/// The waiting side of one approval.
#[derive(Debug)]
pub struct Waiter {
    id: ApprovalId,
    rx: Receiver<Verdict>,
    until: Instant,
}

impl Approvals {
    fn slots(&self) -> MutexGuard<'_, BTreeMap<ApprovalId, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hold `approval` until the owner decides or `ttl` passes.
    pub fn open(&self, approval: Approval, ttl: Duration) -> Waiter {
        let (tx, rx) = mpsc::sync_channel(1);
        let id = approval.approval.clone();
        self.slots().insert(id.clone(), Slot { approval, tx });
        Waiter {
            id,
            rx,
            until: Instant::now() + ttl,
        }
    }

    /// What the owner sees, oldest first.
    pub fn list(&self) -> Vec<Approval> {
        let now = Timestamp::now();
        let mut v: Vec<Approval> = self
            .slots()
            .values()
            .filter(|s| s.approval.expires > now)
            .map(|s| s.approval.clone())
            .collect();
        v.sort_by_key(|a| a.requested);
        v
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
            by: 0,
            reason: Some("the approval ended without a decision".to_string()),
        })
    }

    /// Drop `w` without a verdict (the call could not be recorded as pending).
    pub fn abandon(&self, w: Waiter) {
        self.slots().remove(&w.id);
    }
}
