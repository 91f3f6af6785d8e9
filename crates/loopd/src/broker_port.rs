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
use bxcore::{FrameError, Message, Timestamp, ToolRequest, ToolResponse, Tools};

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

/// The outage behind an `UNAVAILABLE` answer, for the owner (the model is shown `UNAVAILABLE`
/// alone): why, and a runbook pointer, brokerd's own when its answer carried one (a damaged
/// state file points at its entry), else [`BROKER_ANCHOR`]'s.
pub fn outage(why: &str) -> String {
    match bxcore::runbook::split_pointer(why) {
        Some(_) => why.to_string(),
        None => format!("{why}; {}", pointer()),
    }
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

    /// Every U exit: log the line once, answer `Failed { UNAVAILABLE }`, and say the outage
    /// for the owner (`None` for a turn that was cancelled: not an outage). The caller drops the
    /// stream by returning.
    fn unavailable(&self, why: &str) -> (ToolResponse, Option<String>) {
        // The turn's cancel shut the connection down: not an outage, nothing to log.
        if crate::cancel::cancelled() {
            let failed = ToolResponse::Failed {
                message: crate::turn::CANCELLED_CALL.to_string(),
            };
            return (failed, None);
        }
        (self.log)(&unavailable_line(why));
        let failed = ToolResponse::Failed {
            message: UNAVAILABLE.to_string(),
        };
        (failed, Some(outage(why)))
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

impl BrokerPort {
    /// The exchange of one call, every U exit as `Err(why)`.
    fn exchange(
        &self,
        request: &ToolRequest,
        on_pending: &mut dyn FnMut(&Pending),
    ) -> Result<ToolResponse, String> {
        let want = request.call.0;
        // 1. to 4., through the one client: the first deadline taken before connecting (1: "the
        // timeout is too large"), the connection (2), the write timeout (3), the request (4).
        let request = Message::ToolRequest(request.clone());
        let mut exchange = match client::Exchange::start(&self.socket, self.timeout, want, request)
        {
            Ok(ex) => ex,
            Err(ClientError::Send(FrameError::TooLarge(_))) => {
                return Ok(ToolResponse::Failed {
                    message: TOO_LARGE.to_string(),
                });
            }
            Err(e) => return Err(e.to_string()),
        };
        // A cancelled turn shuts this connection down: brokerd withdraws a pending approval.
        let _cancel = crate::cancel::guard(exchange.stream());
        let mut pending_seen = false;
        loop {
            // 5. The frame within the deadline: "the connection closed before the final answer",
            // "no answer in time", or "bad frame: ...".
            let env = match exchange.next_envelope() {
                Ok(env) => env,
                Err(e) => return Err(e.to_string()),
            };
            // 6.
            if env.id != want {
                return Err(format!("an answer for request {}, not {want}", env.id));
            }
            // 7.
            let response = match env.msg {
                Message::ToolResponse(r) => r,
                Message::Error(e) => {
                    return Err(format!("the broker reported an error: {}", e.detail));
                }
                _ => return Err("an unexpected message".to_string()),
            };
            match (response, env.last) {
                // 8.
                (ToolResponse::PendingApproval { .. }, true) => {
                    return Err("a pending frame marked final".to_string());
                }
                // 10.
                (ToolResponse::PendingApproval { approval, expires }, false) => {
                    if pending_seen {
                        return Err("a second pending frame".to_string());
                    }
                    pending_seen = true;
                    match self.after_pending(expires) {
                        Some(next) => exchange.extend(next),
                        None => return Err("an expiry too far away".to_string()),
                    }
                    on_pending(&Pending { approval, expires });
                }
                // 9.
                (_, false) => return Err("an answer not marked final".to_string()),
                // 11.
                (answer, true) => return Ok(answer),
            }
        }
    }
}

impl ToolPort for BrokerPort {
    fn call(&self, request: &ToolRequest, on_pending: &mut dyn FnMut(&Pending)) -> ToolResponse {
        self.call_explained(request, on_pending).0
    }

    fn call_explained(
        &self,
        request: &ToolRequest,
        on_pending: &mut dyn FnMut(&Pending),
    ) -> (ToolResponse, Option<String>) {
        match self.exchange(request, on_pending) {
            Ok(answer) => (answer, None),
            Err(why) => self.unavailable(&why),
        }
    }

    /// brokerd's `tools_list`, through the shared client. A broker that cannot say is an
    /// outage, logged like any other; the turn does not start.
    fn list(&self) -> Result<Tools, String> {
        let why = match client::call(&self.socket, self.timeout, 0, Message::ToolsList {}, |_| {}) {
            Ok(Message::Tools(t)) => return Ok(t),
            Ok(other) => format!("tools_list was answered with {}", other.kind()),
            Err(e) => format!("cannot list the tools on {}: {e}", self.socket.display()),
        };
        (self.log)(&unavailable_line(&why));
        Err(why)
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

    fn list(&self) -> Result<Tools, String> {
        Ok(Tools {
            tools: Vec::new(),
            workspace: Vec::new(),
        })
    }
}
