//! Pending approvals: held in memory only (a restart denies them, and the chain records it),
//! each bound to one waiting call. The owner's decision and the expiry race for the entry under
//! one lock, so exactly one of them wins.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bxcore::{Approval, ApprovalId, Timestamp};

/// How a slot was closed by someone other than its waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    Allow,
    Deny,
    /// The requester cancelled or went away.
    Withdraw,
}

#[derive(Debug)]
struct Slot {
    approval: Approval,
    tx: SyncSender<Close>,
}

/// The pending approvals.
#[derive(Debug, Default)]
pub struct Approvals {
    slots: Mutex<BTreeMap<ApprovalId, Slot>>,
}

/// How a pending approval ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approved,
    Denied,
    Expired,
    /// The requester cancelled, or went away, before the decision.
    Withdrawn,
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

fn verdict(close: Close) -> Verdict {
    match close {
        Close::Allow => Verdict::Approved,
        Close::Deny => Verdict::Denied,
        Close::Withdraw => Verdict::Withdrawn,
    }
}

/// The waiting side of one approval.
#[derive(Debug)]
pub struct Waiter {
    id: ApprovalId,
    rx: Receiver<Close>,
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

    /// The owner's decision on `id`.
    pub fn decide(&self, id: &ApprovalId, allow: bool) -> Result<Approval, DecideError> {
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
        let _ = slot.tx.send(if allow { Close::Allow } else { Close::Deny });
        Ok(slot.approval)
    }

    /// The requester of `id` cancelled or went away: the approval is no longer pending, and
    /// its waiter ends with `Withdrawn`. False when it was not pending (decided or expired).
    pub fn withdraw(&self, id: &ApprovalId) -> bool {
        match self.slots().remove(id) {
            Some(slot) => {
                let _ = slot.tx.send(Close::Withdraw);
                true
            }
            None => false,
        }
    }

    /// Wait for the decision on `w`, at most until its expiry.
    pub fn wait(&self, w: Waiter) -> Verdict {
        let left = w.until.saturating_duration_since(Instant::now());
        match w.rx.recv_timeout(left) {
            Ok(close) => return verdict(close),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        // Out of time: whoever removes the slot first wins. If the owner's decision took it
        // first, its answer is in the channel.
        if self.slots().remove(&w.id).is_some() {
            return Verdict::Expired;
        }
        match w.rx.try_recv() {
            Ok(close) => verdict(close),
            Err(_) => Verdict::Denied,
        }
    }

    /// Drop `w` without a verdict (the call could not be recorded as pending).
    pub fn abandon(&self, w: Waiter) {
        self.slots().remove(&w.id);
    }
}
