//! The `script` provider: replies from a file of scripted turns, for the dev box, the demo, the
//! selftest and tests. It is a provider like the others, with a fixed script: loopd cannot tell
//! it from a model except by what it says.
//!
//! The file is TOML (`docs/inference.md` has the whole format):
//!
//! ```toml
//! # Steps answer in order, one per request, whatever the request says.
//! [[step]]
//! text = "Let me read it."
//! tool_calls = [{ tool = "workspace_read", args = { path = "notes.txt" } }]
//!
//! [[step]]
//! after = "tool"                 # a check: this step expects the request to end with a tool result
//! text = "It says: {last_tool}"
//!
//! # Once the steps are used up, the first rule that matches answers.
//! [[rule]]
//! user = "(?i)\\bhello\\b"       # a regex on the last user text
//! text = "Hello! This is the scripted provider."
//!
//! [[rule]]
//! text = "I am a scripted model; I only know my script."
//! ```
//!
//! `{last_user}`, `{last_tool}` and `{last_system}` in a reply's text are replaced by the last
//! user text, the last tool result's text and the last system text (what memory recalled, when
//! the turn has a recall). The text streams as `infer_delta` frames, a word at a time. The
//! position in the steps is held in memory: a restart starts the script again.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bxcore::runbook::Anchored;
use bxcore::{ChatMessage, InferReply, InferRequest, Usage};
use regex_lite::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::config::CONFIG_ANCHOR;
use crate::error::InferError;
use crate::reply::{Draft, DraftCall};

/// The shipped default script, for a dev box that should answer any text: a greeting, the
/// core `time_now` tool when asked the time, what a tool answered once it ran, and a fixed
/// reply otherwise. `bxctl dev up` writes it beside the configuration; the package installs the
/// file as `share/boxmaker/inferproxy-default-script.toml`, which the NixOS module's
/// configuration names when no script is set.
pub const DEFAULT: &str = include_str!("../scripts/default.toml");

