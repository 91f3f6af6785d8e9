//! The broker and one `broker.sock` connection: a tool call decided, recorded, perhaps put to the
//! owner, run, raised and answered; or the list of tools the model may be offered.
//!
//! Every step is in the audit chain and durable before it takes effect: the decision before the
//! tool runs (or the answer that refuses it), the raise and the result before the answer.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use bxcore::layout::BrokerRequest;
use bxcore::runbook::{Anchored, Pointed};
use bxcore::{
    Approval, ApprovalId, CallId, DataClass, ErrorCode, Label, Message, SessionId, Timestamp,
    ToolRequest, ToolResponse, Tools, WireError, WorkspaceRoot, canonical,
};
use serde_json::{Value, json};
use toolkit::{Entry, Env, Plan, Reads, Registry, ToolError};

pub use bxharden::serve::send;

use crate::approvals::{Approvals, Verdict};
use crate::config::Config;
use crate::fingerprints::{FULL_ANCHOR, Fingerprints, LEAK_ANCHOR, WEAK_ANCHOR};
use crate::leases::{Covers, Leases};
use crate::ledger::record::{Draft, Event, args_detail};
use crate::ledger::{Ledger, LedgerError};
use crate::marks::MarkStore;
use crate::policy::{self, AskRule, Decision};

/// Why a pending approval closed without a decision: its requester cancelled or went away.
const WITHDRAWN: &str = "the requester cancelled or went away before the decision";

/// The runbook anchor of an approval the policy put to the owner again.
pub const ASKED_AGAIN_ANCHOR: &str = "broker-approval-asked-again";

/// Why an approved call was put to the owner again instead of run.
pub const ASKED_AGAIN: &str =
    "approved, but the policy, asked again, puts the call to the owner for another reason";

/// The socket's name in the lines brokerd logs and the errors it sends.
pub const SOCKET: &str = "broker.sock";

/// The reason of a call the owner denied.
pub const OWNER_DENIED: &str = "the owner denied it";

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
    leases: Leases,
    fingerprints: Fingerprints,
    marks: Arc<MarkStore>,
}

impl Broker {
    /// A broker over an open ledger. The configuration was checked when it loaded.
    pub fn new(
        cfg: Config,
        registry: Registry,
        env: Env,
        ledger: Ledger,
        fingerprints: Fingerprints,
        marks: Arc<MarkStore>,
    ) -> Broker {
        let approvals = Approvals::new(cfg.approvals.limits());
        let leases = Leases::new(cfg.approvals.lease_limits());
        Broker {
            cfg,
            registry,
            env,
            ledger,
            approvals,
            leases,
            fingerprints,
            marks,
        }
    }

