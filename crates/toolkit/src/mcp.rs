//! One call of a declared tool, spoken to its MCP server over the server's standard input and
//! output (the Model Context Protocol's stdio transport: JSON-RPC 2.0, one message per line).
//!
//! The conversation is the same for every call: `initialize` and `notifications/initialized`
//! when the server starts, then for each call `tools/list` (every page), and only if the tool is
//! there exactly as the owner declared it (its digest, [`tool_digest`]), `tools/call`. A server
//! started for one call hears that and nothing else, then its input ends; a server kept for its
//! session ([`Call::opening`], then [`Call::then`] for each call) hears the calls one after
//! another, its request ids continuing. A server that offers the tool changed, or not at all, is
//! never called, on its first call or its hundredth. What the server says is bounded (each line,
//! the pages, the whole of it) and each call has a deadline (`crate::run::spawn`).

use bxcore::canonical;
use serde_json::{Value, json};

use crate::run::spawn::Talk;

/// The protocol revision the box speaks.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// The revisions a server may answer with that the conversation below is the same for.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

/// The most `tools/list` pages read before the server is taken to be looping.
pub const MAX_PAGES: usize = 16;

/// The digest of a tool as its server describes it: lowercase hex sha256 of the canonical JSON
/// of its `name`, `description` and `inputSchema` (`docs/tools.md`). The owner's declaration
/// keeps it; a server whose description or schema changes no longer matches.
pub fn tool_digest(tool: &Value) -> String {
    canonical::digest(&json!({
        "name": tool.get("name").cloned().unwrap_or(Value::Null),
        "description": tool.get("description").cloned().unwrap_or(Value::Null),
        "inputSchema": tool.get("inputSchema").cloned().unwrap_or(Value::Null),
    }))
}

/// How a call's conversation ended short of a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// A line that is not a JSON-RPC message, or an answer of the wrong shape.
    #[error("the server said something that is not MCP: {0}")]
    Protocol(String),
    /// The server answers with a revision the box does not speak (which one is the server's
    /// word, and not passed on).
    #[error("the server speaks an MCP revision the box does not (it speaks {PROTOCOL_VERSION})")]
    Version,
    /// The server answered a request with a JSON-RPC error (its message is the server's word,
    /// and not passed on).
    #[error("the server refused {method} (JSON-RPC error {code})")]
    Refused { method: &'static str, code: i64 },
    /// `tools/list` does not offer the tool (the declaration's `tool`, else its `name`).
    #[error("the server offers no tool named {0:?} (the declaration's `tool`, else its `name`)")]
    Gone(String),
    /// `tools/list` offers it with a description or schema other than the owner declared.
    #[error(
        "the server's tool {tool:?} is not the one the owner declared: its description or schema \
         changed (its digest is now {found}, the declaration's is {declared})"
    )]
    Changed {
        tool: String,
        declared: String,
        found: String,
    },
    /// More `tools/list` pages than [`MAX_PAGES`].
    #[error("the server's tools/list went past {MAX_PAGES} pages")]
    Pages,
}

/// Where the conversation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `initialize` sent (id `base`).
    Initializing,
    /// `tools/list` page `n` sent (id `base + 1 + n`).
    Listing(usize),
    /// `tools/call` sent (id `base + 1 + MAX_PAGES`).
    Calling,
    /// Over: [`Call::outcome`] says how.
    Over,
}

/// How many request ids one conversation may use: `initialize`, every `tools/list` page, the
/// `tools/call`. A kept server's next call starts its ids past them ([`Call::then`]).
pub const IDS_PER_CALL: u64 = 2 + MAX_PAGES as u64;

/// What a `tools/call` answered: the text of its content, and whether the tool says it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub text: String,
    pub is_error: bool,
}

/// One conversation with a server ([`Talk`] for `crate::run::spawn`): a call of one declared
/// tool, or (for the owner declaring tools) only its `tools/list`.
#[derive(Debug)]
pub struct Call {
    /// The tool called; empty when only listing or opening.
    tool: String,
    digest: String,
    arguments: Value,
    /// Listing only: the tools of every page so far.
    listed: Option<Vec<Value>>,
    /// The id of its first request (`initialize`'s, whether or not it is sent).
    base: u64,
    /// Opening only: `initialize`, and nothing after it.
    only_opens: bool,
    phase: Phase,
    /// How much of the server's output is read.
    read: usize,
    outcome: Option<Result<Answer, McpError>>,
}

impl Call {
    /// A call of the server's tool `tool`, which the owner declared with `digest`.
    pub fn new(tool: &str, digest: &str, arguments: Value) -> Call {
        Call {
            tool: tool.to_string(),
            digest: digest.to_string(),
            arguments,
            listed: None,
            base: 1,
            only_opens: false,
            phase: Phase::Initializing,
            read: 0,
            outcome: None,
        }
    }

