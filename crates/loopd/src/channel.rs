//! The channel server on loop.sock: one connection, one `turn` frame in, `turn_event` frames out
//! as they happen, then one final `turn_done` or `error`. A session runs one turn at a time.
//! A `health` frame instead is answered with what `crate::health` finds.
//!
//! The server keeps no session state in memory but the set of busy sessions: everything else is
//! in the session logs, so any connection can resume any session and a restart loses nothing.

use std::collections::HashSet;
use std::fmt;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use bxcore::layout::{BridgeRequest, LoopRequest};
use bxcore::{
    Envelope, ErrorCode, FrameError, Message, SessionId, Turn, TurnDone, TurnEvent, TurnKey,
    TurnRecord, write_frame,
};

use crate::baseline::Baseline;
use crate::config::Config;
use crate::infer::Client;
use crate::outbox::Outbox;
use crate::recall::Recall;
use crate::session::{self, Session, SessionError, TORN_TAIL_ANCHOR};
use crate::tools::{Registry, ToolPort};
use crate::turn::{Runtime, TurnError, run_turn};

/// Everything a turn needs, shared by every connection.
pub struct Context {
    pub cfg: Config,
    pub client: Client,
    pub port: Box<dyn ToolPort>,
    pub registry: Registry,
    busy: Mutex<HashSet<SessionId>>,
    outbox: Option<Arc<Outbox>>,
    recall: Option<Recall>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("cfg", &self.cfg)
            .field("client", &self.client)
            .field("outbox", &self.outbox)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(
        cfg: Config,
        client: Client,
        port: Box<dyn ToolPort>,
        registry: Registry,
    ) -> Context {
        Context {
            cfg,
            client,
            port,
            registry,
            busy: Mutex::new(HashSet::new()),
            outbox: None,
            recall: None,
        }
    }

    /// Hand every finished turn to this outbox (the memory hand-off).
    pub fn with_outbox(mut self, outbox: Arc<Outbox>) -> Context {
        self.outbox = Some(outbox);
        self
    }

    /// Ask memory for recall at the start of every turn.
    pub fn with_recall(mut self, recall: Recall) -> Context {
        self.recall = Some(recall);
        self
    }

    /// Whether a session is running a turn now.
    pub fn is_busy(&self, session: &SessionId) -> bool {
        self.busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(session)
    }
}

/// The busy mark of one session, removed when dropped.
struct Busy<'a> {
    set: &'a Mutex<HashSet<SessionId>>,
    id: SessionId,
}

