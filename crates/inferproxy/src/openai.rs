//! The OpenAI-compatible chat completions API: `POST {base_url}/chat/completions`, streamed.
//!
//! Request: the history as `messages` (assistant `tool_calls` with their arguments as a JSON
//! string, tool results as `role: tool` with `tool_call_id`), `tools` as functions, `stream:
//! true` with `stream_options.include_usage`. Reply: `data:` chunks whose `choices[0].delta`
//! carries text and tool-call fragments (gathered by `index`), a `finish_reason`, a last chunk
//! with `usage`, then `data: [DONE]`. Servers differ in small ways (an `id` and name repeated on
//! every fragment, `content: ""` chunks, usage on every chunk); each is taken as it comes, and
//! anything that breaks the format is refused, never guessed at.

use bxcore::{ChatMessage, InferRequest, Usage};
use serde_json::{Map, Value, json};

use crate::config::{MaxTokensKey, Slot};
use crate::error::{InferError, excerpt};
use crate::reply::{Draft, DraftCall, wire_call_id};
use crate::sse::Event;
use crate::stream::{Failure, Flow, StreamParser, count, grow_check, json_object, push_text};

/// The request body for `slot`, its `max_tokens` under the name `max_tokens_key` says.
pub fn request_body(req: &InferRequest, slot: &Slot, max_tokens_key: MaxTokensKey) -> Value {
    let messages: Vec<Value> = req.messages.iter().map(message).collect();
    let mut body = json!({
        "model": slot.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    body[max_tokens_key.name()] = json!(slot.max_tokens);
    if let Some(t) = slot.temperature {
        body["temperature"] = json!(t);
    }
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(
            req.tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }})
                })
                .collect(),
        );
    }
    body
}

fn message(m: &ChatMessage) -> Value {
    match m {
        ChatMessage::System { text } => json!({"role": "system", "content": text}),
        ChatMessage::User { text } => json!({"role": "user", "content": text}),
        ChatMessage::Assistant { text, tool_calls } => {
            let mut v = json!({"role": "assistant"});
            v["content"] = if text.is_empty() && !tool_calls.is_empty() {
                Value::Null
            } else {
                json!(text)
            };
            if !tool_calls.is_empty() {
                v["tool_calls"] = Value::Array(
                    tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": wire_call_id(c.call),
                                "type": "function",
                                "function": {"name": c.tool, "arguments": arguments(&c.args)},
                            })
                        })
                        .collect(),
                );
            }
            v
        }
        ChatMessage::Tool { call, text } => json!({
            "role": "tool",
            "tool_call_id": wire_call_id(*call),
            "content": text,
        }),
    }
}

/// Arguments as the JSON string the API takes; a null (no arguments) is `{}`.
fn arguments(args: &Value) -> String {
    match args {
        Value::Null => "{}".to_string(),
        v => v.to_string(),
    }
}

/// The streamed reply's parser.
#[derive(Debug, Default)]
pub struct Stream {
    draft: Draft,
    /// Per call in `draft.calls`: the `index` it streams under and the last `id` seen.
    slots: Vec<(Option<u64>, String)>,
    finish: Option<String>,
    refusal: String,
    max_tokens: u32,
}

impl Stream {
    pub fn new(max_tokens: u32) -> Stream {
        Stream {
            max_tokens,
            ..Stream::default()
        }
    }

    fn chunk(
        &mut self,
        m: &Map<String, Value>,
        deliver: &mut dyn FnMut(&str),
    ) -> Result<(), Failure> {
        if let Some(err) = m.get("error").filter(|e| !e.is_null()) {
            return Err(in_stream_error(err));
        }
        if let Some(u) = m.get("usage").filter(|u| !u.is_null()) {
            self.draft.usage = usage(u)?;
        }
        let choices = match m.get("choices") {
            Some(Value::Array(c)) => c,
            None | Some(Value::Null) if m.contains_key("usage") => return Ok(()),
            _ => {
                return Err(Failure::fatal(InferError::malformed(format!(
                    "a chunk with no choices: {}",
                    excerpt(&Value::Object(m.clone()).to_string())
                ))));
            }
        };
        for choice in choices {
            let idx = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            if idx != 0 {
                return Err(Failure::fatal(InferError::malformed(format!(
                    "a chunk for choice {idx}, but one choice was asked for"
                ))));
            }
            if let Some(delta) = choice.get("delta").filter(|d| !d.is_null()) {
                self.delta(delta, deliver)?;
            }
            match choice.get("finish_reason") {
                None | Some(Value::Null) => {}
                Some(Value::String(r)) => self.finish = Some(r.clone()),
                Some(other) => {
                    return Err(Failure::fatal(InferError::malformed(format!(
                        "finish_reason is not a string: {}",
                        excerpt(&other.to_string())
                    ))));
                }
            }
        }
        Ok(())
    }