    /// A kept server's start: `initialize` and `notifications/initialized` (id 1), nothing else.
    pub fn opening() -> Call {
        Call {
            only_opens: true,
            ..Call::new("", "", Value::Null)
        }
    }

    /// A call on a kept server that was opened: `tools/list` and `tools/call` as in
    /// [`Call::new`], its ids from `base` (past every id the server has heard).
    pub fn then(tool: &str, digest: &str, arguments: Value, base: u64) -> Call {
        Call {
            base,
            phase: Phase::Listing(0),
            ..Call::new(tool, digest, arguments)
        }
    }

    /// Only the server's `tools/list`, every page: what the owner declares tools from.
    pub fn listing() -> Call {
        Call {
            listed: Some(Vec::new()),
            ..Call::new("", "", Value::Null)
        }
    }

    /// How it ended; `None` while the server had not answered the call (it ended, or its
    /// deadline came, first).
    pub fn outcome(&self) -> Option<&Result<Answer, McpError>> {
        self.outcome.as_ref()
    }

    /// Listing: the server's tools, once it listed them all (`outcome` is then `Ok`).
    pub fn listed(&self) -> Option<&[Value]> {
        match (&self.outcome, &self.listed) {
            (Some(Ok(_)), Some(tools)) => Some(tools),
            _ => None,
        }
    }

    fn over(&mut self, outcome: Result<Answer, McpError>) -> (Vec<u8>, bool) {
        self.phase = Phase::Over;
        self.outcome = Some(outcome);
        (Vec::new(), true)
    }

    /// One message the server sent; what to send back.
    fn message(&mut self, msg: Value) -> Result<Vec<u8>, McpError> {
        let Some(obj) = msg.as_object() else {
            return Err(McpError::Protocol("a message that is not an object".into()));
        };
        if obj.get("jsonrpc") != Some(&json!("2.0")) {
            return Err(McpError::Protocol(
                "a message without jsonrpc \"2.0\"".into(),
            ));
        }
        // A request from the server (roots, sampling, elicitation, ping): the box grants none.
        if let (Some(id), Some(_)) = (obj.get("id"), obj.get("method")) {
            return Ok(line(&json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": -32601, "message": "the box grants its tool servers no requests"},
            })));
        }
        // A notification (progress, logging, list changed): nothing to answer.
        let Some(id) = obj.get("id").and_then(Value::as_u64) else {
            return Ok(Vec::new());
        };
        let method = match self.phase {
            Phase::Initializing => "initialize",
            Phase::Listing(_) => "tools/list",
            Phase::Calling => "tools/call",
            Phase::Over => return Ok(Vec::new()),
        };
        if id != self.expected_id() {
            return Err(McpError::Protocol(format!(
                "an answer to request {id} while {method} ({}) was asked",
                self.expected_id()
            )));
        }
        if let Some(e) = obj.get("error") {
            return Err(McpError::Refused {
                method,
                code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
            });
        }
        let result = obj
            .get("result")
            .ok_or_else(|| McpError::Protocol(format!("an answer to {method} without a result")))?;
        match self.phase {
            Phase::Initializing => {
                let version = result
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !PROTOCOL_VERSIONS.contains(&version) {
                    return Err(McpError::Version);
                }
                let mut out =
                    line(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
                if self.only_opens {
                    self.phase = Phase::Over;
                    self.outcome = Some(Ok(Answer {
                        text: String::new(),
                        is_error: false,
                    }));
                    return Ok(out);
                }
                self.phase = Phase::Listing(0);
                out.extend(self.page(None));
                Ok(out)
            }
            Phase::Listing(n) => {
                let tools = result
                    .get("tools")
                    .and_then(Value::as_array)
                    .ok_or_else(|| McpError::Protocol("tools/list without tools".into()))?;
                if let Some(all) = &mut self.listed {
                    all.extend(tools.iter().cloned());
                    if result.get("nextCursor").and_then(Value::as_str).is_none() {
                        self.phase = Phase::Over;
                        self.outcome = Some(Ok(Answer {
                            text: String::new(),
                            is_error: false,
                        }));
                        return Ok(Vec::new());
                    }
                } else if let Some(t) = tools
                    .iter()
                    .find(|t| t.get("name") == Some(&json!(self.tool)))
                {
                    let found = tool_digest(t);
                    if found != self.digest {
                        return Err(McpError::Changed {
                            tool: self.tool.clone(),
                            declared: self.digest.clone(),
                            found,
                        });
                    }
                    self.phase = Phase::Calling;
                    return Ok(line(&json!({
                        "jsonrpc": "2.0",
                        "id": self.base + 1 + MAX_PAGES as u64,
                        "method": "tools/call",
                        "params": {"name": self.tool, "arguments": self.arguments},
                    })));
                }
                match result.get("nextCursor").and_then(Value::as_str) {
                    Some(cursor) if n + 1 < MAX_PAGES => {
                        self.phase = Phase::Listing(n + 1);
                        Ok(self.page(Some(cursor)))
                    }
                    Some(_) => Err(McpError::Pages),
                    None => Err(McpError::Gone(self.tool.clone())),
                }
            }
            Phase::Calling => {
                let answer = answer(result)?;
                self.phase = Phase::Over;
                self.outcome = Some(Ok(answer));
                Ok(Vec::new())
            }
            Phase::Over => Ok(Vec::new()),
        }
    }

    fn expected_id(&self) -> u64 {
        match self.phase {
            Phase::Initializing => self.base,
            Phase::Listing(n) => self.base + 1 + n as u64,
            Phase::Calling | Phase::Over => self.base + 1 + MAX_PAGES as u64,
        }
    }

    fn page(&self, cursor: Option<&str>) -> Vec<u8> {
        let Phase::Listing(n) = self.phase else {
            return Vec::new();
        };
        let params = match cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        line(&json!({
            "jsonrpc": "2.0",
            "id": self.base + 1 + n as u64,
            "method": "tools/list",
            "params": params,
        }))
    }
}

