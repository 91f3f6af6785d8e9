//! One turn: the owner's text in, rounds of inference and tool calls, every step recorded in the
//! session log and sent to the channel as it happens.
//!
//! Order matters for what survives a crash: each record is appended before its event is sent, an
//! assistant message that asks for tools is fsync'd before any of its calls leaves loopd (so a
//! call id the broker has seen is never handed out again after a restart), and the turn's end is
//! fsync'd before the channel hears `turn_done`.

use std::fmt;

use bxcore::runbook::Anchored;
use bxcore::{
    ChatMessage, ErrorCode, InferRequest, Outcome, Timestamp, ToolDef, ToolRequest, ToolResponse,
    TurnEvent, Usage,
};

use crate::baseline::BaselineError;
use crate::cancel;
use crate::config::Loop;
use crate::infer::{Client, InferError};
use crate::recall::Recall;
use crate::session::{Record, Session, SessionError};
use crate::tools::{Offer, Registry, SessionInfo, ToolPort};

/// Everything one turn uses, borrowed from the server's context.
pub struct Runtime<'a> {
    pub limits: &'a Loop,
    pub client: &'a Client,
    pub port: &'a dyn ToolPort,
    pub registry: &'a Registry,
    /// Asked for the owner's memory at the start of the turn, when memory is configured.
    pub recall: Option<&'a Recall>,
    /// Called with each event as it happens.
    pub emit: &'a mut dyn FnMut(TurnEvent),
}

impl fmt::Debug for Runtime<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("limits", self.limits)
            .field("client", self.client)
            .finish_non_exhaustive()
    }
}

/// A finished turn: its number, what it used, and its messages (user text first).
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub turn: u64,
    pub usage: Usage,
    pub messages: Vec<ChatMessage>,
}

/// Why a turn ended without `turn_done`.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The session would exceed its context budget.
    #[error(
        "the session holds about {estimated} tokens, over its budget of {budget}: start a new \
         session"
    )]
    SessionFull { estimated: u64, budget: u64 },
    /// The turn used all its rounds and the model still asked for tools.
    #[error("the model still asked for tools after {0} rounds")]
    TurnLimit(u32),
    #[error(transparent)]
    Infer(InferError),
    #[error(transparent)]
    Session(SessionError),
    /// A new session's baseline could not be read.
    #[error(transparent)]
    Baseline(BaselineError),
    /// The channel cancelled the turn; nothing more was started.
    #[error("the turn was cancelled by its channel; no model or tool call was started after that")]
    Cancelled,
    /// The tool broker could not say which tools there are: the turn did not start (no model
    /// call), since the model would be offered none of the owner's tools.
    #[error("the tool broker is unavailable ({0}); the turn did not start")]
    Broker(String),
    /// Every worker loopd may run is serving a turn: the turn did not start.
    #[error(
        "loopd runs at most {0} session(s) at once ([workers] max) and every one is running a \
         turn; this turn did not start: send it again when one of them ends"
    )]
    WorkersFull(usize),
    /// The session's worker could not be started or reached: the turn did not start.
    #[error("the session's worker could not be started or reached ({0}); the turn did not start")]
    Worker(String),
    /// The channel's message was a turn of this session already: it is not run again.
    #[error(
        "the channel's message {0} was a turn of this session already (the channel handed it off \
         twice, across a restart); it does not run again"
    )]
    Repeated(bxcore::TurnKey),
}

/// What the model is shown for a tool call its turn was cancelled before: by the owner (Ctrl-C)
/// or by the channel going away; loopd cannot tell which.
pub const CANCELLED_CALL: &str =
    "the turn was cancelled (by the owner, or its channel went away) before this call ran";

/// The runbook entry of a session over its context budget.
pub const SESSION_FULL_ANCHOR: &str = "session-full";
/// The runbook entry of a turn that used all its rounds.
pub const TURN_LIMIT_ANCHOR: &str = "turn-limit";
/// The runbook entry of a channel's message handed off a second time.
pub const REPEATED_ANCHOR: &str = "channel-turn-repeated";

