//! The broker's policy (`docs/policy.md`): the decision for one call, every step in the order
//! the design fixes, in one function ([`decide`]). Pure: it reads the session's label
//! (`bxcore::Label`), the tool's plan and the leak check, and says what happens; the broker
//! records it and carries it out.

use std::fmt;

use bxcore::{DataClass, Label};
use serde_json::Value;
use toolkit::{ApprovalRule, Effect, Entry, Env, Plan, Registry, ToolError};

use crate::fingerprints::{Encoding, FULL_ANCHOR, Full};

/// The leak check, as `decide` asks it (step 3): whether arguments carry text released from a
/// secret root, and how. The fingerprint store answers it; `decide` only reads it.
pub trait Leaks {
    fn leak(&self, args: &Value) -> Option<Encoding>;
    /// Whether the check cannot vouch for any argument (its store is full): then nothing goes
    /// out or down.
    fn full(&self) -> Option<Full> {
        None
    }
}

/// No text released from a secret root at all (a test's broker, a tool with nothing to send).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLeaks;

impl Leaks for NoLeaks {
    fn leak(&self, _args: &Value) -> Option<Encoding> {
        None
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
    /// The rule an approval names (`Approval::rule`).
    pub fn from_name(name: &str) -> Option<AskRule> {
        [
            AskRule::UntrustedEffect,
            AskRule::Always,
            AskRule::WhileUntrusted,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
    }

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

/// Why a call was denied: the text the caller is shown, and the leak it carried, when that is
/// why (brokerd logs those with their pointer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub reason: String,
    pub leak: Option<Encoding>,
    /// Denied because the leak check's store is full.
    pub full: Option<Full>,
}

impl Denial {
    fn because(reason: String) -> Denial {
        Denial {
            reason,
            leak: None,
            full: None,
        }
    }
}

/// What happens to one call.
#[derive(Debug)]
pub enum Decision<'r> {
    /// Step 1 or 3: `denied`, with the reason.
    Denied(Denial),
    /// Step 2 (or a path the tool cannot act on): `failed`. No state change when only the
    /// arguments were looked at; `touched` when planning ran against a root's files, which
    /// raises the session as a read of that place would.
    Failed {
        message: String,
        touched: Option<Label>,
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

/// Decide one call, in order (`docs/policy.md`, "The decision, in order"): unknown tool,
/// arguments, egress and write-down and the leak check, untrusted effect, the tool's approval
/// rule, allowed. Pure: it reads the session's label, the tool's plan and the leak check, and
/// says what happens; the broker records it and carries it out.
pub fn decide<'r>(
    registry: &'r Registry,
    env: &Env,
    leaks: &dyn Leaks,
    tool: &str,
    args: &Value,
    session: Label,
) -> Decision<'r> {
    // 1. Unknown or disabled.
    let Some(entry) = registry.get(tool) else {
        return Decision::Denied(Denial::because(format!("no such tool: {tool:?}")));
    };
    // 2. The schema.
    if let Err(message) = entry.validate(args) {
        return Decision::Failed {
            message,
            touched: None,
        };
    }
    let plan = match entry.plan_seen(args, env, session) {
        Ok(plan) => plan,
        Err(ToolError::Denied(reason)) => return Decision::Denied(Denial::because(reason)),
        Err(e) => {
            let touched = match &e {
                ToolError::Touched(reached, _) => Some(reached.label),
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
        if session.class > max {
            return Decision::Denied(Denial::because(format!(
                "this session has read {} data and {tool} sends data out of the box to a \
                 destination cleared for {max} data at most; no approval can allow this: \
                 start a fresh session for it",
                session.class
            )));
        }
    }
    if let (Effect::Local, Some(into)) = (plan.effect, plan.writes_into) {
        if session.class > into {
            return Decision::Denied(Denial::because(format!(
                "this session has read {} data and {tool} would write into a {into} place, \
                 from where a fresh session could send it out; no approval can allow this: \
                 start a fresh session for it",
                session.class
            )));
        }
    }
    //    And, for any session, nothing released from a secret root goes out or down (the
    //    leak check: a secret cannot change sessions).
    if goes_below_secret(&plan) {
        // A store that could not hold a release vouches for nothing: fail closed.
        if let Some(full) = leaks.full() {
            return Decision::Denied(Denial {
                reason: format!(
                    "{full}: until the owner acts, nothing goes out of the box or into a place \
                     below secret, from any session; no approval can allow this; {}",
                    bxcore::runbook::pointer(FULL_ANCHOR)
                ),
                leak: None,
                full: Some(full),
            });
        }
        if let Some(how) = leaks.leak(&entry.leak_view(args)) {
            return Decision::Denied(Denial {
                reason: format!(
                    "leak: the arguments carry text released from a secret root ({}); no \
                     approval can allow this; {}",
                    how.as_str(),
                    bxcore::runbook::pointer(crate::fingerprints::LEAK_ANCHOR)
                ),
                leak: Some(how),
                full: None,
            });
        }
    }
    // 4. Prompt injection: third-party text in the context may be steering the model.
    if session.untrusted && plan.effect != Effect::None {
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
        ApprovalRule::Untrusted if session.untrusted => {
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

/// Whether the call carries data out of the box, or into a place below `secret`: what the leak
/// check looks at.
fn goes_below_secret(plan: &Plan) -> bool {
    match (plan.effect, plan.writes_into) {
        (Effect::None, _) => false,
        (Effect::Egress { max }, _) => max < DataClass::Secret,
        (Effect::Local, into) => into.is_none_or(|c| c < DataClass::Secret),
    }
}