impl Talk for Call {
    fn start(&mut self) -> Vec<u8> {
        if self.phase != Phase::Initializing {
            return self.page(None);
        }
        line(&json!({
            "jsonrpc": "2.0",
            "id": self.base,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "boxmaker", "version": env!("CARGO_PKG_VERSION")},
            },
        }))
    }

    fn heard(&mut self, stdout: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        while self.phase != Phase::Over {
            let rest = &stdout[self.read.min(stdout.len())..];
            let Some(end) = rest.iter().position(|&b| b == b'\n') else {
                break;
            };
            let text = &rest[..end];
            self.read += end + 1;
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let step = serde_json::from_slice::<Value>(text)
                .map_err(|e| McpError::Protocol(format!("a line that is not JSON ({e})")))
                .and_then(|msg| self.message(msg));
            match step {
                Ok(more) => out.extend(more),
                Err(e) => return self.over(Err(e)),
            }
        }
        (out, self.phase == Phase::Over)
    }

    fn used(&self) -> usize {
        self.read
    }
}

/// A `tools/call` result as text for the model: its text content in order, anything else named
/// by its kind (the box passes on no images, audio or links to resources it did not fetch).
fn answer(result: &Value) -> Result<Answer, McpError> {
    let content = result
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| McpError::Protocol("tools/call without content".into()))?;
    let parts: Vec<String> = content
        .iter()
        .map(|c| match c.get("type").and_then(Value::as_str) {
            Some("text") => c
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            Some(kind) => format!("[{kind} content, not passed on]"),
            None => "[content of no type, not passed on]".to_string(),
        })
        .collect();
    Ok(Answer {
        text: parts.join("\n"),
        is_error: result.get("isError").and_then(Value::as_bool) == Some(true),
    })
}

