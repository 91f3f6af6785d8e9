//! The broker port: every tool call that is not a core tool goes to brokerd over broker.sock.
//!
//! Whatever goes wrong there, the model gets a plain failure and the turn goes on; loopd logs one
//! line that points at the runbook. One connection per call, no retries (brokerd records every
//! call it sees, so a retry would be a second call), and one deadline for the whole answer read
//! through `bxcore::client` (its `Deadline`), so a peer that trickles bytes cannot hold a turn
//! past its timeout.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bxcore::client::{self, ClientError};
use bxcore::{FrameError, Message, Timestamp, ToolDef, ToolRequest, ToolResponse};

use crate::config::MAX_TIMEOUT_MS;
use crate::tools::{Pending, ToolPort};

pub const UNAVAILABLE: &str = "the tool broker is unavailable";
pub const NOT_CONFIGURED: &str = "no tool broker is configured";
pub const TOO_LARGE: &str = "the request is too large for the tool broker";
/// The runbook entry of every outage line here.
pub const BROKER_ANCHOR: &str = "broker-unavailable";

/// The pointer of [`BROKER_ANCHOR`], the end of every outage line here.
pub fn pointer() -> String {
    bxcore::runbook::pointer(BROKER_ANCHOR)
}

/// `loopd: {UNAVAILABLE}: {why}` and the pointer.
pub fn unavailable_line(why: &str) -> String {
    format!("loopd: {UNAVAILABLE}: {why}; {}", pointer())
}

/// `loopd: {NOT_CONFIGURED}: every tool call except the core ones will fail` and the pointer.
pub fn not_configured_line() -> String {
    format!(
        "loopd: {NOT_CONFIGURED}: every tool call except the core ones will fail; {}",
        pointer()
    )
}

/// A logger for the port's outage lines.
pub type Log = Box<dyn Fn(&str) + Send + Sync>;

/// Asks brokerd, one connection per call.
pub struct BrokerPort {
    socket: PathBuf,
    timeout: Duration,
    log: Log,
}

impl std::fmt::Debug for BrokerPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerPort")
            .field("socket", &self.socket)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl BrokerPort {
    /// A port that logs to stderr.
    pub fn new(socket: PathBuf, timeout: Duration) -> BrokerPort {
        BrokerPort::with_log(socket, timeout, Box::new(|l| eprintln!("{l}")))
    }

    pub fn with_log(socket: PathBuf, timeout: Duration, log: Log) -> BrokerPort {
        BrokerPort {
            socket,
            timeout,
            log,
        }
    }

    /// Every U exit: log the line once, answer `Failed { UNAVAILABLE }`. The caller drops the
    /// stream by returning.
    fn unavailable(&self, why: &str) -> ToolResponse {
        // The turn's cancel shut the connection down: not an outage, nothing to log.
        if crate::cancel::cancelled() {
            return ToolResponse::Failed {
                message: crate::turn::CANCELLED_CALL.to_string(),
            };
        }
        (self.log)(&unavailable_line(why));
        ToolResponse::Failed {
            message: UNAVAILABLE.to_string(),
        }
    }

    /// The deadline after a pending frame: `expires` (from a peer: every sum checked), then the
    /// timeout on top. An `expires` in the past leaves the timeout; one more than 24 hours away
    /// is too far.
    fn after_pending(&self, expires: Timestamp) -> Option<Instant> {
        let wait = expires
            .unix_millis()
            .saturating_sub(Timestamp::now().unix_millis());
        if wait > MAX_TIMEOUT_MS {
            return None;
        }
        Instant::now()
            .checked_add(Duration::from_millis(wait))?
            .checked_add(self.timeout)
    }
}

impl ToolPort for BrokerPort {
    fn call(&self, request: &ToolRequest, on_pending: &mut dyn FnMut(&Pending)) -> ToolResponse {
        let want = request.call.0;
        // 1. to 4., through the one client: the first deadline taken before connecting (1: "the
        // timeout is too large"), the connection (2), the write timeout (3), the request (4).
        let request = Message::ToolRequest(request.clone());
        let mut exchange = match client::Exchange::start(&self.socket, self.timeout, want, request)
        {
            Ok(ex) => ex,
            Err(ClientError::Send(FrameError::TooLarge(_))) => {
                return ToolResponse::Failed {
                    message: TOO_LARGE.to_string(),
                };
            }
            Err(e) => return self.unavailable(&e.to_string()),
        };
        // A cancelled turn shuts this connection down: brokerd withdraws a pending approval.
        let _cancel = crate::cancel::guard(exchange.stream());
        let mut pending_seen = false;
        loop {
            // 5. The frame within the deadline: "the connection closed before the final answer",
            // "no answer in time", or "bad frame: ...".
            let env = match exchange.next_envelope() {
                Ok(env) => env,
                Err(e) => return self.unavailable(&e.to_string()),
            };
            // 6.
            if env.id != want {
                return self.unavailable(&format!("an answer for request {}, not {want}", env.id));
            }
            // 7.
            let response = match env.msg {
                Message::ToolResponse(r) => r,
                Message::Error(e) => {
                    return self
                        .unavailable(&format!("the broker reported an error: {}", e.detail));
                }
                _ => return self.unavailable("an unexpected message"),
            };
            match (response, env.last) {
                // 8.
                (ToolResponse::PendingApproval { .. }, true) => {
                    return self.unavailable("a pending frame marked final");
                }
                // 10.
                (ToolResponse::PendingApproval { approval, expires }, false) => {
                    if pending_seen {
                        return self.unavailable("a second pending frame");
                    }
                    pending_seen = true;
                    match self.after_pending(expires) {
                        Some(next) => exchange.extend(next),
                        None => return self.unavailable("an expiry too far away"),
                    }
                    on_pending(&Pending { approval, expires });
                }
                // 9.
                (_, false) => return self.unavailable("an answer not marked final"),
                // 11.
                (answer, true) => return answer,
            }
        }
    }

    /// brokerd's `tools_list`, through the shared client. A broker that cannot say offers no
    /// tools this turn, and the outage is logged like any other.
    fn list(&self) -> Vec<ToolDef> {
        match client::call(&self.socket, self.timeout, 0, Message::ToolsList {}, |_| {}) {
            Ok(Message::Tools(t)) => t.tools,
            Ok(other) => {
                (self.log)(&unavailable_line(&format!(
                    "tools_list was answered with {}",
                    other.kind()
                )));
                Vec::new()
            }
            Err(e) => {
                (self.log)(&unavailable_line(&format!("cannot list the tools: {e}")));
                Vec::new()
            }
        }
    }
}

/// No broker configured: every call fails plainly, and nothing is logged per call (the
/// `not_configured_line` is printed once at start).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBroker;

impl ToolPort for NoBroker {
    fn call(&self, _request: &ToolRequest, _on_pending: &mut dyn FnMut(&Pending)) -> ToolResponse {
        ToolResponse::Failed {
            message: NOT_CONFIGURED.to_string(),
        }
    }

    fn list(&self) -> Vec<ToolDef> {
        Vec::new()
    }
}
