//! Printing: human text by default, JSON with `--json`; failures on stderr for people and as
//! `{"error": {...}}` on stdout for scripts.

use bxcore::client::ClientError;
use bxcore::visible::{Mode, Shown};
use serde::Serialize;
use serde_json::json;

use crate::Outcome;
use crate::context::Context;

/// Print `value` as one line of JSON.
pub fn json_line(value: &impl Serialize) {
    match serde_json::to_string(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("bxctl: cannot encode the output: {e}"),
    }
}

/// Report a failed request to brokerd.
pub fn failed(ctx: &Context, what: &str, e: &ClientError) -> Outcome {
    let (code, detail) = match e {
        ClientError::Remote(w) => (w.code.as_str().to_string(), w.detail.clone()),
        ClientError::Connect { .. } => ("unavailable".to_string(), e.to_string()),
        other => ("failed".to_string(), other.to_string()),
    };
    if ctx.json {
        json_line(&json!({"error": {"code": code, "detail": detail, "what": what}}));
    } else {
        eprintln!(
            "bxctl: {}: {}",
            Shown(what, Mode::Line),
            Shown(&detail, Mode::Line)
        );
        if matches!(e, ClientError::Connect { .. }) {
            eprintln!(
                "bxctl: is brokerd running, and is {} yours? (--home or --admin name another)",
                ctx.admin.display()
            );
        }
    }
    Outcome::Failed
}

/// `9m 58s`, `1h 02m`, `expired`.
pub fn time_left(ms: i128) -> String {
    if ms <= 0 {
        return "expired".to_string();
    }
    let s = ms / 1000;
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}
