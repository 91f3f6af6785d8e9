//! Anthropic's Messages API: `POST {base_url}/v1/messages` with `x-api-key` and
//! `anthropic-version`, streamed.
//!
//! Request: system messages go to the top-level `system`; the rest become alternating `user` and
//! `assistant` turns of content blocks: assistant tool calls as `tool_use` blocks, tool results as
//! `tool_result` blocks in one user turn (consecutive results merged, results first), empty text
//! blocks dropped (the API refuses them), empty arguments sent as `{}`. Reply: `message_start`,
//! then per block `content_block_start`, `content_block_delta` (`text_delta`,
//! `input_json_delta`), `content_block_stop`, then `message_delta` (stop reason, usage) and
//! `message_stop`; `ping` anywhere; an `error` event ends the stream.

use bxcore::{ChatMessage, InferRequest};
use serde_json::{Map, Value, json};

use crate::config::Slot;
use crate::error::{InferError, excerpt};
use crate::reply::{Draft, DraftCall, wire_call_id};
use crate::sse::Event;
use crate::stream::{Failure, Flow, StreamParser, count, grow_check, json_object, push_text};

/// The API version every request names.
pub const API_VERSION: &str = "2023-06-01";

/// The request body for `slot`.
pub fn request_body(req: &InferRequest, slot: &Slot) -> Value {
    let mut system: Vec<&str> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, block: Value| match turns.last_mut() {
        Some((r, blocks)) if *r == role => blocks.push(block),
        _ => turns.push((role, vec![block])),
    };
    for m in &req.messages {
        match m {
            ChatMessage::System { text } => {
                if !text.is_empty() {
                    system.push(text);
                }
            }
            ChatMessage::User { text } => {
                if !text.is_empty() {
                    push("user", json!({"type": "text", "text": text}));
                }
            }
            ChatMessage::Assistant { text, tool_calls } => {
                if !text.is_empty() {
                    push("assistant", json!({"type": "text", "text": text}));
                }
                for c in tool_calls {
                    let input = match &c.args {
                        Value::Object(_) => c.args.clone(),
                        _ => json!({}),
                    };
                    push(
                        "assistant",
                        json!({"type": "tool_use", "id": wire_call_id(c.call), "name": c.tool, "input": input}),
                    );
                }
            }
            ChatMessage::Tool { call, text } => {
                let mut block = json!({"type": "tool_result", "tool_use_id": wire_call_id(*call)});
                if !text.is_empty() {
                    block["content"] = json!(text);
                }
                push("user", block);
            }
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, mut blocks)| {
            // The API wants a user turn's tool results before anything else in it.
            blocks.sort_by_key(|b| b["type"] != "tool_result");
            json!({"role": role, "content": blocks})
        })
        .collect();
    let mut body = json!({
        "model": slot.model,
        "max_tokens": slot.max_tokens,
        "messages": messages,
        "stream": true,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if let Some(t) = slot.temperature {
        body["temperature"] = json!(t);
    }
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(
            req.tools
                .iter()
                .map(|t| {
                    json!({"name": t.name, "description": t.description, "input_schema": t.parameters})
                })
                .collect(),
        );
    }
    body
}

/// What a content block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    /// The position of its call in the draft.
    Tool(usize),
    /// Extended thinking: not part of the reply, not forwarded.
    Thinking,
}

/// The streamed reply's parser.
#[derive(Debug, Default)]
pub struct Stream {
    draft: Draft,
    started: bool,
    /// Per block index: what it is, and whether it has stopped.
    blocks: Vec<Option<(Block, bool)>>,
    /// Tool calls whose input arrived whole in `content_block_start`.
    whole_input: Vec<Option<String>>,
    stop_reason: Option<String>,
    max_tokens: u32,
}

fn bad(what: String) -> Failure {
    Failure::fatal(InferError::malformed(what))
}

impl Stream {
    pub fn new(max_tokens: u32) -> Stream {
        Stream {
            max_tokens,
            ..Stream::default()
        }
    }