impl<'a> Busy<'a> {
    fn mark(set: &'a Mutex<HashSet<SessionId>>, id: &SessionId) -> Option<Busy<'a>> {
        let fresh = set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone());
        fresh.then(|| Busy {
            set,
            id: id.clone(),
        })
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// The connection's writer: after the first failed write the channel is gone and nothing more is
/// sent.
struct Reply {
    stream: UnixStream,
    id: u64,
    gone: bool,
}

impl Reply {
    fn send(&mut self, last: bool, msg: Message) {
        if self.gone {
            return;
        }
        let env = Envelope::new(self.id, last, msg);
        match write_frame(&mut self.stream, &env) {
            Ok(()) => {}
            // Too large for one frame is not the channel going away: send the event with its
            // bulk left out (the session log holds it whole).
            Err(FrameError::TooLarge(n)) => {
                if let Message::TurnEvent { event } = env.msg {
                    let small = Message::TurnEvent {
                        event: shrink(event, n),
                    };
                    if write_frame(&mut self.stream, &Envelope::new(self.id, last, small)).is_err()
                    {
                        self.gone = true;
                    }
                }
            }
            Err(_) => self.gone = true,
        }
    }
}

/// An event whose text or arguments made a frame of `n` bytes, with them replaced by a note.
fn shrink(event: TurnEvent, n: usize) -> TurnEvent {
    let note = format!("({n} bytes: too large for one frame; the session log holds it whole)");
    match event {
        TurnEvent::AssistantText { .. } => TurnEvent::AssistantText { text: note },
        TurnEvent::ToolCall { call, tool, .. } => TurnEvent::ToolCall {
            call,
            tool,
            args: serde_json::json!({ "too_large": note }),
        },
        TurnEvent::ToolResult {
            call,
            outcome,
            outage,
            ..
        } => TurnEvent::ToolResult {
            call,
            outcome,
            text: note,
            outage,
        },
        pending @ TurnEvent::ToolPending { .. } => pending,
    }
}

/// One connection's request. Steps 1 and 2 are the accept path's: the first frame, whole,
/// within its deadline (a malformed one answered with its code, id 0; `ping` with `pong`), and
/// loop.sock's table, which takes `turn` and `health` and answers any other kind `bad_message`.
pub fn handle(mut stream: UnixStream, id: u64, request: LoopRequest, ctx: &Context) {
    match request {
        LoopRequest::Turn(turn) => serve_turn(stream, id, turn, None, ctx),
        LoopRequest::Health => {
            let report = Message::HealthReport(crate::health::report(&ctx.cfg));
            let _ = bxharden::serve::send(&mut stream, id, true, report);
        }
    }
}

/// One turn, steps 3 to 7; a channel's turn with the key of the owner's message it is.
fn serve_turn(stream: UnixStream, id: u64, turn: Turn, key: Option<&TurnKey>, ctx: &Context) {
    let mut reply = Reply {
        stream,
        id,
        gone: false,
    };
    // 3. A resume of a session that does not exist runs no turn: it is answered before the
    // session is marked busy, or a create of that session racing with it would be refused as
    // busy while nothing runs, and both could fail.
    if turn.resume && session::absent(&ctx.cfg.sessions_dir(), &turn.session) {
        let e = TurnError::Session(SessionError::NotFound(turn.session.clone()));
        reply.send(true, error_message(&e));
        return;
    }
    let Some(busy) = Busy::mark(&ctx.busy, &turn.session) else {
        reply.send(
            true,
            Message::Error(bxcore::WireError {
                code: ErrorCode::SessionBusy,
                detail: format!("the session {} is running a turn already", turn.session),
            }),
        );
        return;
    };
    // 4.
    let result = run(ctx, &turn, key, &mut reply);
    // 5. Release before the last frame: a channel that sends its next turn the moment it reads
    // the final frame must find the session free.
    drop(busy);
    // 6.
    let last = match result {
        Ok(done) => Message::TurnDone(done),
        Err(e) => {
            // An outage or a damaged file is logged too, so the journal finds it by its anchor.
            if let (true, Some(anchor)) = (e.logged(), e.anchor()) {
                let line = format!("loopd: session {}: {}", turn.session, e.line());
                bxharden::log::line(anchor, &line);
            }
            error_message(&e)
        }
    };
    // 7. A failed write means the channel went away: `Reply` stops sending.
    reply.send(true, last);
}

/// The runbook entry of a turn on bridge.sock for a session outside the channel's prefix.
pub const BRIDGE_SESSION_ANCHOR: &str = "bridge-session-refused";

/// One bridge.sock connection: a turn of the channel daemon, which may name only sessions that
/// begin with `prefix` (`[bridge] session_prefix`); any other is refused `forbidden`, logged, and
/// runs nothing. Everything else is loop.sock's [`handle`].
pub fn handle_bridge(stream: UnixStream, id: u64, request: BridgeRequest, ctx: &Context) {
    let BridgeRequest::ChannelTurn(turn) = request;
    let (turn, key) = turn.split();
    let prefix = &ctx.cfg.bridge.session_prefix;
    if !turn.session.as_str().starts_with(prefix.as_str()) {
        let detail = format!(
            "the channel may run turns only in sessions named {prefix}..., not {}; {}",
            turn.session,
            bxcore::runbook::pointer(BRIDGE_SESSION_ANCHOR)
        );
        bxharden::log::line(
            BRIDGE_SESSION_ANCHOR,
            &format!("loopd: bridge.sock: {detail}"),
        );
        let mut stream = stream;
        let _ = write_frame(
            &mut stream,
            &Envelope::error(id, ErrorCode::Forbidden, detail),
        );
        return;
    }
    serve_turn(stream, id, turn, Some(&key), ctx);
}

/// The final `error` frame's message for a turn that failed.
fn error_message(e: &TurnError) -> Message {
    Message::Error(bxcore::WireError {
        code: e.code(),
        detail: e.line(),
    })
}

/// Open or create the session, run the turn, hand it to memory.
fn run(
    ctx: &Context,
    turn: &bxcore::Turn,
    key: Option<&TurnKey>,
    reply: &mut Reply,
) -> Result<TurnDone, TurnError> {
    let dir = ctx.cfg.sessions_dir();
    // A session that exists is opened first, so a channel's message it ran already is refused
    // before anything else is asked (the broker may be down; the answer is still the repeat).
    let opened = if turn.resume {
        let session = Session::open(&dir, &turn.session, &|l| {
            bxharden::log::line(TORN_TAIL_ANCHOR, l)
        })?;
        if let Some(key) = key.filter(|k| session.has_key(k)) {
            return Err(TurnError::Repeated(key.clone()));
        }
        Some(session)
    } else {
        None
    };
    // What the model is offered, asked before anything is written: a broker that cannot say
    // ends the turn here, before a session is made or a model called.
    let offer = ctx
        .registry
        .offer(ctx.port.as_ref())
        .map_err(TurnError::Broker)?;
    let mut session = match opened {
        Some(session) => session,
        None => {
            let about = crate::prompt::about(&offer);
            let baseline =
                Baseline::assemble(&ctx.cfg.loop_dir(), &about).map_err(TurnError::Baseline)?;
            Session::create(&dir, &turn.session, &ctx.cfg.slots.main, &baseline.system)?
        }
    };
    // While the turn runs, the channel's end of input cancels it (`cancel`): watched from the
    // moment there is a turn to cancel, so a refused open or create costs no thread.
    let token = crate::cancel::Cancel::new();
    let _watch = token.watch(&reply.stream);
    let _entered = token.enter();
    let mut emit = |event: TurnEvent| reply.send(false, Message::TurnEvent { event });
    let mut rt = Runtime {
        limits: &ctx.cfg.turns,
        client: &ctx.client,
        port: ctx.port.as_ref(),
        registry: &ctx.registry,
        recall: ctx.recall.as_ref(),
        emit: &mut emit,
    };
    let finished = run_turn(&mut rt, &mut session, &turn.text, key, &offer)?;
    if let Some(outbox) = &ctx.outbox {
        let record = TurnRecord {
            session: turn.session.clone(),
            turn: finished.turn,
            messages: finished.messages,
        };
        if let Err(e) = outbox.put(&record) {
            bxharden::log::fail_in(
                &format_args!("turn {} of {}", record.turn, record.session),
                &e,
            );
        }
    }
    Ok(TurnDone {
        session: turn.session.clone(),
        usage: finished.usage,
    })
}