    fn delta(&mut self, delta: &Value, deliver: &mut dyn FnMut(&str)) -> Result<(), Failure> {
        match delta.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) => push_text(&mut self.draft, t, deliver)?,
            Some(other) => {
                return Err(Failure::fatal(InferError::malformed(format!(
                    "delta content is not text: {}",
                    excerpt(&other.to_string())
                ))));
            }
        }
        if let Some(Value::String(r)) = delta.get("refusal") {
            self.refusal.push_str(r);
        }
        match delta.get("tool_calls") {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Array(calls)) => {
                for c in calls {
                    self.tool_fragment(c)?;
                }
                Ok(())
            }
            Some(other) => Err(Failure::fatal(InferError::malformed(format!(
                "delta tool_calls is not a list: {}",
                excerpt(&other.to_string())
            )))),
        }
    }

    /// One tool-call fragment. Calls are told apart by `index`; a fragment without one
    /// continues the last call unless it carries a new `id`. A new `id` with a name at an index
    /// that already has a named call starts another call (servers that reuse index 0).
    fn tool_fragment(&mut self, c: &Value) -> Result<(), Failure> {
        let index = c.get("index").and_then(Value::as_u64);
        let id = c.get("id").and_then(Value::as_str).unwrap_or("");
        let f = c.get("function");
        let name = f
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let args = match f.and_then(|f| f.get("arguments")) {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            // A server that sends the arguments as an object, not as its JSON text.
            Some(Value::Object(_)) => {
                return self.tool_fragment(&{
                    let mut c = c.clone();
                    let text = c["function"]["arguments"].to_string();
                    c["function"]["arguments"] = Value::String(text);
                    c
                });
            }
            Some(other) => {
                return Err(Failure::fatal(InferError::malformed(format!(
                    "tool call arguments are not text: {}",
                    excerpt(&other.to_string())
                ))));
            }
        };
        let at = match index {
            Some(i) => self.slots.iter().rposition(|(si, _)| *si == Some(i)),
            None => match self.slots.last() {
                Some((_, last_id)) if id.is_empty() || id == last_id => Some(self.slots.len() - 1),
                _ => None,
            },
        };
        let at = match at {
            Some(k)
                if !id.is_empty()
                    && !self.slots[k].1.is_empty()
                    && id != self.slots[k].1
                    && !name.is_empty()
                    && !self.draft.calls[k].name.is_empty() =>
            {
                None
            }
            other => other,
        };
        let k = match at {
            Some(k) => k,
            None => {
                self.draft.calls.push(DraftCall::default());
                self.slots.push((index, String::new()));
                self.draft.calls.len() - 1
            }
        };
        if !id.is_empty() {
            self.slots[k].1 = id.to_string();
        }
        self.draft.calls[k].set_name(name, &format!("tool call {k}"))?;
        grow_check(&self.draft, args.len())?;
        self.draft.calls[k].args.push_str(args);
        Ok(())
    }
}

impl StreamParser for Stream {
    fn event(&mut self, ev: &Event, deliver: &mut dyn FnMut(&str)) -> Result<Flow, Failure> {
        if !ev.name.is_empty() && ev.name != "message" {
            if ev.name == "error" {
                let m = json_object(&ev.data, "an error event")?;
                return Err(in_stream_error(
                    m.get("error").unwrap_or(&Value::Object(m.clone())),
                ));
            }
            return Err(Failure::fatal(InferError::malformed(format!(
                "an unknown event {:?}",
                ev.name
            ))));
        }
        if ev.data.trim() == "[DONE]" {
            return Ok(Flow::Done);
        }
        let m = json_object(&ev.data, "a chunk")?;
        self.chunk(&m, deliver)?;
        Ok(Flow::More)
    }

    fn finish(self: Box<Self>) -> Result<Draft, Failure> {
        let s = *self;
        if !s.refusal.is_empty() {
            return Err(Failure::fatal(InferError::Stopped(format!(
                "the model refused: {}",
                excerpt(&s.refusal)
            ))));
        }
        match s.finish.as_deref() {
            None => Err(Failure::fatal(InferError::malformed(
                "the stream ended with [DONE] but no finish_reason",
            ))),
            Some(r) => {
                stop(r, &s.draft, s.max_tokens)?;
                Ok(s.draft)
            }
        }
    }
}

/// The meaning of a `finish_reason`.
fn stop(reason: &str, draft: &Draft, max_tokens: u32) -> Result<(), Failure> {
    match reason {
        "stop" | "tool_calls" | "function_call" => Ok(()),
        "length" if draft.calls.is_empty() => Ok(()),
        "length" => Err(Failure::fatal(InferError::Stopped(format!(
            "the reply reached the slot's max_tokens ({max_tokens}) inside a tool call"
        )))),
        "content_filter" => Err(Failure::fatal(InferError::Stopped(
            "the provider's content filter stopped it (finish_reason content_filter)".into(),
        ))),
        other => Err(Failure::fatal(InferError::malformed(format!(
            "an unknown finish_reason {:?}",
            excerpt(other)
        )))),
    }
}

