//! Envelopes and every message kind, with the exact wire shapes of `docs/protocol.md`.
//!
//! Every struct and every enum variant refuses unknown keys: a key the protocol does not name is
//! `bad_message`, never silently dropped. Enums are internally tagged (`kind`, `outcome`, `type`,
//! `role`), so nested tags flatten into their parent object on the wire.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    ApprovalId, CallId, DataClass, ErrorCode, Label, LeaseId, PROTOCOL_VERSION, SessionId,
    Timestamp, TurnKey, WireError,
};

/// One frame's body: `{"v": 1, "id": 7, "final": true, "msg": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// `PROTOCOL_VERSION`.
    pub v: u32,
    /// Picked by the requester; every reply frame carries the same id.
    pub id: u64,
    /// `false` on interim frames (`turn_event`, `pending_approval`, `infer_delta`), `true` on
    /// the last. (`final` is a Rust keyword, hence the field's name.)
    #[serde(rename = "final")]
    pub last: bool,
    pub msg: Message,
}

impl Envelope {
    /// An envelope of this protocol version.
    pub fn new(id: u64, last: bool, msg: Message) -> Envelope {
        Envelope {
            v: PROTOCOL_VERSION,
            id,
            last,
            msg,
        }
    }

    /// A final `error` frame.
    pub fn error(id: u64, code: ErrorCode, detail: impl Into<String>) -> Envelope {
        Envelope::new(
            id,
            true,
            Message::Error(WireError {
                code,
                detail: detail.into(),
            }),
        )
    }
}

/// Every message kind, tagged by `kind` in snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// Every socket: is this daemon alive, and which is it?
    Ping {},
    Pong(Pong),
    /// loop.sock: one turn of a session.
    Turn(Turn),
    /// bridge.sock: one turn of a channel's session, named by the owner's message it answers.
    ChannelTurn(ChannelTurn),
    TurnEvent {
        event: TurnEvent,
    },
    TurnDone(TurnDone),
    /// broker.sock: one tool call.
    ToolRequest(ToolRequest),
    ToolResponse(ToolResponse),
    /// broker.sock: the tools the model may be offered.
    ToolsList {},
    Tools(Tools),
    /// loop.sock: is every part a turn needs there? (No model request.)
    Health {},
    HealthReport(HealthReport),
    /// infer.sock: does the model provider answer? (No token spent.)
    ProviderProbe {},
    ProviderReport(ProviderReport),
    /// gateway.sock: the hosts gatewayd may fetch from.
    HostsList {},
    Hosts(Hosts),
    /// admin.sock: the owner's view and decisions.
    ApprovalsList {},
    Approvals(Approvals),
    /// One pending approval whole, by id (the list carries summaries, so it always fits).
    ApprovalShow(ApprovalShow),
    Approval(Approval),
    ApprovalDecision(ApprovalDecision),
    ApprovalAck(ApprovalAck),
    /// admin.sock: the owner's leases.
    LeasesList {},
    Leases(Leases),
    LeaseRevoke(LeaseRef),
    LeaseRevoked(LeaseRef),
    /// admin.sock: the files an untrusted session wrote (their marks), and clearing one.
    MarksList {},
    Marks(Marks),
    MarkClear(MarkRef),
    MarkCleared(MarkCleared),
    AuditVerify {},
    /// admin.sock: verify, and check that the chain holds a head the owner kept.
    AuditVerifyHead(AuditHead),
    AuditReport(AuditReport),
    /// state.sock: memoryd asks what a session has read; the answer is its label.
    SessionState(SessionQuery),
    SessionStateReply(Label),
    /// infer.sock: one model call.
    InferRequest(InferRequest),
    InferDelta(InferDelta),
    InferReply(InferReply),
    /// memory.sock: one finished turn.
    TurnRecord(TurnRecord),
    TurnFiled(TurnFiled),
    /// memory.sock: what the owner's main memory holds about a query, at the start of a turn.
    MemoryRecall(MemoryRecall),
    /// memories.sock: the owner's view of memory.
    MemoryRecent(MemoryRecent),
    MemorySearch(MemorySearch),
    Memories(Memories),
    MemoryForget(MemoryForget),
    MemoryForgotten(MemoryForgotten),
    MemoryStatus {},
    MemoryReport(MemoryReport),
    /// gateway.sock: one request to the web.
    FetchRequest(FetchRequest),
    FetchReply(FetchReply),
    /// gateway.sock: the web answered, and the fetch was refused or failed after that (a
    /// redirect not followed, a body cut off, a page that could not be reduced to text). The
    /// detail names the refusal by category and never quotes what the web sent; the caller
    /// treats it as third-party content all the same, since the answer reached the box.
    FetchFailed(WireError),
    /// channel.sock: the owner asks channeld for a pairing code for one room.
    ChannelPair(ChannelPair),
    ChannelPairing(ChannelPairing),
    /// channel.sock: how the channel is (`bxctl status`).
    ChannelStatus {},
    ChannelReport(ChannelReport),
    /// Any socket: the request was not answered.
    Error(WireError),
}

