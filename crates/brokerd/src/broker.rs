//! The broker and one `broker.sock` connection: a tool call decided, recorded, perhaps put to the
//! owner, run, raised and answered; or the list of tools the model may be offered.
//!
//! Every step is in the audit chain and durable before it takes effect: the decision before the
//! tool runs (or the answer that refuses it), the raise and the result before the answer.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use bxcore::{
    Approval, ApprovalId, CallId, Envelope, ErrorCode, Message, SessionId, Timestamp, ToolRequest,
    ToolResponse, Tools, WireError, canonical,
};
use serde_json::{Value, json};
use toolkit::{Entry, Env, Plan, Registry};

pub use bxharden::serve::send;

use crate::approvals::{Approvals, Verdict};
use crate::config::Config;
use crate::ledger::record::{Draft, Event, args_detail};
use crate::ledger::{Ledger, LedgerError};
use crate::policy::{self, Decision};

/// The socket's name in the lines brokerd logs and the errors it sends.
pub const SOCKET: &str = "broker.sock";

/// What the model is shown when a result could not be recorded: the owner has the details.
pub const NOT_RECORDED: &str =
    "the broker could not record the result, so it is not returned (the owner's log says why)";

/// Everything a connection needs: the configuration, the tools, the ledger and the approvals.
#[derive(Debug)]
pub struct Broker {
    cfg: Config,
    registry: Registry,
    env: Env,
    ledger: Ledger,
    approvals: Approvals,
}

impl Broker {
    /// A broker over an open ledger. The configuration was checked when it loaded.
    pub fn new(cfg: Config, registry: Registry, env: Env, ledger: Ledger) -> Broker {
        Broker {
            cfg,
            registry,
            env,
            ledger,
            approvals: Approvals::default(),
        }
    }

    pub fn cfg(&self) -> &Config {
        &self.cfg
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    /// Log one line that already ends with its runbook pointer.
    pub fn log(&self, anchor: &str, line: &str) {
        bxharden::log::line(anchor, line);
    }

    /// Log a ledger fault as `brokerd: {e}`.
    fn fault(&self, e: &LedgerError) {
        bxharden::log::error(e.anchor(), e);
    }
}

/// Serve one `broker.sock` request from loopd (a kind its table accepts): its frames, then the
/// close.
pub fn handle(mut stream: UnixStream, envelope: Envelope, broker: &Broker) {
    let id = envelope.id;
    match envelope.msg {
        Message::ToolRequest(req) => tool_request(&mut stream, broker, id, req),
        Message::ToolsList {} => {
            let tools = broker.registry.defs();
            let _ = send(&mut stream, id, true, Message::Tools(Tools { tools }));
        }
        other => bxharden::serve::unhandled(&mut stream, id, &other),
    }
}

/// One call, as far as the socket is concerned.
struct Call<'a> {
    stream: &'a mut UnixStream,
    broker: &'a Broker,
    id: u64,
    session: SessionId,
    call: CallId,
    tool: String,
    args: Value,
}

impl Call<'_> {
    fn draft(&self, event: Event, detail: Value) -> Draft {
        Draft::call(&self.session, self.call, &self.tool, event, detail)
    }

    fn answer(&mut self, response: ToolResponse) {
        let _ = send(self.stream, self.id, true, Message::ToolResponse(response));
    }

    fn internal(&mut self, e: &dyn std::fmt::Display) {
        let _ = send(
            self.stream,
            self.id,
            true,
            Message::Error(WireError {
                code: ErrorCode::Internal,
                detail: e.to_string(),
            }),
        );
    }

    /// Record `drafts` durably, then send `response`; a record that fails is an `internal`
    /// error instead, logged.
    fn record_then(&mut self, drafts: Vec<Draft>, response: ToolResponse) {
        match self.broker.ledger.record(drafts) {
            Ok(()) => self.answer(response),
            Err(e) => {
                self.broker.fault(&e);
                self.internal(&e);
            }
        }
    }
}

