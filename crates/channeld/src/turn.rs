//! One room's turns: each message of the owner handed to loopd on bridge.sock exactly as
//! `bxctl chat` hands it on loop.sock (one `turn` per connection, `turn_event` frames as they
//! come, `turn_done` or `error`), and the answer streamed into one Matrix message edited in
//! place, at most once per `[limits] edit_interval_ms`, with a typing notice while the model
//! works, the tool calls shown compactly, and a long answer cut with a note.
//!
//! Every message the channel sends has a transaction id derived from the owner's event it
//! answers, so a retry (the homeserver down, channeld restarted) is the same message, never a
//! second one.

use std::time::{Duration, Instant};

use bxcore::client::{ClientError, Exchange};
use bxcore::visible::Mode;
use bxcore::{ChannelTurn, ErrorCode, Message, Outcome, SessionId, TurnEvent, TurnKey};
use serde_json::Value;

use crate::channel::{Channel, LOOPD_ANCHOR, Queued};
use crate::render::{self, Rendered};

/// How long the channel tries to deliver the end of an answer while the homeserver is down.
const FINAL_WITHIN: Duration = Duration::from_secs(15 * 60);

/// How often the typing notice is renewed while the model works.
const TYPING_EVERY: Duration = Duration::from_secs(20);

/// The first 16 hex digits of the sha256 of `s`: transaction ids and approval codes.
pub fn txn_digest(s: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Send `content` as an `m.room.message` with `txn`, retrying while the homeserver is down
/// (with backoff) until `within`; the event's id, or `None` (logged) when it never went.
pub fn send_retrying(
    ch: &Channel,
    room: &str,
    txn: &str,
    content: &Value,
    within: Duration,
) -> Option<String> {
    let until = Instant::now() + within;
    let mut backoff = Duration::from_millis(500);
    loop {
        match ch.client.send(room, "m.room.message", txn, content) {
            Ok(id) => return Some(id),
            Err(e) if e.retryable() && Instant::now() + backoff < until => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(e) => {
                let pointer = bxcore::runbook::pointer(e.anchor());
                bxharden::log::line(
                    e.anchor(),
                    &format!(
                        "channeld: cannot send to {}: {e}; {pointer}",
                        crate::channel::shown(room)
                    ),
                );
                return None;
            }
        }
    }
}

/// After a restart: every answer that was being streamed when channeld stopped gets a note
/// that it was cut short (its turn was cancelled when its connection to loopd closed).
pub fn note_cut_short(ch: &Channel) {
    let replies = ch.state().replies;
    for (room, event) in replies {
        ch.notice(
            &room,
            &format!("cut-{}", txn_digest(&event)),
            "The answer above was cut short: the channel restarted while it was being written, \
             and that turn was cancelled. Nothing was sent twice; send your message again to \
             continue.",
            Duration::from_millis(ch.cfg.limits.request_ms),
        );
        ch.update(|s| s.replies.remove(&room));
    }
}

/// The worker of `room`: hands its queued messages to loopd one at a time, until none waits.
pub fn worker(ch: &Channel, room: &str) {
    let mut backoff = Duration::from_secs(1);
    let mut logged = false;
    while let Some(q) = ch.next(room) {
        match hand_off(ch, room, &q) {
            Ok(ex) => {
                backoff = Duration::from_secs(1);
                logged = false;
                stream(ch, room, &q, ex);
                // What a long answer took is given back, so the idle daemon stays small.
                bxharden::heap::give_back();
            }
            Err(e) => {
                if !logged {
                    bxharden::runbook!(
                        LOOPD_ANCHOR,
                        "cannot hand a message in {} to loopd on {}: {e}; it waits and is tried \
                         again",
                        crate::channel::shown(room),
                        ch.cfg.sockets.bridge.display()
                    );
                    logged = true;
                }
                ch.not_handed_off(room, q);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(ch.cfg.limits.max_backoff_ms));
            }
        }
    }
}

/// How long a message waits for its session while loopd still ends the room's previous turn
/// (one whose channel connection closed when channeld stopped), before it fails with a note.
const BUSY_WITHIN: Duration = Duration::from_secs(120);

/// What the room is told when loopd refuses a message it ran already.
const REPEATED_NOTE: &str = "[the channel stopped just after handing this message to the box: \
                             its turn started then and was cut short when the channel went \
                             away (the session log shows how far it got); it does not run \
                             again. Send the message again to have it answered.]";

/// Start the turn for `q`: the `channel_turn` frame written to loopd is the hand-off, after which
/// the message is never handed off again; should channeld stop before it remembers that, loopd
/// knows the message by its key and refuses it `turn_repeated`. A session loopd has (or has not)
/// against what the state says is corrected once.
fn hand_off(ch: &Channel, room: &str, q: &Queued) -> Result<(Exchange, String, bool), ClientError> {
    let (session, created) = ch.session_of(room);
    let ex = start(ch, &session, created, q)?;
    ch.handed_off(&q.event);
    Ok((ex, session, created))
}

