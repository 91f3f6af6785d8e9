//! Why one inference failed: each failure names what a person can do about it and its runbook
//! entry, and becomes one `error inference` frame (its `Display` is the frame's detail).

use bxcore::ErrorCode;
use bxcore::runbook::Anchored;

/// The provider could not be reached: DNS, connect, TLS, or the connection broke.
pub const UNREACHABLE_ANCHOR: &str = "inference-unreachable";
/// The provider refused the key (401, 403).
pub const AUTH_ANCHOR: &str = "inference-auth-refused";
/// The provider refused the request (another 4xx): a wrong model name, a request it cannot take.
pub const REFUSED_ANCHOR: &str = "inference-request-refused";
/// The provider stayed overloaded or failing (429, 5xx) through every retry.
pub const OVERLOADED_ANCHOR: &str = "inference-overloaded";
/// The provider reported an error inside a stream that had started.
pub const PROVIDER_ANCHOR: &str = "inference-provider-error";
/// The request's deadline passed.
pub const TIMEOUT_ANCHOR: &str = "inference-timeout";
/// The provider's output broke the wire format: a cut stream, invalid JSON, an unknown event.
pub const MALFORMED_ANCHOR: &str = "inference-malformed";
/// The provider stopped the reply on purpose: a content filter, a refusal.
pub const STOPPED_ANCHOR: &str = "inference-stopped";
/// loopd named a slot this inferproxy does not have, or sent more than the slot's context.
pub const SLOT_ANCHOR: &str = "inference-slot";
/// The `script` provider has no reply for this request.
pub const SCRIPT_ANCHOR: &str = "inference-script-exhausted";
/// loopd went away before the reply's end: the provider's answer was left unread.
pub const ABANDONED_ANCHOR: &str = "inference-abandoned";

/// One inference's failure. Its runbook entry is its [`Anchored::anchor`]; the frame's detail is
/// its text with the pointer ([`Anchored::pointed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InferError {
    /// The request names a slot that is not configured.
    #[error("no slot named {0:?} is configured")]
    UnknownSlot(String),
    /// The request is larger than the slot's `context_tokens` (estimated as bytes / 4).
    #[error(
        "the request is about {estimate} tokens, over slot {slot:?}'s context_tokens of {budget}"
    )]
    OverContext {
        slot: String,
        estimate: u64,
        budget: u64,
    },
    /// DNS, connect, TLS or the connection itself failed.
    #[error("the provider cannot be reached: {0}")]
    Unreachable(String),
    /// 401 or 403, with the provider's message.
    #[error("the provider refused the API key ({status}): {message}")]
    Auth { status: u16, message: String },
    /// Another 4xx (a 404 most often: a model or a path it does not know), with the URL the
    /// request went to (the base URL and the path, never the key: it travels in a header) and
    /// the provider's message.
    #[error("the provider refused the request ({status} from {url}): {message}")]
    Refused {
        status: u16,
        url: String,
        message: String,
    },
    /// 429 or 5xx after every retry, or with a `Retry-After` past the deadline.
    #[error(
        "the provider answered {status} after {attempts} attempt{}: {message}",
        if *attempts == 1 { "" } else { "s" }
    )]
    Overloaded {
        status: u16,
        message: String,
        attempts: u32,
    },
    /// An error event inside the stream: its type and message.
    #[error("the provider reported {kind} in the stream: {message}")]
    InStream { kind: String, message: String },
    /// The deadline passed (`timeout_ms` for the whole request, retries included).
    #[error("no whole reply within the deadline of {timeout_ms} ms ({during})")]
    Timeout { timeout_ms: u64, during: String },
    /// The provider's output broke its wire format.
    #[error("the provider's reply is malformed: {0}")]
    Malformed(String),
    /// The provider stopped the reply: a content filter, a refusal.
    #[error("the provider stopped the reply: {0}")]
    Stopped(String),
    /// The script has no reply for this request.
    #[error("the script has no reply: {0}")]
    ScriptExhausted(String),
    /// loopd went away (its turn was cancelled) before the reply's end: inferproxy stopped
    /// reading and closed the provider's connection, so the provider stops generating.
    #[error(
        "loopd went away before the reply's end (its turn was cancelled): the provider's answer \
         was abandoned and its connection closed"
    )]
    Abandoned,
}

