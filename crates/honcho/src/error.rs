//! Every way a Honcho call can fail, in words a person can act on. Each error knows its runbook
//! anchor (the logger adds the pointer) and whether trying again later may help, which decides
//! whether memoryd keeps a turn in its outbox for a retry or reports it.

use std::time::Duration;

use crate::id::IdError;
use crate::token::TokenError;

/// The base URL or another setting cannot be used.
pub const CONFIG_ANCHOR: &str = "honcho-config";
/// The server cannot be reached, timed out, or failed (5xx, 429).
pub const UNREACHABLE_ANCHOR: &str = "honcho-unavailable";
/// The server refused the token (401, 403).
pub const AUTH_ANCHOR: &str = "honcho-auth";
/// The server refused a request (4xx other than auth), or answered something the client cannot
/// read: a disagreement about the API, not an outage.
pub const REFUSED_ANCHOR: &str = "honcho-refused";

/// A failed Honcho call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the Honcho URL {url} cannot be used: {why}")]
    BadUrl { url: String, why: String },
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("{0}")]
    BadId(#[from] IdError),
    #[error("Honcho at {url} cannot be reached: {why}")]
    Unreachable { url: String, why: String },
    #[error("Honcho at {url} did not answer within {}s", .after.as_secs_f32())]
    Timeout { url: String, after: Duration },
    #[error("Honcho answered {status} to {what}: {detail}")]
    Server {
        status: u16,
        what: String,
        detail: String,
    },
    #[error(
        "Honcho refused the token ({status}) for {what}: {detail}; the key file or credential \
         holds no token this server accepts"
    )]
    Unauthorized {
        status: u16,
        what: String,
        detail: String,
    },
    #[error("Honcho has no {what} (404): {detail}")]
    NotFound { what: String, detail: String },
    #[error("Honcho refused {what} ({status}): {detail}")]
    Refused {
        status: u16,
        what: String,
        detail: String,
    },
    #[error("Honcho's answer to {what} cannot be read: {why}")]
    Malformed { what: String, why: String },
    #[error("{what} cannot be sent to Honcho: {why}")]
    Invalid { what: String, why: String },
}

impl Error {
    /// Whether trying the same call later may succeed: the server was down, slow or
    /// overloaded. A refusal, a bad setting or an answer that cannot be read will not change by
    /// itself.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Error::Unreachable { .. } | Error::Timeout { .. } | Error::Server { .. }
        )
    }
}

impl bxcore::runbook::Anchored for Error {
    fn anchor(&self) -> &str {
        match self {
            Error::BadUrl { .. } | Error::BadId(_) => CONFIG_ANCHOR,
            Error::Token(e) => e.anchor(),
            Error::Unreachable { .. } | Error::Timeout { .. } | Error::Server { .. } => {
                UNREACHABLE_ANCHOR
            }
            Error::Unauthorized { .. } => AUTH_ANCHOR,
            Error::NotFound { .. }
            | Error::Refused { .. }
            | Error::Malformed { .. }
            | Error::Invalid { .. } => REFUSED_ANCHOR,
        }
    }

    fn code(&self) -> bxcore::ErrorCode {
        if self.retryable() {
            bxcore::ErrorCode::Unavailable
        } else {
            bxcore::ErrorCode::Internal
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::runbook::Anchored;

    #[test]
    fn an_outage_is_retryable_and_a_refusal_is_not() {
        let down = Error::Unreachable {
            url: "http://127.0.0.1:1".into(),
            why: "connection refused".into(),
        };
        assert!(down.retryable());
        assert_eq!(down.anchor(), "honcho-unavailable");
        let refused = Error::Refused {
            status: 422,
            what: "adding 3 messages".into(),
            detail: "bad".into(),
        };
        assert!(!refused.retryable());
        assert_eq!(refused.anchor(), "honcho-refused");
        let auth = Error::Unauthorized {
            status: 401,
            what: "x".into(),
            detail: "No access token provided".into(),
        };
        assert!(!auth.retryable());
        assert_eq!(auth.anchor(), "honcho-auth");
    }
}