impl Message {
    /// The wire name of this message's kind, e.g. `tool_request`.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Ping {} => "ping",
            Message::Pong(_) => "pong",
            Message::Turn(_) => "turn",
            Message::ChannelTurn(_) => "channel_turn",
            Message::TurnEvent { .. } => "turn_event",
            Message::TurnDone(_) => "turn_done",
            Message::ToolRequest(_) => "tool_request",
            Message::ToolResponse(_) => "tool_response",
            Message::ToolsList {} => "tools_list",
            Message::Tools(_) => "tools",
            Message::Health {} => "health",
            Message::HealthReport(_) => "health_report",
            Message::ProviderProbe {} => "provider_probe",
            Message::ProviderReport(_) => "provider_report",
            Message::HostsList {} => "hosts_list",
            Message::Hosts(_) => "hosts",
            Message::ApprovalsList {} => "approvals_list",
            Message::Approvals(_) => "approvals",
            Message::ApprovalShow(_) => "approval_show",
            Message::Approval(_) => "approval",
            Message::ApprovalDecision(_) => "approval_decision",
            Message::ApprovalAck(_) => "approval_ack",
            Message::LeasesList {} => "leases_list",
            Message::Leases(_) => "leases",
            Message::LeaseRevoke(_) => "lease_revoke",
            Message::LeaseRevoked(_) => "lease_revoked",
            Message::MarksList {} => "marks_list",
            Message::Marks(_) => "marks",
            Message::MarkClear(_) => "mark_clear",
            Message::MarkCleared(_) => "mark_cleared",
            Message::AuditVerify {} => "audit_verify",
            Message::AuditVerifyHead(_) => "audit_verify_head",
            Message::AuditReport(_) => "audit_report",
            Message::SessionState(_) => "session_state",
            Message::SessionStateReply(_) => "session_state_reply",
            Message::InferRequest(_) => "infer_request",
            Message::InferDelta(_) => "infer_delta",
            Message::InferReply(_) => "infer_reply",
            Message::TurnRecord(_) => "turn_record",
            Message::TurnFiled(_) => "turn_filed",
            Message::MemoryRecall(_) => "memory_recall",
            Message::MemoryRecent(_) => "memory_recent",
            Message::MemorySearch(_) => "memory_search",
            Message::Memories(_) => "memories",
            Message::MemoryForget(_) => "memory_forget",
            Message::MemoryForgotten(_) => "memory_forgotten",
            Message::MemoryStatus {} => "memory_status",
            Message::MemoryReport(_) => "memory_report",
            Message::FetchRequest(_) => "fetch_request",
            Message::FetchReply(_) => "fetch_reply",
            Message::FetchFailed(_) => "fetch_failed",
            Message::ChannelPair(_) => "channel_pair",
            Message::ChannelPairing(_) => "channel_pairing",
            Message::ChannelStatus {} => "channel_status",
            Message::ChannelReport(_) => "channel_report",
            Message::Error(_) => "error",
        }
    }

    /// The one `pong` every daemon answers `ping` with.
    pub fn pong(daemon: &str, version: &str) -> Message {
        Message::Pong(Pong {
            daemon: daemon.to_string(),
            version: version.to_string(),
            protocol: PROTOCOL_VERSION,
        })
    }
}

