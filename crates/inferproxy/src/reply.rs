//! The reply as it is assembled from a provider's stream, and how it becomes the protocol's
//! `infer_reply`: tool calls numbered from the request's `first_call`, arguments parsed once, at
//! the end, and refused (never repaired, never made up) when they are not a JSON object.

use bxcore::{CallId, ChatMessage, InferReply, ToolCall, Usage};
use serde_json::Value;

use crate::error::InferError;

/// How the provider sees the call numbered `call`: `call_<n>`.
pub fn wire_call_id(call: CallId) -> String {
    format!("call_{}", call.0)
}

/// One tool call being assembled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DraftCall {
    /// The tool's name (set once; a repeat of the same name is ignored).
    pub name: String,
    /// The arguments' JSON text, as its fragments arrived.
    pub args: String,
}

impl DraftCall {
    /// Take a name fragment from a stream that may repeat the name on every delta. A second,
    /// different name for the same call is malformed.
    pub fn set_name(&mut self, name: &str, which: &str) -> Result<(), InferError> {
        if name.is_empty() || self.name == name {
            return Ok(());
        }
        if self.name.is_empty() {
            self.name = name.to_string();
            return Ok(());
        }
        Err(InferError::malformed(format!(
            "{which} changed its tool name from {:?} to {name:?}",
            self.name
        )))
    }
}

/// The reply so far: its text, its tool calls in order, the usage reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    pub text: String,
    pub calls: Vec<DraftCall>,
    pub usage: Usage,
}

impl Draft {
    /// The whole assistant message, tool calls numbered `first_call`, `first_call + 1`, ...
    pub fn finish(self, first_call: CallId) -> Result<InferReply, InferError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (i, c) in self.calls.into_iter().enumerate() {
            let n = first_call
                .0
                .checked_add(i as u64)
                .ok_or_else(|| InferError::malformed("the call numbers overflow"))?;
            if c.name.is_empty() {
                return Err(InferError::malformed(format!("tool call {i} has no name")));
            }
            let args = parse_args(&c.args).map_err(|why| {
                InferError::malformed(format!(
                    "the arguments of tool call {i} ({:?}) are {why}",
                    crate::error::excerpt(&c.name)
                ))
            })?;
            tool_calls.push(ToolCall {
                call: CallId(n),
                tool: c.name,
                args,
            });
        }
        Ok(InferReply {
            message: ChatMessage::Assistant {
                text: self.text,
                tool_calls,
            },
            usage: self.usage,
        })
    }
}

/// A tool call's arguments: empty means `{}`; anything else must be one JSON object.
pub fn parse_args(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(format!(
            "not a JSON object but {}",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
            }
        )),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::runbook::Anchored;
    use serde_json::json;

    #[test]
    fn calls_are_numbered_from_first_call() {
        let d = Draft {
            text: "ok".into(),
            calls: vec![
                DraftCall {
                    name: "a".into(),
                    args: r#"{"x":1}"#.into(),
                },
                DraftCall {
                    name: "b".into(),
                    args: String::new(),
                },
            ],
            usage: Usage {
                input_tokens: 3,
                output_tokens: 4,
            },
        };
        let r = d.finish(CallId(7)).unwrap();
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"message": {"role": "assistant", "text": "ok", "tool_calls": [
                {"call": 7, "tool": "a", "args": {"x": 1}},
                {"call": 8, "tool": "b", "args": {}}
            ]}, "usage": {"input_tokens": 3, "output_tokens": 4}})
        );
    }

    #[test]
    fn a_call_with_no_name_is_malformed() {
        let d = Draft {
            calls: vec![DraftCall {
                name: String::new(),
                args: "{}".into(),
            }],
            ..Draft::default()
        };
        let e = d.finish(CallId(1)).unwrap_err();
        assert_eq!(e.anchor(), "inference-malformed");
        assert!(e.to_string().contains("tool call 0 has no name"), "{e}");
    }

    #[test]
    fn arguments_that_are_not_an_object_are_malformed() {
        for (bad, why) in [
            ("{\"x\":", "not valid JSON"),
            ("[1]", "an array"),
            ("\"s\"", "a string"),
            ("null", "null"),
        ] {
            let d = Draft {
                calls: vec![DraftCall {
                    name: "t".into(),
                    args: bad.into(),
                }],
                ..Draft::default()
            };
            let e = d.finish(CallId(1)).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_repeated_name_is_kept_once_and_a_changed_one_refused() {
        let mut c = DraftCall::default();
        c.set_name("get_weather", "call 0").unwrap();
        c.set_name("get_weather", "call 0").unwrap();
        c.set_name("", "call 0").unwrap();
        assert_eq!(c.name, "get_weather");
        assert!(c.set_name("rm_rf", "call 0").is_err());
    }

    #[test]
    fn wire_ids_are_call_n() {
        assert_eq!(wire_call_id(CallId(42)), "call_42");
    }
}