    fn index(m: &Map<String, Value>, what: &str) -> Result<usize, Failure> {
        m.get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i < 4096)
            .ok_or_else(|| bad(format!("{what} has no valid index")))
    }

    fn usage(&mut self, u: &Value) -> Result<(), Failure> {
        if u.get("input_tokens").is_some() {
            // Cached prompt tokens are counted apart from `input_tokens`; they are input too.
            self.draft.usage.input_tokens = count(u.get("input_tokens"), "input_tokens")?
                .saturating_add(count(
                    u.get("cache_creation_input_tokens"),
                    "cache_creation_input_tokens",
                )?)
                .saturating_add(count(
                    u.get("cache_read_input_tokens"),
                    "cache_read_input_tokens",
                )?);
        }
        if u.get("output_tokens").is_some() {
            self.draft.usage.output_tokens = count(u.get("output_tokens"), "output_tokens")?;
        }
        Ok(())
    }

    fn block_start(
        &mut self,
        m: &Map<String, Value>,
        deliver: &mut dyn FnMut(&str),
    ) -> Result<(), Failure> {
        let i = Self::index(m, "content_block_start")?;
        if self.blocks.get(i).is_some_and(Option::is_some) {
            return Err(bad(format!("content block {i} started twice")));
        }
        let cb = m
            .get("content_block")
            .ok_or_else(|| bad(format!("content block {i} starts with no content_block")))?;
        let kind = cb.get("type").and_then(Value::as_str).unwrap_or("");
        let block = match kind {
            "text" => {
                let t = cb.get("text").and_then(Value::as_str).unwrap_or("");
                push_text(&mut self.draft, t, deliver)?;
                Block::Text
            }
            "tool_use" => {
                let mut call = DraftCall::default();
                let name = cb.get("name").and_then(Value::as_str).unwrap_or("");
                call.set_name(name, &format!("content block {i}"))?;
                let whole = match cb.get("input") {
                    Some(Value::Object(o)) if !o.is_empty() => {
                        Some(Value::Object(o.clone()).to_string())
                    }
                    None | Some(Value::Null) | Some(Value::Object(_)) => None,
                    Some(other) => {
                        return Err(bad(format!(
                            "tool_use block {i} has an input that is not an object: {}",
                            excerpt(&other.to_string())
                        )));
                    }
                };
                self.draft.calls.push(call);
                self.whole_input.push(whole);
                Block::Tool(self.draft.calls.len() - 1)
            }
            "thinking" | "redacted_thinking" => Block::Thinking,
            other => {
                return Err(bad(format!(
                    "an unknown content block type {:?}",
                    excerpt(other)
                )));
            }
        };
        if self.blocks.len() <= i {
            self.blocks.resize(i + 1, None);
        }
        self.blocks[i] = Some((block, false));
        Ok(())
    }

    fn block_delta(
        &mut self,
        m: &Map<String, Value>,
        deliver: &mut dyn FnMut(&str),
    ) -> Result<(), Failure> {
        let i = Self::index(m, "content_block_delta")?;
        let (block, stopped) = self.blocks.get(i).copied().flatten().ok_or_else(|| {
            bad(format!(
                "a delta for content block {i}, which never started"
            ))
        })?;
        if stopped {
            return Err(bad(format!(
                "a delta for content block {i} after it stopped"
            )));
        }
        let delta = m
            .get("delta")
            .ok_or_else(|| bad(format!("content_block_delta {i} has no delta")))?;
        let kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, block) {
            ("text_delta", Block::Text) => {
                let t = delta
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("text_delta {i} has no text")))?;
                push_text(&mut self.draft, t, deliver)
            }
            ("input_json_delta", Block::Tool(k)) => {
                let part = delta
                    .get("partial_json")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("input_json_delta {i} has no partial_json")))?;
                grow_check(&self.draft, part.len())?;
                self.draft.calls[k].args.push_str(part);
                Ok(())
            }
            ("thinking_delta" | "signature_delta", Block::Thinking) => Ok(()),
            (kind, block) => Err(bad(format!(
                "a {:?} delta for content block {i}, a {} block",
                excerpt(kind),
                match block {
                    Block::Text => "text",
                    Block::Tool(_) => "tool_use",
                    Block::Thinking => "thinking",
                }
            ))),
        }
    }
}