    /// What untrusted sessions wrote.
    pub fn marks(&self) -> &MarkStore {
        &self.marks
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

    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Where a call of `tool` with `args` lands, as a lease names it (`root notes`, `any`).
    pub fn place(&self, tool: &str, args: &Value) -> String {
        self.registry
            .get(tool)
            .map_or_else(|| "any".to_string(), |e| e.place(args, &self.env))
    }

    /// What the model may be offered now: every enabled tool, and the workspace roots they
    /// reach. `web_fetch` names the hosts gatewayd allows, and is left out while it allows
    /// none (every fetch would be refused); a gateway that cannot be asked leaves it offered
    /// as it is, so the outage shows where a fetch fails.
    pub fn offer(&self) -> Tools {
        let mut tools = self.registry.defs();
        if let Some(socket) = &self.env.gateway {
            let web = toolkit::Tool::name(&toolkit::WebFetch);
            match toolkit::web_fetch::allowed_hosts(socket) {
                Ok(hosts) if hosts.is_empty() => tools.retain(|t| t.name != web),
                Ok(hosts) => {
                    for t in tools.iter_mut().filter(|t| t.name == web) {
                        t.description = toolkit::web_fetch::description_for(&hosts);
                    }
                }
                Err(_) => {}
            }
        }
        let workspace = self
            .env
            .roots
            .iter()
            .map(|r| WorkspaceRoot {
                name: r.name().to_string(),
                path: r.path.display().to_string(),
                class: r.class,
                writable: r.writable,
                untrusted: r.untrusted,
            })
            .collect();
        Tools { tools, workspace }
    }

    /// Log one line that already ends with its runbook pointer.
    pub fn log(&self, anchor: &str, line: &str) {
        bxharden::log::line(anchor, line);
    }

    /// Log a ledger fault as `brokerd: {e}` and its pointer.
    fn fault(&self, e: &LedgerError) {
        bxharden::log::fail(e);
    }
}

/// Serve one `broker.sock` request from loopd (a kind its table accepts): its frames, then the
/// close.
pub fn handle(mut stream: UnixStream, id: u64, request: BrokerRequest, broker: &Broker) {
    match request {
        BrokerRequest::ToolRequest(req) => tool_request(&mut stream, broker, id, req),
        BrokerRequest::ToolsList => {
            let _ = send(&mut stream, id, true, Message::Tools(broker.offer()));
        }
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
    /// Whether the requester can still be watched while an approval waits: a watch ends by
    /// shutting the stream's reading half, so a call asked again after one waits unwatched (its
    /// approval then ends at its expiry if the requester went away).
    watchable: bool,
}

impl Call<'_> {
    fn draft(&self, event: Event, detail: Value) -> Draft {
        Draft::call(&self.session, self.call, &self.tool, event, detail)
    }

    fn answer(&mut self, response: ToolResponse) {
        let _ = send(self.stream, self.id, true, Message::ToolResponse(response));
    }

    fn internal(&mut self, e: &dyn Anchored) {
        let _ = send(
            self.stream,
            self.id,
            true,
            Message::Error(WireError {
                code: ErrorCode::Internal,
                detail: Pointed(e).to_string(),
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

/// One call on `broker.sock`: recorded as requested, decided against the session's state, then
/// refused, failed, run, or put to the owner.
fn tool_request(stream: &mut UnixStream, broker: &Broker, id: u64, req: ToolRequest) {
    let mut c = Call {
        stream,
        broker,
        id,
        session: req.session,
        call: req.call,
        // A name no tool has is kept as a bounded summary from here on: in the chain, in the
        // refusal, in the log.
        tool: crate::ledger::record::tool_name(&req.tool),
        args: req.args,
        watchable: true,
    };
    let requested = c.draft(Event::Requested, args_detail(&c.args));
    let Some(state) = c.state(&requested) else {
        return;
    };
    match broker.decide(&c.session, c.call, &c.tool, &c.args, state) {
        Decision::Denied(d) => c.deny(vec![requested], None, d.reason),
        Decision::Failed { message, touched } => c.fail(vec![requested], message, touched),
        Decision::Allow { entry, plan } => c.allow(requested, entry, &plan),
        Decision::Ask {
            entry,
            plan,
            rule,
            reason,
        } => c.ask(requested, state, entry, &plan, rule, reason),
    }
}

impl Call<'_> {
    /// The session's label. Never the default: a damaged state is a refusal, recorded and
    /// logged with the store's text.
    fn state(&mut self, requested: &Draft) -> Option<Label> {
        match self.broker.ledger.state(&self.session) {
            Ok(s) => Some(s),
            Err(e) => {
                bxharden::log::fail(&e);
                let failed = self.draft(Event::Failed, failed_detail(&e.pointed().to_string()));
                let _ = self.broker.ledger.record(vec![requested.clone(), failed]);
                self.internal(&e);
                None
            }
        }
    }

    /// Answer `denied` with `reason`, after `before` and the `denied` record.
    fn deny(&mut self, mut before: Vec<Draft>, approval: Option<Value>, reason: String) {
        let mut detail = json!({"reason": reason});
        if let (Value::Object(m), Some(Value::Object(a))) = (&mut detail, approval) {
            m.extend(a);
        }
        before.push(self.draft(Event::Denied, detail));
        self.record_then(before, ToolResponse::Denied { reason });
    }

    /// Answer `failed`: what the failure told raises the session first when the call ran
    /// against a root's files (`touched`). The chain holds the message's digest, never its
    /// text, which may echo argument values.
    fn fail(&mut self, before: Vec<Draft>, message: String, touched: Option<Label>) {
        let Some(carried) = touched else {
            let failed = self.draft(Event::Failed, failed_detail(&message));
            let mut drafts = before;
            drafts.push(failed);
            return self.record_then(drafts, ToolResponse::Failed { message });
        };
        if !before.is_empty() {
            if let Err(e) = self.broker.ledger.record(before) {
                self.broker.fault(&e);
                return self.internal(&e);
            }
        }
        let detail = failed_detail(&message);
        match self.broker.ledger.raise(
            &self.session,
            self.call,
            &self.tool,
            carried,
            Event::Failed,
            detail,
        ) {
            Ok(_) => self.answer(ToolResponse::Failed { message }),
            Err(e) => {
                self.broker.fault(&e);
                self.internal(&e);
            }
        }
    }

    /// Record the decision to run, then run.
    fn allow(&mut self, requested: Draft, entry: &Entry, plan: &Plan) {
        let allowed = self.draft(Event::Allowed, json!({"rule": "allowed"}));
        if let Err(e) = self.broker.ledger.record(vec![requested, allowed]) {
            self.broker.fault(&e);
            return self.internal(&e);
        }
        run(self, entry, plan);
    }

    /// Put the call to the owner: record it pending, tell the caller, wait for the verdict.
    fn ask(
        &mut self,
        requested: Draft,
        state: Label,
        entry: &Entry,
        plan: &Plan,
        rule: AskRule,
        reason: String,
    ) {
        let broker = self.broker;
        let scope = entry.place(&self.args, &broker.env);
        // A lease the owner gave for calls like this one answers the ask: recorded as approved
        // by it, before the call runs. Only an ask: a denial never reaches here.
        let covers = Covers {
            session: &self.session,
            tool: &self.tool,
            scope: &scope,
            rule: rule.as_str(),
        };
        if let Some(lease) = broker.leases.find(&covers) {
            let approved = self.draft(
                Event::Approved,
                json!({
                    "lease": lease.lease,
                    "by": lease.by,
                    "rule": rule.as_str(),
                    "digest": canonical::digest(&self.args),
                }),
            );
            if let Err(e) = broker.ledger.record(vec![requested, approved]) {
                broker.fault(&e);
                return self.internal(&e);
            }
            return run(self, entry, plan);
        }
        let now = Timestamp::now();
        let ttl = broker.cfg.approvals.ttl_ms;
        let approval = Approval {
            approval: ApprovalId::random(),
            session: self.session.clone(),
            call: self.call,
            tool: self.tool.clone(),
            args: self.args.clone(),
            digest: canonical::digest(&self.args),
            taint: state.class,
            untrusted: state.untrusted,
            rule: rule.as_str().to_string(),
            reason: reason.clone(),
            lease_scope: lease_scope(
                &self.tool,
                &scope,
                rule,
                Duration::from_millis(broker.cfg.approvals.lease_ttl_ms),
            ),
            requested: now,
            expires: now.plus_millis(ttl),
        };
        let aid = approval.approval.clone();
        let expires = approval.expires;
        let pending = self.draft(
            Event::Pending,
            json!({
                "approval": aid,
                "rule": rule.as_str(),
                "reason": reason,
                "digest": approval.digest,
                "expires": expires,
            }),
        );
        // The table's bounds first: a call the owner's view cannot hold is denied, never queued
        // (`approvals::Refused`).
        let waiter = match broker.approvals.open(approval, Duration::from_millis(ttl)) {
            Ok(w) => w,
            Err(refused) => {
                return self.deny(vec![requested], None, refused.pointed().to_string());
            }
        };
        if let Err(e) = broker.ledger.record(vec![requested, pending]) {
            broker.approvals.abandon(waiter);
            broker.fault(&e);
            return self.internal(&e);
        }
        let interim = Message::ToolResponse(ToolResponse::PendingApproval {
            approval: aid.clone(),
            expires,
        });
        if !send(self.stream, self.id, false, interim) {
            // The caller is gone: nobody would take the result. Close the approval, recorded as
            // any requester that goes away while its approval is pending (docs/policy.md):
            // whether it went before or after this frame is only timing.
            broker.approvals.abandon(waiter);
            let closed = self.draft(
                Event::Withdrawn,
                json!({"approval": aid, "reason": WITHDRAWN}),
            );
            if let Err(e) = broker.ledger.record(vec![closed]) {
                broker.fault(&e);
            }
            return;
        }
        // The requester's end of input while it waits withdraws the approval: a turn
        // cancelled, or a loopd gone. Watched by a thread until the wait is over.
        let verdict = if self.watchable {
            self.watchable = false;
            wait_watching(self.stream, broker, waiter, &aid)
        } else {
            broker.approvals.wait(waiter)
        };
        match verdict {
            Verdict::Approved { by } => self.approved(&aid, &by, entry, rule),
            Verdict::Denied { by, reason } => {
                let reason = reason.unwrap_or_else(|| OWNER_DENIED.to_string());
                self.deny(
                    Vec::new(),
                    Some(by.record(json!({"approval": aid}))),
                    reason,
                );
            }
            Verdict::Expired => {
                let reason = "the approval expired".to_string();
                let expired = self.draft(Event::Expired, json!({"approval": aid, "why": reason}));
                self.record_then(vec![expired], ToolResponse::Denied { reason });
            }
            Verdict::Withdrawn => {
                let withdrawn = self.draft(
                    Event::Withdrawn,
                    json!({"approval": aid, "reason": WITHDRAWN}),
                );
                // Nobody takes an answer: the record is what is left of the call.
                if let Err(e) = broker.ledger.record(vec![withdrawn]) {
                    broker.fault(&e);
                }
            }
        }
    }

    /// The owner approved: decide the call again, whole, against the session's state now (it
    /// may have read something since it asked), and run it only if the policy still lets it
    /// for the reason the owner saw: a call the policy now puts to the owner for another reason
    /// is asked again, a new approval that says why.
    fn approved(
        &mut self,
        aid: &ApprovalId,
        by: &crate::approvals::By,
        entry: &Entry,
        asked: AskRule,
    ) {
        let broker = self.broker;
        let tag = by.record(json!({"approval": aid}));
        let plan = match broker.redecide(&self.session, &self.tool, &self.args, asked) {
            Redecision::Runs(p) => p,
            Redecision::Denied(reason) => return self.deny(Vec::new(), Some(tag), reason),
            Redecision::Failed(message, touched) => {
                return self.fail(Vec::new(), message, touched);
            }
            Redecision::Unreadable(e) => {
                bxharden::log::fail(&e);
                let reason = e.pointed().to_string();
                return self.deny(Vec::new(), Some(tag), reason);
            }
            Redecision::AskAgain {
                plan,
                rule,
                reason,
                state,
            } => {
                let closed = self.draft(
                    Event::Withdrawn,
                    by.record(json!({
                        "approval": aid,
                        "reason": format!(
                            "{ASKED_AGAIN} ({} now, {} when the owner was asked)",
                            rule.as_str(),
                            asked.as_str()
                        ),
                    })),
                );
                return self.ask(closed, state, entry, &plan, rule, reason);
            }
        };
        let approved = self.draft(
            Event::Approved,
            by.record(json!({"approval": aid, "digest": canonical::digest(&self.args)})),
        );
        if let Err(e) = broker.ledger.record(vec![approved]) {
            broker.fault(&e);
            return self.internal(&e);
        }
        run(self, entry, &plan);
    }
}

/// Wait for the decision on `waiter` while a thread watches the requester: its end of input
/// (or any byte, which the protocol does not allow after the request) withdraws `approval`.
/// Without a thread the wait goes on unwatched, as before.
fn wait_watching(
    stream: &UnixStream,
    broker: &Broker,
    waiter: crate::approvals::Waiter,
    approval: &ApprovalId,
) -> Verdict {
    let (Ok(clone), Ok(own)) = (stream.try_clone(), stream.try_clone()) else {
        return broker.approvals.wait(waiter);
    };
    std::thread::scope(|s| {
        let watcher = std::thread::Builder::new().spawn_scoped(s, move || {
            // A timeout is not the requester going away: only its end of input (or a byte) is.
            bxcore::deadline::wait_for_hangup(&clone);
            broker.approvals.withdraw(approval);
        });
        let verdict = broker.approvals.wait(waiter);
        // Shutting down our reading half wakes the watcher; the approval is decided by now,
        // so its `withdraw` finds nothing pending.
        let _ = own.shutdown(std::net::Shutdown::Read);
        if let Ok(w) = watcher {
            let _ = w.join();
        }
        verdict
    })
}

/// Run an allowed call, raise the session by its result, and answer. A run that fails after it
/// ran against a root's files raises as its result would have.
fn run(c: &mut Call<'_>, entry: &Entry, plan: &Plan) {
    match entry.run(&c.args, plan, &c.broker.env, &c.session) {
        Ok(out) => {
            // Released from a secret root: what came from the root (never the box's own words
            // or a root's path) fingerprinted, durably, before anyone sees it.
            if plan.carries.class == DataClass::Secret {
                if let Err(e) = c.release(&out) {
                    bxharden::log::fail(&e);
                    return c.answer(ToolResponse::Failed {
                        message: NOT_RECORDED.to_string(),
                    });
                }
            }
            let mut detail = json!({
                "class": plan.carries.class,
                "untrusted_output": plan.carries.untrusted,
                "content_bytes": out.content.len(),
            });
            if let Some(summary) = &out.summary {
                detail["ended"] = json!(summary);
            }
            if plan.marks_writes {
                // What it wrote is marked untrusted (`docs/policy.md`, "Marks").
                detail["marks_writes"] = json!(true);
            }
            match c.broker.ledger.raise(
                &c.session,
                c.call,
                &c.tool,
                plan.carries,
                Event::Result,
                detail,
            ) {
                Ok(_) => c.answer(ToolResponse::Result {
                    content: out.content,
                    class: plan.carries.class,
                    untrusted: plan.carries.untrusted,
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
            let touched = match (&e, entry.declared().reads) {
                (ToolError::Touched(reached, _), _) => Some(plan.carries.join(reached.label)),
                (_, Reads::Root) => Some(plan.carries),
                (_, Reads::Fixed(_)) => None,
            };
            c.fail(Vec::new(), e.to_string(), touched);
        }
    }
}

impl Call<'_> {
    /// Fingerprint what `out` released from a secret root, and tell the owner what the owner
    /// must know of it: a store now full (egress and write-down stop), a fingerprint that will
    /// deny ordinary text (a short secret, a host name: perhaps planted by the model).
    fn release(&self, out: &toolkit::Output) -> Result<(), crate::fingerprints::StoreError> {
        let paths: Vec<String> = self
            .broker
            .env
            .roots
            .iter()
            .map(|r| r.path.display().to_string())
            .collect();
        let cut: Vec<&str> = paths.iter().map(String::as_str).collect();
        let r = self.broker.fingerprints.release(&out.released(), &cut)?;
        let whose = format!(
            "{} call {} of session {}",
            self.tool,
            self.call.0,
            self.session.as_str()
        );
        if r.filled {
            let full = crate::fingerprints::Full::Capacity;
            self.broker.log(
                FULL_ANCHOR,
                &format!(
                    "brokerd: {full} ({whose}): egress and write-down are denied for every \
                     session until the owner acts; {}",
                    bxcore::runbook::pointer(FULL_ANCHOR)
                ),
            );
        }
        if let Some(weak) = r.weak {
            self.broker.log(
                WEAK_ANCHOR,
                &format!(
                    "brokerd: {whose} released from a secret root: {weak}; {}",
                    bxcore::runbook::pointer(WEAK_ANCHOR)
                ),
            );
        }
        Ok(())
    }
}

/// What a lease given with an approval would cover, and for how long, for a person: a lease
/// lives `ttl` (`[approvals] lease_ttl_ms`) unless the session ends or the owner revokes it
/// first, and the owner is told that, not "for ever".
pub fn lease_scope(tool: &str, scope: &str, rule: AskRule, ttl: Duration) -> String {
    let place = if scope == "any" {
        format!("any call of {tool}")
    } else {
        format!("{tool} calls in {scope}")
    };
    let when = match rule {
        AskRule::UntrustedEffect => "while the session has read third-party content",
        AskRule::Always => "that always ask the owner",
        AskRule::WhileUntrusted => "that ask while the session has read third-party content",
    };
    format!("{place} {when}, in this session for {}", for_person(ttl))
}

/// `ttl` as a person says it: `1 h`, `90 min`, `45 s`.
fn for_person(ttl: Duration) -> String {
    let s = ttl.as_secs().max(1);
    match s {
        _ if s % 3600 == 0 => format!("{} h", s / 3600),
        _ if s % 60 == 0 => format!("{} min", s / 60),
        _ => format!("{s} s"),
    }
}

/// What the chain holds about a failure: the digest and length of its message, never the text,
/// which may echo argument values (a path, a URL of any length).
pub fn failed_detail(message: &str) -> Value {
    json!({
        "message_digest": canonical::sha256_hex(message.as_bytes()),
        "message_bytes": message.len(),
    })
}

/// A call decided again when the owner approved it.
#[derive(Debug)]
pub enum Redecision {
    /// The policy still lets it run (as it is now planned): allowed, or asked for the same
    /// reason the owner approved.
    Runs(Plan),
    /// The policy now asks for another reason than the one the owner saw: asked again.
    AskAgain {
        plan: Plan,
        rule: AskRule,
        reason: String,
        state: Label,
    },
    /// The policy now denies it, with this reason.
    Denied(String),
    /// It can no longer be carried out.
    Failed(String, Option<Label>),
    /// The session's state cannot be read.
    Unreadable(crate::state::StateError),
}

impl Broker {
    /// The policy's decision for one call (`policy::decide`, the leak check against the
    /// fingerprint store within it); a call denied as a leak is logged with its pointer.
    pub fn decide<'r>(
        &'r self,
        session: &SessionId,
        call: CallId,
        tool: &str,
        args: &Value,
        state: Label,
    ) -> Decision<'r> {
        let d = policy::decide(
            &self.registry,
            &self.env,
            &self.fingerprints,
            tool,
            args,
            state,
        );
        if let Decision::Denied(policy::Denial {
            full: Some(full), ..
        }) = &d
        {
            self.log(
                FULL_ANCHOR,
                &format!(
                    "brokerd: denied {tool} call {} of session {}: {full}; {}",
                    call.0,
                    session.as_str(),
                    bxcore::runbook::pointer(FULL_ANCHOR)
                ),
            );
        }
        if let Decision::Denied(policy::Denial {
            leak: Some(how), ..
        }) = &d
        {
            self.log(
                LEAK_ANCHOR,
                &format!(
                    "brokerd: denied {tool} call {} of session {} as a leak ({}); {}",
                    call.0,
                    session.as_str(),
                    how.as_str(),
                    bxcore::runbook::pointer(LEAK_ANCHOR)
                ),
            );
        }
        d
    }

    /// Decide `tool(args)` for `session` against its state now: the second decision of a call
    /// the owner approved when asked for `asked`, in the broker thread and for the owner's
    /// answer. Whole: a deny denies, and an ask for another reason asks again.
    pub fn redecide(
        &self,
        session: &SessionId,
        tool: &str,
        args: &Value,
        asked: AskRule,
    ) -> Redecision {
        let state = match self.ledger.state(session) {
            Ok(s) => s,
            Err(e) => return Redecision::Unreadable(e),
        };
        match self.decide(session, CallId(0), tool, args, state) {
            Decision::Denied(d) => Redecision::Denied(d.reason),
            Decision::Failed { message, touched } => Redecision::Failed(message, touched),
            Decision::Allow { plan, .. } => Redecision::Runs(plan),
            Decision::Ask { plan, rule, .. } if rule == asked => Redecision::Runs(plan),
            Decision::Ask {
                plan, rule, reason, ..
            } => Redecision::AskAgain {
                plan,
                rule,
                reason,
                state,
            },
        }
    }
}
