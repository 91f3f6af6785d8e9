//! Runbook pointers: the one place that writes them.
//!
//! Every refusal or outage line ends with `see docs/runbook.md#<anchor>`, and `docs/runbook.md`
//! has a `## <anchor>` entry saying what the line means, how to confirm it and how to fix it. An
//! error knows its entry ([`Anchored`]); its text never carries the pointer, which is added where
//! the line is written: by [`Pointed`] (what a person reads, what an `error` frame carries) or
//! the logger (`bxharden::log::fail`, which also sets the journal's `RUNBOOK=` field). The runbook
//! check (`tests/runbook.rs`) finds every anchor and refuses a pointer typed anywhere else.

use std::fmt;

/// The runbook file every pointer names, relative to the repository root.
pub const RUNBOOK: &str = "docs/runbook.md";

/// `see docs/runbook.md#<anchor>`.
pub fn pointer(anchor: &str) -> String {
    format!("see {RUNBOOK}#{anchor}")
}

/// `text`, then the pointer of `anchor` when there is one: the line of an error some of whose
/// answers point at the runbook and some (a refusal that says what to do itself) do not.
pub fn with_pointer(text: &dyn fmt::Display, anchor: Option<&str>) -> String {
    match anchor {
        Some(a) => format!("{text}; {}", pointer(a)),
        None => text.to_string(),
    }
}

/// `text` split into what it says and the anchor of the runbook pointer it ends with
/// (`...; see docs/runbook.md#<anchor>`), when it ends with one: a peer's answer that already
/// points at its entry is shown with that pointer, not a second one.
pub fn split_pointer(text: &str) -> Option<(&str, &str)> {
    let (said, anchor) = text.rsplit_once(&format!("; {}", pointer("")))?;
    let kebab = anchor
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (!anchor.is_empty() && kebab).then_some((said, anchor))
}

/// An error that knows its runbook entry. Its `Display` is what went wrong, without the pointer;
/// [`pointed`](Anchored::pointed) is the whole line a person reads.
pub trait Anchored: std::error::Error {
    /// The `## <anchor>` entry of `docs/runbook.md` the error's line points at (a constant,
    /// or the entry a peer's answer pointed at).
    fn anchor(&self) -> &str;

    /// The code it is answered with when it is answered on the wire.
    fn code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Internal
    }

    /// The error's text and its pointer: `{error}; see docs/runbook.md#{anchor}`.
    fn pointed(&self) -> Pointed<'_>
    where
        Self: Sized,
    {
        Pointed(self)
    }
}

/// An [`Anchored`] error shown with its pointer: `{error}; see docs/runbook.md#{anchor}`.
#[derive(Clone, Copy)]
pub struct Pointed<'a>(pub &'a dyn Anchored);

impl fmt::Display for Pointed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.0, pointer(self.0.anchor()))
    }
}

impl fmt::Debug for Pointed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the thing is broken")]
    struct Broken;

    // Not a real entry: kept out of the runbook check's sight (it reads literals handed to
    // `pointer` and constants named `*_ANCHOR`).
    const MADE_UP: &str = "thing-broken";

    impl Anchored for Broken {
        fn anchor(&self) -> &str {
            MADE_UP
        }
    }

    #[test]
    fn a_pointed_error_ends_with_the_pointer_of_its_anchor() {
        assert_eq!(Broken.to_string(), "the thing is broken");
        assert_eq!(
            Broken.pointed().to_string(),
            format!("the thing is broken; {}", pointer(MADE_UP))
        );
        let dynamic: &dyn Anchored = &Broken;
        assert_eq!(Pointed(dynamic).to_string(), Broken.pointed().to_string());
    }
}