impl StreamParser for Stream {
    fn event(&mut self, ev: &Event, deliver: &mut dyn FnMut(&str)) -> Result<Flow, Failure> {
        let m = json_object(&ev.data, "an event")?;
        let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
        if !ev.name.is_empty() && ev.name != kind {
            return Err(bad(format!(
                "an event named {:?} carries {:?}",
                excerpt(&ev.name),
                excerpt(kind)
            )));
        }
        if !self.started && !matches!(kind, "message_start" | "ping" | "error") {
            return Err(bad(format!("{:?} before message_start", excerpt(kind))));
        }
        match kind {
            "ping" => {}
            "error" => return Err(in_stream_error(m.get("error").unwrap_or(&Value::Null))),
            "message_start" => {
                if self.started {
                    return Err(bad("message_start twice".into()));
                }
                self.started = true;
                if let Some(u) = m.get("message").and_then(|msg| msg.get("usage")) {
                    self.usage(u)?;
                }
            }
            "content_block_start" => self.block_start(&m, deliver)?,
            "content_block_delta" => self.block_delta(&m, deliver)?,
            "content_block_stop" => {
                let i = Self::index(&m, "content_block_stop")?;
                match self.blocks.get_mut(i) {
                    Some(Some((_, stopped))) if !*stopped => *stopped = true,
                    _ => return Err(bad(format!("content block {i} stopped but was not open"))),
                }
            }
            "message_delta" => {
                if let Some(r) = m.get("delta").and_then(|d| d.get("stop_reason")) {
                    match r {
                        Value::Null => {}
                        Value::String(r) => self.stop_reason = Some(r.clone()),
                        other => {
                            return Err(bad(format!(
                                "stop_reason is not a string: {}",
                                excerpt(&other.to_string())
                            )));
                        }
                    }
                }
                if let Some(u) = m.get("usage") {
                    self.usage(u)?;
                }
            }
            "message_stop" => return Ok(Flow::Done),
            other => return Err(bad(format!("an unknown event {:?}", excerpt(other)))),
        }
        Ok(Flow::More)
    }

    fn finish(self: Box<Self>) -> Result<Draft, Failure> {
        let mut s = *self;
        if let Some(i) = s.blocks.iter().position(|b| matches!(b, Some((_, false)))) {
            return Err(bad(format!("message_stop while content block {i} is open")));
        }
        for (k, whole) in s.whole_input.iter().enumerate() {
            if let Some(w) = whole {
                if s.draft.calls[k].args.is_empty() {
                    s.draft.calls[k].args = w.clone();
                }
            }
        }
        match s.stop_reason.as_deref() {
            None => Err(bad("message_stop with no stop_reason".into())),
            Some(r) => {
                stop(r, &s.draft, s.max_tokens)?;
                Ok(s.draft)
            }
        }
    }
}

/// The meaning of a `stop_reason`.
fn stop(reason: &str, draft: &Draft, max_tokens: u32) -> Result<(), Failure> {
    match reason {
        "end_turn" | "stop_sequence" | "tool_use" => Ok(()),
        "max_tokens" if draft.calls.is_empty() => Ok(()),
        "max_tokens" => Err(Failure::fatal(InferError::Stopped(format!(
            "the reply reached the slot's max_tokens ({max_tokens}) inside a tool call"
        )))),
        "refusal" => Err(Failure::fatal(InferError::Stopped(
            "the model refused (stop_reason refusal)".into(),
        ))),
        "pause_turn" | "model_context_window_exceeded" => Err(Failure::fatal(InferError::Stopped(
            format!("stop_reason {reason}"),
        ))),
        other => Err(bad(format!("an unknown stop_reason {:?}", excerpt(other)))),
    }
}

