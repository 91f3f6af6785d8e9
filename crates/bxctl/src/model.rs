//! The model the box talks to, as inferproxy's config names it (provider, model of loopd's main
//! slot, base URL), shown by `status` and `selftest`; and the one minimal request `selftest`
//! sends through inferproxy to see that the model answers.

use std::path::Path;
use std::time::Duration;

use bxcore::client::{ClientError, Exchange};
use bxcore::layout;
use bxcore::{CallId, ChatMessage, InferRequest, Message};
use serde::Serialize;
use toml::Table;

use crate::target::Target;

/// What inferproxy is configured to talk to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelLine {
    /// `openai`, `anthropic` or `script`.
    pub provider: String,
    /// The slot loopd names for new sessions, and the model it maps to (the script file for the
    /// script provider).
    pub slot: String,
    pub model: Option<String>,
    pub base_url: Option<String>,
    /// The config file this was read from.
    pub config: String,
}

impl ModelLine {
    /// `openai gpt-4o-mini (slot main) at https://api.openai.com/v1`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} {} (slot {})",
            self.provider,
            self.model.as_deref().unwrap_or("(no model for this slot)"),
            self.slot
        );
        if let Some(url) = &self.base_url {
            s.push_str(&format!(" at {url}"));
        }
        s
    }
}

fn read(path: &Path) -> Result<Table, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.parse::<Table>()
        .map_err(|e| format!("{} does not parse: {e}", path.display()))
}

fn string(t: &Table, keys: &[&str]) -> Option<String> {
    let mut v = t.get(keys[0])?;
    for k in &keys[1..] {
        v = v.get(k)?;
    }
    v.as_str().map(str::to_string)
}

/// The slot loopd creates sessions with (`[slots] main`, default `main`).
pub fn main_slot(target: &dyn Target) -> String {
    read(&target.config("loopd"))
        .ok()
        .and_then(|t| string(&t, &["slots", "main"]))
        .unwrap_or_else(|| "main".to_string())
}

/// The model of the box at `target`, from inferproxy's config.
pub fn configured(target: &dyn Target) -> Result<ModelLine, String> {
    let path = target.config("inferproxy");
    let t = read(&path).map_err(|e| format!("the model is unknown: {e}"))?;
    let provider = string(&t, &["provider", "kind"]).ok_or_else(|| {
        format!(
            "the model is unknown: {} has no [provider] kind",
            path.display()
        )
    })?;
    let slot = main_slot(target);
    let model = if provider == "script" {
        string(&t, &["provider", "script"])
    } else {
        string(&t, &["slots", &slot, "model"])
    };
    Ok(ModelLine {
        provider,
        slot,
        model,
        base_url: string(&t, &["provider", "base_url"]),
        config: path.display().to_string(),
    })
}

/// How much of the model's answer is shown.
const SAID: usize = 60;

/// What the model answered to the minimal request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAnswer {
    /// The first line of its text (or how many tool calls it asked for instead).
    pub said: String,
}

/// Send one minimal request (one user message, no tools) to inferproxy for `slot`, and wait
/// until `deadline` for its reply.
pub fn ask(
    target: &dyn Target,
    slot: &str,
    deadline: Duration,
) -> Result<ModelAnswer, ClientError> {
    let socket = target.socket(&layout::INFER);
    let request = Message::InferRequest(InferRequest {
        slot: slot.to_string(),
        messages: vec![ChatMessage::User {
            text: "This is a health check. Reply with the word ok.".to_string(),
        }],
        tools: Vec::new(),
        first_call: CallId(1),
    });
    let mut ex = Exchange::start(&socket, deadline, 1, request)?;
    loop {
        let env = ex.next_frame()?;
        match env.msg {
            Message::InferDelta(_) if !env.last => {}
            Message::InferReply(r) if env.last => {
                let said = match r.message {
                    ChatMessage::Assistant { text, tool_calls } if text.trim().is_empty() => {
                        format!("(no text, {} tool call(s))", tool_calls.len())
                    }
                    ChatMessage::Assistant { text, .. } => {
                        let first = text.lines().next().unwrap_or_default();
                        match first.char_indices().nth(SAID) {
                            Some((i, _)) => format!("{} …", &first[..i]),
                            None => first.to_string(),
                        }
                    }
                    other => format!("(a {} message)", kind(&other)),
                };
                return Ok(ModelAnswer { said });
            }
            other => return Err(ClientError::Unexpected(other.kind())),
        }
    }
}

fn kind(m: &ChatMessage) -> &'static str {
    match m {
        ChatMessage::System { .. } => "system",
        ChatMessage::User { .. } => "user",
        ChatMessage::Assistant { .. } => "assistant",
        ChatMessage::Tool { .. } => "tool",
    }
}