/// `pong {daemon, version, protocol}`: the daemon's name, its crate version, the protocol it
/// speaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pong {
    pub daemon: String,
    pub version: String,
    pub protocol: u32,
}

/// `turn {session, resume, text}`: `resume: false` creates the session, `true` continues it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub session: SessionId,
    pub resume: bool,
    pub text: String,
}

/// `channel_turn {session, resume, text, key}`: a `turn` from a channel daemon, with the key of
/// the owner's message it is (a Matrix event id). loopd keeps the key with the turn; the same key
/// again in that session is refused `turn_repeated` and runs nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelTurn {
    pub session: SessionId,
    pub resume: bool,
    pub text: String,
    pub key: TurnKey,
}

impl ChannelTurn {
    /// The turn, and the key it is kept under.
    pub fn split(self) -> (Turn, TurnKey) {
        let ChannelTurn {
            session,
            resume,
            text,
            key,
        } = self;
        (
            Turn {
                session,
                resume,
                text,
            },
            key,
        )
    }
}

/// What a turn does, sent to the channel as it happens. Tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TurnEvent {
    /// A piece of the assistant's text, as it streams.
    AssistantText { text: String },
    /// The model asked for a tool.
    ToolCall {
        call: CallId,
        tool: String,
        args: Value,
    },
    /// The broker asked the owner; the call waits until `expires`.
    ToolPending {
        call: CallId,
        approval: ApprovalId,
        expires: Timestamp,
    },
    /// The call's outcome and what the model is shown.
    ToolResult {
        call: CallId,
        outcome: Outcome,
        text: String,
        /// For the owner, never shown to the model: the outage behind a `failed` (the broker
        /// could not be reached, or answered that its state is damaged), ending with its runbook
        /// pointer. Absent when the tool itself answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outage: Option<String>,
    },
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Result,
    Failed,
    Denied,
}

/// `turn_done {session, usage}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnDone {
    pub session: SessionId,
    pub usage: Usage,
}

/// Tokens used: `{input_tokens, output_tokens}`. A provider that reports none gives zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    /// The sum of two usages, saturating.
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
        }
    }
}

/// `tool_request {session, call, tool, args}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRequest {
    pub session: SessionId,
    pub call: CallId,
    pub tool: String,
    pub args: Value,
}

/// The broker's answer to a tool call, tagged by `outcome`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolResponse {
    /// The tool ran: its content, and the class and trust of what it carried back.
    Result {
        content: String,
        class: DataClass,
        untrusted: bool,
    },
    /// The tool could not run, or failed: nothing was read, nothing raised.
    Failed { message: String },
    /// The policy or the owner said no.
    Denied { reason: String },
    /// Interim: the owner is asked; the final answer comes before `expires`.
    PendingApproval {
        approval: ApprovalId,
        expires: Timestamp,
    },
}

/// `tools {tools, workspace}`: what the model may be offered, and the workspace roots its tools
/// reach (loopd tells the model where they are: the system message of a new session).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tools {
    pub tools: Vec<ToolDef>,
    pub workspace: Vec<WorkspaceRoot>,
}

/// One workspace root as the model is told of it: its name (what a relative path starts with),
/// where it is, its class, whether it may be written, whether third parties wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRoot {
    pub name: String,
    pub path: String,
    pub class: DataClass,
    pub writable: bool,
    pub untrusted: bool,
}

/// `hosts {hosts}`: gatewayd's allow-list, as its entries are written (`example.org`,
/// `*.example.org`); the answer to `hosts_list`. Nothing else about an entry (its credential) is
/// told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hosts {
    pub hosts: Vec<String>,
}

/// `provider_report {provider, reachable, detail}`: whether inferproxy's model provider answers,
/// asked without spending a token (its list of models, or a connection); the answer to
/// `provider_probe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderReport {
    /// `openai`, `anthropic` or `script`, and where.
    pub provider: String,
    pub reachable: bool,
    /// What was asked and what came back; for an unreachable provider, why, with its pointer.
    pub detail: String,
}