fn tool_request(stream: &mut UnixStream, broker: &Broker, id: u64, req: ToolRequest) {
    let mut c = Call {
        stream,
        broker,
        id,
        session: req.session,
        call: req.call,
        tool: req.tool,
        args: req.args,
    };
    let requested = c.draft(Event::Requested, args_detail(&c.args));

    let state = match broker.ledger.state(&c.session) {
        Ok(s) => s,
        Err(e) => {
            // Never the default: a damaged state is a refusal, logged with the store's text.
            bxharden::log::error(crate::state::STATE_ANCHOR, &e);
            let failed = c.draft(Event::Failed, json!({"message": e.to_string()}));
            let _ = broker.ledger.record(vec![requested, failed]);
            c.internal(&e);
            return;
        }
    };

    match policy::decide(&broker.registry, &broker.env, &c.tool, &c.args, state) {
        Decision::Denied(reason) => {
            let denied = c.draft(Event::Denied, json!({"reason": reason}));
            c.record_then(vec![requested, denied], ToolResponse::Denied { reason });
        }
        Decision::Failed(message) => {
            let failed = c.draft(Event::Failed, json!({"message": message}));
            c.record_then(vec![requested, failed], ToolResponse::Failed { message });
        }
        Decision::Allow { entry, plan } => {
            let allowed = c.draft(Event::Allowed, json!({"rule": "allowed"}));
            if let Err(e) = broker.ledger.record(vec![requested, allowed]) {
                broker.fault(&e);
                c.internal(&e);
                return;
            }
            run(&mut c, entry, &plan);
        }
        Decision::Ask {
            entry,
            plan,
            rule,
            reason,
        } => {
            let now = Timestamp::now();
            let ttl = broker.cfg.approvals.ttl_ms;
            let approval = Approval {
                approval: ApprovalId::random(),
                session: c.session.clone(),
                call: c.call,
                tool: c.tool.clone(),
                args: c.args.clone(),
                digest: canonical::digest(&c.args),
                taint: state.taint,
                untrusted: state.untrusted,
                rule: rule.as_str().to_string(),
                reason: reason.clone(),
                requested: now,
                expires: now.plus_millis(ttl),
            };
            let aid = approval.approval.clone();
            let expires = approval.expires;
            let pending = c.draft(
                Event::Pending,
                json!({
                    "approval": aid,
                    "rule": rule.as_str(),
                    "reason": reason,
                    "digest": approval.digest,
                    "expires": expires,
                }),
            );
            if let Err(e) = broker.ledger.record(vec![requested, pending]) {
                broker.fault(&e);
                c.internal(&e);
                return;
            }
            let waiter = broker.approvals.open(approval, Duration::from_millis(ttl));
            let interim = Message::ToolResponse(ToolResponse::PendingApproval {
                approval: aid.clone(),
                expires,
            });
            if !send(c.stream, c.id, false, interim) {
                // The caller is gone: nobody would take the result. Close the approval.
                broker.approvals.abandon(waiter);
                let closed = c.draft(
                    Event::Denied,
                    json!({"approval": aid, "reason": "the caller went away before the decision"}),
                );
                if let Err(e) = broker.ledger.record(vec![closed]) {
                    broker.fault(&e);
                }
                return;
            }
            match broker.approvals.wait(waiter) {
                Verdict::Approved => {
                    let approved = c.draft(
                        Event::Approved,
                        json!({"approval": aid, "digest": canonical::digest(&c.args)}),
                    );
                    if let Err(e) = broker.ledger.record(vec![approved]) {
                        broker.fault(&e);
                        c.internal(&e);
                        return;
                    }
                    run(&mut c, entry, &plan);
                }
                Verdict::Denied => {
                    let reason = "the owner denied it".to_string();
                    let denied = c.draft(Event::Denied, json!({"approval": aid, "reason": reason}));
                    c.record_then(vec![denied], ToolResponse::Denied { reason });
                }
                Verdict::Expired => {
                    let reason = "the approval expired".to_string();
                    let expired = c.draft(Event::Expired, json!({"approval": aid, "why": reason}));
                    c.record_then(vec![expired], ToolResponse::Denied { reason });
                }
            }
        }
    }
}

/// Run an allowed call, raise the session by its result, and answer.
fn run(c: &mut Call<'_>, entry: &Entry, plan: &Plan) {
    match entry.run(&c.args, &c.broker.env) {
        Ok(out) => {
            let detail = json!({
                "class": plan.reads,
                "untrusted_output": plan.untrusted_output,
                "content_bytes": out.content.len(),
            });
            match c
                .broker
                .ledger
                .raise(&c.session, c.call, &c.tool, plan, detail)
            {
                Ok(_) => c.answer(ToolResponse::Result {
                    content: out.content,
                    class: plan.reads,
                    untrusted: plan.untrusted_output,
                }),
                Err(e) => {
                    // A result whose raise is not on disk is never returned.
                    c.broker.fault(&e);
                    c.answer(ToolResponse::Failed {
                        message: NOT_RECORDED.to_string(),
                    });
                }
            }
        }
        Err(e) => {
            let message = e.to_string();
            let failed = c.draft(Event::Failed, json!({"message": message}));
            c.record_then(vec![failed], ToolResponse::Failed { message });
        }
    }
}
