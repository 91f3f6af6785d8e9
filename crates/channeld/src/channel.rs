//! The channel itself: what channeld holds while it runs, and the sync loop that reads the
//! owner's rooms.
//!
//! Who may talk: a message is a turn only when its sender is a paired owner (`state.owners`,
//! bound by `bxctl channel pair`) and its room is one of `[matrix] rooms`. Anyone else's message,
//! invite or reaction does nothing (the first from each sender is logged once). An invite is
//! taken only to a configured room and only from a configured or paired owner; any other is
//! refused (left).
//!
//! Nothing lost, nothing twice: a message is queued for its room, handed off to loopd by the
//! room's worker (`turn`), and only then marked seen; the sync position that is kept
//! (`state.since`) moves only when no message is waiting to be handed off, so a restart resumes
//! from a position where nothing is left behind, and the seen event ids keep a resumed sync from
//! handing a message off twice.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bxcore::Timestamp;
use serde_json::Value;

use crate::approve::Approvals;
use crate::config::Config;
use crate::matrix::{Client, MatrixError};
use crate::render;
use crate::state::{State, session_for};

/// The runbook anchor of an invite refused.
pub const INVITE_ANCHOR: &str = "channel-invite-refused";
/// The runbook anchor of a message from someone who is not the owner.
pub const STRANGER_ANCHOR: &str = "channel-stranger-ignored";
/// The runbook anchor of a turn that could not be handed to loopd.
pub const LOOPD_ANCHOR: &str = "channel-loopd-unavailable";

/// How many senders' first ignored message is logged, at most.
const STRANGERS_LOGGED: usize = 64;

/// How many of the owner's messages may wait for their room's turn; one more is not taken (the
/// owner is told) and is never a turn.
pub const MAX_WAITING: usize = 16;

/// One message of the owner waiting for its room's turn.
#[derive(Debug, Clone)]
pub struct Queued {
    pub event: String,
    pub text: String,
}

#[derive(Debug, Default)]
struct Queues {
    waiting: BTreeMap<String, VecDeque<Queued>>,
    /// Rooms whose worker runs.
    running: BTreeSet<String>,
    /// Messages taken from a queue and not yet handed off.
    handing: usize,
}

/// A pairing code waiting to be sent by the owner.
#[derive(Debug, Clone)]
pub struct Pairing {
    pub room: String,
    pub code: String,
    pub expires: Timestamp,
}

/// Whether the homeserver answered the last sync.
#[derive(Debug, Clone)]
pub struct Status {
    pub connected: bool,
    pub detail: String,
}

/// Everything the channel holds while it runs.
#[derive(Debug)]
pub struct Channel {
    pub cfg: Config,
    pub client: Client,
    pub dir: PathBuf,
    state: Mutex<State>,
    queues: Mutex<Queues>,
    /// The sync position read to, in memory (kept in `state.since` once nothing waits).
    cursor: Mutex<Option<String>>,
    pub pairing: Mutex<Option<Pairing>>,
    pub status: Mutex<Status>,
    pub approvals: Approvals,
    strangers: Mutex<BTreeSet<String>>,
}