/// `health_report {checks}`: loopd's answer to `health` on loop.sock: each part a turn needs,
/// asked as a turn would ask it, without a model request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthReport {
    pub checks: Vec<HealthCheck>,
}

/// One part of a health report: `inference`, `provider`, `broker`, `memory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    pub part: String,
    pub ok: bool,
    /// What answered, or why not (with its runbook pointer).
    pub detail: String,
}

/// A tool's definition as the model sees it: `parameters` is a JSON Schema object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// `approvals {pending}`: a summary of each pending approval, oldest first, without the
/// arguments (`approval_show` fetches one whole), so the list fits in a frame however large the
/// arguments are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approvals {
    pub pending: Vec<ApprovalSummary>,
}

/// The longest `tool` and `reason` a summary carries, in bytes: with brokerd's bound on the
/// number pending, the list always fits in a frame.
pub const SUMMARY_TEXT_MAX: usize = 512;

/// One pending approval without its arguments: their size and digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSummary {
    pub approval: ApprovalId,
    pub session: SessionId,
    pub call: CallId,
    pub tool: String,
    /// The size of the canonical JSON of the arguments, in bytes.
    pub args_bytes: u64,
    /// sha256 (hex) of the canonical JSON of the arguments.
    pub digest: String,
    pub taint: DataClass,
    pub untrusted: bool,
    pub rule: String,
    pub reason: String,
    /// What a lease given with this approval would cover (`lease_scope` of [`Approval`]).
    pub lease_scope: String,
    pub requested: Timestamp,
    pub expires: Timestamp,
}

/// `approval_show {approval}`: answered by `approval {..}`, the whole pending approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalShow {
    pub approval: ApprovalId,
}

/// A pending approval, as the owner sees it: what the owner sees is what the owner approves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    pub approval: ApprovalId,
    pub session: SessionId,
    pub call: CallId,
    pub tool: String,
    /// The whole arguments.
    pub args: Value,
    /// sha256 (hex) of the canonical JSON of `args`.
    pub digest: String,
    /// The session's taint when asked.
    pub taint: DataClass,
    /// Whether the session had read third-party content when asked.
    pub untrusted: bool,
    /// The policy step that asked.
    pub rule: String,
    /// Why, for a person.
    pub reason: String,
    /// What a lease given with this approval would cover: the tool, where its calls land (a
    /// workspace root, a host), and the rule that asked (`workspace_write into the root notes,
    /// while the session has read third-party content`).
    pub lease_scope: String,
    pub requested: Timestamp,
    pub expires: Timestamp,
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn clip(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl Approval {
    /// Its summary for `approvals`: the arguments' size and digest instead of the arguments,
    /// `tool` and `reason` cut to [`SUMMARY_TEXT_MAX`] bytes.
    pub fn summary(&self) -> ApprovalSummary {
        ApprovalSummary {
            approval: self.approval.clone(),
            session: self.session.clone(),
            call: self.call,
            tool: clip(&self.tool, SUMMARY_TEXT_MAX),
            args_bytes: crate::canonical::to_string(&self.args).len() as u64,
            digest: self.digest.clone(),
            taint: self.taint,
            untrusted: self.untrusted,
            rule: clip(&self.rule, SUMMARY_TEXT_MAX),
            reason: clip(&self.reason, SUMMARY_TEXT_MAX),
            lease_scope: clip(&self.lease_scope, SUMMARY_TEXT_MAX),
            requested: self.requested,
            expires: self.expires,
        }
    }
}

/// `approval_decision {approval, allow, lease, approver}`: `lease: true` with `allow: true` also
/// allows the calls like this one (the approval's `lease_scope`) in the session until the lease
/// expires or is revoked; on decide.sock `approver` says who, in the channel's
/// terms, decided (a Matrix user id), which brokerd records in the audit chain beside the
/// peer's uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    pub approval: ApprovalId,
    pub allow: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub lease: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One lease: the owner's "allow for this session". While it lives, a call of `session` that
/// the policy would put to the owner for `rule`, of `tool`, landing in `scope`, runs without
/// asking, recorded as approved by this lease. It never lets through a call the policy denies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    pub lease: LeaseId,
    pub session: SessionId,
    pub tool: String,
    /// Where the calls land: `root notes`, `host example.org`, or `any` for a tool with no
    /// place of its own.
    pub scope: String,
    /// The policy step it answers (`untrusted-effect`, `approval-always`, ...).
    pub rule: String,
    /// Who granted it: `uid 1000`.
    pub by: String,
    pub granted: Timestamp,
    pub expires: Timestamp,
}