impl Anchored for InferError {
    /// The runbook anchor of this failure.
    fn anchor(&self) -> &str {
        match self {
            InferError::UnknownSlot(_) | InferError::OverContext { .. } => SLOT_ANCHOR,
            InferError::Unreachable(_) => UNREACHABLE_ANCHOR,
            InferError::Auth { .. } => AUTH_ANCHOR,
            InferError::Refused { .. } => REFUSED_ANCHOR,
            InferError::Overloaded { .. } => OVERLOADED_ANCHOR,
            InferError::InStream { .. } => PROVIDER_ANCHOR,
            InferError::Timeout { .. } => TIMEOUT_ANCHOR,
            InferError::Malformed(_) => MALFORMED_ANCHOR,
            InferError::Stopped(_) => STOPPED_ANCHOR,
            InferError::ScriptExhausted(_) => SCRIPT_ANCHOR,
            InferError::Abandoned => ABANDONED_ANCHOR,
        }
    }

    /// Every failure is answered `error inference`.
    fn code(&self) -> ErrorCode {
        ErrorCode::Inference
    }
}

impl InferError {
    /// The same failure with the key redacted from every text in it (the provider's messages,
    /// the excerpts of its output), after JSON escapes in them are decoded.
    pub fn redacted(self, r: &crate::redact::Redactor<'_>) -> InferError {
        let t = |s: String| r.text(&s);
        match self {
            InferError::UnknownSlot(s) => InferError::UnknownSlot(t(s)),
            InferError::OverContext {
                slot,
                estimate,
                budget,
            } => InferError::OverContext {
                slot: t(slot),
                estimate,
                budget,
            },
            InferError::Unreachable(s) => InferError::Unreachable(t(s)),
            InferError::Auth { status, message } => InferError::Auth {
                status,
                message: t(message),
            },
            InferError::Refused {
                status,
                url,
                message,
            } => InferError::Refused {
                status,
                url: t(url),
                message: t(message),
            },
            InferError::Overloaded {
                status,
                message,
                attempts,
            } => InferError::Overloaded {
                status,
                message: t(message),
                attempts,
            },
            InferError::InStream { kind, message } => InferError::InStream {
                kind: t(kind),
                message: t(message),
            },
            InferError::Timeout { timeout_ms, during } => InferError::Timeout {
                timeout_ms,
                during: t(during),
            },
            InferError::Malformed(s) => InferError::Malformed(t(s)),
            InferError::Stopped(s) => InferError::Stopped(t(s)),
            InferError::ScriptExhausted(s) => InferError::ScriptExhausted(t(s)),
            InferError::Abandoned => InferError::Abandoned,
        }
    }

    /// Shorthand for a malformed-output error.
    pub(crate) fn malformed(what: impl Into<String>) -> InferError {
        InferError::Malformed(what.into())
    }
}

/// At most 200 characters of `text`, control characters replaced: what an error may quote of
/// a provider's output.
pub fn excerpt(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > 200 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short_and_single_line() {
        let long = "a\n".repeat(300);
        let e = excerpt(&long);
        assert_eq!(e.chars().count(), 201);
        assert!(!e.contains('\n'));
    }

    #[test]
    fn every_error_ends_with_its_pointer() {
        let all = [
            InferError::UnknownSlot("x".into()),
            InferError::OverContext {
                slot: "main".into(),
                estimate: 10,
                budget: 5,
            },
            InferError::Unreachable("refused".into()),
            InferError::Auth {
                status: 401,
                message: "m".into(),
            },
            InferError::Refused {
                status: 400,
                url: "http://127.0.0.1:9/v1/chat/completions".into(),
                message: "m".into(),
            },
            InferError::Overloaded {
                status: 503,
                message: "m".into(),
                attempts: 3,
            },
            InferError::InStream {
                kind: "overloaded_error".into(),
                message: "Overloaded".into(),
            },
            InferError::Timeout {
                timeout_ms: 5,
                during: "reading the stream".into(),
            },
            InferError::malformed("cut"),
            InferError::Stopped("content_filter".into()),
            InferError::ScriptExhausted("done".into()),
            InferError::Abandoned,
        ];
        for e in all {
            let s = e.pointed().to_string();
            assert!(
                s.ends_with(&format!("; {}", bxcore::runbook::pointer(e.anchor()))),
                "{s}"
            );
            assert!(!e.to_string().contains("docs/runbook"), "{e}");
        }
    }
}
