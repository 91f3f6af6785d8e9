//! The tools a turn may use: the core tools loopd answers itself, and the `ToolPort` every other
//! call goes through.
//!
//! The model is offered the core tools plus what the port lists at the start of each turn (so a
//! tool the owner disabled in brokerd is never offered). A call to a tool that was not offered
//! is answered `failed` here and never reaches the broker.

use bxcore::{
    ApprovalId, DataClass, SessionId, Timestamp, ToolDef, ToolRequest, ToolResponse, Tools,
};
use serde_json::{Value, json};

/// A pending frame the broker sent: the owner was asked, and the call waits until `expires`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub approval: ApprovalId,
    pub expires: Timestamp,
}

/// Where tool calls go. Never panics; every failure is an answer (`Failed`) the model sees.
pub trait ToolPort: Send + Sync {
    /// Run one tool call. `on_pending` is called at most once, when the owner is asked.
    /// The answer is `Result`, `Failed` or `Denied`, never `PendingApproval`.
    fn call(&self, request: &ToolRequest, on_pending: &mut dyn FnMut(&Pending)) -> ToolResponse;

    /// [`call`](Self::call), and for a `Failed` answer that is an outage (what runs the tool
    /// could not be reached or answered, not the tool's own failure) what it was, for the owner:
    /// the model is shown the answer alone. By default there is none.
    fn call_explained(
        &self,
        request: &ToolRequest,
        on_pending: &mut dyn FnMut(&Pending),
    ) -> (ToolResponse, Option<String>) {
        (self.call(request, on_pending), None)
    }

    /// The tools the model may be offered besides the core ones, and the workspace they reach.
    /// `Err` says why the port cannot say (it logged it): a turn then does not start, since
    /// the model would be offered tools that are not there, or none.
    fn list(&self) -> Result<Tools, String>;
}

/// What a turn offers the model: every tool it may call, the core ones first, and the
/// workspace roots the broker's tools reach.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Offer {
    pub tools: Vec<ToolDef>,
    pub workspace: Vec<bxcore::WorkspaceRoot>,
}

/// The tool registry: the core tools, and the offer made to the model each turn.
#[derive(Debug, Clone)]
pub struct Registry {
    core: Vec<ToolDef>,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry::new()
    }
}

/// What `session_info` reports, taken from the session as the call runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub session: SessionId,
    pub slot: String,
    pub turn: u64,
    pub records: u64,
    pub estimated_tokens: u64,
    pub context_tokens: u64,
}

impl Registry {
    /// The registry with loopd's core tools, `time_now` and `session_info`.
    pub fn new() -> Registry {
        let no_args = json!({"type": "object", "properties": {}, "additionalProperties": false});
        Registry {
            core: vec![
                ToolDef {
                    name: "time_now".to_string(),
                    description: "The current date and time, in UTC and as Unix milliseconds."
                        .to_string(),
                    parameters: no_args.clone(),
                },
                ToolDef {
                    name: "session_info".to_string(),
                    description: "This conversation's session name, model slot, turn number \
                                  and how much of its context budget it has used."
                        .to_string(),
                    parameters: no_args,
                },
            ],
        }
    }

    /// The core tools' definitions.
    pub fn core(&self) -> &[ToolDef] {
        &self.core
    }

    pub fn is_core(&self, name: &str) -> bool {
        self.core.iter().any(|t| t.name == name)
    }

    /// What the model is offered this turn: the core tools, then the port's (a port tool that
    /// has a core tool's name is left out: the core one is what runs). `Err`: the port could
    /// not say, and why.
    pub fn offer(&self, port: &dyn ToolPort) -> Result<Offer, String> {
        let listed = port.list()?;
        let mut tools = self.core.clone();
        for t in listed.tools {
            if !tools.iter().any(|c| c.name == t.name) {
                tools.push(t);
            }
        }
        Ok(Offer {
            tools,
            workspace: listed.workspace,
        })
    }

    /// Run a core tool in loopd. `None` when `name` is not a core tool.
    pub fn run_core(&self, name: &str, args: &Value, info: &SessionInfo) -> Option<ToolResponse> {
        if !self.is_core(name) {
            return None;
        }
        if !args.as_object().is_some_and(|m| m.is_empty()) {
            return Some(ToolResponse::Failed {
                message: format!("{name} takes no arguments: call it with {{}}"),
            });
        }
        let content = match name {
            "time_now" => {
                let now = Timestamp::now();
                json!({"utc": utc_text(now), "unix_ms": now.unix_millis()})
            }
            _ => json!({
                "session": info.session.as_str(),
                "slot": info.slot,
                "turn": info.turn,
                "records": info.records,
                "estimated_tokens": info.estimated_tokens,
                "context_tokens": info.context_tokens,
            }),
        };
        Some(ToolResponse::Result {
            content: content.to_string(),
            class: DataClass::Public,
            untrusted: false,
        })
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a Unix-millisecond timestamp (proleptic Gregorian, UTC).
pub fn utc_text(t: Timestamp) -> String {
    t.utc_text()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_text_matches_known_instants() {
        assert_eq!(utc_text(Timestamp(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            utc_text(Timestamp(1_764_489_600_123)),
            "2025-11-30T08:00:00.123Z"
        );
        assert_eq!(
            utc_text(Timestamp(951_782_400_000)),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