/// `leases {leases}`: every live lease, the oldest first; the answer to `leases_list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Leases {
    pub leases: Vec<Lease>,
}

/// `lease_revoke {lease}`, answered by `lease_revoked {lease}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRef {
    pub lease: LeaseId,
}

/// One marked object: what an untrusted session wrote, untrusted from then on whatever root it
/// lies in, until the owner clears it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mark {
    /// Where the kernel resolved it.
    pub path: String,
    /// The root it lies in, and its path there (empty: the root itself).
    pub root: String,
    pub rel: String,
    /// The whole tree beneath it is marked (a `run` call's writable root).
    pub whole: bool,
    pub marked: Timestamp,
}

/// `marks {marks, max, left_off}`: the marks, oldest first, as many as fit in half a frame
/// (`left_off` counts the rest); `max` is the store's bound. The answer to `marks_list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Marks {
    pub marks: Vec<Mark>,
    pub max: u64,
    pub left_off: u64,
}

/// `mark_clear {path}`: the owner clears the mark `path` names (its resolved path, or
/// `<root>/<rel>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkRef {
    pub path: String,
}

/// `mark_cleared {cleared}`: the marks cleared, recorded in the audit chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkCleared {
    pub cleared: Vec<Mark>,
}

/// The longest `approver` brokerd records, in bytes (a Matrix user id is at most 255).
pub const APPROVER_MAX: usize = 255;

/// `approval_ack {approval}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalAck {
    pub approval: ApprovalId,
}

/// `audit_verify_head {seq, hash}`: a head the owner kept (from the journal), to check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditHead {
    pub seq: u64,
    /// 64 hex.
    pub hash: String,
}

/// `audit_report {records, head, ok, detail}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditReport {
    pub records: u64,
    /// The last record's hash (64 hex), or 64 zeros for an empty chain.
    pub head: String,
    pub ok: bool,
    pub detail: String,
}

/// `session_state {session}`: memoryd's question on state.sock, answered by
/// `session_state_reply {class, untrusted}`: the session's [`Label`] as brokerd holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionQuery {
    pub session: SessionId,
}

/// A chat message for inference, tagged by `role`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub enum ChatMessage {
    System {
        text: String,
    },
    User {
        text: String,
    },
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        call: CallId,
        text: String,
    },
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub call: CallId,
    pub tool: String,
    pub args: Value,
}

/// `infer_request {slot, messages, tools, first_call}`: the reply's tool calls are numbered from
/// `first_call`, so loopd owns every `CallId`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferRequest {
    pub slot: String,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolDef>,
    pub first_call: CallId,
}

/// `infer_delta {text}`: a piece of the reply's text, as it streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferDelta {
    pub text: String,
}

/// `infer_reply {message, usage}`: the whole assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferReply {
    pub message: ChatMessage,
    pub usage: Usage,
}

/// `turn_record {session, turn, messages}`: a finished turn, numbered from 1 in its session,
/// user text first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnRecord {
    pub session: SessionId,
    pub turn: u64,
    pub messages: Vec<ChatMessage>,
}

/// `turn_filed {session, turn}`: the record is durable on memoryd's side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnFiled {
    pub session: SessionId,
    pub turn: u64,
}

/// Where memoryd files a turn (its `[[routes]]`): the owner's main memory (read back into
/// context by recall), quarantine (kept, never read back), or the device's local store only
/// (never sent to a remote store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryRoute {
    Main,
    Quarantine,
    Local,
}

