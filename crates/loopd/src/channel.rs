//! The channel server on loop.sock: one connection, one `turn` frame in, `turn_event` frames out
//! as they happen, then one final `turn_done` or `error`. A session runs one turn at a time.
//! A `health` frame instead is answered with what `crate::health` finds.
//!
//! The monitor reads the first frame and hands the connection to the session's worker
//! (`crate::monitor`); the worker serves the turn ([`serve_turn`]). Neither keeps session state
//! in memory but the set of busy sessions: everything else is in the session logs, so a
//! restart loses nothing.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bxcore::layout::{BridgeRequest, LoopRequest};
use bxcore::{
    Envelope, ErrorCode, FrameError, Message, SessionId, Turn, TurnDone, TurnEvent, TurnKey,
    TurnRecord, write_frame,
};

use crate::baseline::{Baseline, Owner};
use crate::config::Config;
use crate::infer::Client;
use crate::monitor::Monitor;
use crate::outbox::Outbox;
use crate::recall::Recall;
use crate::session::{self, Session, SessionError, TORN_TAIL_ANCHOR};
use crate::tools::{Registry, ToolPort};
use crate::turn::{Runtime, TurnError, run_turn};

/// Everything a turn needs, shared by every connection a worker is handed.
pub struct Context {
    pub cfg: Config,
    pub client: Client,
    pub port: Box<dyn ToolPort>,
    pub registry: Registry,
    busy: Mutex<HashSet<SessionId>>,
    outbox: Option<Arc<Outbox>>,
    recall: Option<Recall>,
    one: Option<OneSession>,
}

/// The one session a worker serves: its id, its log (from the monitor at the start, or made
/// through it when the session begins), and the owner's part of its baseline
/// (`crate::control::ToWorker::Start`).
pub struct OneSession {
    pub session: SessionId,
    pub path: PathBuf,
    pub owner: Owner,
    pub log: Mutex<Option<File>>,
    /// Asks the monitor to make the log.
    pub create: Box<dyn Fn() -> std::io::Result<File> + Send + Sync>,
}

impl fmt::Debug for OneSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneSession")
            .field("session", &self.session)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
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
            one: None,
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

    /// Serve this one session only, as a worker does.
    pub fn with_one(mut self, one: OneSession) -> Context {
        self.one = Some(one);
        self
    }

    /// The session's log, for one turn: in a worker its own descriptor of the one file (made
    /// through the monitor when `!resume` and it does not exist yet); in a context of every
    /// session (one process, as the tests and benchmarks run it), the log in the sessions'
    /// directory, made unless `resume`.
    fn log_for(&self, session: &SessionId, resume: bool) -> Result<(File, PathBuf), TurnError> {
        let one = match &self.one {
            Some(one) if one.session == *session => one,
            Some(_) => {
                // The monitor hands a worker its own session's connections only.
                return Err(TurnError::Worker(format!(
                    "this worker does not serve the session {session}"
                )));
            }
            None => {
                let dir = self.cfg.sessions_dir();
                let file = session::open_log(&dir, session, !resume)?;
                return Ok((file, session::log_path(&dir, session)));
            }
        };
        let io = |e| TurnError::Session(SessionError::Io(one.path.clone(), e));
        let mut log = one.log.lock().unwrap_or_else(|p| p.into_inner());
        let file = match &*log {
            Some(f) => f,
            None if resume => {
                return Err(TurnError::Session(SessionError::NotFound(session.clone())));
            }
            None => log.insert((one.create)().map_err(io)?),
        };
        Ok((file.try_clone().map_err(io)?, one.path.clone()))
    }

    /// The owner's part of a new session's baseline: the monitor's, or read now.
    fn owner(&self) -> Result<Owner, TurnError> {
        match &self.one {
            Some(one) => Ok(one.owner.clone()),
            None => Owner::read(&self.cfg.loop_dir()).map_err(TurnError::Baseline),
        }
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
struct Reply<'a> {
    stream: UnixStream,
    id: u64,
    gone: bool,
    /// Called once, just before the final frame (or when the reply is dropped without one).
    served: Option<Served<'a>>,
}

