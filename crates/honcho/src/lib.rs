//! A blocking client for Honcho's v3 HTTP API, the remote store memoryd files turns into.
//!
//! Honcho is a separate server spoken to over HTTP only. This crate is what memoryd needs of it
//! and no more: workspaces and peers (get-or-create), sessions created explicitly with their
//! metadata, message batches that a retry never files twice, context, search, and session
//! deletion. Everything is bounded: one deadline per request, a cap on every response body, and
//! at most [`MAX_BATCH`] messages per request, as Honcho accepts.
//!
//! - [`BaseUrl`]: the server's base (`http://host:port`); the client adds `/v3` itself.
//! - [`Token`]: the bearer token, from a key file or a systemd credential; never printed.
//! - [`Client`]: the calls. [`Session`] can only be had from [`Client::create_session`], so no
//!   message is ever written to a session that was not created on purpose (Honcho would create a
//!   missing one silently, without its metadata).
//! - [`Error`]: every failure, in words a person can act on, each with its runbook anchor and
//!   whether a retry may help.

mod base_url;
mod client;
mod error;
mod id;
mod token;
mod types;

pub use base_url::BaseUrl;
pub use client::{Client, Options};
pub use error::{AUTH_ANCHOR, CONFIG_ANCHOR, Error, REFUSED_ANCHOR, UNREACHABLE_ANCHOR};
pub use id::{Id, IdError};
pub use token::{CREDENTIAL, Token, TokenError};
pub use types::{
    Appended, Context, Deletion, Message, MessageKey, NewMessage, PeerConfig, Session, Workspace,
    split_content,
};

/// The most messages Honcho takes in one batch.
pub const MAX_BATCH: usize = 100;

/// The most characters (Unicode scalar values) Honcho takes in one message's content.
pub const MAX_CONTENT_CHARS: usize = 25_000;

/// The metadata keys the client stamps on every message it adds, and looks for before adding:
/// the turn and the part of it, which together name the message within its session.
pub const TURN_KEY: &str = "turn";
/// See [`TURN_KEY`].
pub const PART_KEY: &str = "part";
