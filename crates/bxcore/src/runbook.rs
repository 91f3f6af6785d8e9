//! Runbook pointers: the one way every crate ends a refusal or outage line.
//!
//! Every such line ends with `see docs/runbook.md#<anchor>`, and `docs/runbook.md` has a
//! `## <anchor>` entry saying what the line means, how to confirm it and how to fix it. The
//! runbook check (`tests/runbook.rs`) finds every anchor handed to [`pointer`].

/// The runbook file every pointer names, relative to the repository root.
pub const RUNBOOK: &str = "docs/runbook.md";

/// `see docs/runbook.md#<anchor>`.
pub fn pointer(anchor: &str) -> String {
    format!("see {RUNBOOK}#{anchor}")
}

/// An error that knows its runbook entry. The logger (`bxharden::log::fail`) adds the pointer
/// and the journal's `RUNBOOK=` field in one place, so the error's text never carries it.
pub trait Anchored: std::error::Error {
    /// The `## <anchor>` entry of `docs/runbook.md` the error's line points at.
    fn anchor(&self) -> &'static str;

    /// The code it is answered with when it is answered on the wire.
    fn code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Internal
    }
}