impl TurnError {
    /// The code an `error` frame carries for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            TurnError::SessionFull { .. } => ErrorCode::SessionFull,
            TurnError::TurnLimit(_) => ErrorCode::TurnLimit,
            TurnError::Infer(_) => ErrorCode::Inference,
            TurnError::Session(SessionError::Exists(_)) => ErrorCode::SessionExists,
            TurnError::Session(SessionError::NotFound(_)) => ErrorCode::NoSuchSession,
            TurnError::Session(_) | TurnError::Baseline(_) => ErrorCode::Internal,
            TurnError::Cancelled => ErrorCode::Cancelled,
            TurnError::Broker(_) => ErrorCode::Unavailable,
            TurnError::Repeated(_) => ErrorCode::TurnRepeated,
            TurnError::WorkersFull(_) => ErrorCode::Unavailable,
            TurnError::Worker(_) => ErrorCode::Internal,
        }
    }

    /// The runbook entry its line points at: a model call's failure where inferproxy's answer
    /// pointed; none for the refusals that say what to do themselves (exists, not found,
    /// cancelled).
    pub fn anchor(&self) -> Option<&str> {
        match self {
            TurnError::SessionFull { .. } => Some(SESSION_FULL_ANCHOR),
            TurnError::TurnLimit(_) => Some(TURN_LIMIT_ANCHOR),
            TurnError::Infer(e) => Some(e.anchor()),
            TurnError::Session(e) => e.anchor(),
            TurnError::Baseline(e) => Some(e.anchor()),
            TurnError::Cancelled => None,
            TurnError::Broker(_) => Some(crate::broker_port::BROKER_ANCHOR),
            TurnError::Repeated(_) => Some(REPEATED_ANCHOR),
            TurnError::WorkersFull(_) => Some(crate::monitor::WORKERS_FULL_ANCHOR),
            TurnError::Worker(_) => Some(crate::monitor::WORKER_ANCHOR),
        }
    }

    /// Whether loopd logs it too: outages and damaged files, not the refusals a channel is told
    /// about (busy, full, the turn limit, exists, not found, cancelled).
    pub fn logged(&self) -> bool {
        matches!(
            self,
            TurnError::Infer(_)
                | TurnError::Baseline(_)
                | TurnError::Broker(_)
                | TurnError::Session(SessionError::Torn { .. } | SessionError::Io(..))
                | TurnError::Repeated(_)
                | TurnError::WorkersFull(_)
                | TurnError::Worker(_)
        )
    }

    /// The line the channel is told (an `error` frame's detail): the text and its pointer.
    pub fn line(&self) -> String {
        bxcore::runbook::with_pointer(self, self.anchor())
    }
}

impl From<SessionError> for TurnError {
    fn from(e: SessionError) -> TurnError {
        TurnError::Session(e)
    }
}

/// Run one turn of `session` with the owner's `text`, the model offered `offer`; a channel's
/// turn carries `key`, the owner's message it is, kept with the user's text.
pub fn run_turn(
    rt: &mut Runtime<'_>,
    session: &mut Session,
    text: &str,
    key: Option<&bxcore::TurnKey>,
    offer: &Offer,
) -> Result<Finished, TurnError> {
    if let Some(key) = key.filter(|k| session.has_key(k)) {
        return Err(TurnError::Repeated(key.clone()));
    }
    let turn = session.turns() + 1;
    // Recall never fails the turn: without an answer in time, the turn goes on without it. It
    // comes before the user's text, so the request still ends with it, and it is not part of
    // the turn handed to memory (a memory is never filed again as a new one).
    let known = |m: &bxcore::Memory| session.has_recalled(&m.session, m.turn);
    if let Some((recalled, memories)) = rt.recall.and_then(|r| r.ask(session.id(), text, &known)) {
        session.append(&Record::Recall {
            turn,
            text: recalled,
            memories,
        })?;
    }
    session.append(&Record::User {
        turn,
        text: text.to_string(),
        key: key.cloned(),
    })?;
    // The turn starts at the user's text: a call an earlier turn left unanswered (its worker
    // or loopd ended mid-call) is answered "interrupted" just before it, and belongs to that
    // turn, not to this one's record for memory.
    let start = session.messages().len() - 1;
    let mut usage = Usage::default();
    let result = rounds(rt, session, turn, &offer.tools, &mut usage);
    let end = Record::TurnEnd {
        turn,
        usage,
        at: Timestamp::now(),
        error: result.as_ref().err().map(TurnError::code),
    };
    let ended = session.append(&end).and_then(|()| session.sync());
    result?;
    ended?;
    Ok(Finished {
        turn,
        usage,
        messages: session.messages()[start..].to_vec(),
    })
}