/// A lock that a panic elsewhere does not make unusable.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channel {
    pub fn new(cfg: Config, client: Client, dir: PathBuf, state: State) -> Channel {
        let cursor = state.since.clone();
        Channel {
            cfg,
            client,
            dir,
            state: Mutex::new(state),
            queues: Mutex::new(Queues::default()),
            cursor: Mutex::new(cursor),
            pairing: Mutex::new(None),
            status: Mutex::new(Status {
                connected: false,
                detail: "starting: no sync yet".into(),
            }),
            approvals: Approvals::default(),
            strangers: Mutex::new(BTreeSet::new()),
        }
    }

    /// The bot's own user id.
    pub fn me(&self) -> &str {
        &self.cfg.matrix.user
    }

    /// Change the state and save it; a failed save is logged (the change stays in memory and
    /// is saved with the next).
    pub fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut s = lock(&self.state);
        let r = f(&mut s);
        if let Err(e) = s.save(&self.dir) {
            bxharden::log::fail(&e);
        }
        r
    }

    /// A copy of the state.
    pub fn state(&self) -> State {
        lock(&self.state).clone()
    }

    /// Whether `user` is a paired owner.
    pub fn is_owner(&self, user: &str) -> bool {
        lock(&self.state).owners.iter().any(|o| o == user)
    }

    /// Whether `user` may invite the channel into a configured room: a configured or paired owner.
    pub fn may_invite(&self, user: &str) -> bool {
        self.cfg.matrix.owners.iter().any(|o| o == user) || self.is_owner(user)
    }

    /// Whether `room` is one the channel serves.
    pub fn serves(&self, room: &str) -> bool {
        self.cfg.matrix.rooms.iter().any(|r| r == room)
    }

    /// `room`'s session, and whether loopd has it yet.
    pub fn session_of(&self, room: &str) -> (String, bool) {
        let s = lock(&self.state);
        match s.rooms.get(room) {
            Some(r) => (r.session.clone(), r.created),
            None => (session_for(&self.cfg.matrix.session_prefix, room), false),
        }
    }

    /// Remember that loopd has `room`'s session.
    pub fn created(&self, room: &str, session: &str) {
        self.update(|s| {
            s.rooms.insert(
                room.to_string(),
                crate::state::RoomState {
                    session: session.to_string(),
                    created: true,
                },
            );
        });
    }

    /// The message `event` was handed off: never again a turn.
    pub fn handed_off(&self, event: &str) {
        self.update(|s| s.mark_seen(event));
        lock(&self.queues).handing -= 1;
        self.advance();
    }

    /// The message went back to its queue (loopd could not take it).
    pub fn not_handed_off(&self, room: &str, q: Queued) {
        let mut queues = lock(&self.queues);
        queues.handing -= 1;
        queues
            .waiting
            .entry(room.to_string())
            .or_default()
            .push_front(q);
    }

    /// Keep the sync position once no message waits to be handed off.
    fn advance(&self) {
        let idle = {
            let q = lock(&self.queues);
            q.handing == 0 && q.waiting.values().all(VecDeque::is_empty)
        };
        if !idle {
            return;
        }
        let cursor = lock(&self.cursor).clone();
        if cursor.is_some() && lock(&self.state).since != cursor {
            self.update(|s| s.since = cursor);
        }
    }

    /// Queue a message of the owner in `room`, and start the room's worker if it is idle.
    fn enqueue(self: &Arc<Self>, room: &str, q: Queued) {
        if lock(&self.state).seen(&q.event) {
            return;
        }
        let mut queues = lock(&self.queues);
        let waiting = queues.waiting.entry(room.to_string()).or_default();
        if waiting.iter().any(|w| w.event == q.event) {
            return;
        }
        if waiting.len() >= MAX_WAITING {
            drop(queues);
            // Not taken, and said so: it is seen, so a resumed sync does not bring it back.
            self.update(|s| s.mark_seen(&q.event));
            self.notice(
                room,
                &format!("full-{}", crate::turn::txn_digest(&q.event)),
                &format!(
                    "Not taken: {MAX_WAITING} of your messages wait for this room's turn already. \
                     Send it again once the answers have come."
                ),
                Duration::from_millis(self.cfg.limits.request_ms),
            );
            return;
        }
        waiting.push_back(q);
        if queues.running.insert(room.to_string()) {
            let ch = Arc::clone(self);
            let owned = room.to_string();
            let spawned = std::thread::Builder::new()
                .name("room".into())
                .stack_size(512 * 1024)
                .spawn(move || crate::turn::worker(&ch, &owned));
            if spawned.is_err() {
                // The message stays queued; the next message starts the worker again.
                queues.running.remove(room);
            }
        }
    }

    /// The next message of `room` to hand off; none: the room's worker ends.
    pub fn next(&self, room: &str) -> Option<Queued> {
        let mut queues = lock(&self.queues);
        match queues.waiting.get_mut(room).and_then(VecDeque::pop_front) {
            Some(q) => {
                queues.handing += 1;
                Some(q)
            }
            None => {
                queues.running.remove(room);
                None
            }
        }
    }

    fn set_status(&self, connected: bool, detail: String) {
        *lock(&self.status) = Status { connected, detail };
    }

    /// A note from the channel itself in `room` (`m.notice`), sent once for `txn` and retried
    /// while the homeserver is down, until `within`.
    pub fn notice(&self, room: &str, txn: &str, text: &str, within: Duration) -> Option<String> {
        let content = render::plain(text).content("m.notice");
        crate::turn::send_retrying(self, room, txn, &content, within)
    }
}

