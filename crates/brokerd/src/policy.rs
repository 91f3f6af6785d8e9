//! The broker's policy (`docs/policy.md`): what a session carries, and the decision for one call,
//! in the order the design fixes. Pure: it reads the session's state and the tool's plan and
//! says what happens; the broker records it and carries it out.

use std::fmt;

use bxcore::DataClass;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolkit::{ApprovalRule, Effect, Entry, Env, Labels, Plan, Registry, ToolError};

/// What a session has read: the highest class (`taint`, never `public`) and whether any of it
/// was third-party content. Both only rise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawState")]
pub struct SessionState {
    pub taint: DataClass,
    pub untrusted: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    taint: DataClass,
    untrusted: bool,
}

impl TryFrom<RawState> for SessionState {
    type Error = String;
    fn try_from(raw: RawState) -> Result<SessionState, String> {
        if raw.taint == DataClass::Public {
            return Err(
                "a taint of public is never valid: a session starts private and only rises"
                    .to_string(),
            );
        }
        Ok(SessionState {
            taint: raw.taint,
            untrusted: raw.untrusted,
        })
    }
}

impl Default for SessionState {
    /// A session that has made no tool call: the owner's own conversation, trusted.
    fn default() -> SessionState {
        SessionState {
            taint: DataClass::Private,
            untrusted: false,
        }
    }
}

/// What a call carried into the session, by its result or by what its failure told: the class
/// and whether it was third-party content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carried {
    pub class: DataClass,
    pub untrusted: bool,
}

impl From<&Plan> for Carried {
    fn from(plan: &Plan) -> Carried {
        Carried {
            class: plan.reads,
            untrusted: plan.untrusted_output,
        }
    }
}

impl From<&Labels> for Carried {
    fn from(l: &Labels) -> Carried {
        Carried {
            class: l.class,
            untrusted: l.untrusted,
        }
    }
}

impl Carried {
    /// Both at once: the higher class, untrusted if either is.
    pub fn join(self, other: Carried) -> Carried {
        Carried {
            class: self.class.max(other.class),
            untrusted: self.untrusted || other.untrusted,
        }
    }
}

impl SessionState {
    /// The state after a call that carried `c` in: `taint = max`, `untrusted |=`.
    pub fn raised(self, c: Carried) -> SessionState {
        SessionState {
            taint: self.taint.max(c.class),
            untrusted: self.untrusted || c.untrusted,
        }
    }
}

/// The policy step that asked the owner, as an `Approval`'s `rule` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskRule {
    /// Step 4: an untrusted session asking for a local or egress effect.
    UntrustedEffect,
    /// Step 5: the tool (or the policy file) says `approval = "always"`.
    Always,
    /// Step 5: `approval = "untrusted"` while the session is untrusted.
    WhileUntrusted,
}

impl AskRule {
    pub fn as_str(self) -> &'static str {
        match self {
            AskRule::UntrustedEffect => "untrusted-effect",
            AskRule::Always => "approval-always",
            AskRule::WhileUntrusted => "approval-untrusted",
        }
    }
}

impl fmt::Display for AskRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to one call.
#[derive(Debug)]
pub enum Decision<'r> {
    /// Step 1 or 3: `denied`, with the reason.
    Denied(String),
    /// Step 2 (or a path the tool cannot act on): `failed`. No state change when only the
    /// arguments were looked at; `touched` when planning ran against a root's files, which
    /// raises the session as a read of that place would.
    Failed {
        message: String,
        touched: Option<Carried>,
    },
    /// Steps 4 and 5: the owner must approve.
    Ask {
        entry: &'r Entry,
        plan: Plan,
        rule: AskRule,
        reason: String,
    },
    /// Step 6: run it.
    Allow { entry: &'r Entry, plan: Plan },
}

/// Decide one call, in order: unknown tool, arguments, egress and write-down, untrusted effect,
/// the tool's approval rule, allowed.
pub fn decide<'r>(
    registry: &'r Registry,
    env: &Env,
    tool: &str,
    args: &Value,
    state: SessionState,
) -> Decision<'r> {
    // 1. Unknown or disabled.
    let Some(entry) = registry.get(tool) else {
        return Decision::Denied(format!("no such tool: {tool:?}"));
    };
    // 2. The schema.
    if let Err(message) = entry.validate(args) {
        return Decision::Failed {
            message,
            touched: None,
        };
    }
    let seen = toolkit::Seen {
        class: state.taint,
        untrusted: state.untrusted,
    };
    let plan = match entry.plan_seen(args, env, seen) {
        Ok(plan) => plan,
        Err(ToolError::Denied(reason)) => return Decision::Denied(reason),
        Err(e) => {
            let touched = match &e {
                ToolError::Touched(labels, _) => Some(Carried::from(labels)),
                ToolError::Refused(_) | ToolError::Failed(_) | ToolError::Denied(_) => None,
            };
            return Decision::Failed {
                message: e.to_string(),
                touched,
            };
        }
    };
    // 3. Nothing flows to a place below the session's taint: not out of the box, not into a
    //    place a fresh session could send it out from. No approval lifts this.
    if let Effect::Egress { max } = plan.effect {
        if state.taint > max {
            return Decision::Denied(format!(
                "this session has read {} data and {tool} sends data out of the box to a \
                 destination cleared for {max} data at most; no approval can allow this: \
                 start a fresh session for it",
                state.taint
            ));
        }
    }
    if let (Effect::Local, Some(into)) = (plan.effect, plan.writes_into) {
        if state.taint > into {
            return Decision::Denied(format!(
                "this session has read {} data and {tool} would write into a {into} place, \
                 from where a fresh session could send it out; no approval can allow this: \
                 start a fresh session for it",
                state.taint
            ));
        }
    }
    // 4. Prompt injection: third-party text in the context may be steering the model.
    if state.untrusted && plan.effect != Effect::None {
        return Decision::Ask {
            entry,
            plan,
            rule: AskRule::UntrustedEffect,
            reason: format!(
                "this session has read third-party content, which may be steering the model, \
                 and {tool} {}",
                match plan.effect {
                    Effect::Egress { .. } => "sends data out of the box",
                    _ => "changes the box",
                }
            ),
        };
    }
    // 5. The tool's own rule, as tightened.
    match entry.declared().approval {
        ApprovalRule::Always => {
            return Decision::Ask {
                entry,
                plan,
                rule: AskRule::Always,
                reason: format!("{tool} always asks the owner"),
            };
        }
        ApprovalRule::Untrusted if state.untrusted => {
            return Decision::Ask {
                entry,
                plan,
                rule: AskRule::WhileUntrusted,
                reason: format!(
                    "{tool} asks the owner while the session has read third-party content"
                ),
            };
        }
        _ => {}
    }
    // 6.
    Decision::Allow { entry, plan }
}
