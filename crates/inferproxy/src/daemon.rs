//! What inferproxy's table (`main.rs`) is made of: what its configuration names, read (the key,
//! the CA bundle, the script), what it says it serves, its sandbox, and the handler of its one
//! socket.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use bxcore::layout::InferRequests;
use bxcore::runbook::Anchored;
use bxcore::{Envelope, InferDelta, InferRequest, Message};
use bxharden::daemon::StartError;
use bxharden::{Profile, SeccompProfile, serve};

use crate::config::Config;
use crate::provider::{Inference, Provider};

/// Everything the configuration names, read while the whole filesystem is there: the key, the CA
/// bundle, the script.
pub fn inference(cfg: &Config) -> Result<Inference, StartError> {
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    Inference::from_config(cfg, creds.as_deref()).map_err(|e| StartError::anchored(&e))
}

/// What the daemon serves, for `check` and the startup notice. Never the key.
pub fn describe(cfg: &Config, inference: &Inference) -> String {
    let provider = match inference.provider() {
        Provider::Script(s) => {
            let (steps, rules) = s.size();
            format!(
                "script {} ({steps} steps, {rules} rules)",
                s.path().display()
            )
        }
        Provider::Http(h) => {
            let e = h.endpoint();
            let key = if cfg.provider.keyless {
                "no key: keyless".to_string()
            } else {
                format!("key from {}", h.key_source().display())
            };
            format!(
                "{} at {} (TCP port {}, {key})",
                cfg.provider.kind.name(),
                e.url,
                e.port
            )
        }
    };
    let slots: Vec<String> = cfg
        .slots
        .iter()
        .map(|(n, s)| {
            format!(
                "{n} (model {}, max_tokens {}, context_tokens {})",
                s.model, s.max_tokens, s.context_tokens
            )
        })
        .collect();
    format!(
        "inference on {} by {provider}; slots: {}; timeout {} ms, {} retries",
        cfg.infer_socket().display(),
        slots.join(", "),
        cfg.limits.timeout_ms,
        cfg.limits.retries
    )
}

/// What inferproxy may touch: its own directory and its configuration; for an HTTP provider,
/// the resolver's files, the CA bundle and TCP connect to the provider's port.
pub fn profile(cfg: &Config, inference: &Inference, config: &Path) -> Profile {
    let mut profile = Profile::new(SeccompProfile::Inferproxy)
        .read_write(cfg.own_dir())
        .read_only(config);
    if let Provider::Http(h) = inference.provider() {
        profile = profile.resolver_and_ca().connect_tcp(h.endpoint().port);
    }
    profile
}

/// One `infer_request`: its text streamed as `infer_delta` frames, then `infer_reply` or `error
/// inference`; or one `provider_probe`: whether the provider answers, without a token spent.
pub fn handle(mut stream: UnixStream, id: u64, request: InferRequests, inference: &Inference) {
    match request {
        InferRequests::InferRequest(req) => answer(&mut stream, id, &req, inference),
        InferRequests::ProviderProbe => {
            let report = inference.probe();
            if !report.reachable {
                bxharden::log::line(
                    bxcore::runbook::split_pointer(&report.detail)
                        .map_or(crate::error::UNREACHABLE_ANCHOR, |(_, a)| a),
                    &format!(
                        "inferproxy: the provider does not answer a probe: {}",
                        report.detail
                    ),
                );
            }
            let _ = serve::send(&mut stream, id, true, Message::ProviderReport(report));
        }
    }
}

fn answer(stream: &mut UnixStream, id: u64, req: &InferRequest, inference: &Inference) {
    let alive = std::cell::Cell::new(true);
    let fd = stream.as_raw_fd();
    // loopd shuts the connection down when the owner cancels the turn: then the provider's
    // answer is left unread and its connection closed, so a local model stops generating
    // rather than finishing a reply nobody reads.
    let gone = || !alive.get() || peer_closed(fd);
    let result = inference.infer_while(
        req,
        &mut |text| {
            // A peer that went away is not written to again.
            if alive.get() {
                alive.set(serve::send(
                    stream,
                    id,
                    false,
                    Message::InferDelta(InferDelta {
                        text: text.to_string(),
                    }),
                ));
            }
        },
        &gone,
    );
    let alive = alive.get();
    match result {
        Ok(reply) => {
            let calls = match &reply.message {
                bxcore::ChatMessage::Assistant { tool_calls, .. } => tool_calls.len(),
                _ => 0,
            };
            tracing::info!(
                "inferproxy: slot {}: a reply with {calls} tool call{}, {} input and {} output tokens",
                req.slot,
                if calls == 1 { "" } else { "s" },
                reply.usage.input_tokens,
                reply.usage.output_tokens
            );
            if !alive {
                return;
            }
            match bxcore::write_frame(stream, &Envelope::new(id, true, Message::InferReply(reply)))
            {
                Ok(()) => {}
                Err(bxcore::FrameError::TooLarge(n)) => {
                    let e = crate::error::InferError::malformed(format!(
                        "the reply is {n} bytes as a frame, over the limit of {}",
                        bxcore::MAX_FRAME
                    ));
                    fail(stream, id, &req.slot, &e);
                }
                Err(_) => {}
            }
        }
        Err(e) => {
            if alive {
                fail(stream, id, &req.slot, &e);
            } else {
                log_failure(&req.slot, &e);
            }
        }
    }
}

/// Whether the peer on `fd` closed its end: a read that would find its end of file, peeked
/// without waiting (the request was read whole, and loopd sends nothing more on it).
fn peer_closed(fd: std::os::fd::RawFd) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    let mut one = [0u8; 1];
    match recv(fd, &mut one, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(0) => true,
        Ok(_) | Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => false,
        Err(_) => true,
    }
}

fn log_failure(slot: &str, e: &crate::InferError) {
    // The slot is the client's text: escaped and bounded, it stays on its one line.
    let slot = crate::error::excerpt(slot);
    bxharden::log::fail_in(&format_args!("slot {slot}"), e);
}

fn fail(stream: &mut UnixStream, id: u64, slot: &str, e: &crate::InferError) {
    log_failure(slot, e);
    let _ = bxcore::write_frame(
        stream,
        &Envelope::error(id, e.code(), e.pointed().to_string()),
    );
}