/// Where the request's last message comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum After {
    /// The request ends with the user's message: a new turn.
    User,
    /// The request ends with a tool result: the model is to go on after a tool ran.
    Tool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    step: Vec<ReplyText>,
    #[serde(default)]
    rule: Vec<ReplyText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyText {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    after: Option<After>,
    #[serde(default)]
    text: String,
    #[serde(default)]
    tool_calls: Vec<CallText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallText {
    tool: String,
    #[serde(default)]
    args: Option<toml::Table>,
}

/// One scripted reply and when it applies.
#[derive(Debug)]
struct Reply {
    user: Option<Regex>,
    after: Option<After>,
    text: String,
    calls: Vec<(String, Value)>,
}

impl Reply {
    fn matches(&self, last_user: Option<&str>, after: Option<After>) -> bool {
        if self.after.is_some_and(|a| Some(a) != after) {
            return false;
        }
        match &self.user {
            None => true,
            Some(re) => last_user.is_some_and(|u| re.is_match(u)),
        }
    }
}

/// A loaded script and its position.
#[derive(Debug)]
pub struct Script {
    path: PathBuf,
    steps: Vec<Reply>,
    rules: Vec<Reply>,
    next: Mutex<usize>,
}

/// Why a script does not load. Its runbook entry is the configuration's.
#[derive(Debug, thiserror::Error)]
#[error("the script {}: {why}", path.display())]
pub struct ScriptError {
    path: PathBuf,
    why: String,
}

impl Anchored for ScriptError {
    fn anchor(&self) -> &str {
        CONFIG_ANCHOR
    }
}

impl Script {
    /// Read and check the script at `path`.
    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScriptError {
            path: path.into(),
            why: format!("cannot read it: {e}"),
        })?;
        Script::parse(path, &text)
    }

    /// Parse and check a script's text (named `path` in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Script, ScriptError> {
        let err = |why: String| ScriptError {
            path: path.into(),
            why,
        };
        let file: File = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        if file.step.is_empty() && file.rule.is_empty() {
            return Err(err("it has no [[step]] and no [[rule]]".into()));
        }
        let convert = |kind: &str, list: Vec<ReplyText>| -> Result<Vec<Reply>, ScriptError> {
            list.into_iter()
                .enumerate()
                .map(|(i, r)| {
                    let at = format!("{kind} {}", i + 1);
                    if r.text.is_empty() && r.tool_calls.is_empty() {
                        return Err(err(format!("{at} has neither text nor tool_calls")));
                    }
                    let user = match r.user {
                        None => None,
                        Some(p) => Some(
                            Regex::new(&p).map_err(|e| err(format!("{at}: user pattern: {e}")))?,
                        ),
                    };
                    let mut calls = Vec::new();
                    for c in r.tool_calls {
                        if c.tool.trim().is_empty() {
                            return Err(err(format!("{at} has a tool call with no tool")));
                        }
                        let args = serde_json::to_value(c.args.unwrap_or_default())
                            .map_err(|e| err(format!("{at}: args: {e}")))?;
                        calls.push((c.tool, args));
                    }
                    Ok(Reply {
                        user,
                        after: r.after,
                        text: r.text,
                        calls,
                    })
                })
                .collect()
        };
        Ok(Script {
            path: path.into(),
            steps: convert("step", file.step)?,
            rules: convert("rule", file.rule)?,
            next: Mutex::new(0),
        })
    }

    /// How many steps and rules it has.
    pub fn size(&self) -> (usize, usize) {
        (self.steps.len(), self.rules.len())
    }

    /// The script's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answer one request: the next step, else the first rule that matches.
    pub fn infer(
        &self,
        req: &InferRequest,
        deliver: &mut dyn FnMut(&str),
    ) -> Result<InferReply, InferError> {
        let last_user = req.messages.iter().rev().find_map(|m| match m {
            ChatMessage::User { text } => Some(text.as_str()),
            _ => None,
        });
        let last_tool = req.messages.iter().rev().find_map(|m| match m {
            ChatMessage::Tool { text, .. } => Some(text.as_str()),
            _ => None,
        });
        let last_system = req.messages.iter().rev().find_map(|m| match m {
            ChatMessage::System { text } => Some(text.as_str()),
            _ => None,
        });
        let after = match req.messages.last() {
            Some(ChatMessage::User { .. }) => Some(After::User),
            Some(ChatMessage::Tool { .. }) => Some(After::Tool),
            _ => None,
        };
        let reply = {
            // A poisoned lock only means another request panicked mid-answer; the position is
            // a plain number and stays meaningful.
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            match self.steps.get(*next) {
                Some(step) => {
                    if !step.matches(last_user, after) {
                        return Err(InferError::ScriptExhausted(format!(
                            "step {} of {} does not match this request (the last message is {}); \
                             the script and the conversation are out of step",
                            *next + 1,
                            self.path.display(),
                            match after {
                                Some(After::User) => "the user's",
                                Some(After::Tool) => "a tool result",
                                None => "neither the user's nor a tool result",
                            }
                        )));
                    }
                    *next += 1;
                    step
                }
                None => self
                    .rules
                    .iter()
                    .find(|r| r.matches(last_user, after))
                    .ok_or_else(|| {
                        InferError::ScriptExhausted(format!(
                            "all {} steps of {} are used and no rule matches",
                            self.steps.len(),
                            self.path.display()
                        ))
                    })?,
            }
        };
        let text = reply
            .text
            .replace("{last_user}", last_user.unwrap_or(""))
            .replace("{last_tool}", last_tool.unwrap_or(""))
            .replace("{last_system}", last_system.unwrap_or(""));
        for word in text.split_inclusive(char::is_whitespace) {
            deliver(word);
        }
        let draft = Draft {
            text,
            calls: reply
                .calls
                .iter()
                .map(|(tool, args)| DraftCall {
                    name: tool.clone(),
                    args: args.to_string(),
                })
                .collect(),
            usage: Usage::default(),
        };
        draft.finish(req.first_call)
    }
}