/// The sync loop: runs until the process ends. A homeserver that is down or refuses the token
/// is a status line (once per episode) and a retry with backoff, never a crash.
pub fn run(ch: &Arc<Channel>) {
    crate::turn::note_cut_short(ch);
    let mut backoff = Duration::from_secs(1);
    let max = Duration::from_millis(ch.cfg.limits.max_backoff_ms);
    let wait = Duration::from_millis(ch.cfg.limits.sync_timeout_ms);
    let mut down_since: Option<Instant> = None;
    loop {
        let since = lock(&ch.cursor).clone();
        match ch.client.sync(since.as_deref(), wait) {
            Ok(v) => {
                if let Some(when) = down_since.take() {
                    bxharden::log::notice(&format!(
                        "the homeserver {} answers again (after {} s)",
                        ch.client.base(),
                        when.elapsed().as_secs()
                    ));
                }
                backoff = Duration::from_secs(1);
                ch.set_status(
                    true,
                    format!("syncing with {} as {}", ch.client.base(), ch.me()),
                );
                process(ch, &v, since.is_none());
                if let Some(next) = v["next_batch"].as_str() {
                    *lock(&ch.cursor) = Some(next.to_string());
                }
                ch.advance();
            }
            Err(e) => {
                let line = format!("{e}; retrying in {} s", backoff.as_secs());
                ch.set_status(
                    false,
                    format!("{e}; {}", bxcore::runbook::pointer(e.anchor())),
                );
                if down_since.is_none() {
                    down_since = Some(Instant::now());
                    log_matrix(&e, &line);
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(max);
            }
        }
    }
}

fn log_matrix(e: &MatrixError, line: &str) {
    let pointer = bxcore::runbook::pointer(e.anchor());
    bxharden::log::line(e.anchor(), &format!("channeld: {line}; {pointer}"));
}

/// One sync answer. The first (no position yet) only takes the position and the invites: what
/// the rooms held before the channel started is never a turn.
fn process(ch: &Arc<Channel>, v: &Value, first: bool) {
    if let Some(invites) = v["rooms"]["invite"].as_object() {
        for (room, r) in invites {
            invite(ch, room, r);
        }
    }
    if first {
        return;
    }
    let Some(joined) = v["rooms"]["join"].as_object() else {
        return;
    };
    for (room, r) in joined {
        let Some(events) = r["timeline"]["events"].as_array() else {
            continue;
        };
        for e in events {
            event(ch, room, e);
        }
    }
}

fn invite(ch: &Channel, room: &str, r: &Value) {
    let inviter = r["invite_state"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| {
            e["type"] == "m.room.member"
                && e["state_key"] == ch.me()
                && e["content"]["membership"] == "invite"
        })
        .and_then(|e| e["sender"].as_str())
        .unwrap_or("");
    if ch.serves(room) && ch.may_invite(inviter) {
        match ch.client.join(room) {
            Ok(()) => bxharden::log::notice(&format!(
                "joined {} on the invite of {}",
                shown(room),
                shown(inviter)
            )),
            Err(e) => log_matrix(&e, &format!("cannot join {}: {e}", shown(room))),
        }
        return;
    }
    let why = if ch.serves(room) {
        "who is not an owner ([matrix] owners, or paired)"
    } else {
        "to a room that is not in [matrix] rooms"
    };
    bxharden::runbook!(
        INVITE_ANCHOR,
        "refused the invite of {} to {}: {why}",
        shown(inviter),
        shown(room)
    );
    if let Err(e) = ch.client.leave(room) {
        log_matrix(&e, &format!("cannot leave {}: {e}", shown(room)));
    }
}

/// An id as a log line may show it.
pub fn shown(s: &str) -> String {
    bxcore::visible::escape(crate::matrix::cut(s, 255), bxcore::visible::Mode::Quoted).into_owned()
}

/// The `m.relates_to` of an event's content.
fn relation(e: &Value) -> &Value {
    &e["content"]["m.relates_to"]
}

fn event(ch: &Arc<Channel>, room: &str, e: &Value) {
    let sender = e["sender"].as_str().unwrap_or("");
    let id = e["event_id"].as_str().unwrap_or("");
    if sender == ch.me() || id.is_empty() || !ch.serves(room) {
        return;
    }
    let kind = e["type"].as_str().unwrap_or("");
    let rel = relation(e);
    match kind {
        "m.reaction" if rel["rel_type"] == "m.annotation" => {
            let target = rel["event_id"].as_str().unwrap_or("");
            let key = rel["key"].as_str().unwrap_or("");
            if ch.is_owner(sender) {
                crate::approve::reaction(ch, room, sender, target, key);
            }
        }
        "m.room.message" => {
            let body = e["content"]["body"].as_str().unwrap_or("");
            if pair(ch, room, sender, body) {
                return;
            }
            if !ch.is_owner(sender) {
                ignore(ch, room, sender);
                return;
            }
            // An edit of an earlier message is not a new turn.
            if rel["rel_type"] == "m.replace" {
                return;
            }
            if let Some(target) = rel["m.in_reply_to"]["event_id"].as_str() {
                if crate::approve::reply(ch, room, sender, target, body) {
                    return;
                }
            }
            if e["content"]["msgtype"] != "m.text" {
                return;
            }
            let text = crate::matrix::cut(body, ch.cfg.limits.max_turn_bytes).to_string();
            ch.enqueue(
                room,
                Queued {
                    event: id.to_string(),
                    text,
                },
            );
        }
        _ => {}
    }
}

/// A message that is the pairing code for this room binds its sender as the owner.
fn pair(ch: &Channel, room: &str, sender: &str, body: &str) -> bool {
    let matched = {
        let mut p = lock(&ch.pairing);
        match p.as_ref() {
            Some(pairing)
                if pairing.room == room
                    && body.trim() == pairing.code
                    && Timestamp::now() < pairing.expires
                    && (ch.cfg.matrix.owners.is_empty()
                        || ch.cfg.matrix.owners.iter().any(|o| o == sender)) =>
            {
                *p = None;
                true
            }
            _ => false,
        }
    };
    if !matched {
        return false;
    }
    ch.update(|s| {
        if !s.owners.iter().any(|o| o == sender) {
            s.owners.push(sender.to_string());
        }
    });
    bxharden::log::notice(&format!(
        "paired {} as the owner, in {}",
        shown(sender),
        shown(room)
    ));
    let text = format!(
        "Paired: {} is the owner of this channel now. Messages here from that account are turns.",
        render::shown(sender, bxcore::visible::Mode::Line)
    );
    ch.notice(
        room,
        &format!("pair-{}", crate::turn::txn_digest(sender)),
        &text,
        Duration::from_millis(ch.cfg.limits.request_ms),
    );
    true
}

/// A message from someone who is not the owner: never a turn; its sender's first is logged.
fn ignore(ch: &Channel, room: &str, sender: &str) {
    let mut seen = lock(&ch.strangers);
    if seen.len() < STRANGERS_LOGGED && seen.insert(sender.to_string()) {
        bxharden::runbook!(
            STRANGER_ANCHOR,
            "ignored a message from {} in {}: not a paired owner (later ones are not logged)",
            shown(sender),
            shown(room)
        );
    }
}
