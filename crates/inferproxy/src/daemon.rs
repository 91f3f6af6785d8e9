//! `inferproxy serve` and `inferproxy check`: the daemon's start, in the order the sandbox
//! needs (everything read and bound before it closes, no thread before it), and its one socket.

use std::convert::Infallible;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bxcore::layout;
use bxcore::runbook::Anchored;
use bxcore::{Envelope, InferDelta, InferRequest, Message};
use bxharden::daemon::{self, Cli, Command, NoMore, Spec, Start, StartError, Usage};
use bxharden::{Daemon, Profile, SeccompProfile, serve};

use crate::config::{CONFIG_ANCHOR, Config};
use crate::provider::{Inference, Provider};

/// The socket's name in `[peers]` and in log lines.
pub fn socket_name() -> String {
    layout::INFER.file()
}

/// inferproxy, for the start-up every daemon runs.
pub const SPEC: Spec = Spec {
    daemon: Daemon {
        name: "inferproxy",
        version: env!("CARGO_PKG_VERSION"),
    },
    config_anchor: CONFIG_ANCHOR,
};

/// Everything the configuration names, read while the whole filesystem is there: the key, the CA
/// bundle, the script.
fn inference(cfg: &Config) -> Result<Inference, StartError> {
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    Inference::from_config(cfg, creds.as_deref()).map_err(|e| StartError::anchored(&e))
}

/// What the daemon serves, for `check` and the startup notice. Never the key.
fn describe(cfg: &Config, inference: &Inference) -> String {
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

/// `inferproxy check --config FILE`: load and check everything, print what would be served.
pub fn check(config: &Path) -> ExitCode {
    daemon::check(SPEC, config, |cfg: Config| {
        let inference = inference(&cfg)?;
        println!("inferproxy: configuration ok");
        println!("inferproxy: would serve {}", describe(&cfg, &inference));
        Ok(())
    })
}

/// `inferproxy serve --config FILE`.
pub fn serve(config: &Path) -> ExitCode {
    daemon::run(SPEC, || start(config))
}

fn start(config: &Path) -> Result<Infallible, StartError> {
    let mut s = Start::<Config>::load(SPEC, config)?;
    let inference = inference(s.cfg())?;
    let own = s.cfg().own_dir();
    s.own_dir(&own)?;
    let path = s.cfg().infer_socket();
    let socket = s.listen(layout::INFER, &path)?;

    let mut profile = Profile::new(SeccompProfile::Inferproxy)
        .read_write(&own)
        .read_only(config);
    if let Provider::Http(h) = inference.provider() {
        profile = profile.resolver_and_ca().connect_tcp(h.endpoint().port);
    }
    let (cfg, running) = s.sandbox(&profile)?;

    serve::set_timeouts(serve::Timeouts {
        first_frame_ms: cfg.limits.first_frame_ms,
        write_ms: cfg.limits.write_ms,
    });
    let what = describe(&cfg, &inference);
    let inference = std::sync::Arc::new(inference);
    running.serve(socket, move |stream, env| handle(stream, env, &inference))?;
    bxharden::log::notice(&format!("serving {what}"));
    running.ready()
}

/// One `infer_request`: its text streamed as `infer_delta` frames, then `infer_reply` or `error
/// inference`; or one `provider_probe`: whether the provider answers, without a token spent.
fn handle(mut stream: UnixStream, env: Envelope, inference: &Inference) {
    match env.msg {
        Message::InferRequest(req) => answer(&mut stream, env.id, &req, inference),
        Message::ProviderProbe {} => {
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
            let _ = serve::send(&mut stream, env.id, true, Message::ProviderReport(report));
        }
        other => serve::unhandled(&mut stream, env.id, &other),
    }
}

fn answer(stream: &mut UnixStream, id: u64, req: &InferRequest, inference: &Inference) {
    let mut alive = true;
    let result = inference.infer(req, &mut |text| {
        // A peer that went away is not written to again; the reply is finished quietly.
        if alive {
            alive = serve::send(
                stream,
                id,
                false,
                Message::InferDelta(InferDelta {
                    text: text.to_string(),
                }),
            );
        }
    });
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

/// The command line's words: `serve` or `check`, each with `--config FILE`.
pub const USAGE: Usage = Usage {
    about: "The model's only door: the one holder of model API keys",
    serve: "Serve infer.sock",
    check: "Load and check the configuration and the files it names, print what would be served",
};

/// The whole program.
pub fn main() -> ExitCode {
    match Cli::<NoMore>::parse(SPEC.daemon, &USAGE) {
        Command::Serve { config } => serve(&config),
        Command::Check { config } => check(&config),
        Command::More(no) => match no {},
    }
}
