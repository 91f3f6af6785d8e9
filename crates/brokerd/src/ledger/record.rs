//! One audit record, its hash, and the redacted summary arguments are recorded as.

use bxcore::{CallId, SessionId, Timestamp, canonical};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The `prev` of the first record: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a record says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Requested,
    Allowed,
    Denied,
    Pending,
    Approved,
    Expired,
    Result,
    Failed,
    Recovered,
    Accepted,
    Started,
}

/// One line of `chain.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub seq: u64,
    pub time: Timestamp,
    pub prev: String,
    pub hash: String,
    pub session: Option<SessionId>,
    pub call: Option<CallId>,
    pub tool: Option<String>,
    pub event: Event,
    pub detail: Value,
}

/// A record before the chain gives it its place (`seq`, `prev`, `hash`).
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub session: Option<SessionId>,
    pub call: Option<CallId>,
    pub tool: Option<String>,
    pub event: Event,
    pub detail: Value,
}

impl Draft {
    /// A record about one call.
    pub fn call(
        session: &SessionId,
        call: CallId,
        tool: &str,
        event: Event,
        detail: Value,
    ) -> Draft {
        Draft {
            session: Some(session.clone()),
            call: Some(call),
            tool: Some(tool.to_string()),
            event,
            detail,
        }
    }

    /// A record about the broker itself (start, recovery, acceptance).
    pub fn broker(event: Event, detail: Value) -> Draft {
        Draft {
            session: None,
            call: None,
            tool: None,
            event,
            detail,
        }
    }
}

/// The hash of a record given as a JSON object without its `hash` key: sha256 of `prev`'s 64
/// characters followed by the canonical JSON of the object.
pub fn hash_of(prev: &str, without_hash: &Value) -> String {
    let body = canonical::to_string(without_hash);
    let mut bytes = Vec::with_capacity(prev.len() + body.len());
    bytes.extend_from_slice(prev.as_bytes());
    bytes.extend_from_slice(body.as_bytes());
    canonical::sha256_hex(&bytes)
}

impl Record {
    /// Seal `draft` as record `seq` after `prev`.
    pub fn seal(draft: Draft, seq: u64, prev: &str, time: Timestamp) -> Record {
        let mut r = Record {
            seq,
            time,
            prev: prev.to_string(),
            hash: String::new(),
            session: draft.session,
            call: draft.call,
            tool: draft.tool,
            event: draft.event,
            detail: draft.detail,
        };
        r.hash = hash_of(prev, &r.value_without_hash());
        r
    }

    /// The record as JSON without `hash`, as it is hashed.
    pub fn value_without_hash(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.remove("hash");
        }
        v
    }

    /// The line written for it: canonical JSON and a newline.
    pub fn line(&self) -> String {
        let v = serde_json::to_value(self).unwrap_or(Value::Null);
        let mut s = canonical::to_string(&v);
        s.push('\n');
        s
    }
}

/// The most characters of a redacted summary.
const SUMMARY_MAX: usize = 200;

/// What is recorded about a call's arguments: their digest, and a summary that names each key
/// and the shape of its value, never the value (arguments may carry secrets).
pub fn args_detail(args: &Value) -> Value {
    let mut detail = Map::new();
    detail.insert("args_digest".into(), Value::String(canonical::digest(args)));
    detail.insert("args_summary".into(), Value::String(summary(args)));
    Value::Object(detail)
}

/// `{path: string(23), content: string(1024)}`: keys and shapes only.
pub fn summary(args: &Value) -> String {
    let shape = |v: &Value| match v {
        Value::Null => "null".to_string(),
        Value::Bool(_) => "bool".to_string(),
        Value::Number(_) => "number".to_string(),
        Value::String(s) => format!("string({})", s.chars().count()),
        Value::Array(a) => format!("array({})", a.len()),
        Value::Object(o) => format!("object({})", o.len()),
    };
    let mut s = match args {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| {
                    let k_short: String = k.chars().take(32).collect();
                    format!("{k_short}: {}", shape(&m[k]))
                })
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        other => shape(other),
    };
    if s.chars().count() > SUMMARY_MAX {
        s = s.chars().take(SUMMARY_MAX).collect();
        s.push('…');
    }
    s
}