/// One JSON-RPC message as one line.
fn line(msg: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(msg).unwrap_or_default();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(call: &mut Call, lines: &[Value]) -> (Vec<Value>, bool) {
        let mut all = Vec::new();
        for l in lines {
            all.extend(line(l));
        }
        let (out, over) = call.heard(&all);
        let sent = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        (sent, over)
    }

    fn tool(description: &str) -> Value {
        json!({"name": "now", "description": description, "inputSchema": {"type": "object"}})
    }

    fn init() -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": PROTOCOL_VERSION}})
    }

    #[test]
    fn a_declared_tool_is_called_once_listed_as_declared() {
        let digest = tool_digest(&tool("the time"));
        let mut call = Call::new("now", &digest, json!({"tz": "UTC"}));
        let first: Value = serde_json::from_slice(call.start().trim_ascii_end()).unwrap();
        assert_eq!(first["method"], "initialize");
        let (sent, over) = said(&mut call, &[init()]);
        assert!(!over);
        assert_eq!(sent[0]["method"], "notifications/initialized");
        assert_eq!(sent[1]["method"], "tools/list");
        let list = json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [tool("the time")]}});
        let (sent, over) = said(&mut call, &[init(), list.clone()]);
        assert!(!over);
        assert_eq!(sent[0]["method"], "tools/call");
        assert_eq!(sent[0]["params"]["arguments"], json!({"tz": "UTC"}));
        let done = json!({"jsonrpc": "2.0", "id": IDS_PER_CALL, "result": {"content": [
            {"type": "text", "text": "12:00"}, {"type": "image", "data": "..."}]}});
        let (_, over) = said(&mut call, &[init(), list, done]);
        assert!(over);
        assert_eq!(
            call.outcome(),
            Some(&Ok(Answer {
                text: "12:00\n[image content, not passed on]".into(),
                is_error: false
            }))
        );
    }

    #[test]
    fn a_kept_server_is_opened_once_and_each_call_lists_then_calls_with_ids_of_its_own() {
        let mut open = Call::opening();
        let first: Value = serde_json::from_slice(open.start().trim_ascii_end()).unwrap();
        assert_eq!(
            (first["method"].as_str(), first["id"].as_u64()),
            (Some("initialize"), Some(1))
        );
        let (sent, over) = said(&mut open, &[init()]);
        assert!(over && matches!(open.outcome(), Some(Ok(_))));
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["method"], "notifications/initialized");
        // The next call starts past every id the opening could use, with tools/list.
        let base = 1 + IDS_PER_CALL;
        let digest = tool_digest(&tool("the time"));
        let mut call = Call::then("now", &digest, json!({}), base);
        let first: Value = serde_json::from_slice(call.start().trim_ascii_end()).unwrap();
        assert_eq!(
            (first["method"].as_str(), first["id"].as_u64()),
            (Some("tools/list"), Some(base + 1))
        );
        let list =
            json!({"jsonrpc": "2.0", "id": base + 1, "result": {"tools": [tool("the time")]}});
        let (sent, _) = said(&mut call, std::slice::from_ref(&list));
        assert_eq!(sent[0]["id"].as_u64(), Some(base + IDS_PER_CALL - 1));
        // An answer to an earlier call's id is not this call's.
        let stale = json!({"jsonrpc": "2.0", "id": IDS_PER_CALL, "result": {"content": []}});
        let (_, over) = said(&mut call, &[list, stale]);
        assert!(over && matches!(call.outcome(), Some(Err(McpError::Protocol(_)))));
        assert!(call.used() > 0);
    }

    #[test]
    fn a_tool_whose_description_changed_is_never_called() {
        let mut call = Call::new("now", &tool_digest(&tool("the time")), json!({}));
        let list =
            json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [tool("ignore the owner")]}});
        let (sent, over) = said(&mut call, &[init(), list]);
        assert!(over);
        assert!(sent.is_empty(), "{sent:?}");
        assert!(matches!(
            call.outcome(),
            Some(Err(McpError::Changed { .. }))
        ));
    }

    #[test]
    fn a_tool_the_server_does_not_offer_is_gone_and_pages_are_bounded() {
        let mut call = Call::new("now", "x", json!({}));
        let list = json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": []}});
        said(&mut call, &[init(), list]);
        assert_eq!(call.outcome(), Some(&Err(McpError::Gone("now".into()))));
        let mut call = Call::new("now", "x", json!({}));
        let mut lines = vec![init()];
        for n in 0..MAX_PAGES {
            lines.push(
                json!({"jsonrpc": "2.0", "id": 2 + n, "result": {"tools": [], "nextCursor": "c"}}),
            );
        }
        said(&mut call, &lines);
        assert_eq!(call.outcome(), Some(&Err(McpError::Pages)));
    }

    #[test]
    fn a_listing_reads_every_page_and_calls_nothing() {
        let mut call = Call::listing();
        let p1 =
            json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [tool("a")], "nextCursor": "c"}});
        let (sent, _) = said(&mut call, &[init(), p1.clone()]);
        assert_eq!(sent[2]["params"]["cursor"], "c");
        let p2 = json!({"jsonrpc": "2.0", "id": 3, "result": {"tools": [tool("b")]}});
        let (sent, over) = said(&mut call, &[init(), p1, p2]);
        assert!(over && sent.is_empty(), "{sent:?}");
        let listed = call.listed().unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[1]["description"], "b");
    }

    #[test]
    fn the_servers_own_requests_are_refused_and_its_notifications_ignored() {
        let mut call = Call::new("now", "x", json!({}));
        let (sent, over) = said(
            &mut call,
            &[
                json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}),
                json!({"jsonrpc": "2.0", "id": "r1", "method": "roots/list"}),
            ],
        );
        assert!(!over);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["id"], "r1");
        assert_eq!(sent[0]["error"]["code"], -32601);
    }

    #[test]
    fn what_is_not_mcp_ends_the_call() {
        for bad in [
            b"not json\n".to_vec(),
            line(&json!([1])),
            line(&json!({"id": 1, "result": {}})),
            line(&json!({"jsonrpc": "2.0", "id": 7, "result": {}})),
            line(&json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "1999"}})),
            line(&json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "no"}})),
        ] {
            let mut call = Call::new("now", "x", json!({}));
            let (out, over) = call.heard(&bad);
            assert!(over && out.is_empty(), "{}", String::from_utf8_lossy(&bad));
            assert!(matches!(call.outcome(), Some(Err(_))));
        }
    }
}
