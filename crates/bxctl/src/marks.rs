//! `bxctl marks`, `bxctl marks clear PATH`: the files an untrusted session wrote, which every
//! later read (and listing, and `run`) takes as third-party content, and the owner clearing one
//! once they checked it (recorded in the audit chain). Every path is escaped
//! (`bxcore::visible`): a name the model chose cannot change how the list looks.

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown};
use bxcore::{Mark, MarkRef, Message};
use serde_json::json;

use crate::context::Context;
use crate::done::{Done, Ended};
use crate::output::{failed, json_line};

/// One mark, for a person.
pub fn mark_text(m: &Mark) -> String {
    let what = if m.whole {
        "everything beneath (a program run by such a session could write there)"
    } else {
        "written by a session that had read third-party content"
    };
    let name = if m.rel.is_empty() {
        m.root.clone()
    } else {
        format!("{}/{}", m.root, m.rel)
    };
    format!(
        "{}\n  path     {}\n  marked   {}\n  why      {what}\n  bxctl marks clear {}\n",
        Shown(&name, Mode::Line),
        Shown(&m.path, Mode::Line),
        crate::output::ago(m.marked),
        Shown(&name, Mode::Line),
    )
}

/// `bxctl marks`: every mark, oldest first.
pub fn list(ctx: &Context) -> Ended {
    let what = "cannot list the marks";
    let got = match client::call(&ctx.admin, ctx.timeout, 1, Message::MarksList {}, |_| {}) {
        Ok(Message::Marks(m)) => m,
        Ok(other) => return Err(failed(ctx, what, &ClientError::Unexpected(other.kind()))),
        Err(e) => return Err(failed(ctx, what, &e)),
    };
    if ctx.json {
        json_line(&json!({"marks": got.marks, "max": got.max, "left_off": got.left_off}));
        return Ok(Done);
    }
    if got.marks.is_empty() && got.left_off == 0 {
        println!("no marks (of at most {})", got.max);
        return Ok(Done);
    }
    for m in &got.marks {
        println!("{}", mark_text(m));
    }
    if got.left_off > 0 {
        println!("(and {} more)", got.left_off);
    }
    println!(
        "{} of at most {} marks; check a file, then: bxctl marks clear ROOT/PATH",
        got.marks.len() as u64 + got.left_off,
        got.max
    );
    Ok(Done)
}

/// `bxctl marks clear PATH`: `PATH` as the list names it (`root/rel`, or the resolved path).
pub fn clear(ctx: &Context, path: &str) -> Ended {
    let msg = Message::MarkClear(MarkRef {
        path: path.to_string(),
    });
    let what = format!("cannot clear the mark of {}", Shown(path, Mode::Line));
    match client::call(&ctx.admin, ctx.timeout, 1, msg, |_| {}) {
        Ok(Message::MarkCleared(c)) => {
            if ctx.json {
                json_line(&json!({"cleared": c.cleared}));
            } else {
                for m in &c.cleared {
                    println!("cleared {}", Shown(&m.path, Mode::Line));
                }
            }
            Ok(Done)
        }
        Ok(other) => Err(failed(ctx, &what, &ClientError::Unexpected(other.kind()))),
        Err(e) => Err(failed(ctx, &what, &e)),
    }
}
