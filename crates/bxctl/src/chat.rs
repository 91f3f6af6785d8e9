//! `bxctl chat`: one message to a session, or an interactive prompt; the turn's events are shown
//! as they come (assistant text as it streams, each tool call, its outcome, approvals with the
//! command that answers them), or printed as JSON lines with `--json`.

use std::fmt;
use std::io::{self, BufRead, IsTerminal, Read, Write};
use std::path::Path;
use std::time::Duration;

use bxcore::client::{ClientError, Exchange};
use bxcore::runbook::pointer;
use bxcore::visible::{Mode, Shown};
use bxcore::{ErrorCode, Message, Outcome, SessionId, Timestamp, Turn, TurnEvent, Usage};

/// The longest a turn may take as seen from the channel: a turn may wait for the owner's
/// approval, which expires after ten minutes by default.
pub const TURN_TIMEOUT: Duration = Duration::from_secs(3600);

/// The session `chat` uses when none is named.
pub const DEFAULT_SESSION: &str = "main";

#[derive(Debug)]
pub enum ChatError {
    /// The session id is not one.
    BadSession(String),
    /// loopd could not be reached or broke off.
    Unreachable { socket: String, why: ClientError },
    /// loopd answered the turn with an error.
    Refused(bxcore::WireError),
    /// Reading the message from standard input failed.
    Input(io::Error),
}

impl fmt::Display for ChatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChatError::BadSession(why) => write!(f, "--session: {why}"),
            ChatError::Unreachable { socket, why } => write!(
                f,
                "cannot talk to loopd on {socket}: {why}; {}",
                pointer("bxctl-unreachable")
            ),
            ChatError::Refused(e) => write!(
                f,
                "loopd refused the turn: {}: {}",
                e.code,
                Shown(&e.detail, Mode::Line)
            ),
            ChatError::Input(e) => write!(f, "cannot read the message: {e}"),
        }
    }
}

impl std::error::Error for ChatError {}

/// How the events of a turn are shown.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    /// One JSON line per frame, nothing else.
    pub json: bool,
    /// ANSI colours (only on a terminal).
    pub color: bool,
}

/// What one turn did, for callers that check it (the demo, tests).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TurnLog {
    pub events: Vec<TurnEvent>,
    pub usage: Usage,
}

/// Send one turn and show its events on `out` as they arrive. `on_event` sees each event too
/// (the demo answers approvals from it).
pub fn turn(
    loop_socket: &Path,
    session: &SessionId,
    resume: bool,
    text: &str,
    style: Style,
    out: &mut dyn Write,
    mut on_event: impl FnMut(&TurnEvent),
) -> Result<TurnLog, ChatError> {
    let unreachable = |why| ChatError::Unreachable {
        socket: loop_socket.display().to_string(),
        why,
    };
    let msg = Message::Turn(Turn {
        session: session.clone(),
        resume,
        text: text.to_string(),
    });
    let mut ex = Exchange::start(loop_socket, TURN_TIMEOUT, 1, msg).map_err(unreachable)?;
    let mut log = TurnLog::default();
    let mut painter = Painter {
        style,
        mid_text: false,
    };
    loop {
        let env = match ex.next_frame() {
            Ok(env) => env,
            Err(ClientError::Remote(e)) => {
                painter.end_text(out);
                return Err(ChatError::Refused(e));
            }
            Err(e) => {
                painter.end_text(out);
                return Err(unreachable(e));
            }
        };
        if style.json {
            let _ = writeln!(out, "{}", serde_json::to_string(&env).unwrap_or_default());
        }
        match env.msg {
            Message::TurnEvent { event } if !env.last => {
                if !style.json {
                    painter.event(&event, out);
                }
                on_event(&event);
                log.events.push(event);
            }
            Message::TurnDone(done) if env.last => {
                log.usage = done.usage;
                if !style.json {
                    painter.done(&done.session, done.usage, out);
                }
                return Ok(log);
            }
            other => {
                painter.end_text(out);
                return Err(unreachable(ClientError::Unexpected(other.kind())));
            }
        }
    }
}

struct Painter {
    style: Style,
    mid_text: bool,
}

impl Painter {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.style.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    fn end_text(&mut self, out: &mut dyn Write) {
        if self.mid_text {
            let _ = writeln!(out);
            self.mid_text = false;
        }
    }

