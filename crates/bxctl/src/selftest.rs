//! `bxctl selftest`: what the owner cares about, each as one check: every socket of the box
//! answers `ping` as its own daemon, every daemon runs confined, loopd finds every part a turn
//! needs (`health` on loop.sock: inferproxy, the model provider, brokerd, memoryd), the model
//! answers one minimal request through inferproxy, the audit chain verifies, and `loopd
//! selftest` finds the sockets loopd's configuration names answering as loopd's user (how it
//! runs is the box's own: [`Target::loopd_selftest`]; on the device through the owner's
//! on-demand unit, `boxmaker-selftest@.service`, which runs it as loopd's user). The sockets
//! it asks itself are those the box lets it ([`Target::selftest_asks`]): on the device the
//! owner's (loop.sock among them, so `health` runs there too), loopd's selftest those that are
//! loopd's user's, and no model request is made there (the device check, `bxctl check`, reaches
//! every socket as its client). The checks are `crate::health`'s, as `status` and the device
//! check make them. A check that could not run (a socket that is not the caller's to reach) is
//! `skipped`, and a skipped check is never `ok`: the verdict is `ok` only when every check
//! passed. Each check is named for what it checked.

use std::io::{self, Write};
use std::time::Duration;

use bxcore::client::ClientError;
use bxcore::layout::{self, SOCKETS};
use bxcore::runbook::Anchored;
use bxcore::visible::{Mode, Shown};
use serde::Serialize;

use crate::done::{Done, Ended, Failure};
use crate::health::{self, ANSWER, Check, Form, JsonCheck};
use crate::model::{self, ModelLine};
use crate::target::{self, SelftestRun, Target};

/// How long loopd's selftest unit has for its report on the device.
const UNIT_DEADLINE: Duration = Duration::from_secs(120);

/// How long the model has to answer the minimal request, unless `--model-timeout` says.
pub const MODEL_DEADLINE: Duration = Duration::from_secs(120);

/// How selftest says its checks: `  ping loop.sock         ok: loopd 0.1.0`, and
/// `"state": "ok" | "failed" | "skipped"` in `--json`.
pub const FORM: Form = Form {
    words: ["ok", "FAILED", "SKIPPED"],
    json_key: "state",
    json_words: ["ok", "failed", "skipped"],
    name_width: Some(22),
};

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

/// The whole selftest, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct SelftestReport<'a> {
    pub home: String,
    pub ok: bool,
    pub model: Option<ModelLine>,
    pub checks: Vec<JsonCheck<'a>>,
}

/// `Err` with every check that did not pass, when one did not.
pub fn verdict(checks: &[Check]) -> Result<(), Failed> {
    let bad: Vec<String> = checks
        .iter()
        .filter(|c| !c.is_ok())
        .map(|c| match c.state {
            health::State::Skipped => format!("{}: skipped ({})", c.check, c.detail),
            _ => format!("{}: {}", c.check, c.detail),
        })
        .collect();
    let names: Vec<&str> = checks
        .iter()
        .filter(|c| !c.is_ok())
        .map(|c| c.check.as_str())
        .collect();
    match bad.len() {
        0 => Ok(()),
        1 => Err(Failed(bad.join("; "))),
        // Each is said above with its cause; the verdict names them and the first cause.
        n => Err(Failed(format!(
            "{n} of {} checks did not pass{}, each said above; the first: {}",
            checks.len(),
            if n <= 4 {
                format!(" ({})", names.join(", "))
            } else {
                String::new()
            },
            bad[0]
        ))),
    }
}

/// What `bxctl selftest` was asked.
#[derive(Debug, Clone, Copy)]
pub struct SelftestOptions {
    pub json: bool,
    /// How long the model has to answer.
    pub model_timeout: Duration,
}

