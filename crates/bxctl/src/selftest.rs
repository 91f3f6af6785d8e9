//! `bxctl selftest`: what the owner cares about, each as one check: every socket of the box
//! answers `ping` as its own daemon, every daemon runs confined, loopd finds every part a turn
//! needs (`health` on loop.sock: inferproxy, the model provider, brokerd, memoryd), the model
//! answers one minimal request through inferproxy, the audit chain verifies, and `loopd
//! selftest` finds the sockets loopd's configuration names answering as loopd's user (in the
//! dev box directly; on the device through the owner's on-demand unit,
//! `boxmaker-selftest@.service`, which runs it as loopd's user: `crate::ondemand`). On the
//! device the owner pings the sockets that are the owner's (loop.sock among them, so `health`
//! runs there too), and loopd's selftest those that are loopd's user's; no model request is made
//! there (the device check, `bxctl check`, reaches every socket as its client). A check that
//! could not run (a socket that is not the caller's to reach) is `skipped`, and a skipped check
//! is never `ok`: the verdict is `ok` only when every check passed. Each check is named for what
//! it checked.

use std::io::{self, Write};
use std::process::Command;
use std::time::Duration;

use bxcore::Message;
use bxcore::client::{self, ClientError};
use bxcore::layout::{self, SOCKETS};
use bxcore::runbook::Anchored;
use bxcore::visible::{Mode, Shown};
use serde::Serialize;

use crate::dev::procs::find_daemon;
use crate::model::{self, ModelLine};
use crate::status::{self, SocketState};
use crate::target::Target;

/// The device's template unit that runs `loopd selftest` as loopd's user, one instance per
/// connection on the owner's selftest socket.
pub const UNIT: &str = "boxmaker-selftest@.service";

const PING: Duration = Duration::from_secs(5);

/// How long loopd's selftest unit has for its report on the device.
const UNIT_DEADLINE: Duration = Duration::from_secs(120);

/// How long the model has to answer the minimal request, unless `--model-timeout` says.
pub const MODEL_DEADLINE: Duration = Duration::from_secs(120);

/// Why the selftest failed: every check that did not pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("selftest: FAILED: {0}")]
pub struct Failed(pub String);

/// The runbook entry of a failed selftest.
pub const FAILED_ANCHOR: &str = "bxctl-selftest-failed";

impl Anchored for Failed {
    fn anchor(&self) -> &str {
        FAILED_ANCHOR
    }
}

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Ok,
    Failed,
    /// It could not run; never counted as ok.
    Skipped,
}

/// One check and what it found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub check: String,
    pub state: State,
    pub detail: String,
}

/// The whole selftest, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub home: String,
    pub ok: bool,
    pub model: Option<ModelLine>,
    pub checks: Vec<Check>,
}

impl Report {
    /// `Err` with every check that did not pass, when one did not.
    pub fn verdict(&self) -> Result<(), Failed> {
        let bad: Vec<String> = self
            .checks
            .iter()
            .filter(|c| c.state != State::Ok)
            .map(|c| match c.state {
                State::Skipped => format!("{}: skipped ({})", c.check, c.detail),
                _ => format!("{}: {}", c.check, c.detail),
            })
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Failed(bad.join("; ")))
        }
    }
}

/// What `bxctl selftest` was asked.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub json: bool,
    /// How long the model has to answer.
    pub model_timeout: Duration,
}

fn check(checks: &mut Vec<Check>, out: &mut dyn Write, json: bool, c: Check) {
    if !json {
        let state = match c.state {
            State::Ok => "ok",
            State::Failed => "FAILED",
            State::Skipped => "SKIPPED",
        };
        let _ = writeln!(out, "  {:<22} {state}: {}", c.check, c.detail);
    }
    checks.push(c);
}

