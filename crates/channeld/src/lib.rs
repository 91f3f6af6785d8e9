//! channeld: the Matrix channel. The owner talks to the box from their phone, in the rooms
//! they named, and answers its approvals there.
//!
//! channeld is a client of loopd (bridge.sock: one `turn` per connection, as `bxctl chat`
//! speaks on loop.sock) and of brokerd (decide.sock: the approvals of the channel's own
//! sessions only, with the owner's Matrix id recorded as the approver), and of the configured
//! homeserver (the Matrix client-server API, over TLS, to addresses resolved once at start). It
//! serves channel.sock to the owner (pairing, status). It holds the bot's access token and
//! nothing else: no tool, no memory, no model. `docs/channels.md` tells how to set it up.

pub mod approve;
pub mod channel;
pub mod config;
pub mod daemon;
pub mod matrix;
pub mod owner;
pub mod render;
pub mod state;
pub mod token;
pub mod turn;

pub use config::Config;
