//! brokerd, the tool broker: the model proposes, the broker disposes.
//!
//! Every tool call from loopd passes the policy (`policy`), which decides from what the session
//! has read (`state`, raised by the `ledger`) and what the tool declares (`toolkit`); risky calls
//! wait for the owner (`approvals`, on `admin.sock`), or run under a lease the owner gave for
//! the session (`leases`); every step is in a hash-chained audit log
//! that is durable before the step takes effect (`ledger::chain`). memoryd asks a session's state
//! on `state.sock`.

pub mod admin;
pub mod approvals;
pub mod broker;
pub mod config;
pub mod daemon;
pub mod decide;
pub mod declare;
pub mod dirs;
pub mod fingerprints;
pub mod leases;
pub mod ledger;
pub mod marks;
pub mod policy;

pub mod state;
pub mod state_socket;
