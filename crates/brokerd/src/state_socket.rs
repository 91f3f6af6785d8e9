//! One `state.sock` connection: `memoryd` asks for a session's state when a turn ends, and the
//! answer is what the state store holds. It reads, and never changes anything: no state, no
//! audit record.

use std::os::unix::net::UnixStream;

use bxcore::layout::StateRequest;
use bxcore::runbook::Anchored;
use bxcore::{ErrorCode, Message, WireError};

use crate::broker::{Broker, send};
use crate::state::StateStore;

/// The socket's name in the lines `brokerd` logs and the errors it sends.
pub const SOCKET: &str = "state.sock";

/// Serve one `state.sock` question from `memoryd` (the accept path read it, answered a malformed
/// frame or `ping`, and refused every kind but `session_state`): one final answer, then the
/// connection is closed.
pub fn handle(mut stream: UnixStream, id: u64, request: StateRequest, broker: &Broker) {
    // 1. The question.
    let StateRequest::SessionState(question) = request;

    // 2. The store the ledger writes. A session without a file is the store's default, `private`
    //    and trusted; a file that cannot be read is an error, never that default. Its own store:
    //    the ledger's lock is never taken, so a question never waits behind a tool call.
    let store = StateStore::new(&broker.cfg().state_dir());
    let response = match store.read(&question.session) {
        Ok(label) => Message::SessionStateReply(label),
        Err(e) => {
            bxharden::log::fail(&e);
            Message::Error(WireError {
                code: ErrorCode::Internal,
                detail: e.pointed().to_string(),
            })
        }
    };

    // 3. The final frame; a failed send is ignored, as the peer is gone.
    let _ = send(&mut stream, id, true, response);
}
