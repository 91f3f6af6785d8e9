//! `bxctl channel pair|status`: the owner's side of the Matrix channel, on channeld's owner
//! socket (`channel.sock`). Pairing binds the owner's Matrix id without trusting any first
//! message: bxctl prints a one-time code, the owner sends it from their Matrix account in the
//! named room, and channeld binds that sender.

use std::path::PathBuf;
use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown};
use bxcore::{ChannelPair, ChannelReport, Message};
use serde_json::json;

use crate::Outcome;
use crate::output::{Asked, failed_at, json_line};

/// What the channel commands need to know.
#[derive(Debug, Clone)]
pub struct ChannelContext {
    /// channeld's owner socket.
    pub socket: PathBuf,
    pub json: bool,
    pub timeout: Duration,
}

fn failed(ctx: &ChannelContext, what: &str, e: &ClientError) -> Outcome {
    let asked = Asked {
        daemon: "channeld",
        socket: &ctx.socket,
        flag: "--channel",
    };
    failed_at(ctx.json, &asked, what, e)
}

/// `bxctl channel pair --room ROOM`: a one-time code for the owner to send in `room`.
pub fn pair(ctx: &ChannelContext, room: &str) -> Outcome {
    let what = "channel_pair";
    let msg = Message::ChannelPair(ChannelPair {
        room: room.to_string(),
    });
    match client::call(&ctx.socket, ctx.timeout, 1, msg, |_| {}) {
        Ok(Message::ChannelPairing(p)) => {
            if ctx.json {
                json_line(&json!({"room": p.room, "code": p.code, "expires": p.expires}));
            } else {
                let left = p.expires.0.saturating_sub(bxcore::Timestamp::now().0) / 60_000;
                println!(
                    "Send this message from your Matrix account in {}, within {left} minutes:\n\n    {}\n\n\
                     The account that sends it becomes the owner: its messages there are turns, and \
                     its reactions answer approvals. The code works once.",
                    Shown(&p.room, Mode::Line),
                    p.code
                );
            }
            Outcome::Done
        }
        Ok(other) => failed(ctx, what, &ClientError::Unexpected(other.kind())),
        Err(e) => failed(ctx, what, &e),
    }
}

/// The channel's report, for `bxctl status` and `bxctl channel status`.
pub fn report(socket: &std::path::Path, timeout: Duration) -> Result<ChannelReport, ClientError> {
    match client::call(socket, timeout, 1, Message::ChannelStatus {}, |_| {})? {
        Message::ChannelReport(r) => Ok(r),
        other => Err(ClientError::Unexpected(other.kind())),
    }
}

/// One line that says how the channel is.
pub fn describe(r: &ChannelReport) -> String {
    format!(
        "Matrix {} as {}: {}; owners {}; rooms {}",
        Shown(&r.homeserver, Mode::Line),
        Shown(&r.user, Mode::Line),
        Shown(&r.detail, Mode::Line),
        if r.owners.is_empty() {
            "none paired yet (bxctl channel pair)".to_string()
        } else {
            Shown(&r.owners.join(", "), Mode::Line).to_string()
        },
        Shown(&r.rooms.join(", "), Mode::Line)
    )
}

/// `bxctl channel status`.
pub fn status(ctx: &ChannelContext) -> Outcome {
    match report(&ctx.socket, ctx.timeout) {
        Ok(r) => {
            if ctx.json {
                json_line(&serde_json::to_value(&r).unwrap_or_default());
            } else {
                println!("{}", describe(&r));
            }
            if r.connected {
                Outcome::Done
            } else {
                Outcome::Failed
            }
        }
        Err(e) => failed(ctx, "channel_status", &e),
    }
}
