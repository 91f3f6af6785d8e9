//! What every HTTP provider's reply parser does, so that the transport, the deadline and the
//! retry rule live in one place (`provider.rs`) and each provider only knows its wire format.

use serde_json::Value;

use crate::error::{InferError, excerpt};
use crate::reply::Draft;
use crate::sse::Event;

/// The most bytes of text and tool arguments one reply may gather: a reply must fit in one
/// frame to loopd anyway.
pub const MAX_REPLY: usize = bxcore::MAX_FRAME;

/// Whether the stream is complete after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    More,
    Done,
}

/// A failure inside a reply, and whether it may be retried (only while nothing was forwarded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: InferError,
    pub retryable: bool,
    /// The provider's `Retry-After`, when it sent one.
    pub retry_after: Option<std::time::Duration>,
}

impl Failure {
    pub fn fatal(error: InferError) -> Failure {
        Failure {
            error,
            retryable: false,
            retry_after: None,
        }
    }
    pub fn retry(error: InferError) -> Failure {
        Failure {
            error,
            retryable: true,
            retry_after: None,
        }
    }
}

impl From<InferError> for Failure {
    fn from(error: InferError) -> Failure {
        Failure::fatal(error)
    }
}

/// One provider's streaming parser: fed each SSE event in order, it forwards text as it comes
/// and gathers the rest into a [`Draft`].
pub trait StreamParser {
    /// Take one event. Text is handed to `deliver` as it arrives.
    fn event(&mut self, ev: &Event, deliver: &mut dyn FnMut(&str)) -> Result<Flow, Failure>;
    /// The reply, once the stream said it is complete.
    fn finish(self: Box<Self>) -> Result<Draft, Failure>;
}

/// Add text to the draft and forward it, within [`MAX_REPLY`].
pub fn push_text(
    draft: &mut Draft,
    text: &str,
    deliver: &mut dyn FnMut(&str),
) -> Result<(), Failure> {
    if text.is_empty() {
        return Ok(());
    }
    grow_check(draft, text.len())?;
    draft.text.push_str(text);
    deliver(text);
    Ok(())
}

/// Refuse a reply that would grow past [`MAX_REPLY`].
pub fn grow_check(draft: &Draft, more: usize) -> Result<(), Failure> {
    let size = draft.text.len() + draft.calls.iter().map(|c| c.args.len()).sum::<usize>();
    if size.saturating_add(more) > MAX_REPLY {
        return Err(Failure::fatal(InferError::malformed(format!(
            "the reply grew past {MAX_REPLY} bytes"
        ))));
    }
    Ok(())
}

/// Parse one event's data as a JSON object.
pub fn json_object(data: &str, what: &str) -> Result<serde_json::Map<String, Value>, Failure> {
    match serde_json::from_str::<Value>(data) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Failure::fatal(InferError::malformed(format!(
            "{what} is not a JSON object: {}",
            excerpt(data)
        )))),
        Err(e) => Err(Failure::fatal(InferError::malformed(format!(
            "{what} is not JSON ({e}): {}",
            excerpt(data)
        )))),
    }
}

/// A token count from a usage object: absent or null is 0, anything else must be a count.
pub fn count(v: Option<&Value>, what: &str) -> Result<u64, Failure> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v.as_u64().ok_or_else(|| {
            Failure::fatal(InferError::malformed(format!(
                "usage {what} is not a count: {}",
                excerpt(&v.to_string())
            )))
        }),
    }
}

/// A provider error object's message: `error.message`, `message`, or an excerpt of the body.
pub fn error_message(body: &str) -> String {
    if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(body) {
        let nested = m.get("error").and_then(|e| match e {
            Value::Object(e) => e.get("message").and_then(Value::as_str),
            Value::String(s) => Some(s.as_str()),
            _ => None,
        });
        if let Some(msg) = nested
            .or_else(|| m.get("message").and_then(Value::as_str))
            .or_else(|| m.get("detail").and_then(Value::as_str))
        {
            return excerpt(msg);
        }
    }
    let t = body.trim();
    if t.is_empty() {
        "(no message)".to_string()
    } else {
        excerpt(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_come_from_either_provider_shape() {
        assert_eq!(
            error_message(
                r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#
            ),
            "Incorrect API key provided."
        );
        assert_eq!(
            error_message(
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#
            ),
            "invalid x-api-key"
        );
        assert_eq!(
            error_message(r#"{"object":"error","message":"model not found"}"#),
            "model not found"
        );
        assert_eq!(error_message("Bad Gateway\n"), "Bad Gateway");
        assert_eq!(error_message(""), "(no message)");
    }
}