/// Run every check against `target`; one line per check goes to `out` (or one JSON document
/// with `--json`).
pub fn run(target: &Target, opts: Options, out: &mut dyn Write) -> Result<(), Failed> {
    let json = opts.json;
    let mut checks = Vec::new();
    let model = model::configured(target);
    if !json {
        let _ = writeln!(out, "box at {}", target.home().display());
        match &model {
            Ok(m) => {
                let _ = writeln!(out, "model: {}", m.describe());
            }
            Err(why) => {
                let _ = writeln!(out, "model: {why}");
            }
        }
    }
    let device = !target.is_dev_box();
    for spec in SOCKETS {
        // On the device a socket whose client is a daemon's user is that user's alone (0600 in
        // a 0700 directory): loopd's selftest pings loopd's, the device check every one.
        if device && spec.client != layout::OWNER {
            continue;
        }
        let path = target.socket(&spec);
        if !status::expected(target, spec.server) && !path.exists() {
            continue;
        }
        let name = format!("ping {}", spec.file());
        let c = if !path.exists() {
            Check {
                check: name,
                state: State::Failed,
                detail: format!(
                    "{} is absent ({} is not serving it)",
                    path.display(),
                    spec.server
                ),
            }
        } else {
            let answer = crate::peer::as_client(target, &spec, || client::ping(&path, PING))
                .unwrap_or_else(|why| {
                    Err(ClientError::Connect {
                        socket: path.clone(),
                        error: io::Error::other(why),
                    })
                });
            match answer {
                Ok(p) => {
                    let state = SocketState::Answers {
                        daemon: p.daemon.clone(),
                        version: p.version.clone(),
                        protocol: p.protocol,
                    };
                    match status::socket_problem(&spec, &state) {
                        None => Check {
                            check: name,
                            state: State::Ok,
                            detail: format!("{} {}", p.daemon, p.version),
                        },
                        Some(why) => Check {
                            check: name,
                            state: State::Failed,
                            detail: why,
                        },
                    }
                }
                Err(ClientError::Connect { error, .. })
                    if error.kind() == io::ErrorKind::PermissionDenied =>
                {
                    Check {
                        check: name,
                        state: State::Skipped,
                        detail: "not yours to reach: run it as root to check this socket"
                            .to_string(),
                    }
                }
                Err(e) => Check {
                    check: name,
                    state: State::Failed,
                    detail: e.to_string(),
                },
            }
        };
        check(&mut checks, out, json, c);
    }
    let st = status::gather_daemons(target);
    for d in &st {
        if !d.configured {
            continue;
        }
        let name = format!("confined {}", d.name);
        let c = if d.processes.is_empty() {
            Check {
                check: name,
                state: State::Failed,
                detail: "not running (or not visible to you)".to_string(),
            }
        } else {
            let bad: Vec<String> = d
                .processes
                .iter()
                .filter_map(|p| status::confinement_problem(&d.name, p))
                .collect();
            if bad.is_empty() {
                let pids: Vec<String> = d.processes.iter().map(|p| p.pid.to_string()).collect();
                Check {
                    check: name,
                    state: State::Ok,
                    detail: format!(
                        "pid {}: Seccomp 2, NoNewPrivs 1, no capabilities",
                        pids.join(", ")
                    ),
                }
            } else {
                Check {
                    check: name,
                    state: State::Failed,
                    detail: bad.join("; "),
                }
            }
        };
        check(&mut checks, out, json, c);
    }
    match status::health(target) {
        Ok(found) => {
            for h in found {
                let c = Check {
                    check: format!("loopd finds {}", status::part_name(&h.part)),
                    state: if h.ok { State::Ok } else { State::Failed },
                    detail: h.detail,
                };
                check(&mut checks, out, json, c);
            }
        }
        Err(why) => {
            let c = Check {
                check: "loopd answers health".to_string(),
                state: State::Failed,
                detail: why,
            };
            check(&mut checks, out, json, c);
        }
    }
    // The device's infer.sock is loopd's user's: the owner's selftest asks no model there
    // (loopd's `health` above says whether loopd reaches inferproxy and the model provider).
    if !device {
        let c = model_answers(target, &model, opts);
        check(&mut checks, out, json, c);
    }
    let admin = target.socket(&layout::ADMIN);
    let c = match client::call(&admin, PING, 1, Message::AuditVerify {}, |_| {}) {
        Ok(Message::AuditReport(r)) if r.ok => Check {
            check: "audit chain".to_string(),
            state: State::Ok,
            detail: format!("{} records, head {}", r.records, r.head),
        },
        Ok(Message::AuditReport(r)) => Check {
            check: "audit chain".to_string(),
            state: State::Failed,
            detail: format!("BROKEN after {} records: {}", r.records, r.detail),
        },
        Ok(other) => Check {
            check: "audit chain".to_string(),
            state: State::Failed,
            detail: ClientError::Unexpected(other.kind()).to_string(),
        },
        Err(e) => Check {
            check: "audit chain".to_string(),
            state: State::Failed,
            detail: format!("not verified: {e}"),
        },
    };
    check(&mut checks, out, json, c);
    let name = "loopd's own sockets".to_string();
    let c = match loopd_selftest(target) {
        Ok(line) => Check {
            check: name,
            state: State::Ok,
            detail: line,
        },
        Err(why) => Check {
            check: name,
            state: State::Failed,
            detail: why,
        },
    };
    check(&mut checks, out, json, c);
    let report = Report {
        home: target.home().display().to_string(),
        ok: checks.iter().all(|c| c.state == State::Ok),
        model: model.ok(),
        checks,
    };
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&report).unwrap_or_default()
        );
    } else if report.ok {
        let _ = writeln!(out, "selftest: ok");
    }
    report.verdict()
}

