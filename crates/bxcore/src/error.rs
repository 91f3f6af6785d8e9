//! The error codes an `error` frame carries.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a request was not answered. Snake_case on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Zero length, over `MAX_FRAME`, not UTF-8, or the stream broke inside a frame.
    BadFrame,
    /// Not JSON, not an envelope, an unknown kind or key, an invalid id.
    BadMessage,
    /// `v` is not `PROTOCOL_VERSION`.
    BadVersion,
    /// A kind this socket does not accept, or a peer this socket does not serve.
    Forbidden,
    /// The session is running a turn already.
    SessionBusy,
    /// `resume: false` for a session that exists.
    SessionExists,
    /// `resume: true` for a session that does not exist.
    NoSuchSession,
    /// The session's context would exceed its slot's budget.
    SessionFull,
    /// The turn used its tool rounds.
    TurnLimit,
    /// The model could not be reached or answered badly.
    Inference,
    /// A daemon this one depends on is down.
    Unavailable,
    /// A fault of the daemon itself: a damaged file, a failed write.
    Internal,
    /// bridge.sock: the channel's message was a turn already (its key is in the session), so it
    /// is not run again.
    TurnRepeated,
    /// The requester cancelled (loop.sock: the channel shut down its writing half or went
    /// away); nothing more was started for it.
    Cancelled,
}

impl ErrorCode {
    /// The wire name, e.g. `bad_frame`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::BadMessage => "bad_message",
            ErrorCode::BadVersion => "bad_version",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::SessionBusy => "session_busy",
            ErrorCode::SessionExists => "session_exists",
            ErrorCode::NoSuchSession => "no_such_session",
            ErrorCode::SessionFull => "session_full",
            ErrorCode::TurnLimit => "turn_limit",
            ErrorCode::Inference => "inference",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::TurnRepeated => "turn_repeated",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of an `error` frame: `{code, detail}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {detail}")]
#[serde(deny_unknown_fields)]
pub struct WireError {
    pub code: ErrorCode,
    pub detail: String,
}