/// The key loopd keeps `event` under: the event id itself, or (for an id outside a key's bounds,
/// which no homeserver sends) its digest.
fn key_of(event: &str) -> TurnKey {
    TurnKey::new(event).unwrap_or_else(|_| {
        TurnKey::new(format!(
            "sha256:{}",
            bxcore::canonical::sha256_hex(event.as_bytes())
        ))
        .expect("a digest is a turn key")
    })
}

fn start(ch: &Channel, session: &str, resume: bool, q: &Queued) -> Result<Exchange, ClientError> {
    let session = SessionId::new(session.to_string())
        .map_err(|_| ClientError::Unexpected("an invalid session name"))?;
    Exchange::start(
        &ch.cfg.sockets.bridge,
        Duration::from_millis(ch.cfg.limits.turn_ms),
        1,
        Message::ChannelTurn(ChannelTurn {
            session,
            resume,
            text: q.text.clone(),
            key: key_of(&q.event),
        }),
    )
}

/// One part of an answer, in the order it came.
#[derive(Debug)]
enum Part {
    Text(String),
    Tool(String),
}

/// The answer as it streams: one message, edited in place.
struct Reply<'a> {
    ch: &'a Channel,
    room: &'a str,
    /// The owner's event this answers: every transaction id derives from it.
    source: String,
    event: Option<String>,
    parts: Vec<Part>,
    edits: u32,
    last_edit: Instant,
    typing: Instant,
    shown: String,
}

impl Reply<'_> {
    fn render(&self, done: Option<&str>) -> Rendered {
        let max = self.ch.cfg.limits.max_reply_bytes;
        let mut text = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => text.push_str(t),
                Part::Tool(line) => {
                    if !text.is_empty() && !text.ends_with('\n') {
                        text.push('\n');
                    }
                    text.push_str("\n`");
                    text.push_str(&line.replace('`', "'"));
                    text.push_str("`\n\n");
                }
            }
        }
        let total = text.len();
        let mut r = if total > max {
            let mut r = render::markdown(crate::matrix::cut(&text, max));
            let note = render::plain(&format!(
                "\n\n[cut: the answer is {total} bytes, {max} are shown; the whole of it is in \
                 the session log]"
            ));
            r.body.push_str(&note.body);
            r.html.push_str(&format!("<p><em>{}</em></p>", note.html));
            r
        } else if text.trim().is_empty() && done.is_none() {
            render::plain("…")
        } else {
            render::markdown(&text)
        };
        if let Some(end) = done {
            let note = render::plain(end);
            r.body.push_str("\n\n");
            r.body.push_str(&note.body);
            r.html.push_str(&format!("<p><em>{}</em></p>", note.html));
        }
        r
    }

    /// Send the first message, or edit it; `last` retries until [`FINAL_WITHIN`].
    fn show(&mut self, done: Option<&str>, last: bool) {
        let r = self.render(done);
        if r.body == self.shown && !last {
            return;
        }
        let within = if last {
            FINAL_WITHIN
        } else {
            Duration::from_millis(self.ch.cfg.limits.request_ms)
        };
        match &self.event {
            None => {
                let txn = format!("r-{}", txn_digest(&self.source));
                if let Some(id) =
                    send_retrying(self.ch, self.room, &txn, &r.content("m.text"), within)
                {
                    let room = self.room.to_string();
                    let kept = id.clone();
                    self.ch.update(|s| s.replies.insert(room, kept));
                    self.event = Some(id);
                }
            }
            Some(original) => {
                self.edits += 1;
                let txn = format!("e-{}-{}", txn_digest(&self.source), self.edits);
                let content = r.edit_of(original, "m.text");
                send_retrying(self.ch, self.room, &txn, &content, within);
            }
        }
        self.shown = r.body;
        self.last_edit = Instant::now();
    }

    /// Edit if the last edit is old enough.
    fn maybe_show(&mut self) {
        let every = Duration::from_millis(self.ch.cfg.limits.edit_interval_ms);
        if self.last_edit.elapsed() >= every {
            self.show(None, false);
        }
    }

    fn typing(&mut self, on: bool) {
        if on && self.typing.elapsed() < TYPING_EVERY {
            return;
        }
        // A typing notice that does not go is not worth a retry.
        let _ = self.ch.client.typing(self.room, self.ch.me(), on);
        self.typing = Instant::now();
    }

    fn event(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::AssistantText { text } => match self.parts.last_mut() {
                Some(Part::Text(t)) => t.push_str(text),
                _ => self.parts.push(Part::Text(text.clone())),
            },
            TurnEvent::ToolCall { tool, args, .. } => {
                self.parts.push(Part::Tool(format!(
                    "▸ {}({})",
                    one_line(tool, 64),
                    args_summary(args)
                )));
            }
            TurnEvent::ToolPending {
                approval, expires, ..
            } => {
                self.parts.push(Part::Tool(
                    "⏳ waiting for your approval (below)".to_string(),
                ));
                self.show(None, false);
                crate::approve::post(self.ch, self.room, approval, *expires, &self.source);
            }
            TurnEvent::ToolResult {
                outcome,
                text,
                outage,
                ..
            } => {
                let line = match outcome {
                    Outcome::Result => format!("  ✓ done ({} bytes)", text.len()),
                    Outcome::Failed => format!(
                        "  ✗ failed: {}",
                        one_line(outage.as_deref().unwrap_or(text), 160)
                    ),
                    Outcome::Denied => format!("  ⛔ denied: {}", one_line(text, 160)),
                };
                self.parts.push(Part::Tool(line));
            }
        }
    }
}

