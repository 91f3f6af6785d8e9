//! The tools brokerd runs, each with its JSON Schema and the policy metadata the broker decides by.
//!
//! A tool here never decides whether it may run: it declares what it reads, whether its output is
//! third-party content, and what effect it has, and the broker's policy decides from that and the
//! session's state. Tools whose class and trust depend on the call (the workspace tools take those
//! of the root the path lies in) say so through [`Tool::plan`], which the broker asks before it
//! decides, so that what the policy sees is what the tool will do.

pub mod args;
pub mod declared;
pub mod marks;
pub mod mcp;
mod meta;
mod registry;
pub mod run;
pub mod web_fetch;
pub mod workspace;
mod workspace_tools;

pub use declared::{Declaration, Keeping, Kept, Server, Servers, StatePlace};
pub use marks::{MarkError, MarkSet, Marks, NewMark};
pub use meta::{ApprovalRule, Declared, Effect, Plan, Reads};
pub use registry::{Entry, Registry, TOOL_NAMES, Tightening, TighteningError};
pub use run::Run;
pub use web_fetch::WebFetch;
pub use workspace::{Reached, Root, Roots, RootsError};
pub use workspace_tools::{WorkspaceList, WorkspaceRead, WorkspaceWrite};

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use bxcore::{Label, SessionId};
use serde_json::Value;

/// What a tool gives back when it ran: the text the model is shown, for the audit chain a
/// short line on how it ended when there is more to say than that it ran (`run`: the exit code,
/// or the signal and the limit that stopped it), and which of the text came from the place the
/// call read (what brokerd fingerprints when that place is secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub content: String,
    pub summary: Option<String>,
    pub from_place: FromPlace,
}

/// Which part of a tool's text came from the place it read, rather than from the box itself:
/// a confirmation, a path, the `run` tool's framing are the box's own words, and fingerprinting
/// them would refuse every later write that says the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromPlace {
    /// All of the content (a file's text, a directory's names).
    All,
    /// None of it: the box's own words (`wrote 12 bytes to ...`).
    Nothing,
    /// These pieces of it, each on its own (a program's stdout and its stderr).
    Parts(Vec<String>),
}

impl Output {
    /// Text that came, all of it, from the place the call read.
    pub fn text(content: String) -> Output {
        Output {
            content,
            summary: None,
            from_place: FromPlace::All,
        }
    }

    /// Text the box wrote itself: a confirmation, nothing read.
    pub fn own(content: String) -> Output {
        Output {
            content,
            summary: None,
            from_place: FromPlace::Nothing,
        }
    }

    /// The pieces of the content that came from the place the call read.
    pub fn released(&self) -> Vec<&str> {
        match &self.from_place {
            FromPlace::All => vec![self.content.as_str()],
            FromPlace::Nothing => Vec::new(),
            FromPlace::Parts(p) => p.iter().map(String::as_str).collect(),
        }
    }
}

/// Why a tool could not run or failed. Every variant's text is for a person and is what the
/// model is shown as the `failed` message; a failed tool returned nothing and raises nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The arguments are not what the tool can act on (a relative path, a path outside every
    /// root, a symlink that leaves its root, ...).
    #[error("{0}")]
    Refused(String),
    /// The tool ran and the system said no (a missing file, a full disk, ...).
    #[error("{0}")]
    Failed(String),
    /// The owner's configuration does not let this call happen (a program off the `run`
    /// tool's allow-list): the policy's `denied`, not a failure.
    #[error("{0}")]
    Denied(String),
    /// Planning the call ran against the files of a root and then refused it (a write that
    /// leads into a read-only root): what the refusal tells raises the session as a read of
    /// that place would.
    #[error("{1}")]
    Touched(Reached, String),
}

/// What the tools need from the daemon that runs them: the workspace roots, where gatewayd
/// listens, if anywhere, and how the `run` tool starts programs, if it does.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub roots: Roots,
    /// `gateway.sock`; `None` while no gateway is configured.
    pub gateway: Option<PathBuf>,
    /// `[run]`; `None` while the run tool is not configured.
    pub run: Option<Arc<run::Settings>>,
    /// `[tool_servers]`: the MCP servers of the declared tools, each prepared to start.
    pub servers: Arc<Servers>,
}

