//! Policy metadata: what a tool declares (`docs/policy.md`), in types that cannot say a
//! contradiction (an egress limit on a tool that sends nothing, for one).

use bxcore::{DataClass, Label};
use serde::{Deserialize, Serialize};

/// What a tool does to the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Pure or read-only.
    None,
    /// Changes the box: writes files, sets reminders.
    Local,
    /// Sends data out of the box; `max` is the highest class the destination may receive.
    Egress { max: DataClass },
}

impl Effect {
    /// `none`, `local` or `egress`, as the policy and the audit chain name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::None => "none",
            Effect::Local => "local",
            Effect::Egress { .. } => "egress",
        }
    }
}

/// When the owner must approve, beyond the policy's own rules. Ordered: a policy file may raise
/// it, never lower it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRule {
    Never,
    /// While the session is untrusted.
    Untrusted,
    Always,
}

impl ApprovalRule {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalRule::Never => "never",
            ApprovalRule::Untrusted => "untrusted",
            ApprovalRule::Always => "always",
        }
    }
}

/// The class of what a tool's result carries back into the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// Always this class.
    Fixed(DataClass),
    /// That of the workspace root the path lies in.
    Root,
}

/// What a tool declares for every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    pub reads: Reads,
    /// Its result is third-party content (for `Reads::Root`, the root's flag decides too).
    pub untrusted_output: bool,
    pub effect: Effect,
    pub approval: ApprovalRule,
}

/// What one call will do, as the policy decides it: the label of what it carries back into the
/// session, its effect, and, for a write, the class of the place it writes into (the write-down
/// rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub carries: Label,
    pub effect: Effect,
    /// The class of the place a `local` write lands in, when that place has one.
    pub writes_into: Option<DataClass>,
}