/// Run every check against `target`; one line per check goes to `out` as it ends (or one JSON
/// document with `--json`).
pub fn run(target: &dyn Target, opts: SelftestOptions, out: &mut dyn Write) -> Ended {
    let json = opts.json;
    let mut checks = Vec::new();
    let mut check = |c: Check, out: &mut dyn Write| {
        if !json {
            let _ = writeln!(out, "{}", FORM.line(&c));
        }
        checks.push(c);
    };
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
    for spec in SOCKETS {
        if !target.selftest_asks(&spec) {
            continue;
        }
        if let Some(pinged) = health::ping_socket(target, &spec) {
            check(health::socket_check(&spec, &pinged), out);
        }
    }
    for d in &health::daemons(target) {
        if let Some(c) = health::confined_check(d) {
            check(c, out);
        }
    }
    match health::loopd_health(target) {
        Ok(found) => {
            for h in &found {
                check(health::health_check(h), out);
            }
        }
        Err(why) => check(Check::failed("loopd answers health", why), out),
    }
    // Where infer.sock is loopd's user's alone the selftest asks no model (loopd's `health`
    // above says whether loopd reaches inferproxy and the model provider).
    if target.selftest_asks(&layout::INFER) {
        check(model_answers(target, &model, opts.model_timeout), out);
    }
    let admin = target.socket(&layout::ADMIN);
    check(
        health::audit_check(&health::verify_audit(&admin, None, ANSWER)),
        out,
    );
    check(
        Check::from_result("loopd's own sockets", loopd_selftest(target)),
        out,
    );
    let ended = match verdict(&checks) {
        Ok(()) => Ok(Done),
        Err(e) => Err(Failure::anchored(&e)),
    };
    if json {
        let report = SelftestReport {
            home: target.home().display().to_string(),
            ok: ended.is_ok(),
            model: model.ok(),
            checks: FORM.json_all(&checks),
        };
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&report).unwrap_or_default()
        );
    } else if ended.is_ok() {
        let _ = writeln!(out, "selftest: ok");
    }
    ended
}

/// The model answers one minimal request through inferproxy, asked as infer.sock's client.
fn model_answers(
    target: &dyn Target,
    model: &Result<ModelLine, String>,
    timeout: Duration,
) -> Check {
    const NAME: &str = "model answers";
    let m = match model {
        Ok(m) => m,
        Err(why) => return Check::failed(NAME, why.clone()),
    };
    let answer = target::as_client(target, &layout::INFER, || {
        model::ask(target, &m.slot, timeout)
    })
    .unwrap_or_else(|why| {
        Err(ClientError::Connect {
            socket: target.socket(&layout::INFER),
            error: io::Error::other(why),
        })
    });
    match answer {
        Ok(a) => Check::ok(
            NAME,
            format!("{}: {}", m.describe(), Shown(&a.said, Mode::Line)),
        ),
        Err(ClientError::Connect { error, .. })
            if error.kind() == io::ErrorKind::PermissionDenied =>
        {
            Check::skipped(NAME, "infer.sock is not yours to reach: run it as root")
        }
        Err(e) => Check::failed(NAME, format!("{}: {e}", m.describe())),
    }
}

/// `loopd selftest` as the box runs it ([`Target::loopd_selftest`]): what it checked, or why it
/// failed.
fn loopd_selftest(target: &dyn Target) -> Result<String, String> {
    let selftest = target.loopd_selftest()?;
    // What it checked: the sockets loopd's configuration names, as loopd's user (not loopd
    // itself, which `loopd finds ...` is about).
    let passed = format!(
        "{}, as loopd's user: every socket its configuration names answers",
        selftest.what
    );
    let mut command = match selftest.run {
        SelftestRun::Command(command) => command,
        SelftestRun::OnDemand(socket) => {
            let text = crate::ondemand::report(&socket, UNIT_DEADLINE)?;
            return match text.trim().lines().last() {
                Some("selftest: ok") => Ok(passed),
                Some(last) => Err(format!("loopd selftest: {last}")),
                None => Err(format!(
                    "{} said nothing (one selftest runs at a time; journalctl -u \
                     'boxmaker-selftest@*' says why)",
                    selftest.what
                )),
            };
        }
    };
    let output = command
        .output()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let said = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    if output.status.success() {
        return Ok(passed);
    }
    // Its verdict is its last line (`selftest: FAILED: ...`, with its pointer); the lines
    // before it say what it would serve, which is not why it failed.
    let text = [said(&output.stderr), said(&output.stdout)]
        .into_iter()
        .find_map(|t| t.lines().last().map(str::to_string))
        .unwrap_or_else(|| "it said nothing".to_string());
    Err(format!("loopd selftest ({}): {text}", output.status))
}
