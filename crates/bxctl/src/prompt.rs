//! The interactive chat: a line editor with history (rustyline, a maintained crate, rather than
//! hand-written terminal handling: arrow keys, Ctrl-R, editing within the line), the commands
//! `/help`, `/quit` and `/sessions`, which never reach the model, and approvals answered where
//! they are asked: `approve? [y/n/l/show]`.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bxcore::client;
use bxcore::visible::{Mode, Shown};
use bxcore::{ApprovalId, Message, Timestamp};

use crate::approvals::Answer;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::in_flight::cancel_in_flight;

/// What `/help` prints.
pub const HELP: &str = "\
type a message and Enter to send it to the session; the turn's events show as they come.
  /help       this text
  /sessions   the sessions of this box, newest first
  /quit       leave (Ctrl-D too)
Ctrl-C cancels a turn in flight; at the prompt it clears the line.
Up and Down recall earlier messages; Ctrl-R searches them.
A call that needs your approval asks `approve? [y/n/l/show]`: y runs it, n denies it, l runs it
and allows the calls like it in this session for a time (a lease: its `lease` line says which
calls and how long; `bxctl approvals --leases` lists leases, `bxctl approvals revoke` ends one),
show prints it whole (arguments, digest, the rule that asked). Anything else, or Enter, leaves it
unanswered: it waits for `bxctl approve` or `bxctl deny` until it expires.";

/// What one line typed at the prompt is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Send it to the session.
    Message(String),
    Help,
    Quit,
    Sessions,
    /// Nothing to do (an empty line).
    Nothing,
    /// A `/word` that is not a command: never sent to the model.
    Unknown(String),
}

/// What a typed line means.
pub fn parse(line: &str) -> Line {
    let t = line.trim();
    match t {
        "" => Line::Nothing,
        "/help" | "/?" => Line::Help,
        "/quit" | "/exit" | "/q" => Line::Quit,
        "/sessions" => Line::Sessions,
        _ if t.starts_with('/') && !t.starts_with("//") => Line::Unknown(t.to_string()),
        // `//text` sends `/text`.
        _ if t.starts_with("//") => Line::Message(t[1..].to_string()),
        _ => Line::Message(t.to_string()),
    }
}

/// The history file: `$XDG_STATE_HOME/boxmaker/chat-history`, else
/// `~/.local/state/boxmaker/chat-history`.
pub fn history_file() -> Option<PathBuf> {
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .map(|d| d.join("boxmaker/chat-history"))
}

/// The line editor, with the history loaded.
pub struct Prompt {
    editor: DefaultEditor,
    history: Option<PathBuf>,
}

impl std::fmt::Debug for Prompt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prompt")
            .field("history", &self.history)
            .finish_non_exhaustive()
    }
}

/// What reading a line gave.
#[derive(Debug)]
pub enum Read {
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D, or the terminal went away.
    End,
}

impl Prompt {
    pub fn new() -> Result<Prompt, ReadlineError> {
        let mut editor = DefaultEditor::new()?;
        let history = history_file();
        if let Some(h) = &history {
            let _ = editor.load_history(h);
        }
        Ok(Prompt { editor, history })
    }

    /// One line, with `prompt`.
    pub fn read(&mut self, prompt: &str) -> Read {
        match self.editor.readline(prompt) {
            Ok(line) => Read::Line(line),
            Err(ReadlineError::Interrupted) => Read::Interrupted,
            Err(_) => Read::End,
        }
    }

    /// Remember a sent message (in memory and in the history file, which only its owner may
    /// read: messages may be private).
    pub fn remember(&mut self, line: &str) {
        let _ = self.editor.add_history_entry(line);
        if let Some(h) = &self.history {
            if let Some(dir) = h.parent() {
                let _ = fs::create_dir_all(dir);
            }
            // Made 0600 before anything is written to it.
            let _ = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(h);
            let _ = self.editor.save_history(h);
        }
    }