/// What a worker tells its monitor when it is done with a connection: before the final frame,
/// so a channel that sends its next turn the moment it reads that frame finds the worker idle.
pub type Served<'a> = Box<dyn FnOnce() + Send + 'a>;

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.served.take() {
            f();
        }
    }
}

impl Reply<'_> {
    fn send(&mut self, last: bool, msg: Message) {
        if last {
            if let Some(f) = self.served.take() {
                f();
            }
        }
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
pub fn handle(mut stream: UnixStream, id: u64, request: LoopRequest, monitor: &Arc<Monitor>) {
    match request {
        LoopRequest::Turn(turn) => monitor.hand(stream, id, turn, None),
        LoopRequest::Health => {
            let report = Message::HealthReport(crate::health::report(monitor.cfg()));
            let _ = bxharden::serve::send(&mut stream, id, true, report);
        }
    }
}

/// The final `error` frame for a turn the monitor could not hand to a worker, sent on the
/// connection; a failed write is ignored, as the channel is gone.
pub fn refuse(stream: UnixStream, id: u64, session: &SessionId, e: &TurnError) {
    log_failed(session, e);
    Reply {
        stream,
        id,
        gone: false,
        served: None,
    }
    .send(true, error_message(e));
}

/// One turn in the session's worker, steps 3 to 7; a channel's turn with the key of the owner's
/// message it is. `served` is called just before the final frame.
pub fn serve_turn(
    stream: UnixStream,
    id: u64,
    turn: Turn,
    key: Option<&TurnKey>,
    ctx: &Context,
    served: Option<Served<'_>>,
) {
    let mut reply = Reply {
        stream,
        id,
        gone: false,
        served,
    };
    // 3. A resume of a session that does not exist runs no turn: it is answered before the
    // session is marked busy, or a create of that session racing with it would be refused as
    // busy while nothing runs, and both could fail.
    // (In a worker the monitor answered a resume with no log at all; this is one whose log was
    // never begun.)
    let begun = || {
        ctx.log_for(&turn.session, true)
            .and_then(|(file, path)| session::begun(&file, &path).map_err(TurnError::Session))
    };
    let e = match turn.resume.then(begun) {
        Some(Ok(false)) => Some(TurnError::Session(SessionError::NotFound(
            turn.session.clone(),
        ))),
        Some(Err(e)) => Some(e),
        Some(Ok(true)) | None => None,
    };
    if let Some(e) = e {
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
            log_failed(&turn.session, &e);
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
pub fn handle_bridge(stream: UnixStream, id: u64, request: BridgeRequest, monitor: &Arc<Monitor>) {
    let BridgeRequest::ChannelTurn(turn) = request;
    let (turn, key) = turn.split();
    let prefix = &monitor.cfg().bridge.session_prefix;
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
    monitor.hand(stream, id, turn, Some(key));
}

/// An outage, a damaged file or a bound of the box's own is logged too, so the journal finds
/// it by its anchor.
fn log_failed(session: &SessionId, e: &TurnError) {
    if let (true, Some(anchor)) = (e.logged(), e.anchor()) {
        let line = format!("loopd: session {session}: {}", e.line());
        bxharden::log::line(anchor, &line);
    }
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
    reply: &mut Reply<'_>,
) -> Result<TurnDone, TurnError> {
    // A session that exists is opened first, so a channel's message it ran already is refused
    // before anything else is asked (the broker may be down; the answer is still the repeat).
    let opened = if turn.resume {
        let (file, path) = ctx.log_for(&turn.session, true)?;
        let session = Session::resume(file, path.clone(), &turn.session, &|l| {
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
            let baseline = Baseline::compose(&ctx.owner()?, &about);
            let (file, path) = ctx.log_for(&turn.session, false)?;
            Session::begin(
                file,
                path,
                &turn.session,
                &ctx.cfg.slots.main,
                &baseline.system,
            )?
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
