//! How a subcommand ends: [`Done`], or a [`Failure`] that knows its exit code (1 refused or
//! failed, 2 usage, 130 a chat turn the owner cancelled), the line the owner reads and its
//! runbook entry, or the `{"error": ...}` document a script reads with `--json`. `cli::run`
//! prints it, in one place, and exits with its code.

use std::process::ExitCode;

use bxcore::runbook::{Anchored, with_pointer};
use bxcore::visible::{Mode, Shown};

/// The subcommand did what it was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done;

/// How every subcommand ends.
pub type Ended = Result<Done, Failure>;

/// Exit 1: refused or failed.
const FAILED: u8 = 1;
/// Exit 2: a command line that asks for what cannot be, as clap's own usage errors.
const USAGE: u8 = 2;
/// Exit 130: the owner cancelled the turn (Ctrl-C), as a shell reports it.
const CANCELLED: u8 = 130;

/// Why a subcommand did not end done.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Failure {
    code: u8,
    /// What the owner reads on stderr (it may span lines), without the runbook pointer; empty
    /// when the command has said everything already (a report whose verdict it printed).
    text: String,
    anchor: Option<String>,
    /// With `--json`: the document printed on stdout instead of the text.
    json: Option<serde_json::Value>,
}

impl Failure {
    fn new(code: u8, text: impl Into<String>) -> Failure {
        Failure {
            code,
            text: text.into(),
            anchor: None,
            json: None,
        }
    }

    /// Refused or failed, saying `text`.
    pub fn failed(text: impl Into<String>) -> Failure {
        Failure::new(FAILED, text)
    }

    /// Failed, and the command printed all there is to say (its report and verdict).
    pub fn said() -> Failure {
        Failure::new(FAILED, "")
    }

    /// A usage error, saying `text`.
    pub fn usage(text: impl Into<String>) -> Failure {
        Failure::new(USAGE, text)
    }

    /// The owner cancelled the turn.
    pub fn cancelled(text: impl Into<String>) -> Failure {
        Failure::new(CANCELLED, text)
    }

    /// Refused or failed with `e`'s line and runbook entry.
    pub fn anchored(e: &impl Anchored) -> Failure {
        Failure::failed(e.to_string()).pointing(Some(e.anchor()))
    }

    /// The same, pointing at the runbook entry `anchor` when there is one.
    pub fn pointing(mut self, anchor: Option<&str>) -> Failure {
        self.anchor = anchor.map(str::to_string);
        self
    }

    /// The same, printed as `document` on stdout when `json` (`--json`).
    pub fn json_if(mut self, json: bool, document: serde_json::Value) -> Failure {
        if json {
            self.json = Some(document);
        }
        self
    }

    /// The exit code.
    pub fn code(&self) -> u8 {
        self.code
    }

    /// The runbook entry its line points at.
    pub fn anchor(&self) -> Option<&str> {
        self.anchor.as_deref()
    }

    /// The line on stderr: the text, escaped as everything shown to a person is (it may quote
    /// a daemon or the model), and its runbook pointer. Empty when there is nothing to say.
    pub fn line(&self) -> String {
        if self.text.is_empty() {
            return String::new();
        }
        let text = with_pointer(&self.text, self.anchor());
        Shown(&text, Mode::Text).to_string()
    }

    /// Say it (the JSON document on stdout, or the line on stderr) and give the exit code.
    pub fn report(&self) -> ExitCode {
        match &self.json {
            Some(doc) => crate::output::json_line(doc),
            None if !self.text.is_empty() => eprintln!("{}", self.line()),
            None => {}
        }
        ExitCode::from(self.code)
    }
}

/// The exit code of how a subcommand ended, after saying why when it failed.
pub fn exit(ended: Ended) -> ExitCode {
    match ended {
        Ok(Done) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_knows_its_exit_code() {
        assert_eq!(Failure::failed("x").code(), 1);
        assert_eq!(Failure::said().code(), 1);
        assert_eq!(Failure::usage("x").code(), 2);
        assert_eq!(Failure::cancelled("x").code(), 130);
    }

    #[test]
    fn a_failures_line_ends_with_its_pointer_and_shows_controls_escaped() {
        let f = Failure::failed("broke\u{1b}[2J").pointing(Some("bxctl-unreachable"));
        assert_eq!(
            f.line(),
            format!(
                "broke\\u{{1b}}[2J; {}",
                bxcore::runbook::pointer("bxctl-unreachable")
            )
        );
        assert_eq!(Failure::said().line(), "");
    }
}