    fn event(&mut self, event: &TurnEvent, out: &mut dyn Write) {
        match event {
            TurnEvent::AssistantText { text } => {
                let _ = write!(out, "{}", Shown(text, Mode::Text));
                let _ = out.flush();
                self.mid_text = true;
            }
            TurnEvent::ToolCall { call, tool, args } => {
                self.end_text(out);
                let args = args.to_string();
                let line = format!(
                    "→ [{call}] {} {}",
                    Shown(tool, Mode::Line),
                    Shown(&args, Mode::Line)
                );
                let _ = writeln!(out, "{}", self.paint("36", &line));
            }
            TurnEvent::ToolPending {
                call,
                approval,
                expires,
            } => {
                self.end_text(out);
                let left = expires
                    .unix_millis()
                    .saturating_sub(Timestamp::now().unix_millis())
                    / 1000;
                let line = format!(
                    "⏸ [{call}] waits for the owner (approval {approval}, {left} s left): \
                     bxctl approve {approval}   or   bxctl deny {approval}"
                );
                let _ = writeln!(out, "{}", self.paint("33", &line));
            }
            TurnEvent::ToolResult {
                call,
                outcome,
                text,
            } => {
                self.end_text(out);
                let (mark, color) = match outcome {
                    Outcome::Result => ("✓ result", "32"),
                    Outcome::Failed => ("✗ failed", "31"),
                    Outcome::Denied => ("⊘ denied", "31"),
                };
                let first = text.lines().next().unwrap_or_default();
                let more = if text.lines().count() > 1 { " …" } else { "" };
                let line = format!("{mark} [{call}]: {}{more}", Shown(first, Mode::Line));
                let _ = writeln!(out, "{}", self.paint(color, &line));
            }
        }
    }

    fn done(&mut self, session: &SessionId, usage: Usage, out: &mut dyn Write) {
        self.end_text(out);
        let line = format!(
            "(session {session}: {} tokens in, {} out)",
            usage.input_tokens, usage.output_tokens
        );
        let _ = writeln!(out, "{}", self.paint("2", &line));
    }
}

/// What `bxctl chat` was asked.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    pub session: Option<String>,
    pub new: bool,
    pub text: Option<String>,
    pub json: bool,
}

/// `bxctl chat`: one message (from the argument, or all of standard input when it is not a
/// terminal), or a prompt per line on a terminal.
pub fn run(loop_socket: &Path, opts: &ChatOptions) -> Result<(), ChatError> {
    let session = match (&opts.session, opts.new) {
        (Some(s), _) => {
            SessionId::new(s.clone()).map_err(|e| ChatError::BadSession(e.to_string()))?
        }
        (None, true) => SessionId::new(format!("chat-{}", Timestamp::now().unix_millis()))
            .map_err(|e| ChatError::BadSession(e.to_string()))?,
        (None, false) => {
            SessionId::new(DEFAULT_SESSION).map_err(|e| ChatError::BadSession(e.to_string()))?
        }
    };
    let stdout = io::stdout();
    let style = Style {
        json: opts.json,
        color: !opts.json && stdout.is_terminal(),
    };
    let mut out = stdout.lock();
    // Whether the next turn resumes: `--new` creates; otherwise an existing session is resumed
    // and a missing one created.
    let mut resume = if opts.new { Some(false) } else { None };
    let send = |text: &str, resume: &mut Option<bool>, out: &mut dyn Write| {
        let first = resume.unwrap_or(true);
        let r = turn(loop_socket, &session, first, text, style, out, |_| {});
        let r = match r {
            Err(ChatError::Refused(e))
                if e.code == ErrorCode::NoSuchSession && resume.is_none() =>
            {
                turn(loop_socket, &session, false, text, style, out, |_| {})
            }
            other => other,
        };
        if r.is_ok() {
            *resume = Some(true);
        }
        r.map(drop)
    };
    match &opts.text {
        Some(text) => send(text, &mut resume, &mut out),
        None if io::stdin().is_terminal() => {
            let _ = writeln!(
                out,
                "session {session}; an empty line or end of input ends the chat"
            );
            let stdin = io::stdin();
            loop {
                let _ = write!(out, "you> ");
                let _ = out.flush();
                let mut line = String::new();
                if stdin
                    .lock()
                    .read_line(&mut line)
                    .map_err(ChatError::Input)?
                    == 0
                {
                    return Ok(());
                }
                let line = line.trim();
                if line.is_empty() {
                    return Ok(());
                }
                if let Err(e) = send(line, &mut resume, &mut out) {
                    let _ = writeln!(out, "{e}");
                }
            }
        }
        None => {
            let mut text = String::new();
            io::stdin()
                .read_to_string(&mut text)
                .map_err(ChatError::Input)?;
            send(text.trim_end(), &mut resume, &mut out)
        }
    }
}
