//! What the owner declares tools from (`docs/tools.md`): `brokerd tools list` (every tool the
//! broker offers with this configuration, with the label its results carry, its effect and its
//! approval rule) and `brokerd tools ask --server NAME` (the server's own `tools/list`, asked as
//! brokerd's user and confined as a call is, each tool printed as a `[[declared_tools]]` entry
//! to review and paste, with its digest).
//!
//! The entries `ask` prints trust nothing: results are third-party text, `reads = "private"`,
//! the effect `local` and the approval `always`, until the owner chooses otherwise; the
//! description is the server's, there for the owner to read and rewrite in their own words.

use serde_json::{Value, json};
use toolkit::{ApprovalRule, Effect, Reads};

use crate::config::Config;

/// `brokerd tools list`: one line per tool the broker offers with this configuration (a
/// running brokerd offers what it was started with: restart it after a change).
pub fn list(cfg: &Config) -> Result<Vec<String>, String> {
    // As `serve` offers them: web_fetch only with a gateway.
    let env = toolkit::Env {
        gateway: cfg.gateway.socket.clone(),
        ..toolkit::Env::default()
    };
    let registry = cfg.registry().map_err(|e| e.to_string())?.offered(&env);
    let mut out = Vec::new();
    for e in registry.entries() {
        let d = e.declared();
        let reads = match d.reads {
            Reads::Fixed(class) => class.to_string(),
            Reads::Root => "its root's class".to_string(),
        };
        let effect = match d.effect {
            Effect::Egress { max } => format!("egress up to {max}"),
            other => other.as_str().to_string(),
        };
        let kind = match cfg.declared_tools.iter().find(|t| t.name == e.name()) {
            Some(t) => format!("declared, on server {}", t.server),
            None => "built in".to_string(),
        };
        out.push(format!(
            "{:<18} {kind}: reads {reads}{}, effect {effect}, approval {}",
            e.name(),
            if d.untrusted_output {
                ", untrusted"
            } else {
                ""
            },
            d.approval.as_str()
        ));
    }
    // What else a turn's model is offered, and when web_fetch is not.
    out.push(
        "(loopd offers the model its own time_now and session_info besides; web_fetch is \
         offered only while gatewayd's allow-list names a host)"
            .to_string(),
    );
    Ok(out)
}

/// `brokerd tools ask --server NAME`: the server's tools as declarations to review.
pub fn ask(cfg: &Config, name: &str) -> Result<String, String> {
    let Some(sc) = cfg.tool_servers.get(name) else {
        let known: Vec<&str> = cfg.tool_servers.keys().map(String::as_str).collect();
        return Err(format!(
            "there is no [tool_servers.{name}] in the configuration (it has: {}); {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            },
            bxcore::runbook::pointer(toolkit::declared::FAILED_ANCHOR)
        ));
    };
    // As root, as brokerd's own user (`[sandbox] user`), as a call is: what that user cannot
    // read, the server cannot read in a call either.
    let id = bxharden::Identity::resolve(&cfg.sandbox).map_err(|e| {
        format!(
            "{e}: the server is asked as brokerd's user ([sandbox] user), as a call is (a dev box's \
             users exist while it is up: `bxctl dev up` first)"
        )
    })?;
    if id.drops {
        bxharden::privdrop::drop_to(&id).map_err(|e| e.to_string())?;
    }
    let server = crate::daemon::tool_server(cfg, name, sc).map_err(|e| e.to_string())?;
    let tools = server.list(name).map_err(|e| {
        format!(
            "{e}; {}",
            bxcore::runbook::pointer(bxcore::runbook::Anchored::anchor(&e))
        )
    })?;
    let mut out = String::new();
    for t in &tools {
        out.push_str(&entry(name, t)?);
        out.push('\n');
    }
    if tools.is_empty() {
        out.push_str(&format!("# the server {name} offers no tools\n"));
    }
    Ok(out)
}

/// One tool of the server as a `[[declared_tools]]` entry that trusts nothing.
fn entry(server: &str, tool: &Value) -> Result<String, String> {
    let on_server = tool.get("name").and_then(Value::as_str).unwrap_or("");
    // The model calls it by a name the configuration accepts: the server's, lowercased, with
    // anything else made `_`.
    let name: String = on_server
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
            _ => '_',
        })
        .take(64)
        .collect();
    let mut decl = json!({
        "name": name,
        "server": server,
        "description": tool.get("description").and_then(Value::as_str).unwrap_or(""),
        "digest": toolkit::mcp::tool_digest(tool),
        "reads": "private",
        "untrusted": true,
        "effect": "local",
        "approval": ApprovalRule::Always.as_str(),
        "parameters": without_nulls(tool.get("inputSchema").cloned().unwrap_or(json!({"type": "object"}))),
    });
    // Always named: a declaration renamed by the owner still calls the server's tool.
    decl["tool"] = json!(on_server);
    let text = toml::to_string(&json!({"declared_tools": [decl]}))
        .map_err(|e| format!("the tool {on_server:?} cannot be written as TOML: {e}"))?;
    Ok(format!(
        "# {on_server:?} on {server}: the description is the server's; read it, and write what \
         the model is to be told.\n# Choose reads, untrusted, effect (none | local | egress with \
         egress_max) and approval; nothing is trusted until you do.\n{}",
        escaped(&text)
    ))
}

/// `text` with every character a terminal would obey or hide (`bxcore::visible::is_hazard`:
/// C1 controls, bidi overrides, zero-width characters; TOML escapes only C0 and DEL) written as
/// TOML's `\uXXXX` escape, which a basic string reads back as that character.
fn escaped(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if bxcore::visible::is_hazard(c) && (c as u32) <= 0xffff => {
                format!("\\u{:04X}", c as u32)
            }
            c if bxcore::visible::is_hazard(c) => format!("\\U{:08X}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

/// TOML has no null: a schema's `null` values (a `default` of none) are left out.
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.into_iter()
                .filter(|v| !v.is_null())
                .map(without_nulls)
                .collect(),
        ),
        other => other,
    }
}
