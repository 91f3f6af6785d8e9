//! Tool servers kept for their session (`process = "session"`): a server that takes seconds to
//! start (an interpreter, a runtime, a large index) is started at its session's first call and
//! talked to again for the session's next calls, as MCP servers are meant to be.
//!
//! A kept server is one session's alone, so what it holds in memory is what that session told
//! it, which the session's label already covers; no other session's call ever reaches it. It is
//! confined exactly as a server started for one call, holds its session's place for its whole
//! life, hears `tools/list` before every call (a tool changed under a running server is refused
//! as at a start), and is ended:
//!
//! - when it has been idle for the server's `idle_seconds`;
//! - at its `lifetime_seconds`, by its supervisor, whatever it is doing (a call is not started
//!   on a server with less than a call's deadline of its lifetime left: a new one is started);
//! - after a call that did not end in an answer (a deadline, a crash, a protocol error, too
//!   much output): its state is then unknown, and the next call starts it again;
//! - when the server has `max_processes` running and another session calls it: the one idle
//!   longest is ended (with none idle, the call is refused with a pointer);
//! - when brokerd ends: its supervisor sees the stop pipe close.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bxcore::SessionId;
use serde_json::Value;

use super::{CallError, Held, Server, said_on_stderr};
use crate::mcp;
use crate::run::spawn::{Ended, Input, Live, Short, Stopped};

/// How a server's processes are kept for their sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keeping {
    /// Ended after this long without a call.
    pub idle: Duration,
    /// Ended this long after it started, whatever it is doing.
    pub lifetime: Duration,
    /// The most running at once (each a session's).
    pub most: usize,
}

/// One server's kept processes, by session.
#[derive(Debug, Default)]
pub struct Kept {
    slots: Mutex<BTreeMap<SessionId, Slot>>,
    /// A slot came free, or a process was put back (the reaper's next deadline moved).
    changed: Condvar,
    /// Whether the thread that ends idle processes is running.
    reaping: std::sync::atomic::AtomicBool,
}

/// A session's kept process.
#[derive(Debug)]
enum Slot {
    /// A call of the session is talking to it (or starting it).
    Busy,
    /// Between calls.
    Idle(Box<Running>),
}

/// A running server, between its session's calls.
#[derive(Debug)]
struct Running {
    live: Live,
    /// Its session's place, held for its life (it may write there at any time).
    place: Option<Held>,
    /// The id its next call starts from.
    next_id: u64,
    started: Instant,
    /// When its last call ended.
    last: Instant,
}

/// A session's slot while one call holds it: let go when the call is over, however it ends (a
/// panic included), with its process put back for the next call or (`back` empty) none.
struct Busy<'a> {
    kept: &'a Kept,
    session: &'a SessionId,
    back: Option<Box<Running>>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        match self.back.take() {
            Some(running) => self.kept.put_back(self.session, running),
            None => self.kept.release(self.session),
        }
    }
}

/// How a call found its session's slot.
enum Taken {
    /// The session's server, idle: this call's now.
    Running(Box<Running>),
    /// None is running: this call may start one.
    Free,
}