/// One minimal request to the model through inferproxy, as `model answers`.
fn model_answers(target: &Target, model: &Result<ModelLine, String>, opts: Options) -> Check {
    match model {
        Err(why) => Check {
            check: "model answers".to_string(),
            state: State::Failed,
            detail: why.clone(),
        },
        Ok(m) => match crate::peer::as_client(target, &layout::INFER, || {
            model::ask(target, &m.slot, opts.model_timeout)
        })
        .unwrap_or_else(|why| {
            Err(ClientError::Connect {
                socket: target.socket(&layout::INFER),
                error: io::Error::other(why),
            })
        }) {
            Ok(a) => Check {
                check: "model answers".to_string(),
                state: State::Ok,
                detail: format!("{}: {}", m.describe(), Shown(&a.said, Mode::Line)),
            },
            Err(ClientError::Connect { error, .. })
                if error.kind() == io::ErrorKind::PermissionDenied =>
            {
                Check {
                    check: "model answers".to_string(),
                    state: State::Skipped,
                    detail: "infer.sock is not yours to reach: run it as root".to_string(),
                }
            }
            Err(e) => Check {
                check: "model answers".to_string(),
                state: State::Failed,
                detail: format!("{}: {e}", m.describe()),
            },
        },
    }
}

fn loopd_selftest(target: &Target) -> Result<String, String> {
    let output = if target.is_dev_box() {
        let loopd = find_daemon("loopd").ok_or("cannot find the loopd executable")?;
        let config = target.config("loopd");
        let mut cmd = Command::new(loopd);
        cmd.arg("selftest").arg("--config").arg(&config);
        // As the loop's own user where the box has one: its sockets let only that user in.
        let home = crate::dev::DevHome::new(target.home()).ok();
        if let Some(ids) = home.and_then(|h| crate::peer::dev_client(&h, &layout::BROKER)) {
            use std::os::unix::process::CommandExt;
            // std drops the supplementary groups when root sets the uid.
            cmd.uid(ids.uid).gid(ids.gid);
        }
        cmd.output()
    } else {
        return device_selftest();
    }
    .map_err(|e| format!("cannot run it: {e}"))?;
    let said = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    if output.status.success() {
        // What it checked: the sockets loopd's configuration names, as loopd's user (not loopd
        // itself, which `loopd answers health` is about).
        Ok(
            "loopd selftest, as loopd's user: every socket its configuration names answers"
                .to_string(),
        )
    } else {
        let mut text = said(&output.stderr);
        if text.is_empty() {
            text = said(&output.stdout);
        }
        Err(format!("loopd selftest {}: {text}", output.status))
    }
}

/// `loopd selftest` on the device: through the owner's selftest socket, which starts one
/// instance of [`UNIT`] (as loopd's user, in loopd's sandbox) and carries back what it printed.
fn device_selftest() -> Result<String, String> {
    let m = crate::check::manifest::Manifest::load(std::path::Path::new(
        crate::check::manifest::DEFAULT_PATH,
    ))
    .map_err(|e| e.to_string())?;
    let socket = m
        .ondemand
        .map(|o| o.selftest)
        .ok_or("this device's /etc/boxmaker/device.json names no selftest unit for its owner")?;
    let text = crate::ondemand::report(&socket, UNIT_DEADLINE)?;
    let text = text.trim();
    match text.lines().last() {
        Some("selftest: ok") => Ok(format!(
            "{UNIT}, as loopd's user: every socket its configuration names answers"
        )),
        Some(last) => Err(format!("loopd selftest: {last}")),
        None => Err(format!(
            "{UNIT} said nothing (one selftest runs at a time; journalctl -u 'boxmaker-selftest@*' \
             says why)"
        )),
    }
}
