//! Leases: the owner's "allow for this session". An owner asked about the same kind of call
//! again and again (each write into the notes of a session that read a mail) answers once with a
//! lease; while it lives, a call of that session that the policy would put to the owner for the
//! same rule, of the same tool, landing in the same place (`root notes`, `host example.org`),
//! runs without asking and is recorded as approved by the lease.
//!
//! A lease answers the policy's `ask`, never its `deny`: it is looked for only after the whole
//! decision (write-down, egress, the leak check) said "ask". It is held in memory only, like the
//! pending approvals (a restart ends every lease), bounded per session and in all, and ends at
//! its expiry or when the owner revokes it (`bxctl approvals --leases`).

use std::sync::{Mutex, MutexGuard};

use bxcore::runbook::Anchored;
use bxcore::{Lease, LeaseId, SessionId, Timestamp};

/// How many leases the table holds (`[approvals]` in brokerd.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a lease lives, in milliseconds.
    pub ttl_ms: u64,
    /// The most leases one session may hold at once.
    pub per_session: usize,
    /// The most leases in all.
    pub total: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            ttl_ms: 60 * 60 * 1000,
            per_session: 16,
            total: 128,
        }
    }
}

/// Why a lease was not granted (the call it came with is approved all the same).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("session {session} holds {max} leases already; revoke one first")]
    SessionFull { session: SessionId, max: usize },
    #[error("{max} leases are held already; revoke one first")]
    Full { max: usize },
}

/// The runbook entry of a lease that was not granted.
pub const FULL_ANCHOR: &str = "leases-full";

impl Anchored for Refused {
    fn anchor(&self) -> &str {
        FULL_ANCHOR
    }
}

/// What a lease covers: the session, the tool, where its calls land, the rule that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Covers<'a> {
    pub session: &'a SessionId,
    pub tool: &'a str,
    pub scope: &'a str,
    pub rule: &'a str,
}

impl Covers<'_> {
    fn matches(&self, l: &Lease) -> bool {
        l.session == *self.session
            && l.tool == self.tool
            && l.scope == self.scope
            && l.rule == self.rule
    }
}

/// The live leases.
#[derive(Debug, Default)]
pub struct Leases {
    held: Mutex<Vec<Lease>>,
    limits: Limits,
}

impl Leases {
    pub fn new(limits: Limits) -> Leases {
        Leases {
            held: Mutex::new(Vec::new()),
            limits,
        }
    }

    /// The table with the expired leases dropped.
    fn live(&self) -> MutexGuard<'_, Vec<Lease>> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let now = Timestamp::now();
        held.retain(|l| l.expires > now);
        held
    }

    /// Grant a lease for what `covers` names, by `by`. One that covers the same is renewed.
    pub fn grant(&self, covers: &Covers<'_>, by: &str) -> Result<Lease, Refused> {
        let mut held = self.live();
        let now = Timestamp::now();
        let expires = now.plus_millis(self.limits.ttl_ms);
        if let Some(l) = held.iter_mut().find(|l| covers.matches(l)) {
            l.expires = expires;
            l.by = by.to_string();
            return Ok(l.clone());
        }
        if held.len() >= self.limits.total {
            return Err(Refused::Full {
                max: self.limits.total,
            });
        }
        if held.iter().filter(|l| l.session == *covers.session).count() >= self.limits.per_session {
            return Err(Refused::SessionFull {
                session: covers.session.clone(),
                max: self.limits.per_session,
            });
        }
        let lease = Lease {
            lease: LeaseId::random(),
            session: covers.session.clone(),
            tool: covers.tool.to_string(),
            scope: covers.scope.to_string(),
            rule: covers.rule.to_string(),
            by: by.to_string(),
            granted: now,
            expires,
        };
        held.push(lease.clone());
        Ok(lease)
    }

    /// The live lease that covers a call, if any.
    pub fn find(&self, covers: &Covers<'_>) -> Option<Lease> {
        self.live().iter().find(|l| covers.matches(l)).cloned()
    }

    /// Every live lease, the oldest first.
    pub fn list(&self) -> Vec<Lease> {
        self.live().clone()
    }

    /// End the lease `id`; `None` when it is not live.
    pub fn revoke(&self, id: &LeaseId) -> Option<Lease> {
        let mut held = self.live();
        let at = held.iter().position(|l| l.lease == *id)?;
        Some(held.remove(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(s: &str) -> SessionId {
        SessionId::new(s).unwrap()
    }

    fn covers<'a>(session: &'a SessionId, scope: &'a str) -> Covers<'a> {
        Covers {
            session,
            tool: "workspace_write",
            scope,
            rule: "untrusted-effect",
        }
    }

    #[test]
    fn a_lease_covers_its_session_tool_place_and_rule_only() {
        let t = Leases::default();
        let (s1, s2) = (sid("s1"), sid("s2"));
        t.grant(&covers(&s1, "root notes"), "uid 1000").unwrap();
        assert!(t.find(&covers(&s1, "root notes")).is_some());
        assert!(
            t.find(&covers(&s2, "root notes")).is_none(),
            "another session"
        );
        assert!(
            t.find(&covers(&s1, "root inbox")).is_none(),
            "another place"
        );
        let other_tool = Covers {
            tool: "run",
            ..covers(&s1, "root notes")
        };
        assert!(t.find(&other_tool).is_none(), "another tool");
        let other_rule = Covers {
            rule: "approval-always",
            ..covers(&s1, "root notes")
        };
        assert!(t.find(&other_rule).is_none(), "another rule");
    }

    #[test]
    fn a_revoked_or_expired_lease_covers_nothing() {
        let s1 = sid("s1");
        let t = Leases::default();
        let l = t.grant(&covers(&s1, "root notes"), "uid 1000").unwrap();
        assert_eq!(t.revoke(&l.lease).unwrap().lease, l.lease);
        assert!(t.find(&covers(&s1, "root notes")).is_none());
        assert!(t.revoke(&l.lease).is_none());
        let short = Leases::new(Limits {
            ttl_ms: 0,
            ..Limits::default()
        });
        short.grant(&covers(&s1, "root notes"), "uid 1000").unwrap();
        assert!(short.find(&covers(&s1, "root notes")).is_none());
        assert!(short.list().is_empty());
    }

    #[test]
    fn the_table_is_bounded_per_session_and_in_all() {
        let t = Leases::new(Limits {
            ttl_ms: 60_000,
            per_session: 2,
            total: 3,
        });
        let (s1, s2) = (sid("s1"), sid("s2"));
        t.grant(&covers(&s1, "root a"), "u").unwrap();
        t.grant(&covers(&s1, "root b"), "u").unwrap();
        // The same again renews, and takes no room.
        t.grant(&covers(&s1, "root b"), "u").unwrap();
        assert!(matches!(
            t.grant(&covers(&s1, "root c"), "u"),
            Err(Refused::SessionFull { .. })
        ));
        t.grant(&covers(&s2, "root a"), "u").unwrap();
        assert!(matches!(
            t.grant(&covers(&s2, "root b"), "u"),
            Err(Refused::Full { .. })
        ));
        assert_eq!(t.list().len(), 3);
    }
}
