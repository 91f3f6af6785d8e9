//! Is every part a turn needs there? loopd asks each the way a turn would, without a model
//! request: inferproxy (`ping`) and, through it, the model provider (`provider_probe`, which
//! spends no token), brokerd (`tools_list`, as every turn starts), memoryd (`ping`). The owner's
//! channel asks on loop.sock (`health`), and `loopd selftest` prints the same checks: one answer
//! to "is the box healthy", asked where the owner can reach it.

use std::path::Path;
use std::time::Duration;

use bxcore::client;
use bxcore::{HealthCheck, HealthReport, Message, PROTOCOL_VERSION};

use crate::config::Config;

/// How long each part has to answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The runbook entry of a provider that does not answer.
pub const PROVIDER_ANCHOR: &str = "inference-unreachable";

/// Every check, in the order a turn meets the parts.
pub fn report(cfg: &Config) -> HealthReport {
    let mut checks = vec![daemon("inference", "inferproxy", &cfg.inference.socket)];
    if checks[0].ok {
        checks.push(provider(&cfg.inference.socket));
    }
    checks.push(match &cfg.broker.socket {
        Some(socket) => broker(socket),
        // A box configured without a broker runs its turns with the core tools alone: nothing
        // a turn needs is missing.
        None => HealthCheck {
            part: "broker".into(),
            ok: true,
            detail: format!(
                "{}: turns have the core tools only",
                crate::broker_port::NOT_CONFIGURED
            ),
        },
    });
    if let Some(socket) = &cfg.memory.socket {
        checks.push(daemon("memory", "memoryd", socket));
    }
    HealthReport { checks }
}

fn check(part: &str, result: Result<String, String>) -> HealthCheck {
    let (ok, detail) = match result {
        Ok(d) => (true, d),
        Err(d) => (false, d),
    };
    HealthCheck {
        part: part.to_string(),
        ok,
        detail,
    }
}

/// `ping` answered by `daemon` speaking this protocol.
fn daemon(part: &str, daemon: &str, socket: &Path) -> HealthCheck {
    let got = client::ping(socket, TIMEOUT)
        .map_err(|e| format!("{daemon} on {} does not answer: {e}", socket.display()))
        .and_then(|pong| {
            if pong.daemon != daemon {
                Err(format!(
                    "{} is served by {}, not {daemon}",
                    socket.display(),
                    pong.daemon
                ))
            } else if pong.protocol != PROTOCOL_VERSION {
                Err(format!(
                    "{daemon} on {} speaks protocol {}, not {PROTOCOL_VERSION}",
                    socket.display(),
                    pong.protocol
                ))
            } else {
                Ok(format!(
                    "{daemon} {} answers on {}",
                    pong.version,
                    socket.display()
                ))
            }
        });
    check(part, got)
}

/// inferproxy asked whether its provider answers.
fn provider(socket: &Path) -> HealthCheck {
    let got = match client::call(socket, TIMEOUT, 1, Message::ProviderProbe {}, |_| {}) {
        Ok(Message::ProviderReport(r)) if r.reachable => Ok(r.detail),
        Ok(Message::ProviderReport(r)) => Err(r.detail),
        Ok(other) => Err(format!(
            "provider_probe on {} was answered with {}",
            socket.display(),
            other.kind()
        )),
        Err(e) => Err(format!(
            "inferproxy on {} could not say whether the model provider answers: {e}; {}",
            socket.display(),
            bxcore::runbook::pointer(PROVIDER_ANCHOR)
        )),
    };
    check("provider", got)
}

/// brokerd asked who it is, then for the tools, as a turn asks.
fn broker(socket: &Path) -> HealthCheck {
    let who = daemon("broker", "brokerd", socket);
    if !who.ok {
        return who;
    }
    let got = match client::call(socket, TIMEOUT, 1, Message::ToolsList {}, |_| {}) {
        Ok(Message::Tools(t)) => Ok(format!(
            "{}; brokerd offers {} tools over {} workspace roots",
            who.detail,
            t.tools.len(),
            t.workspace.len()
        )),
        Ok(other) => Err(crate::broker_port::unavailable_line(&format!(
            "tools_list on {} was answered with {}",
            socket.display(),
            other.kind()
        ))),
        Err(e) => Err(crate::broker_port::unavailable_line(&format!(
            "tools_list on {}: {e}",
            socket.display()
        ))),
    };
    check("broker", got)
}
