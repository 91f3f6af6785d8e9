//! One audit record, its hash, and the redacted summary arguments are recorded as.

use std::fmt::Write as _;

use bxcore::{CallId, SessionId, Timestamp, canonical};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

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
    /// A pending approval its requester cancelled (or went away from) before the decision.
    Withdrawn,
    Result,
    Failed,
    Recovered,
    Accepted,
    Started,
    /// The owner granted a lease: calls like one approved run without asking, for a while.
    Leased,
    /// The owner revoked a lease.
    LeaseRevoked,
}

impl Event {
    /// The wire name, e.g. `requested`.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Requested => "requested",
            Event::Allowed => "allowed",
            Event::Denied => "denied",
            Event::Pending => "pending",
            Event::Approved => "approved",
            Event::Expired => "expired",
            Event::Withdrawn => "withdrawn",
            Event::Result => "result",
            Event::Failed => "failed",
            Event::Recovered => "recovered",
            Event::Accepted => "accepted",
            Event::Started => "started",
            Event::Leased => "leased",
            Event::LeaseRevoked => "lease_revoked",
        }
    }
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
    canonical::hex_string(&digest(&[
        prev.as_bytes(),
        canonical::to_string(without_hash).as_bytes(),
    ]))
}

/// sha256 of `parts` one after another, each fed to the hasher in turn (never copied into one
/// buffer first).
pub(crate) fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
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
        r.hash = r.computed_hash();
        r
    }

    /// The hash this record should carry: sha256 of its `prev` and its canonical JSON without
    /// `hash`. The same bytes as `hash_of(prev, &value_without_hash())`, built without a tree.
    pub fn computed_hash(&self) -> String {
        let body = self.canonical_without_hash();
        canonical::hex_string(&digest(&[self.prev.as_bytes(), body.as_bytes()]))
    }

    /// Canonical JSON of the record without `hash`: its keys in byte order.
    pub fn canonical_without_hash(&self) -> String {
        // Each part written into one buffer; integers through `Display` (what serde_json
        // writes for them), which cannot fail into a `String`.
        let mut out = String::with_capacity(256);
        out.push_str("{\"call\":");
        match self.call {
            Some(c) => {
                let _ = write!(out, "{}", c.0);
            }
            None => out.push_str("null"),
        }
        out.push_str(",\"detail\":");
        canonical::write(&mut out, &self.detail);
        out.push_str(",\"event\":");
        canonical::write_str(&mut out, self.event.as_str());
        out.push_str(",\"prev\":");
        canonical::write_str(&mut out, &self.prev);
        let _ = write!(out, ",\"seq\":{},\"session\":", self.seq);
        match &self.session {
            Some(s) => canonical::write_str(&mut out, s.as_str()),
            None => out.push_str("null"),
        }
        let _ = write!(out, ",\"time\":{},\"tool\":", self.time.0);
        match &self.tool {
            Some(t) => canonical::write_str(&mut out, t),
            None => out.push_str("null"),
        }
        out.push('}');
        out
    }

    /// The record as JSON without `hash`, as it is hashed.
    pub fn value_without_hash(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.remove("hash");
        }
        v
    }

    /// The line written for it: canonical JSON and a newline. `hash` sorts between `event` and
    /// `prev`, so it goes in just before `"prev"`.
    pub fn line(&self) -> String {
        let body = self.canonical_without_hash();
        let at = body.find(",\"prev\":").unwrap_or(body.len() - 1);
        let mut s = String::with_capacity(body.len() + 80);
        s.push_str(&body[..at]);
        s.push_str(",\"hash\":");
        canonical::write_str(&mut s, &self.hash);
        s.push_str(&body[at..]);
        s.push('\n');
        s
    }
}

/// The most characters of a redacted summary.
const SUMMARY_MAX: usize = 200;

/// What is recorded about a call's arguments: their digest, and a summary that names each key
/// and the shape of its value, never the value (arguments may carry secrets).
/// The longest tool name the chain holds as it is: every tool's name is shorter.
pub const TOOL_NAME_MAX: usize = 64;

/// A tool name as the chain (and a refusal) holds it: as it is when it is a name a tool could
/// have (at most [`TOOL_NAME_MAX`] bytes of `[A-Za-z0-9_.-]`), else a bounded summary of its
/// first characters, its length and its digest, so a caller cannot write a 200 KB name into
/// every record of a call.
pub fn tool_name(tool: &str) -> String {
    let plain = tool.len() <= TOOL_NAME_MAX
        && tool
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if plain {
        return tool.to_string();
    }
    let head: String = tool
        .chars()
        .take(24)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    let digest = canonical::sha256_hex(tool.as_bytes());
    format!("{head}... ({} bytes, sha256 {})", tool.len(), &digest[..16])
}

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
