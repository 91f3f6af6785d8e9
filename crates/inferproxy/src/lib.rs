//! inferproxy: the model's only door.
//!
//! loopd asks for one inference per connection on infer.sock (`infer_request`); inferproxy is
//! the only process of the box that holds a model API key and, with gatewayd, the only one that
//! opens TCP, to one provider's port. It translates the box's chat messages to the provider's
//! wire format and back, streams the reply's text as `infer_delta` frames as it arrives, and
//! answers `infer_reply` with the whole message, or `error inference` with a runbook pointer.
//! Three providers: OpenAI-compatible (`openai`), Anthropic (`anthropic`) and a script file
//! (`script`) for the dev box, the demo and tests. `docs/inference.md` tells how to set each up.

pub mod anthropic;
pub mod config;
pub mod daemon;
pub mod error;
pub mod key;
pub mod openai;
pub mod provider;
pub mod redact;
pub mod reply;
pub mod resolve;
pub mod retry;
pub mod script;
pub mod sse;
pub mod stream;

pub use config::Config;
pub use error::InferError;
pub use key::ApiKey;
pub use provider::{Inference, Provider};
