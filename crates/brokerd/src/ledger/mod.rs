//! The ledger: the one place that reads and raises session state and appends to the audit chain,
//! behind one lock, so two calls of one session never race past each other and a raise is never
//! lost to a concurrent one.

pub mod chain;
mod line;
pub mod lock;
pub mod record;

use std::sync::{Mutex, MutexGuard};

use crate::state::{StateError, StateStore};
use bxcore::runbook::Anchored;
use bxcore::{CallId, Label, SessionId};
use chain::{Audit, AuditError};
use record::{Draft, Event};
use serde_json::Value;

/// Why the ledger could not do a step: the state store's error or the chain's.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(transparent)]
    State(StateError),
    #[error(transparent)]
    Audit(AuditError),
}

impl Anchored for LedgerError {
    /// The runbook entry of the store's error or the chain's.
    fn anchor(&self) -> &str {
        match self {
            LedgerError::State(e) => e.anchor(),
            LedgerError::Audit(e) => e.anchor(),
        }
    }
}

/// The state store and the chain behind one lock.
#[derive(Debug)]
pub struct Ledger {
    lock: Mutex<()>,
    store: StateStore,
    audit: Audit,
}

impl Ledger {
    pub fn new(store: StateStore, audit: Audit) -> Ledger {
        Ledger {
            lock: Mutex::new(()),
            store,
            audit,
        }
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// The session's label, read under the lock.
    pub fn state(&self, session: &SessionId) -> Result<Label, StateError> {
        let _g = self.guard();
        self.store.read(session)
    }

    /// Append `drafts` and wait until they are durable: before the step they record.
    pub fn record(&self, drafts: Vec<Draft>) -> Result<(), LedgerError> {
        self.audit
            .commit(drafts)
            .map(|_| ())
            .map_err(LedgerError::Audit)
    }

    /// After a tool returned, or failed after it ran against a root's files: raise the
    /// session's state by what the call carried (written atomically when it changes), append the
    /// `event` record (`result` or `failed`), and wait until both are durable. Only then may the
    /// answer be sent.
    pub fn raise(
        &self,
        session: &SessionId,
        call: CallId,
        tool: &str,
        carried: Label,
        event: Event,
        mut detail: Value,
    ) -> Result<Label, LedgerError> {
        let (seq, raised) = {
            let _g = self.guard();
            let before = self.store.read(session).map_err(LedgerError::State)?;
            let raised = before.join(carried);
            if raised != before {
                self.store
                    .write(session, raised)
                    .map_err(LedgerError::State)?;
            }
            if let Value::Object(m) = &mut detail {
                m.insert("taint".into(), Value::String(raised.class.to_string()));
                m.insert("untrusted".into(), Value::Bool(raised.untrusted));
                m.insert("raised".into(), Value::Bool(raised != before));
            }
            let seq = self
                .audit
                .append(vec![Draft::call(session, call, tool, event, detail)])
                .map_err(LedgerError::Audit)?;
            (seq, raised)
        };
        self.audit.sync(seq).map_err(LedgerError::Audit)?;
        Ok(raised)
    }
}
