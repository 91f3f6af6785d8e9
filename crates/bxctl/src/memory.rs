//! `bxctl memory recent|search|forget`: the owner's view of what memoryd filed, on memoryd's
//! owner socket (`memories.sock`). Every text shown was the model's or a tool's once: escaped.

use std::path::PathBuf;
use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown};
use bxcore::{Memory, MemoryForget, MemoryRecent, MemoryRoute, MemorySearch, Message, SessionId};
use serde_json::json;

use crate::Outcome;
use crate::output::{Asked, failed_at, json_line};

/// What the memory commands need to know.
#[derive(Debug, Clone)]
pub struct MemoryContext {
    /// memoryd's owner socket.
    pub socket: PathBuf,
    pub json: bool,
    pub timeout: Duration,
}

fn failed(ctx: &MemoryContext, what: &str, e: &ClientError) -> Outcome {
    let asked = Asked {
        daemon: "memoryd",
        socket: &ctx.socket,
        flag: "--memories",
    };
    failed_at(ctx.json, &asked, what, e)
}

fn ask(ctx: &MemoryContext, what: &str, msg: Message) -> Result<Message, Outcome> {
    match client::call(&ctx.socket, ctx.timeout, 1, msg, |_| {}) {
        Ok(m) => Ok(m),
        Err(e) => Err(failed(ctx, what, &e)),
    }
}

fn show(ctx: &MemoryContext, what: &str, got: Result<Message, Outcome>) -> Outcome {
    let memories = match got {
        Ok(Message::Memories(m)) => m.memories,
        Ok(other) => return failed(ctx, what, &ClientError::Unexpected(other.kind())),
        Err(o) => return o,
    };
    if ctx.json {
        json_line(&json!({ "memories": memories }));
        return Outcome::Done;
    }
    if memories.is_empty() {
        println!("(nothing)");
    }
    for m in &memories {
        print_one(m);
    }
    Outcome::Done
}

fn print_one(m: &Memory) {
    println!(
        "{} {} turn {} [{}, {}{}]",
        m.filed.utc_text(),
        m.session,
        m.turn,
        m.route,
        m.class,
        if m.untrusted { ", untrusted" } else { "" }
    );
    for line in m.text.lines() {
        println!("  {}", Shown(line, Mode::Line));
    }
}

/// `bxctl memory recent [--route R] [-n N]`.
pub fn recent(ctx: &MemoryContext, route: Option<MemoryRoute>, n: u32) -> Outcome {
    let what = "cannot list the filed turns";
    show(
        ctx,
        what,
        ask(
            ctx,
            what,
            Message::MemoryRecent(MemoryRecent { route, limit: n }),
        ),
    )
}

/// `bxctl memory search QUERY [-n N]`.
pub fn search(ctx: &MemoryContext, query: &str, n: u32) -> Outcome {
    let what = "cannot search memory";
    show(
        ctx,
        what,
        ask(
            ctx,
            what,
            Message::MemorySearch(MemorySearch {
                query: query.to_string(),
                limit: n,
            }),
        ),
    )
}

/// `bxctl memory forget --session ID`.
pub fn forget(ctx: &MemoryContext, session: &SessionId) -> Outcome {
    let what = "cannot forget the session";
    let got = ask(
        ctx,
        what,
        Message::MemoryForget(MemoryForget {
            session: session.clone(),
        }),
    );
    match got {
        Ok(Message::MemoryForgotten(f)) => {
            if ctx.json {
                json_line(&f);
            } else if f.queued {
                println!(
                    "session {}: {} turn(s) hidden now; the remote store deletes them later",
                    f.session, f.turns
                );
            } else {
                println!("session {}: {} turn(s) deleted", f.session, f.turns);
            }
            Outcome::Done
        }
        Ok(other) => failed(ctx, what, &ClientError::Unexpected(other.kind())),
        Err(o) => o,
    }
}
