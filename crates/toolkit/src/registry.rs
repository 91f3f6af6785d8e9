//! The tools brokerd offers, after the policy file's tightening.
//!
//! The policy file (`[tools.<name>]`) can raise what a tool reads, mark its output untrusted,
//! raise when the owner must approve, or disable it. It can never loosen: a line that tries is
//! refused when the configuration loads, so the owner never believes a tool runs under rules it
//! does not run under.

use std::collections::BTreeMap;
use std::fmt;

use bxcore::{DataClass, Label, SessionId, ToolDef};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    AnyTool, ApprovalRule, Declared, Env, Output, Plan, Reads, Run, ToolError, WebFetch,
    WorkspaceList, WorkspaceRead, WorkspaceWrite,
};

/// `[tools.<name>]`: how the owner tightens one tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tightening {
    /// `false` removes the tool: it is not offered, and a call is "no such tool".
    pub enabled: Option<bool>,
    /// Raise the class its results carry.
    pub reads: Option<DataClass>,
    /// Mark its output third-party content.
    pub untrusted_output: Option<bool>,
    /// Raise when the owner must approve.
    pub approval: Option<ApprovalRule>,
}

/// A `[tools.<name>]` entry that is not a tightening.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TighteningError {
    /// The name is not a tool this broker has.
    #[error(
        "[tools.{}]: there is no tool named {:?} (the tools are {})",
        .0,
        .0,
        TOOL_NAMES.join(", ")
    )]
    UnknownTool(String),
    /// `reads` below the class the tool declares.
    #[error(
        "[tools.{tool}] reads = {asked:?} is below the {declared} the tool declares; the policy \
         file can only tighten a tool"
    )]
    LowerReads {
        tool: String,
        asked: DataClass,
        declared: DataClass,
    },
    /// `untrusted_output = false` for a tool whose output is third-party content.
    #[error(
        "[tools.{0}] untrusted_output = false would trust third-party content; the policy file \
         can only tighten a tool"
    )]
    TrustsUntrusted(String),
    /// `approval` below what the tool declares.
    #[error(
        "[tools.{tool}] approval = {:?} is below the {:?} the tool declares; the policy file can \
         only tighten a tool",
        asked.as_str(),
        declared.as_str()
    )]
    LowerApproval {
        tool: String,
        asked: ApprovalRule,
        declared: ApprovalRule,
    },
}

/// Every tool this broker has, in the order they are offered.
pub const TOOL_NAMES: [&str; 5] = [
    "workspace_list",
    "workspace_read",
    "workspace_write",
    "web_fetch",
    "run",
];

fn all_tools() -> Vec<Box<dyn AnyTool>> {
    vec![
        Box::new(WorkspaceList),
        Box::new(WorkspaceRead),
        Box::new(WorkspaceWrite),
        Box::new(WebFetch),
        Box::new(Run),
    ]
}

/// One enabled tool and its rules after tightening.
pub struct Entry {
    tool: Box<dyn AnyTool>,
    declared: Declared,
    reads_floor: DataClass,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("tool", &self.tool.name())
            .field("declared", &self.declared)
            .field("reads_floor", &self.reads_floor)
            .finish()
    }
}

impl Entry {
    pub fn name(&self) -> &str {
        self.tool.name()
    }

    /// What the tool declares, after the policy file's tightening.
    pub fn declared(&self) -> Declared {
        self.declared
    }

    /// What every call of it carries at the least, whatever it plans: the class the policy
    /// file raised it to, and third-party content when it declares (or was marked) so.
    fn floor(&self) -> Label {
        Label::new(self.reads_floor, self.declared.untrusted_output)
    }

    /// The definition the model is offered.
    pub fn def(&self) -> ToolDef {
        ToolDef {
            name: self.tool.name().to_string(),
            description: self.tool.description().to_string(),
            parameters: self.tool.parameters(),
        }
    }

    /// Parse and check `args` as the tool's typed arguments; the error says what is wrong, for
    /// a person (policy step 2: `failed`, nothing changes).
    pub fn validate(&self, args: &Value) -> Result<(), String> {
        self.tool.validate(args)
    }

    /// What this call will do for a session that has read nothing yet, with the tightening
    /// applied. `args` must have passed `validate`.
    pub fn plan(&self, args: &Value, env: &Env) -> Result<Plan, ToolError> {
        self.plan_seen(args, env, Label::FRESH)
    }

