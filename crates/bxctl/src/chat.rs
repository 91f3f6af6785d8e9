//! `bxctl chat`: one message to a session, or an interactive prompt; the turn's events are shown
//! as they come (assistant text as it streams, each tool call, its outcome, approvals with the
//! command that answers them), or printed as JSON lines with `--json`.

use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};

use bxcore::client::{ClientError, Exchange};
use bxcore::visible::{Mode, Shown};
use bxcore::{ErrorCode, Message, Outcome, SessionId, Timestamp, Turn, TurnEvent, Usage};

use crate::done::{Done, Ended, Failure};
use crate::in_flight::{InFlight, cancel_in_flight};

/// The longest a turn may take as seen from the channel: a turn may wait for the owner's
/// approval, which expires after ten minutes by default.
pub const TURN_TIMEOUT: Duration = Duration::from_secs(3600);

/// The session `chat` uses when none is named.
pub const DEFAULT_SESSION: &str = "main";

/// Why `chat` did not end well. Its text never carries a pointer: [`ChatError::line`] adds the
/// runbook entry of an outage.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The session id is not one.
    #[error("--session: {0}")]
    BadSession(String),
    /// loopd could not be reached or broke off.
    #[error("cannot talk to loopd on {socket}: {why}")]
    Unreachable { socket: String, why: ClientError },
    /// loopd answered the turn with an error. A turn that failed says so once, with loopd's
    /// reason (which names the cause where it happened and its runbook entry); a refusal names
    /// its code.
    #[error("{}", refused(.0))]
    Refused(bxcore::WireError),
    /// Reading the message from standard input failed.
    #[error("cannot read the message: {0}")]
    Input(#[source] io::Error),
    /// The owner cancelled the turn (Ctrl-C); loopd confirmed it.
    #[error(
        "the turn was cancelled: nothing more was started, a pending approval was withdrawn; the \
         session takes the next message at once"
    )]
    Cancelled,
    /// The model sent nothing for this long (`--model-timeout`): the turn was cancelled.
    #[error(
        "the model sent nothing for {} s (--model-timeout), so the turn was cancelled",
        .0.as_secs()
    )]
    ModelTimeout(Duration),
    /// The turn ended, but the box could not run some of its tool calls (an outage, not the
    /// tools' own failures): how many, and the first one's cause (with its runbook pointer).
    #[error(
        "the turn ended, but the box could not run {calls} of its tool calls: {}",
        Shown(first, Mode::Line)
    )]
    Outage { calls: usize, first: String },
}

/// loopd's answer to a turn, escaped: what a failed turn says, or the code of a refusal.
fn refused(e: &bxcore::WireError) -> String {
    match e.code {
        ErrorCode::Inference | ErrorCode::Unavailable => {
            format!("the turn failed: {}", Shown(&e.detail, Mode::Line))
        }
        code => format!(
            "loopd refused the turn ({code}): {}",
            Shown(&e.detail, Mode::Line)
        ),
    }
}

/// The runbook entry of `bxctl chat` failing to reach loopd.
pub const UNREACHABLE_ANCHOR: &str = "bxctl-unreachable";
/// The runbook entry of a model that stayed silent past `--model-timeout`.
pub const MODEL_TIMEOUT_ANCHOR: &str = "inference-timeout";

impl ChatError {
    /// The runbook entry bxctl points at itself: loopd's answers and an outage's cause carry
    /// their own.
    pub fn anchor(&self) -> Option<&'static str> {
        match self {
            ChatError::Unreachable { .. } => Some(UNREACHABLE_ANCHOR),
            ChatError::ModelTimeout(_) => Some(MODEL_TIMEOUT_ANCHOR),
            _ => None,
        }
    }

    /// The line the owner reads: the text and, when bxctl points at an entry, its pointer.
    pub fn line(&self) -> String {
        bxcore::runbook::with_pointer(self, self.anchor())
    }
}

/// A chat that did not end well: exit 130 for a turn the owner cancelled, as a shell reports
/// Ctrl-C; else 1, the line pointing at the runbook entry bxctl points at.
impl From<ChatError> for Failure {
    fn from(e: ChatError) -> Failure {
        let text = format!("bxctl: {e}");
        match e {
            ChatError::Cancelled => Failure::cancelled(text),
            _ => Failure::failed(text).pointing(e.anchor()),
        }
    }
}

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

