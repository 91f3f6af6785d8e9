//! memoryd: every finished turn filed by its session's class, and the owner's memory recalled.
//!
//! loopd hands each finished turn to memory.sock (`turn_record`); memoryd answers `turn_filed`
//! once the turn is durable in its own outbox, then asks brokerd's state.sock for the session's
//! `(class, untrusted)` and files the turn by `[[routes]]`: private and trusted into the owner's
//! main memory, untrusted into quarantine (never read back), secret into the local store only
//! (never sent off the device). At the start of a turn loopd asks `memory_recall`, answered from
//! main memory only. The owner sees, searches and forgets on memories.sock (`bxctl memory`).
//!
//! The stores sit behind one interface ([`store::Store`]): the embedded SQLite store by default,
//! and a remote Honcho store when one is configured.

pub mod config;
pub mod daemon;
pub mod filer;
pub mod forgotten;
pub mod intake;
pub mod outbox;
pub mod routes;
pub mod store;

pub use config::Config;