    /// What this call will do for a session that has read `seen`, with the tightening applied.
    pub fn plan_seen(&self, args: &Value, env: &Env, seen: Label) -> Result<Plan, ToolError> {
        let mut plan = self.tool.plan(args, env, seen).map_err(|e| match e {
            ToolError::Touched(mut reached, why) => {
                reached.label.raise(self.floor());
                ToolError::Touched(reached, why)
            }
            other => other,
        })?;
        plan.carries.raise(self.floor());
        // A call that writes while it carries third-party content (the session read some, or
        // what the call sees holds some) marks what it writes (`crate::marks`).
        plan.marks_writes =
            plan.effect == crate::Effect::Local && (seen.untrusted || plan.carries.untrusted);
        Ok(plan)
    }

    /// Run `session`'s call. Only after the policy allowed it.
    pub fn run(
        &self,
        args: &Value,
        plan: &Plan,
        env: &Env,
        session: &SessionId,
    ) -> Result<Output, ToolError> {
        self.tool.run(args, plan, env, session)
    }

    /// The arguments as the leak check reads them ([`crate::Tool::leak_view`]).
    pub fn leak_view<'a>(&self, args: &'a Value) -> std::borrow::Cow<'a, Value> {
        match self.tool.leak_view(args) {
            Some(v) => std::borrow::Cow::Owned(v),
            None => std::borrow::Cow::Borrowed(args),
        }
    }

    /// Where this call lands, as a lease names it ([`crate::Tool::place`]); `any` for a tool
    /// with no place of its own.
    pub fn place(&self, args: &Value, env: &Env) -> String {
        self.tool
            .place(args, env)
            .unwrap_or_else(|| "any".to_string())
    }
}

/// The enabled tools, after tightening.
#[derive(Debug)]
pub struct Registry {
    entries: Vec<Entry>,
}

impl Registry {
    /// Every tool, tightened by `[tools.<name>]`. An entry for an unknown tool or one that would
    /// loosen a tool is refused.
    pub fn new(tightening: &BTreeMap<String, Tightening>) -> Result<Registry, TighteningError> {
        Registry::with_declared(tightening, &[])
    }

    /// [`Registry::new`], and after the built-in tools the owner's declared ones (each checked
    /// by `Declaration::check` when the configuration loaded), as declared.
    pub fn with_declared(
        tightening: &BTreeMap<String, Tightening>,
        declared: &[crate::Declaration],
    ) -> Result<Registry, TighteningError> {
        for name in tightening.keys() {
            if !TOOL_NAMES.contains(&name.as_str()) {
                return Err(TighteningError::UnknownTool(name.clone()));
            }
        }
        let mut entries = Vec::new();
        for tool in all_tools() {
            let name = tool.name();
            let t = tightening.get(name).cloned().unwrap_or_default();
            let mut declared = tool.declared();
            let mut reads_floor = DataClass::Public;
            if let Some(asked) = t.reads {
                match declared.reads {
                    Reads::Fixed(class) if asked < class => {
                        return Err(TighteningError::LowerReads {
                            tool: name.to_string(),
                            asked,
                            declared: class,
                        });
                    }
                    Reads::Fixed(_) => declared.reads = Reads::Fixed(asked),
                    Reads::Root => reads_floor = asked,
                }
            }
            match t.untrusted_output {
                Some(false) if declared.untrusted_output => {
                    return Err(TighteningError::TrustsUntrusted(name.to_string()));
                }
                Some(flag) => declared.untrusted_output |= flag,
                None => {}
            }
            if let Some(asked) = t.approval {
                if asked < declared.approval {
                    return Err(TighteningError::LowerApproval {
                        tool: name.to_string(),
                        asked,
                        declared: declared.approval,
                    });
                }
                declared.approval = asked;
            }
            if t.enabled == Some(false) {
                continue;
            }
            entries.push(Entry {
                tool,
                declared,
                reads_floor,
            });
        }
        for d in declared {
            let tool = crate::declared::DeclaredTool(d.clone());
            let declared = crate::AnyTool::declared(&tool);
            entries.push(Entry {
                tool: Box::new(tool),
                declared,
                reads_floor: DataClass::Public,
            });
        }
        Ok(Registry { entries })
    }

    /// Only the tools that can run with `env`: a tool whose daemon is absent (`web_fetch`
    /// without a gateway) is neither offered nor run ("no such tool").
    pub fn offered(mut self, env: &Env) -> Registry {
        self.entries.retain(|e| e.tool.available(env));
        self
    }

    /// The enabled tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name() == name)
    }

    /// What the model may be offered.
    pub fn defs(&self) -> Vec<ToolDef> {
        self.entries.iter().map(Entry::def).collect()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}
