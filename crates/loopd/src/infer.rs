//! The inference client: one `infer_request` to inferproxy over infer.sock per model call, its
//! `infer_delta` frames handed on as they arrive, one deadline for the whole answer.
//!
//! loopd owns every `CallId`: the reply's tool calls must be numbered from the request's
//! `first_call` on, one apart, or the reply is refused, so a confused or hostile proxy can never
//! make loopd reuse a call id.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bxcore::ErrorCode;
use bxcore::client::{ClientError, Exchange};
use bxcore::runbook::Anchored;
use bxcore::{ChatMessage, InferReply, InferRequest, Message, ToolCall, Usage};

/// A checked reply: the assistant's text, its tool calls numbered from `first_call`, the usage.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
}

/// The runbook entry every inference failure points at.
pub const INFERENCE_ANCHOR: &str = "inference-unavailable";

/// Talks to inferproxy.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

/// Why a model call gave no usable reply.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    /// infer.sock could not be reached or answered badly.
    #[error("the model call failed: {}", client_text(.0))]
    Client(ClientError),
    /// The reply broke the protocol's rules for inference.
    #[error("the model call failed: {0}")]
    Reply(String),
}

impl Anchored for InferError {
    /// The runbook entry that names the cause: inferproxy's own when its answer carries one
    /// (`inference-unreachable`, `inference-auth-refused`, ...), else `inference-unavailable`.
    fn anchor(&self) -> &str {
        match self {
            InferError::Client(ClientError::Remote(e)) => bxcore::runbook::split_pointer(&e.detail)
                .map_or(INFERENCE_ANCHOR, |(_, anchor)| anchor),
            _ => INFERENCE_ANCHOR,
        }
    }

    fn code(&self) -> ErrorCode {
        ErrorCode::Inference
    }
}

/// inferproxy's answer names the cause where it happened, with its own runbook entry: shown
/// once, as it is, and its pointer is the error's (no second one).
fn client_text(e: &ClientError) -> String {
    match e {
        ClientError::Remote(w) => match bxcore::runbook::split_pointer(&w.detail) {
            Some((text, _)) => text.to_string(),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

impl Client {
    pub fn new(socket: PathBuf, timeout: Duration) -> Client {
        Client { socket, timeout }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One model call. `on_delta` gets each piece of text as it streams.
    pub fn infer(
        &self,
        id: u64,
        request: InferRequest,
        on_delta: &mut dyn FnMut(&str),
    ) -> Result<Reply, InferError> {
        let first = request.first_call.0;
        let mut ex = Exchange::start(
            &self.socket,
            self.timeout,
            id,
            Message::InferRequest(request),
        )
        .map_err(InferError::Client)?;
        // A cancelled turn shuts this connection down: the model call is abandoned.
        let _cancel = crate::cancel::guard(ex.stream());
        loop {
            let env = ex.next_frame().map_err(InferError::Client)?;
            match (env.msg, env.last) {
                (Message::InferDelta(d), false) => on_delta(&d.text),
                (Message::InferReply(reply), true) => return check_reply(reply, first),
                (msg, last) => {
                    return Err(InferError::Reply(format!(
                        "an unexpected {} frame{}",
                        msg.kind(),
                        if last { "" } else { " not marked final" }
                    )));
                }
            }
        }
    }
}

/// The reply is an assistant message whose tool calls are numbered `first`, `first + 1`, ...
fn check_reply(reply: InferReply, first: u64) -> Result<Reply, InferError> {
    let ChatMessage::Assistant { text, tool_calls } = reply.message else {
        return Err(InferError::Reply(
            "the reply is not an assistant message".to_string(),
        ));
    };
    for (i, c) in tool_calls.iter().enumerate() {
        let want = first.checked_add(i as u64);
        if want != Some(c.call.0) {
            return Err(InferError::Reply(format!(
                "the reply numbers a tool call {}, not {}",
                c.call.0,
                want.map_or_else(|| "past the largest id".to_string(), |w| w.to_string())
            )));
        }
        if c.tool.is_empty() {
            return Err(InferError::Reply(
                "the reply asks for a tool with no name".to_string(),
            ));
        }
    }
    Ok(Reply {
        text,
        tool_calls,
        usage: reply.usage,
    })
}
