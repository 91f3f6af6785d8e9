//! Printing: human text by default, JSON with `--json`; a failed request as the [`Failure`]
//! that says it on stderr for people and as `{"error": {...}}` on stdout for scripts.

use std::path::Path;

use bxcore::client::ClientError;
use bxcore::visible::{Mode, Shown};
use serde::Serialize;
use serde_json::json;

use crate::context::Context;
use crate::done::Failure;

/// Print `value` as one line of JSON.
pub fn json_line(value: &impl Serialize) {
    match serde_json::to_string(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("bxctl: cannot encode the output: {e}"),
    }
}

/// The daemon a request went to, for the line that reports its failure.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// `brokerd`, `memoryd`.
    pub daemon: &'a str,
    pub socket: &'a Path,
    /// The flag that names another socket: `--admin`, `--memories`.
    pub flag: &'a str,
}

/// A failed request to brokerd.
pub fn failed(ctx: &Context, what: &str, e: &ClientError) -> Failure {
    let asked = Asked {
        daemon: "brokerd",
        socket: &ctx.admin,
        flag: "--admin",
    };
    failed_at(ctx.json, &asked, what, e)
}

/// The failed request `what` to `asked`: `{"error": {code, detail, what}}` on stdout with
/// `--json`, else a line on stderr, and when the socket did not answer, a second line asking
/// whether the daemon runs and the socket is the owner's.
pub fn failed_at(json: bool, asked: &Asked<'_>, what: &str, e: &ClientError) -> Failure {
    let (code, detail) = match e {
        ClientError::Remote(w) => (w.code.as_str().to_string(), w.detail.clone()),
        ClientError::Connect { .. } => ("unavailable".to_string(), e.to_string()),
        other => ("failed".to_string(), other.to_string()),
    };
    let mut text = format!(
        "bxctl: {}: {}",
        Shown(what, Mode::Line),
        Shown(&detail, Mode::Line)
    );
    let mut anchor = None;
    if matches!(e, ClientError::Connect { .. }) {
        text.push_str(&format!(
            "\nbxctl: is {} running, and is {} yours? (--home or {} name another)",
            asked.daemon,
            asked.socket.display(),
            asked.flag
        ));
        anchor = Some(crate::chat::UNREACHABLE_ANCHOR);
    }
    Failure::failed(text).pointing(anchor).json_if(
        json,
        json!({"error": {"code": code, "detail": detail, "what": what}}),
    )
}

/// A command line value the command refuses (an id that is not one): `{"error": {"code":
/// "usage", "detail"}}` on stdout with `--json`, else `bxctl: <why>` on stderr; exit 1, as a
/// request brokerd refused.
pub fn refused_value(json: bool, why: &dyn std::fmt::Display) -> Failure {
    Failure::failed(format!("bxctl: {why}")).json_if(
        json,
        json!({"error": {"code": "usage", "detail": why.to_string()}}),
    )
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

/// The `--home` bxctl was run with, for every command a hint prints.
static HINT_HOME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// ` --home DIR` when bxctl was run with `--home DIR`, else nothing: a printed hint then talks
/// to the same box.
pub fn hint_home() -> String {
    HINT_HOME
        .get()
        .map(|h| format!(" --home {}", Shown(h, Mode::Line)))
        .unwrap_or_default()
}

/// Remember the `--home` bxctl was run with, for the hints it prints.
pub fn set_hint_home(home: &std::path::Path) {
    let _ = HINT_HOME.set(home.display().to_string());
}

/// How long ago `t` was, for a person: `5m 02s ago`.
pub fn ago(t: bxcore::Timestamp) -> String {
    let ms = i128::from(bxcore::Timestamp::now().0) - i128::from(t.0);
    if ms <= 0 {
        return "just now".to_string();
    }
    format!("{} ago", time_left(ms))
}