fn usage(u: &Value) -> Result<Usage, Failure> {
    Ok(Usage {
        input_tokens: count(u.get("prompt_tokens"), "prompt_tokens")?,
        output_tokens: count(u.get("completion_tokens"), "completion_tokens")?,
    })
}

fn in_stream_error(err: &Value) -> Failure {
    let message = match err {
        Value::String(s) => excerpt(s),
        v => excerpt(
            v.get("message")
                .and_then(Value::as_str)
                .unwrap_or(&v.to_string()),
        ),
    };
    let kind = err
        .get("type")
        .or_else(|| err.get("code"))
        .map(|k| match k {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        })
        .unwrap_or_else(|| "an error".to_string());
    let code = err.get("code").and_then(Value::as_u64);
    let retryable = matches!(code, Some(429 | 500..=599))
        || matches!(
            kind.as_str(),
            "server_error" | "rate_limit_exceeded" | "overloaded_error" | "api_error"
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

/// A whole (not streamed) reply: a server that ignored `stream: true`.
pub fn whole(body: &str, max_tokens: u32, deliver: &mut dyn FnMut(&str)) -> Result<Draft, Failure> {
    let m = json_object(body, "the reply")?;
    if let Some(err) = m.get("error").filter(|e| !e.is_null()) {
        return Err(in_stream_error(err));
    }
    let choice = m
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| Failure::fatal(InferError::malformed("a reply with no choices")))?;
    let msg = choice
        .get("message")
        .ok_or_else(|| Failure::fatal(InferError::malformed("a choice with no message")))?;
    let mut s = Stream::new(max_tokens);
    if let Some(u) = m.get("usage").filter(|u| !u.is_null()) {
        s.draft.usage = usage(u)?;
    }
    // The message has the delta's shape, with whole values and no indexes.
    let mut delta = msg.clone();
    if let Some(Value::Array(calls)) = delta.get_mut("tool_calls") {
        for (i, c) in calls.iter_mut().enumerate() {
            c["index"] = json!(i);
        }
    }
    s.delta(&delta, deliver)?;
    s.finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(str::to_string);
    Box::new(s).finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::runbook::Anchored;

    fn run(events: &[&str]) -> (Result<Draft, Failure>, Vec<String>) {
        let mut s = Box::new(Stream::new(100));
        let mut out = Vec::new();
        for data in events {
            let ev = Event {
                name: String::new(),
                data: (*data).to_string(),
            };
            match s.event(&ev, &mut |t| out.push(t.to_string())) {
                Ok(Flow::Done) => return (s.finish(), out),
                Ok(Flow::More) => {}
                Err(e) => return (Err(e), out),
            }
        }
        panic!("no [DONE]");
    }

    #[test]
    fn a_fragment_without_index_continues_the_last_call() {
        let (d, _) = run(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"t","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ]);
        let d = d.unwrap();
        assert_eq!(d.calls.len(), 1);
        assert_eq!(d.calls[0].args, r#"{"x":1}"#);
    }

    #[test]
    fn a_new_id_and_name_at_a_reused_index_is_a_new_call() {
        let (d, _) = run(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"t","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"u","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ]);
        let d = d.unwrap();
        let names: Vec<&str> = d.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["t", "u"]);
    }

    #[test]
    fn a_refusal_stops_the_reply() {
        let (d, _) = run(&[
            r#"{"choices":[{"delta":{"refusal":"I can't"}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ]);
        let e = d.unwrap_err().error;
        assert_eq!(e.anchor(), "inference-stopped");
    }

    #[test]
    fn finish_reasons_map() {
        let d = Draft::default();
        for ok in ["stop", "tool_calls", "function_call", "length"] {
            assert!(stop(ok, &d, 5).is_ok(), "{ok}");
        }
        let with_call = Draft {
            calls: vec![DraftCall::default()],
            ..Draft::default()
        };
        assert_eq!(
            stop("length", &with_call, 5).unwrap_err().error.anchor(),
            "inference-stopped"
        );
        assert_eq!(
            stop("content_filter", &d, 5).unwrap_err().error.anchor(),
            "inference-stopped"
        );
        assert_eq!(
            stop("eaten_by_a_grue", &d, 5).unwrap_err().error.anchor(),
            "inference-malformed"
        );
    }

    #[test]
    fn a_second_choice_is_refused() {
        let (d, _) = run(&[r#"{"choices":[{"index":1,"delta":{"content":"x"}}]}"#]);
        assert!(d.unwrap_err().error.to_string().contains("choice 1"));
    }

    #[test]
    fn an_in_stream_server_error_may_be_retried() {
        let (d, _) =
            run(&[r#"{"error":{"message":"overloaded","type":"server_error","code":503}}"#]);
        let f = d.unwrap_err();
        assert!(f.retryable);
        assert_eq!(f.error.anchor(), "inference-provider-error");
    }
}
