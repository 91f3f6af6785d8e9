//! `web_fetch {url}`: a page from the web, through gatewayd, the tools' only door to the network.
//! Declared egress with `egress_max = private` (the owner's words may shape a query to the web,
//! nothing secret may) and public, untrusted output. Until a gateway is configured it is decided
//! like any call and then fails, so the policy's answers are the same before and after.

use std::time::Duration;

use bxcore::{DataClass, FetchReply, FetchRequest, Message};
use serde_json::Value;

use crate::args::FetchArgs;
use crate::{ApprovalRule, Declared, Effect, Env, Output, Plan, Reads, Tool, ToolError};

/// What `web_fetch` answers while `[gateway] socket` is not set.
pub const NO_GATEWAY: &str = "no gateway is configured";
/// The most of a page's body a fetch returns.
pub const MAX_BODY: u64 = 256 * 1024;
/// How long a fetch may take, the gateway's own limits included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
pub struct WebFetch;

impl Tool for WebFetch {
    type Args = FetchArgs;
    fn name(&self) -> &'static str {
        "web_fetch"
    }
    fn description(&self) -> &'static str {
        "Fetch a web page over HTTPS and return its text."
    }
    fn parameters(&self) -> Value {
        FetchArgs::schema()
    }
    fn declared(&self) -> Declared {
        Declared {
            reads: Reads::Fixed(DataClass::Public),
            untrusted_output: true,
            effect: Effect::Egress {
                max: DataClass::Private,
            },
            approval: ApprovalRule::Never,
        }
    }
    fn plan(&self, _args: &FetchArgs, _env: &Env) -> Result<Plan, ToolError> {
        Ok(Plan {
            reads: DataClass::Public,
            untrusted_output: true,
            effect: self.declared().effect,
            writes_into: None,
        })
    }
    fn run(&self, args: &FetchArgs, _plan: &Plan, env: &Env) -> Result<Output, ToolError> {
        let url = args.url.as_str();
        let Some(socket) = &env.gateway else {
            return Err(ToolError::Failed(NO_GATEWAY.to_string()));
        };
        let request = Message::FetchRequest(FetchRequest {
            url: url.to_string(),
            method: "GET".to_string(),
            headers: Vec::new(),
            body: String::new(),
            max_bytes: MAX_BODY,
        });
        let unavailable = |why: String| {
            ToolError::Failed(format!(
                "the web gateway at {} could not fetch it: {why}",
                socket.display()
            ))
        };
        let reply = bxcore::client::call(socket, FETCH_TIMEOUT, 1, request, |_| {})
            .map_err(|e| unavailable(e.to_string()))?;
        match reply {
            Message::FetchReply(FetchReply {
                status,
                body,
                truncated,
                ..
            }) => {
                let mut content = format!("HTTP {status}\n\n{body}");
                if truncated {
                    content.push_str("\n(cut at the size limit)");
                }
                Ok(Output::text(content))
            }
            other => Err(unavailable(format!("it answered {}", other.kind()))),
        }
    }
}