fn in_stream_error(err: &Value) -> Failure {
    let kind = err
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("an error")
        .to_string();
    let message = excerpt(err.get("message").and_then(Value::as_str).unwrap_or(""));
    let retryable = matches!(
        kind.as_str(),
        "overloaded_error" | "api_error" | "rate_limit_error"
    );
    Failure {
        error: InferError::InStream {
            kind: excerpt(&kind),
            message,
        },
        retryable,
        retry_after: None,
    }
}

/// A whole (not streamed) message: a server that ignored `stream: true`.
pub fn whole(body: &str, max_tokens: u32, deliver: &mut dyn FnMut(&str)) -> Result<Draft, Failure> {
    let m = json_object(body, "the reply")?;
    if m.get("type").and_then(Value::as_str) == Some("error") {
        return Err(in_stream_error(m.get("error").unwrap_or(&Value::Null)));
    }
    let mut s = Box::new(Stream::new(max_tokens));
    s.started = true;
    if let Some(u) = m.get("usage") {
        s.usage(u)?;
    }
    let content = m
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("a message with no content list".into()))?;
    for (i, block) in content.iter().enumerate() {
        let mut start = Map::new();
        start.insert("index".into(), json!(i));
        start.insert("content_block".into(), block.clone());
        s.block_start(&start, deliver)?;
        s.blocks[i] = s.blocks[i].map(|(b, _)| (b, true));
    }
    s.stop_reason = m
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(str::to_string);
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::Usage;
    use bxcore::runbook::Anchored;

    fn run(events: &[(&str, &str)]) -> (Result<Draft, Failure>, String) {
        let mut s = Box::new(Stream::new(100));
        let mut out = String::new();
        for (name, data) in events {
            let ev = Event {
                name: (*name).to_string(),
                data: (*data).to_string(),
            };
            match s.event(&ev, &mut |t| out.push_str(t)) {
                Ok(Flow::Done) => return (s.finish(), out),
                Ok(Flow::More) => {}
                Err(e) => return (Err(e), out),
            }
        }
        (Err(bad("the stream was cut off".into())), out)
    }

    const START: (&str, &str) = (
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
    );

    #[test]
    fn cached_input_counts_as_input() {
        let (d, _) = run(&[
            START,
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ]);
        let d = d.unwrap();
        assert_eq!(
            d.usage,
            Usage {
                input_tokens: 30,
                output_tokens: 7
            }
        );
    }

    #[test]
    fn an_event_before_message_start_is_malformed() {
        let (d, _) = run(&[(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        )]);
        assert!(
            d.unwrap_err()
                .error
                .to_string()
                .contains("before message_start")
        );
    }

    #[test]
    fn a_delta_of_the_wrong_kind_is_malformed() {
        let (d, _) = run(&[
            START,
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
            ),
        ]);
        assert!(d.unwrap_err().error.to_string().contains("a text block"));
    }

    #[test]
    fn an_unknown_block_or_event_is_malformed() {
        let (d, _) = run(&[
            START,
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"hologram"}}"#,
            ),
        ]);
        assert!(
            d.unwrap_err()
                .error
                .to_string()
                .contains("unknown content block")
        );
        let (d, _) = run(&[START, ("surprise", r#"{"type":"surprise"}"#)]);
        assert!(d.unwrap_err().error.to_string().contains("unknown event"));
    }

    #[test]
    fn thinking_is_not_forwarded() {
        let (d, out) = run(&[
            START,
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":1}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ]);
        assert_eq!(d.unwrap().text, "Hi");
        assert_eq!(out, "Hi");
    }

    #[test]
    fn stop_reasons_map() {
        let d = Draft::default();
        for ok in ["end_turn", "stop_sequence", "tool_use", "max_tokens"] {
            assert!(stop(ok, &d, 1).is_ok(), "{ok}");
        }
        for (r, anchor) in [
            ("refusal", "inference-stopped"),
            ("pause_turn", "inference-stopped"),
            ("teatime", "inference-malformed"),
        ] {
            assert_eq!(stop(r, &d, 1).unwrap_err().error.anchor(), anchor, "{r}");
        }
    }
}
