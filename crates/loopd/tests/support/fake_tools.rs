//! `FakeTools`: a `ToolPort` for tests that answers from a table, optionally with a pending
//! frame first or a wait on a gate, and records every request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::mpsc::Receiver;

use bxcore::{ApprovalId, Timestamp, ToolRequest, ToolResponse};
use loopd::tools::{Pending, ToolPort};

use super::broker::tool;

#[derive(Default)]
pub struct FakeTools {
    pub answers: HashMap<String, ToolResponse>,
    /// Tools whose call reports a pending approval before its answer.
    pub pending: Vec<String>,
    /// A call waits on this before answering (the first call only; at most `bxtest::DEADLINE`).
    pub gate: Mutex<Option<Receiver<()>>>,
    pub seen: Mutex<Vec<ToolRequest>>,
}

impl FakeTools {
    pub fn new(answers: &[(&str, ToolResponse)]) -> FakeTools {
        FakeTools {
            answers: answers
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..FakeTools::default()
        }
    }

    pub fn ok(content: &str) -> ToolResponse {
        ToolResponse::Result {
            content: content.to_string(),
            class: bxcore::DataClass::Public,
            untrusted: false,
        }
    }
}

impl ToolPort for FakeTools {
    fn call(&self, request: &ToolRequest, on_pending: &mut dyn FnMut(&Pending)) -> ToolResponse {
        self.seen.lock().unwrap().push(request.clone());
        if self.pending.contains(&request.tool) {
            on_pending(&Pending {
                approval: ApprovalId::new("00112233aabbccdd").unwrap(),
                expires: Timestamp::now().plus_millis(60_000),
            });
        }
        if let Some(rx) = self.gate.lock().unwrap().take() {
            bxtest::gate(&rx);
        }
        self.answers
            .get(&request.tool)
            .cloned()
            .unwrap_or(ToolResponse::Failed {
                message: format!("no such tool {}", request.tool),
            })
    }

    fn list(&self) -> Result<bxcore::Tools, String> {
        let mut names: Vec<&String> = self.answers.keys().collect();
        names.sort();
        Ok(bxcore::Tools {
            tools: names.into_iter().map(|n| tool(n)).collect(),
            workspace: Vec::new(),
        })
    }
}