impl TurnLog {
    /// The assistant's text of the turn, its pieces joined as they streamed.
    pub fn text(&self) -> String {
        self.events
            .iter()
            .filter_map(|e| match e {
                TurnEvent::AssistantText { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The outages behind its failed tool calls, in order.
    pub fn outages(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter_map(|e| match e {
                TurnEvent::ToolResult {
                    outage: Some(why), ..
                } => Some(why.as_str()),
                _ => None,
            })
            .collect()
    }

    /// `Err(Outage)` when the box could not run a tool call of the turn: the turn failed the
    /// owner even though the model went on.
    pub fn checked(self) -> Result<TurnLog, ChatError> {
        let outages = self.outages();
        match outages.first() {
            None => Ok(self),
            Some(first) => Err(ChatError::Outage {
                calls: outages.len(),
                first: first.to_string(),
            }),
        }
    }
}

/// How a turn waits: a spinner on a terminal, and how long the model may stay silent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Waiting {
    /// Draw a spinner on stderr while nothing arrives (only on a terminal).
    pub spinner: bool,
    /// Cancel the turn when no frame arrives for this long, except while it waits for the
    /// owner's approval.
    pub model_timeout: Option<Duration>,
}

/// Ctrl-C in `chat`: the first cancels the turn in flight (the next message is accepted as
/// soon as loopd answers `cancelled`); one with no turn in flight, or a second one, ends bxctl
/// with 130 as a shell would. SIGINT is blocked in every thread and taken by one that waits for
/// it, so no handler runs in the middle of a write.
pub fn catch_interrupts() {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    if set.thread_block().is_err() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("sigint".into())
        .spawn(move || {
            let mut cancelling = false;
            loop {
                if set.wait().is_err() {
                    return;
                }
                if !cancelling && cancel_in_flight() {
                    cancelling = true;
                    eprintln!("\r(cancelling the turn; Ctrl-C again to leave at once)");
                    continue;
                }
                std::process::exit(130);
            }
        });
}

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
const TICK: Duration = Duration::from_millis(120);

/// Send one turn and show its events on `out` as they arrive. `on_event` sees each event too
/// (the demo answers approvals from it).
pub fn turn(
    loop_socket: &Path,
    session: &SessionId,
    resume: bool,
    text: &str,
    style: Style,
    out: &mut dyn Write,
    on_event: impl FnMut(&TurnEvent),
) -> Result<TurnLog, ChatError> {
    turn_waiting(
        loop_socket,
        session,
        resume,
        text,
        style,
        Waiting::default(),
        out,
        on_event,
    )
}

/// [`turn`], waiting as `waiting` says.
#[allow(clippy::too_many_arguments)]
pub fn turn_waiting(
    loop_socket: &Path,
    session: &SessionId,
    resume: bool,
    text: &str,
    style: Style,
    waiting: Waiting,
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
    let in_flight = InFlight::set(ex.stream());
    // Frames are read by a thread and handed over, so that this one can draw the spinner and
    // notice a silent model while it waits.
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::Builder::new()
        .name("turn-frames".into())
        .spawn(move || {
            loop {
                let frame = ex.next_frame();
                let end = !matches!(&frame, Ok(env) if !env.last);
                if tx.send(frame).is_err() || end {
                    return;
                }
            }
        })
        .map_err(|e| unreachable(ClientError::Receive(bxcore::FrameError::Io(e))))?;
    let mut log = TurnLog::default();
    let mut painter = Painter {
        style,
        mid_text: false,
    };
    let mut spinner = Spinner::new(waiting.spinner && !style.json);
    let mut last = Instant::now();
    let mut approval_pending = false;
    let mut timed_out = None;
    let result = loop {
        let env = match rx.recv_timeout(TICK) {
            Ok(Ok(env)) => env,
            Ok(Err(ClientError::Remote(e))) => {
                spinner.clear();
                painter.end_text(out);
                break match (e.code, timed_out) {
                    (ErrorCode::Cancelled, Some(after)) => Err(ChatError::ModelTimeout(after)),
                    (ErrorCode::Cancelled, None) => Err(ChatError::Cancelled),
                    _ => Err(ChatError::Refused(e)),
                };
            }
            Ok(Err(e)) => {
                spinner.clear();
                painter.end_text(out);
                break Err(unreachable(e));
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Some(limit) = waiting.model_timeout {
                    if !approval_pending && timed_out.is_none() && last.elapsed() >= limit {
                        timed_out = Some(limit);
                        cancel_in_flight();
                    }
                }
                if painter.mid_text {
                    // Streaming text is on this line: a spinner would overwrite it.
                    continue;
                }
                spinner.tick(if approval_pending {
                    "waiting for the owner's decision"
                } else {
                    "waiting for the model"
                });
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                spinner.clear();
                break Err(unreachable(ClientError::Unexpected("end of the frames")));
            }
        };
        spinner.clear();
        last = Instant::now();
        if style.json {
            let _ = writeln!(out, "{}", serde_json::to_string(&env).unwrap_or_default());
        }
        match env.msg {
            Message::TurnEvent { event } if !env.last => {
                approval_pending = matches!(event, TurnEvent::ToolPending { .. });
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
                break Ok(log);
            }
            other => {
                painter.end_text(out);
                break Err(unreachable(ClientError::Unexpected(other.kind())));
            }
        }
    };
    drop(in_flight);
    drop(rx);
    let _ = reader.join();
    result
}

/// A spinner on stderr, drawn and cleared on the same line; nothing when it is off.
struct Spinner {
    on: bool,
    drawn: bool,
    frame: usize,
    since: Instant,
}

impl Spinner {
    fn new(on: bool) -> Spinner {
        Spinner {
            on,
            drawn: false,
            frame: 0,
            since: Instant::now(),
        }
    }

    fn tick(&mut self, what: &str) {
        if !self.on {
            return;
        }
        if !self.drawn {
            self.since = Instant::now();
        }
        self.frame = (self.frame + 1) % SPINNER.len();
        let mut err = io::stderr();
        let _ = write!(
            err,
            "\r{} {what} ({} s; Ctrl-C cancels)\x1b[K",
            SPINNER[self.frame],
            self.since.elapsed().as_secs()
        );
        let _ = err.flush();
        self.drawn = true;
    }

    fn clear(&mut self) {
        if self.drawn {
            let mut err = io::stderr();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.drawn = false;
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
                let home = crate::output::hint_home();
                let line = format!(
                    "⏸ [{call}] waits for the owner (approval {approval}, {left} s left): \
                     bxctl approve {approval}{home}   or   bxctl deny {approval}{home}"
                );
                let _ = writeln!(out, "{}", self.paint("33", &line));
            }
            TurnEvent::ToolResult {
                call,
                outcome,
                text,
                outage,
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
                // The cause the model is not shown, where the owner sees the failure.
                if let Some(why) = outage {
                    let line = format!("  because {}", Shown(why, Mode::Line));
                    let _ = writeln!(out, "{}", self.paint(color, &line));
                }
            }
        }
    }

    fn done(&mut self, session: &SessionId, usage: Usage, out: &mut dyn Write) {
        self.end_text(out);
        // A provider that reports no usage gives zeros (a real call always reads some tokens).
        let line = if usage.input_tokens == 0 && usage.output_tokens == 0 {
            format!("(session {session}: usage unknown, the provider reported none)")
        } else {
            format!(
                "(session {session}: {} tokens in, {} out)",
                usage.input_tokens, usage.output_tokens
            )
        };
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
    /// Cancel a turn whose model sends nothing for this long.
    pub model_timeout: Option<Duration>,
    /// The box's home (`/sessions` lists its sessions).
    pub home: PathBuf,
    /// brokerd's admin socket, where approvals asked in the chat are answered.
    pub admin: PathBuf,
    /// How long brokerd has to answer a decision.
    pub broker_timeout: Duration,
}

/// `bxctl chat`: one message (from the argument, or all of standard input when it is not a
/// terminal), or the interactive prompt on a terminal. On a terminal an approval is answered
/// where it is asked.
pub fn run(loop_socket: &Path, opts: &ChatOptions) -> Ended {
    talk(loop_socket, opts)?;
    Ok(Done)
}

fn talk(loop_socket: &Path, opts: &ChatOptions) -> Result<(), ChatError> {
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
    let waiting = Waiting {
        spinner: !opts.json && io::stderr().is_terminal(),
        model_timeout: opts.model_timeout,
    };
    let terminal = io::stdin().is_terminal() && !opts.json;
    catch_interrupts();
    let mut prompt = if terminal {
        Some(crate::prompt::Prompt::new().map_err(|e| ChatError::Input(io::Error::other(e)))?)
    } else {
        None
    };
    // Whether the next turn resumes: `--new` creates; otherwise an existing session is resumed
    // and a missing one created.
    let mut resume = if opts.new { Some(false) } else { None };
    let send = |text: &str,
                resume: &mut Option<bool>,
                prompt: &mut Option<crate::prompt::Prompt>,
                out: &mut dyn Write| {
        let first = resume.unwrap_or(true);
        let go = |resume: bool, out: &mut dyn Write, prompt: &mut Option<crate::prompt::Prompt>| {
            turn_waiting(
                loop_socket,
                &session,
                resume,
                text,
                style,
                waiting,
                out,
                |e| {
                    // On a terminal, the owner answers where the call is asked.
                    if let (Some(p), TurnEvent::ToolPending { approval, .. }) = (prompt.as_mut(), e)
                    {
                        p.approval(
                            &opts.admin,
                            opts.broker_timeout,
                            approval,
                            &mut io::stdout(),
                        );
                    }
                },
            )
        };
        let r = go(first, out, prompt);
        let r = match r {
            Err(ChatError::Refused(e))
                if e.code == ErrorCode::NoSuchSession && resume.is_none() =>
            {
                go(false, out, prompt)
            }
            other => other,
        };
        // A turn that reached loopd made the session, whatever its end.
        if r.is_ok() || matches!(&r, Err(ChatError::Cancelled | ChatError::ModelTimeout(_))) {
            *resume = Some(true);
        }
        r.and_then(TurnLog::checked).map(drop)
    };
    let mut out = stdout.lock();
    match (&opts.text, prompt.is_some()) {
        (Some(text), _) => send(text, &mut resume, &mut prompt, &mut out),
        (None, true) => {
            let _ = writeln!(
                out,
                "session {session}; /help lists the commands, /quit or Ctrl-D leaves"
            );
            drop(out);
            loop {
                let read = match prompt.as_mut() {
                    Some(p) => p.read("you> "),
                    None => return Ok(()),
                };
                let mut out = io::stdout().lock();
                let line = match read {
                    crate::prompt::Read::Line(l) => l,
                    crate::prompt::Read::Interrupted => continue,
                    crate::prompt::Read::End => return Ok(()),
                };
                match crate::prompt::parse(&line) {
                    crate::prompt::Line::Nothing => {}
                    crate::prompt::Line::Help => {
                        let _ = writeln!(out, "{}", crate::prompt::HELP);
                    }
                    crate::prompt::Line::Quit => return Ok(()),
                    crate::prompt::Line::Sessions => crate::prompt::sessions(&opts.home, &mut out),
                    crate::prompt::Line::Unknown(w) => {
                        let _ = writeln!(
                            out,
                            "{} is not a command (/help lists them; //text sends /text)",
                            Shown(&w, Mode::Line)
                        );
                    }
                    crate::prompt::Line::Message(text) => {
                        if let Some(p) = prompt.as_mut() {
                            p.remember(&text);
                        }
                        if let Err(e) = send(&text, &mut resume, &mut prompt, &mut out) {
                            let _ = writeln!(out, "{}", e.line());
                        }
                    }
                }
            }
        }
        (None, false) => {
            let mut text = String::new();
            io::stdin()
                .read_to_string(&mut text)
                .map_err(ChatError::Input)?;
            send(text.trim_end(), &mut resume, &mut prompt, &mut out)
        }
    }
}