/// `s` on one line, its hazards shown, at most `n` bytes.
fn one_line(s: &str, n: usize) -> String {
    let shown = render::shown(s, Mode::Line);
    let cut = crate::matrix::cut(&shown, n);
    if cut.len() < shown.len() {
        format!("{cut}…")
    } else {
        cut.to_string()
    }
}

/// A tool call's arguments in a few words: `key="value"` each, values cut.
pub fn args_summary(args: &Value) -> String {
    let s = match args {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => {
                        format!("\"{}\"", one_line(&render::shown(s, Mode::Quoted), 60))
                    }
                    other => one_line(&other.to_string(), 60),
                };
                format!("{}={v}", one_line(k, 32))
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => one_line(&other.to_string(), 120),
    };
    one_line(&s, 200)
}

/// Read the turn's frames and stream the answer into the room.
fn stream(ch: &Channel, room: &str, q: &Queued, started: (Exchange, String, bool)) {
    let (mut ex, session, mut created) = started;
    let mut reply = Reply {
        ch,
        room,
        source: q.event.clone(),
        event: None,
        parts: Vec::new(),
        edits: 0,
        last_edit: Instant::now(),
        typing: Instant::now() - TYPING_EVERY,
        shown: String::new(),
    };
    reply.typing(true);
    reply.show(None, false);
    let mut retried = false;
    let busy_until = Instant::now() + BUSY_WITHIN;
    let mut backoff = Duration::from_millis(250);
    let end = loop {
        match ex.next_frame() {
            Ok(env) => match env.msg {
                Message::TurnEvent { event } if !env.last => {
                    if !created {
                        ch.created(room, &session);
                    }
                    reply.event(&event);
                    reply.typing(true);
                    reply.maybe_show();
                }
                Message::TurnDone(_) if env.last => {
                    ch.created(room, &session);
                    break None;
                }
                other => {
                    break Some(format!(
                        "[the turn ended oddly: loopd sent {}]",
                        other.kind()
                    ));
                }
            },
            Err(ClientError::Remote(e))
                if !retried
                    && matches!(e.code, ErrorCode::SessionExists | ErrorCode::NoSuchSession) =>
            {
                // The state and loopd disagree on whether the session exists: loopd ran nothing,
                // so start once more the other way.
                retried = true;
                created = e.code == ErrorCode::SessionExists;
                match start(ch, &session, created, q) {
                    Ok(again) => {
                        if created {
                            ch.created(room, &session);
                        }
                        ex = again;
                    }
                    Err(e) => break Some(format!("[loopd could not be reached again: {e}]")),
                }
            }
            Err(ClientError::Remote(e)) if e.code == ErrorCode::TurnRepeated => {
                break Some(REPEATED_NOTE.to_string());
            }
            Err(ClientError::Remote(e))
                if e.code == ErrorCode::SessionBusy && Instant::now() + backoff < busy_until =>
            {
                // The room's previous turn is still ending in loopd (its connection closed when
                // channeld stopped): this message waits for it, and nothing ran for it yet.
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
                match start(ch, &session, created, q) {
                    Ok(again) => ex = again,
                    Err(e) => break Some(format!("[loopd could not be reached again: {e}]")),
                }
            }
            Err(ClientError::Remote(e)) => {
                break Some(format!(
                    "[the turn failed: {}: {}]",
                    e.code,
                    one_line(&e.detail, 400)
                ));
            }
            Err(e) => break Some(format!("[the turn broke off: {e}]")),
        }
    };
    reply.typing(false);
    reply.show(end.as_deref(), true);
    let room = room.to_string();
    ch.update(|s| s.replies.remove(&room));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_summarised_escaped_and_cut() {
        let a = serde_json::json!({"path": "/w/\u{202e}a\"b", "n": 3});
        let s = args_summary(&a);
        assert_eq!(s, "n=3, path=\"/w/\\u{202e}a\\\"b\"");
        let long = serde_json::json!({"content": "x".repeat(500)});
        assert!(args_summary(&long).len() < 100);
    }
}