/// One tool: its definition as the model sees it, its typed arguments, what it declares to the
/// policy, and how it runs.
pub trait Tool: Send + Sync + fmt::Debug {
    /// Its arguments, parsed and checked before any policy step that needs them.
    type Args: args::Args;
    /// The name the model calls it by.
    fn name(&self) -> &'static str;
    /// One sentence for the model.
    fn description(&self) -> &'static str;
    /// The JSON Schema of its arguments (an object schema), which says what `Args` accepts.
    fn parameters(&self) -> Value;
    /// What it declares, for every call.
    fn declared(&self) -> Declared;
    /// Whether it can run here at all: a tool whose daemon is absent (`web_fetch` with no
    /// gateway configured) is not offered to the model.
    fn available(&self, env: &Env) -> bool {
        let _ = env;
        true
    }
    /// What this one call will read and where it will write. An error here is `failed` before
    /// any policy step that needs the plan.
    fn plan(&self, args: &Self::Args, env: &Env) -> Result<Plan, ToolError>;
    /// The plan for a session that has read `seen` already: for a tool whose reach depends on
    /// it (`run`). The others plan alike for every session.
    fn plan_seen(&self, args: &Self::Args, env: &Env, seen: Label) -> Result<Plan, ToolError> {
        let _ = seen;
        self.plan(args, env)
    }
    /// Run the call as `plan` says (the plan the policy decided on). Only called after the
    /// policy allowed it (or the owner approved it). A run that finds the world changed since the
    /// plan (a file moved into a stricter root) refuses rather than do what was not decided.
    fn run(&self, args: &Self::Args, plan: &Plan, env: &Env) -> Result<Output, ToolError>;
    /// Where this call lands, as a lease names it: `root notes`, `host example.org`, `program
    /// git in root notes`. A lease the owner gives for one call covers the calls that land in
    /// the same place; `None`: the tool has no place of its own (a lease covers any call).
    fn place(&self, args: &Self::Args, env: &Env) -> Option<String> {
        let _ = (args, env);
        None
    }
    /// The arguments as the leak check reads them, when that is not all of them as they are
    /// (`web_fetch`: the URL without the allow-listed part of its host, which the owner chose
    /// and the model cannot carry anything in). `None`: all of them.
    fn leak_view(&self, args: &Self::Args) -> Option<Value> {
        let _ = args;
        None
    }
}

/// A [`Tool`] behind one type, as the registry holds them: arguments arrive as JSON and are
/// parsed into the tool's `Args` at each step, so no step acts on unchecked arguments.
pub(crate) trait AnyTool: Send + Sync + fmt::Debug {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    fn parameters(&self) -> Value;
    fn declared(&self) -> Declared;
    fn available(&self, env: &Env) -> bool;
    fn validate(&self, args: &Value) -> Result<(), String>;
    fn plan(&self, args: &Value, env: &Env, seen: Label) -> Result<Plan, ToolError>;
    /// `session` is the calling session's: a declared tool's server keeps a place for each.
    fn run(
        &self,
        args: &Value,
        plan: &Plan,
        env: &Env,
        session: &SessionId,
    ) -> Result<Output, ToolError>;
    fn place(&self, args: &Value, env: &Env) -> Option<String>;
    fn leak_view(&self, args: &Value) -> Option<Value>;
}

impl<T: Tool> AnyTool for T {
    fn name(&self) -> &str {
        Tool::name(self)
    }
    fn description(&self) -> &str {
        Tool::description(self)
    }
    fn parameters(&self) -> Value {
        Tool::parameters(self)
    }
    fn declared(&self) -> Declared {
        Tool::declared(self)
    }
    fn available(&self, env: &Env) -> bool {
        Tool::available(self, env)
    }
    fn validate(&self, args: &Value) -> Result<(), String> {
        args::parse::<T::Args>(Tool::name(self), args).map(drop)
    }
    fn plan(&self, args: &Value, env: &Env, seen: Label) -> Result<Plan, ToolError> {
        let args = args::parse(Tool::name(self), args).map_err(ToolError::Refused)?;
        Tool::plan_seen(self, &args, env, seen)
    }
    fn run(
        &self,
        args: &Value,
        plan: &Plan,
        env: &Env,
        _session: &SessionId,
    ) -> Result<Output, ToolError> {
        let args = args::parse(Tool::name(self), args).map_err(ToolError::Refused)?;
        Tool::run(self, &args, plan, env)
    }
    fn place(&self, args: &Value, env: &Env) -> Option<String> {
        let args = args::parse(Tool::name(self), args).ok()?;
        Tool::place(self, &args, env)
    }
    fn leak_view(&self, args: &Value) -> Option<Value> {
        let args = args::parse(Tool::name(self), args).ok()?;
        Tool::leak_view(self, &args)
    }
}