fn rounds(
    rt: &mut Runtime<'_>,
    session: &mut Session,
    turn: u64,
    tools: &[ToolDef],
    usage: &mut Usage,
) -> Result<(), TurnError> {
    let budget = rt.limits.context_tokens;
    for _ in 0..rt.limits.max_tool_rounds {
        // A safe point: nothing of this round has started.
        if cancel::cancelled() {
            return Err(TurnError::Cancelled);
        }
        let estimated = session.estimated_tokens();
        if estimated > budget {
            return Err(TurnError::SessionFull { estimated, budget });
        }
        let first_call = session.next_call();
        let request = InferRequest {
            slot: session.slot().to_string(),
            messages: session.messages().to_vec(),
            tools: tools.to_vec(),
            first_call,
        };
        let mut streamed = false;
        let emit = &mut *rt.emit;
        let reply = rt
            .client
            .infer(first_call.0, request, &mut |delta: &str| {
                if !delta.is_empty() {
                    streamed = true;
                    emit(TurnEvent::AssistantText {
                        text: delta.to_string(),
                    });
                }
            })
            .map_err(|e| {
                if cancel::cancelled() {
                    TurnError::Cancelled
                } else {
                    TurnError::Infer(e)
                }
            })?;
        *usage = usage.plus(reply.usage);
        let (text, tool_calls) = (reply.text, reply.tool_calls);
        if !streamed && !text.is_empty() {
            (rt.emit)(TurnEvent::AssistantText { text: text.clone() });
        }
        session.append(&Record::Assistant {
            text,
            tool_calls: tool_calls.clone(),
        })?;
        if tool_calls.is_empty() {
            return Ok(());
        }
        session.sync()?;
        for call in tool_calls {
            (rt.emit)(TurnEvent::ToolCall {
                call: call.call,
                tool: call.tool.clone(),
                args: call.args.clone(),
            });
            // A safe point: a call the turn was cancelled before is not started, but recorded
            // as failed, so every call of the assistant message has its result.
            let (response, outage) = if cancel::cancelled() {
                let failed = ToolResponse::Failed {
                    message: CANCELLED_CALL.to_string(),
                };
                (failed, None)
            } else {
                answer(rt, session, turn, tools, &call)
            };
            let (outcome, text) = shown(response);
            session.append(&Record::Tool {
                call: call.call,
                tool: call.tool,
                outcome,
                text: text.clone(),
            })?;
            (rt.emit)(TurnEvent::ToolResult {
                call: call.call,
                outcome,
                text,
                outage,
            });
        }
    }
    if cancel::cancelled() {
        return Err(TurnError::Cancelled);
    }
    Err(TurnError::TurnLimit(rt.limits.max_tool_rounds))
}

/// One tool call's answer: a core tool runs here, an offered tool goes to the port, anything
/// else fails without leaving loopd. With it, the outage behind a failure, for the owner.
fn answer(
    rt: &mut Runtime<'_>,
    session: &Session,
    turn: u64,
    offered: &[ToolDef],
    call: &bxcore::ToolCall,
) -> (ToolResponse, Option<String>) {
    let info = SessionInfo {
        session: session.id().clone(),
        slot: session.slot().to_string(),
        turn,
        records: session.records(),
        estimated_tokens: session.estimated_tokens(),
        context_tokens: rt.limits.context_tokens,
    };
    if let Some(r) = rt.registry.run_core(&call.tool, &call.args, &info) {
        return (r, None);
    }
    if !offered.iter().any(|t| t.name == call.tool) {
        let failed = ToolResponse::Failed {
            message: format!("no tool named {:?} is offered", call.tool),
        };
        return (failed, None);
    }
    let request = ToolRequest {
        session: session.id().clone(),
        call: call.call,
        tool: call.tool.clone(),
        args: call.args.clone(),
    };
    let emit = &mut *rt.emit;
    let (response, outage) = rt.port.call_explained(&request, &mut |p| {
        emit(TurnEvent::ToolPending {
            call: call.call,
            approval: p.approval.clone(),
            expires: p.expires,
        });
    });
    let response = match response {
        // A port must never return a pending frame as an answer; if one does, the call failed.
        ToolResponse::PendingApproval { .. } => ToolResponse::Failed {
            message: "the tool call got no final answer".to_string(),
        },
        other => other,
    };
    (response, outage)
}

/// The outcome and the text the model is shown.
fn shown(response: ToolResponse) -> (Outcome, String) {
    match response {
        ToolResponse::Result { content, .. } => (Outcome::Result, content),
        ToolResponse::Failed { message } => (Outcome::Failed, message),
        ToolResponse::Denied { reason } => (Outcome::Denied, reason),
        ToolResponse::PendingApproval { .. } => (
            Outcome::Failed,
            "the tool call got no final answer".to_string(),
        ),
    }
}
