//! `bxctl memory recent|search|forget`: the owner's view of what memoryd filed, on memoryd's
//! owner socket (`memories.sock`). Every text shown was the model's or a tool's once: escaped.

use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown};
use bxcore::{Memory, MemoryForget, MemoryRecent, MemoryRoute, MemorySearch, Message, SessionId};
use serde_json::json;

use crate::context::SocketContext;
use crate::done::{Done, Ended, Failure};
use crate::output::json_line;

/// Ask memoryd `msg`; a failure says it was `what`.
fn ask(ctx: &SocketContext, what: &str, msg: Message) -> Result<Message, Failure> {
    client::call(&ctx.socket, ctx.timeout, 1, msg, |_| {}).map_err(|e| ctx.failed(what, &e))
}

fn show(ctx: &SocketContext, what: &str, msg: Message) -> Ended {
    let memories = match ask(ctx, what, msg)? {
        Message::Memories(m) => m.memories,
        other => return Err(ctx.failed(what, &ClientError::Unexpected(other.kind()))),
    };
    if ctx.json {
        json_line(&json!({ "memories": memories }));
        return Ok(Done);
    }
    if memories.is_empty() {
        println!("(nothing)");
    }
    for m in &memories {
        print_one(m);
    }
    Ok(Done)
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

fn recent_message(route: Option<MemoryRoute>, n: u32) -> Message {
    Message::MemoryRecent(MemoryRecent { route, limit: n })
}

/// `bxctl memory recent [--route R] [-n N]`.
pub fn recent(ctx: &SocketContext, route: Option<MemoryRoute>, n: u32) -> Ended {
    show(ctx, "cannot list the filed turns", recent_message(route, n))
}

/// The newest `n` turns filed to `route`, as `bxctl memory recent --route R --json` lists them
/// (the demo checks its memory steps by them).
pub fn list_recent(
    socket: &std::path::Path,
    route: Option<MemoryRoute>,
    n: u32,
    timeout: Duration,
) -> Result<Vec<Memory>, ClientError> {
    match client::call(socket, timeout, 1, recent_message(route, n), |_| {})? {
        Message::Memories(m) => Ok(m.memories),
        other => Err(ClientError::Unexpected(other.kind())),
    }
}

/// `bxctl memory search QUERY [-n N]`.
pub fn search(ctx: &SocketContext, query: &str, n: u32) -> Ended {
    let msg = Message::MemorySearch(MemorySearch {
        query: query.to_string(),
        limit: n,
    });
    show(ctx, "cannot search memory", msg)
}

/// `bxctl memory forget --session ID`.
pub fn forget(ctx: &SocketContext, session: &SessionId) -> Ended {
    let what = "cannot forget the session";
    let msg = Message::MemoryForget(MemoryForget {
        session: session.clone(),
    });
    match ask(ctx, what, msg)? {
        Message::MemoryForgotten(f) => {
            if ctx.json {
                json_line(&f);
            } else if f.queued {
                println!(
                    "session {}: {} turn(s) hidden now; the remote store deletes them later; \
                     its later turns are filed nowhere",
                    f.session, f.turns
                );
            } else {
                println!(
                    "session {}: {} turn(s) deleted; its later turns are filed nowhere",
                    f.session, f.turns
                );
            }
            Ok(Done)
        }
        other => Err(ctx.failed(what, &ClientError::Unexpected(other.kind()))),
    }
}