impl MemoryRoute {
    /// Every route, in this order.
    pub const ALL: [MemoryRoute; 3] = [
        MemoryRoute::Main,
        MemoryRoute::Quarantine,
        MemoryRoute::Local,
    ];

    /// Its name on the wire and in configuration: `main`, `quarantine`, `local`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryRoute::Main => "main",
            MemoryRoute::Quarantine => "quarantine",
            MemoryRoute::Local => "local",
        }
    }

    /// The route called `name`.
    pub fn from_name(name: &str) -> Option<MemoryRoute> {
        MemoryRoute::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl std::fmt::Display for MemoryRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `memory_recall {session, query, max_tokens}`: loopd's question at the start of a turn. The
/// answer (`memories`) comes from the owner's main memory only, at most `max_tokens` (bytes / 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRecall {
    pub session: SessionId,
    pub query: String,
    pub max_tokens: u32,
}

/// `memory_recent {route, limit}`: the latest filed turns, newest first, of one route or all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRecent {
    #[serde(default)]
    pub route: Option<MemoryRoute>,
    pub limit: u32,
}

/// `memory_search {query, limit}`: the owner's search over every route, best match first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySearch {
    pub query: String,
    pub limit: u32,
}

/// One filed turn: the text of its user and assistant messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    pub session: SessionId,
    pub turn: u64,
    pub route: MemoryRoute,
    /// The session's class when the turn was filed.
    pub class: DataClass,
    pub untrusted: bool,
    pub filed: Timestamp,
    pub text: String,
}

/// `memories {memories}`: the answer to `memory_recall`, `memory_recent` and `memory_search`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memories {
    pub memories: Vec<Memory>,
}

/// `memory_forget {session}`: the owner deletes every filed turn of one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryForget {
    pub session: SessionId,
}

/// `memory_forgotten {session, turns, queued}`: `turns` were deleted (or hidden at once);
/// `queued` when a remote store deletes them later (the turns are hidden from every answer now).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryForgotten {
    pub session: SessionId,
    pub turns: u64,
    pub queued: bool,
}

/// `memory_report {store, outbox, undecided}`: for `bxctl status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryReport {
    /// What files the turns: the stores and where they are.
    pub store: String,
    /// Records durable in memoryd's outbox, not yet filed.
    pub outbox: u64,
    /// Why the oldest waits, when it waits for something (the broker's answer, a store).
    pub waiting: Option<String>,
    /// The remote store, when one is configured: whether it answered just now, and why not.
    pub remote: Option<RemoteHealth>,
}

/// Whether memoryd's remote store (Honcho) answered a question that changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteHealth {
    pub reachable: bool,
    /// What answered, or why not (with its runbook pointer).
    pub detail: String,
}

/// One HTTP header, in order; a name may repeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// `fetch_request {url, method, headers, body, max_bytes}`: one request for gatewayd to make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchRequest {
    pub url: String,
    pub method: String,
    pub headers: Vec<Header>,
    pub body: String,
    pub max_bytes: u64,
}

/// `fetch_reply {url, status, headers, body, truncated}`: the URL the last redirect led to, the
/// body as readable text (HTML reduced, invalid UTF-8 replaced), read no further than
/// `max_bytes` with `truncated: true`, and the headers without `Set-Cookie`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchReply {
    pub url: String,
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: String,
    pub truncated: bool,
}

/// `channel_pair {room}`: a one-time code for the owner to send from their Matrix account in
/// `room` (one of the rooms channeld is configured with); the sender is then bound as the owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelPair {
    pub room: String,
}

/// `channel_pairing {room, code, expires}`: the code, valid once, until `expires`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelPairing {
    pub room: String,
    pub code: String,
    pub expires: Timestamp,
}

/// `channel_report {homeserver, user, connected, detail, owners, rooms}`: what channeld is
/// connected to as whom, whether its last sync worked (`detail` says why not, with its runbook
/// pointer), the owners paired and the rooms it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelReport {
    pub homeserver: String,
    pub user: String,
    pub connected: bool,
    pub detail: String,
    pub owners: Vec<String>,
    pub rooms: Vec<String>,
}
