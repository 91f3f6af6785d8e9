//! `bxctl channel pair|status`: the owner's side of the Matrix channel, on channeld's owner
//! socket (`channel.sock`). Pairing binds the owner's Matrix id without trusting any first
//! message: bxctl prints a one-time code, the owner sends it from their Matrix account in the
//! named room, and channeld binds that sender.

use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown};
use bxcore::{ChannelPair, ChannelReport, Message};
use serde_json::json;

use crate::context::SocketContext;
use crate::done::{Done, Ended, Failure};
use crate::output::json_line;

/// `bxctl channel pair --room ROOM`: a one-time code for the owner to send in `room`.
pub fn pair(ctx: &SocketContext, room: &str) -> Ended {
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
            Ok(Done)
        }
        Ok(other) => Err(ctx.failed(what, &ClientError::Unexpected(other.kind()))),
        Err(e) => Err(ctx.failed(what, &e)),
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
pub fn status(ctx: &SocketContext) -> Ended {
    let r = report(&ctx.socket, ctx.timeout).map_err(|e| ctx.failed("channel_status", &e))?;
    if ctx.json {
        json_line(&serde_json::to_value(&r).unwrap_or_default());
    } else {
        println!("{}", describe(&r));
    }
    // Its line says why it does not sync; nothing more to say.
    if r.connected {
        Ok(Done)
    } else {
        Err(Failure::said())
    }
}
