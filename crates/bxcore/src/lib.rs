//! The box's one wire protocol.
//!
//! Every socket in the box speaks length-prefixed JSON envelopes and nothing else, so that each
//! daemon parses exactly one format, strictly: a 4-byte big-endian length, then that many bytes
//! of UTF-8 JSON. Every struct refuses unknown keys and every id validates when it is
//! deserialized, so a malformed or hostile frame is refused at the edge, before any daemon logic
//! sees it. `docs/protocol.md` describes the protocol with an example frame per kind.

pub mod canonical;
mod class;
pub mod client;
pub mod deadline;
pub mod durable;
mod error;
mod frame;
mod ids;
mod label;
pub mod layout;
mod message;
pub mod queue;
pub mod runbook;
pub mod secret;
pub mod visible;

pub use class::DataClass;
pub use error::{ErrorCode, WireError};
pub use frame::{
    FrameError, MAX_FRAME, PROTOCOL_VERSION, decode_body, read_frame, read_frame_body,
    read_frame_len, write_frame,
};
pub use ids::{ApprovalId, CallId, IdError, LeaseId, SessionId, Timestamp, TurnKey};
pub use label::Label;
pub use message::{
    APPROVER_MAX, Approval, ApprovalAck, ApprovalDecision, ApprovalShow, ApprovalSummary,
    Approvals, AuditHead, AuditReport, ChannelPair, ChannelPairing, ChannelReport, ChannelTurn,
    ChatMessage, Envelope, FetchReply, FetchRequest, Header, HealthCheck, HealthReport, Hosts,
    InferDelta, InferReply, InferRequest, Lease, LeaseRef, Leases, Mark, MarkCleared, MarkRef,
    Marks, Memories, Memory, MemoryForget, MemoryForgotten, MemoryRecall, MemoryRecent,
    MemoryReport, MemoryRoute, MemorySearch, Message, Outcome, Pong, ProviderReport, RemoteHealth,
    SUMMARY_TEXT_MAX, SessionQuery, ToolCall, ToolDef, ToolRequest, ToolResponse, Tools, Turn,
    TurnDone, TurnEvent, TurnFiled, TurnRecord, Usage, WorkspaceRoot,
};