    /// Ask the owner about a pending call: `y` approves, `n` denies, `l` approves with a lease,
    /// `show` prints it whole and asks again; anything else (Enter, `/quit`, a line typed
    /// before the question) leaves it unanswered, pending for `bxctl approve` or `deny` until
    /// it expires. Ctrl-C cancels the turn instead. What was typed before the question is
    /// thrown away first: a line typed ahead never answers it.
    pub fn approval(
        &mut self,
        admin: &Path,
        timeout: Duration,
        approval: &ApprovalId,
        out: &mut dyn Write,
    ) {
        discard_typed_ahead();
        loop {
            let answer = match self.read("approve? [y/n/l/show] ") {
                Read::Line(l) => l.trim().to_ascii_lowercase(),
                Read::Interrupted => {
                    cancel_in_flight();
                    let _ = writeln!(out, "(cancelling the turn; the approval is withdrawn)");
                    return;
                }
                Read::End => String::new(),
            };
            let answer = match answer.as_str() {
                "y" | "yes" => Answer::Allow { lease: false },
                "l" | "lease" => Answer::Allow { lease: true },
                "n" | "no" => Answer::Deny,
                "show" | "s" => {
                    self.show(admin, timeout, approval, out);
                    continue;
                }
                _ => {
                    let home = crate::output::hint_home();
                    let _ = writeln!(
                        out,
                        "not answered: the call waits for bxctl approve {approval}{home} or bxctl \
                         deny {approval}{home} until it expires (y, n, l or show answer here)"
                    );
                    return;
                }
            };
            let decision = Message::ApprovalDecision(answer.decision(approval));
            let said = match client::call(admin, timeout, 2, decision, |_| {}) {
                Ok(Message::ApprovalAck(_)) => match answer {
                    Answer::Allow { lease: false } => "approved: it runs".to_string(),
                    Answer::Allow { lease: true } => {
                        "approved: it runs, and so do the calls like it while the lease lives \
                         (bxctl approvals --leases)"
                            .to_string()
                    }
                    Answer::Deny => "denied".to_string(),
                },
                Ok(other) => format!("brokerd answered {}", other.kind()),
                Err(e) => format!("the decision did not reach brokerd: {e}"),
            };
            let _ = writeln!(out, "{}", Shown(&said, Mode::Line));
            return;
        }
    }

    fn show(
        &mut self,
        admin: &Path,
        timeout: Duration,
        approval: &ApprovalId,
        out: &mut dyn Write,
    ) {
        let ask = Message::ApprovalShow(bxcore::ApprovalShow {
            approval: approval.clone(),
        });
        let shown = match client::call(admin, timeout, 1, ask, |_| {}) {
            Ok(Message::Approval(a)) => crate::approvals::show(&a, Timestamp::now(), true),
            Ok(other) => format!("brokerd answered {}\n", other.kind()),
            Err(e) => format!("approval {approval}: {e}\n"),
        };
        let _ = write!(out, "{shown}");
    }
}

/// Throw away what was typed at the terminal and not read yet (`tcflush(TCIFLUSH)`): the
/// question about an approval is answered only by what is typed after it is asked.
fn discard_typed_ahead() {
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let _ = nix::sys::termios::tcflush(stdin.as_fd(), nix::sys::termios::FlushArg::TCIFLUSH);
}

/// `/sessions`: the session logs under `<home>/loop/sessions`, newest first.
pub fn sessions(home: &Path, out: &mut dyn Write) {
    let dir = home.join("loop/sessions");
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            let _ = writeln!(
                out,
                "cannot list the sessions in {}: {e} (on the device they are loopd's: use sudo)",
                dir.display()
            );
            return;
        }
    };
    let mut found: Vec<(std::time::SystemTime, String, u64)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".jsonl")?.to_string();
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, name, meta.len()))
        })
        .collect();
    found.sort_by_key(|b| std::cmp::Reverse(b.0));
    if found.is_empty() {
        let _ = writeln!(out, "no sessions yet");
    }
    for (when, name, len) in found {
        let ms = when
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:<24} last used {}  ({len} bytes)",
            Shown(&name, Mode::Line),
            Timestamp(ms).utc_text()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_never_messages_and_a_double_slash_sends_one() {
        assert_eq!(parse("/quit"), Line::Quit);
        assert_eq!(parse("  /help "), Line::Help);
        assert_eq!(parse("/sessions"), Line::Sessions);
        assert_eq!(parse(""), Line::Nothing);
        assert_eq!(parse("   "), Line::Nothing);
        assert_eq!(parse("/frobnicate"), Line::Unknown("/frobnicate".into()));
        assert_eq!(
            parse("//etc is a dir"),
            Line::Message("/etc is a dir".into())
        );
        assert_eq!(parse("hello"), Line::Message("hello".into()));
    }
}