impl Kept {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<SessionId, Slot>> {
        // A call that panicked while holding it left the table whole (each step is one insert
        // or remove).
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session's slot, made busy for this call: waits (until `until`) while another call
    /// of the session holds it; makes room by ending the process idle longest. `ended` gets
    /// the processes to end once the table is let go.
    fn take(
        &self,
        who: &str,
        session: &SessionId,
        keeping: &Keeping,
        until: Instant,
        ended: &mut Vec<Running>,
    ) -> Result<Taken, CallError> {
        let mut slots = self.lock();
        loop {
            match slots.remove(session) {
                Some(Slot::Busy) => {
                    slots.insert(session.clone(), Slot::Busy);
                    let now = Instant::now();
                    if now >= until {
                        return Err(CallError::Busy {
                            who: who.to_string(),
                            why: "another call of this session held its process until this \
                                  call's deadline"
                                .to_string(),
                        });
                    }
                    slots = self
                        .changed
                        .wait_timeout(slots, until - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                Some(Slot::Idle(running)) => {
                    slots.insert(session.clone(), Slot::Busy);
                    return Ok(Taken::Running(running));
                }
                None => {
                    if slots.len() >= keeping.most {
                        let oldest = slots
                            .iter()
                            .filter_map(|(s, slot)| match slot {
                                Slot::Idle(r) => Some((r.last, s.clone())),
                                Slot::Busy => None,
                            })
                            .min();
                        let Some((_, oldest)) = oldest else {
                            return Err(CallError::Busy {
                                who: who.to_string(),
                                why: format!(
                                    "its {} processes (its max_processes) are all in calls of \
                                     other sessions",
                                    keeping.most
                                ),
                            });
                        };
                        if let Some(Slot::Idle(r)) = slots.remove(&oldest) {
                            ended.push(*r);
                        }
                    }
                    slots.insert(session.clone(), Slot::Busy);
                    return Ok(Taken::Free);
                }
            }
        }
    }

    /// The call is over and the process may serve the session's next.
    fn put_back(&self, session: &SessionId, running: Box<Running>) {
        self.lock().insert(session.clone(), Slot::Idle(running));
        self.changed.notify_all();
    }

    /// The call is over and the session has no process (it ended, or was ended).
    fn release(&self, session: &SessionId) {
        self.lock().remove(session);
        self.changed.notify_all();
    }

    /// How many processes are running (idle or in a call).
    pub fn running(&self) -> usize {
        self.lock().len()
    }

    /// Start the thread that ends idle processes, once.
    fn reap(self: &Arc<Self>, keeping: Keeping) {
        use std::sync::atomic::Ordering;
        if self.reaping.swap(true, Ordering::SeqCst) {
            return;
        }
        let kept = Arc::clone(self);
        let started = std::thread::Builder::new()
            .name("kept-reaper".to_string())
            .spawn(move || kept.reaper(keeping));
        if let Err(e) = started {
            // Then each process still ends at its lifetime, or when the next call finds it idle.
            self.reaping.store(false, Ordering::SeqCst);
            bxharden::log::line(
                super::FAILED_ANCHOR,
                &format!(
                    "brokerd: the thread that ends idle tool servers could not start ({e}): \
                     they end at their lifetime; {}",
                    bxcore::runbook::pointer(super::FAILED_ANCHOR)
                ),
            );
        }
    }

    /// End each idle process at its idle deadline (or as its lifetime nears), sleeping until
    /// the next one.
    fn reaper(&self, keeping: Keeping) {
        let mut slots = self.lock();
        loop {
            let now = Instant::now();
            let due = |r: &Running| {
                (r.last + keeping.idle).min(r.started + keeping.lifetime.saturating_sub(MARGIN))
            };
            let done: Vec<SessionId> = slots
                .iter()
                .filter_map(|(s, slot)| match slot {
                    Slot::Idle(r) if due(r) <= now => Some(s.clone()),
                    _ => None,
                })
                .collect();
            let mut ended = Vec::new();
            for s in done {
                if let Some(Slot::Idle(r)) = slots.remove(&s) {
                    ended.push(*r);
                }
            }
            let next = slots
                .values()
                .filter_map(|slot| match slot {
                    Slot::Idle(r) => Some(due(r)),
                    Slot::Busy => None,
                })
                .min();
            if !ended.is_empty() {
                drop(slots);
                for r in ended {
                    end(r);
                }
                self.changed.notify_all();
                slots = self.lock();
                continue;
            }
            slots = match next {
                Some(at) => {
                    self.changed
                        .wait_timeout(slots, at.saturating_duration_since(now))
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.changed.wait(slots).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

/// How near its lifetime an idle process is ended rather than kept for a call that would meet
/// it.
const MARGIN: Duration = Duration::from_secs(1);

/// End a kept process (its supervisor ends its group).
fn end(r: Running) {
    let _ = r.live.end();
}

impl Server {
    /// One call of the server's tool `tool` (declared with `digest`) for `session` on the
    /// session's kept process, started for it if none is running (or it ended); the
    /// conversation, once the server answered.
    pub(super) fn call_kept(
        &self,
        keeping: &Keeping,
        who: &str,
        session: &SessionId,
        tool: &str,
        digest: &str,
        args: &Value,
    ) -> Result<mcp::Call, CallError> {
        let until = Instant::now() + self.timeout;
        let mut ended = Vec::new();
        let taken = self.kept.take(who, session, keeping, until, &mut ended);
        for r in ended {
            end(r);
        }
        let taken = taken?;
        // From here the slot is this call's, and is let go however the call ends.
        let mut busy = Busy {
            kept: &self.kept,
            session,
            back: None,
        };
        let running = match taken {
            Taken::Running(mut r) => {
                // Alive, with room in its lifetime for this call's deadline.
                if r.live.running() && r.started + keeping.lifetime > until + MARGIN {
                    Some(r)
                } else {
                    end(*r);
                    None
                }
            }
            Taken::Free => None,
        };
        let mut running = match running {
            Some(r) => {
                // It may have written to its place since its last call: measured again.
                if let Some(place) = &r.place {
                    self.room_of(who, place)?;
                }
                r
            }
            None => self.start_kept(keeping, who, session, until)?,
        };
        let mut talk = mcp::Call::then(tool, digest, args.clone(), running.next_id);
        running.next_id += mcp::IDS_PER_CALL;
        match running.live.talk(&mut talk, until) {
            Ok(()) => {
                // An answer, or the server's JSON-RPC refusal of the call: it is sound for the
                // next. Anything else (a tool changed or gone, words that are not MCP) ends it.
                let sound = matches!(
                    talk.outcome(),
                    Some(Ok(_) | Err(mcp::McpError::Refused { .. }))
                );
                if sound {
                    running.last = Instant::now();
                    busy.back = Some(running);
                    drop(busy);
                    self.kept.reap(*keeping);
                } else {
                    said_on_stderr(who, running.live.stderr());
                    end(*running);
                }
                match talk.outcome() {
                    Some(Err(error)) => Err(CallError::Mcp {
                        who: who.to_string(),
                        error: error.clone(),
                    }),
                    _ => Ok(talk),
                }
            }
            Err(stopped) => Err(self.short(keeping, who, stopped)),
        }
    }

    /// Start the session's process: its place held, the server confined, `initialize` answered.
    fn start_kept(
        &self,
        keeping: &Keeping,
        who: &str,
        session: &SessionId,
        until: Instant,
    ) -> Result<Box<Running>, CallError> {
        let place = self.session_place(who, session)?;
        let (launch, own) = self.launch(who, place.as_ref().map(|p| p.path.as_path()))?;
        let mut opening = mcp::Call::opening();
        let job = self.job(
            launch,
            own.as_ref(),
            Input::Talk(&mut opening),
            keeping.lifetime,
        );
        let started = Instant::now();
        let live = Live::start(job, until).map_err(|stopped| self.short(keeping, who, stopped))?;
        if let Some(Err(error)) = opening.outcome() {
            said_on_stderr(who, live_stderr(live).as_slice());
            return Err(CallError::Mcp {
                who: who.to_string(),
                error: error.clone(),
            });
        }
        Ok(Box::new(Running {
            live,
            place,
            next_id: 1 + mcp::IDS_PER_CALL,
            started,
            last: started,
        }))
    }

    /// A talk that ended short, as the call's error (the process has ended).
    fn short(&self, keeping: &Keeping, who: &str, stopped: Stopped) -> CallError {
        match stopped.finished {
            Err(error) => CallError::Spawn {
                who: who.to_string(),
                error,
            },
            Ok(done) => {
                said_on_stderr(who, &done.stderr.bytes);
                CallError::Silent {
                    who: who.to_string(),
                    how: match stopped.why {
                        // The call's deadline, which brokerd met by ending it.
                        Short::Late => self.how(Ended::TimedOut, false),
                        Short::Cut => self.how(done.ended, true),
                        // The supervisor's deadline: the process's whole life.
                        Short::Ended if done.ended == Ended::TimedOut => format!(
                            "its lifetime of {} s came first",
                            keeping.lifetime.as_secs()
                        ),
                        Short::Ended => self.how(done.ended, false),
                    },
                }
            }
        }
    }
}

/// What an opened process wrote on its standard error, once it is ended.
fn live_stderr(live: Live) -> Vec<u8> {
    match live.end() {
        Ok(done) => done.stderr.bytes,
        Err(_) => Vec::new(),
    }
}
