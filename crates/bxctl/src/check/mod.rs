//! `bxctl check`: the device check. The owner runs it after each `nixos-rebuild switch`, as
//! themselves (the checks then run as root in the owner's on-demand unit,
//! `boxmaker-check@.service`, and the report comes back on its socket: `crate::ondemand`) or as
//! root; the NixOS VM test and the device twin (`make twin`) run the same. It reads what the
//! module installed (`/etc/boxmaker/device.json`: the units, sockets, directories and owners)
//! and checks the running box against it, one line per check: `ok`, `FAIL` with why, or `skip`
//! with why (a skipped check is never counted as passed). Exit 1 on any failure.

pub mod files;
pub mod live;
pub mod manifest;

use std::io::Write;

use bxcore::runbook::pointer;
use serde_json::json;

use crate::done::{Done, Ended, Failure};
use crate::health::{Check, Form, State};
use manifest::Manifest;

/// How the device check says its checks: `FAIL directory /var/lib/boxmaker/loop: mode 0755, not
/// 0700`, and `"result": "ok" | "fail" | "skip"` in `--json` (the device twin and the NixOS VM
/// test read both).
pub const FORM: Form = Form {
    words: ["ok  ", "FAIL", "skip"],
    json_key: "result",
    json_words: ["ok", "fail", "skip"],
    name_width: None,
};

/// The runbook entry of a device check that failed.
pub const FAILED_ANCHOR: &str = "device-check-failed";

/// Every check, in the order run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    fn add(&mut self, c: Check) {
        self.checks.push(c);
    }

    fn count(&self, state: State) -> usize {
        self.checks.iter().filter(|c| c.state == state).count()
    }

    pub fn failures(&self) -> usize {
        self.count(State::Failed)
    }

    pub fn skipped(&self) -> usize {
        self.count(State::Skipped)
    }

    /// No check failed (a skipped one is counted apart, never as passed).
    pub fn passed(&self) -> bool {
        self.failures() == 0
    }

    /// One line per check, then the verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&FORM.line(c));
            out.push('\n');
        }
        let n = self.checks.len();
        if self.passed() {
            out.push_str(&format!(
                "check: ok ({} passed, {} skipped)\n",
                n - self.skipped(),
                self.skipped()
            ));
        } else {
            out.push_str(&format!(
                "check: FAILED ({} of {n} checks); {}\n",
                self.failures(),
                pointer(FAILED_ANCHOR)
            ));
        }
        out
    }

    /// `{"ok": bool, "checks": [{"check", "result": "ok"|"fail"|"skip", "detail"}]}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({"ok": self.passed(), "checks": FORM.json_all(&self.checks)})
    }
}

/// Run every check against the box `m` describes. Needs root: it reads each daemon's
/// `/proc/<pid>/task`, and talks to each socket as its client and as a refused peer.
pub fn run(m: &Manifest) -> Report {
    let mut r = Report::default();
    let since = live::now_secs().saturating_sub(1);
    let named = |name: String, found: Result<String, String>| Check::from_result(name, found);

    for s in &m.services {
        r.add(named(format!("unit {}", s.unit), live::active(&s.unit)));
    }
    for s in &m.sockets {
        r.add(named(format!("unit {}", s.unit), live::active(&s.unit)));
    }
    for s in &m.services {
        r.add(named(format!("sandbox {}", s.daemon), live::sandbox(s)));
    }
    for d in &m.directories {
        r.add(named(
            format!("directory {}", d.path.display()),
            files::directory(d),
        ));
    }
    for s in &m.sockets {
        r.add(named(
            format!("socket {}", s.path.display()),
            files::socket(s),
        ));
    }
    r.add(named(
        "writable by others".into(),
        files::nobody_else_writes(m),
    ));
    for s in &m.sockets {
        r.add(live::ping(s));
    }
    for s in &m.sockets {
        r.add(named(
            format!("peer refused on {}", s.file()),
            live::refuses(s, since),
        ));
    }
    r.add(named(
        "tools_list".into(),
        match m.socket("broker") {
            Some(s) => live::tools_list(s),
            None => Err("the box has no broker socket".into()),
        },
    ));
    let turn = match (m.service("inferproxy"), m.socket("loop")) {
        (Some(inferproxy), Some(sock)) => match live::provider_kind(&inferproxy.config) {
            Ok(kind) if kind == "script" => {
                named("scripted turn".into(), live::scripted_turn(m, sock))
            }
            Ok(kind) => Check::skipped(
                "scripted turn",
                format!(
                    "the provider is `{kind}`, not `script`: the check makes no real model request"
                ),
            ),
            Err(e) => Check::failed("scripted turn", e),
        },
        _ => Check::failed(
            "scripted turn",
            "the box has no inferproxy service or no loop socket",
        ),
    };
    r.add(turn);
    r.add(match m.socket("admin") {
        Some(s) => live::audit_chain(m, s),
        None => Check::failed("audit chain", "the box has no admin socket"),
    });
    for s in &m.services {
        r.add(named(
            format!("security {}", s.unit),
            live::security(&s.unit, m.security_threshold),
        ));
    }
    r
}

/// How long the device check's unit has for its report when the owner asks for it.
pub const UNIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// Why the device check could not run: a usage error (exit 2), or its unit sent no report
/// (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(
        "bxctl check reads every daemon's /proc and talks to each socket as its client, and \
         this device has no check unit for its owner: run it as root (sudo bxctl check)"
    )]
    NotRoot,
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    /// The owner's check unit could not be reached or sent no report.
    #[error("{0}")]
    Unit(String),
}

impl From<CheckError> for Failure {
    fn from(e: CheckError) -> Failure {
        match e {
            CheckError::Unit(why) => Failure::failed(format!("bxctl: {why}")),
            e => Failure::usage(format!("bxctl: {e}")),
        }
    }
}

/// `bxctl check`: load the manifest, run the checks, print them and the verdict; a failure
/// has said everything on `out` already. As anyone but root, the checks run in the owner's
/// on-demand unit (`boxmaker-check@.service`, as root: `crate::ondemand`) and its report is
/// printed here the same way.
pub fn main(manifest: &std::path::Path, json: bool, out: &mut dyn Write) -> Ended {
    let m = Manifest::load(manifest).map_err(CheckError::from)?;
    let report = if nix::unistd::geteuid().is_root() {
        run(&m)
    } else {
        through_unit(&m)?
    };
    if json {
        let _ = writeln!(out, "{}", report.to_json());
    } else {
        let _ = write!(out, "{}", report.render());
    }
    if report.passed() {
        Ok(Done)
    } else {
        Err(Failure::said())
    }
}

/// The device check as its unit runs it: connect to the owner's check socket and read the JSON
/// report (`bxctl check --json`, as root).
fn through_unit(m: &Manifest) -> Result<Report, CheckError> {
    let Some(socket) = m.ondemand.as_ref().map(|o| o.check.clone()) else {
        return Err(CheckError::NotRoot);
    };
    let text = crate::ondemand::report(&socket, UNIT_DEADLINE).map_err(CheckError::Unit)?;
    serde_json::from_str::<serde_json::Value>(text.trim())
        .map_err(|e| e.to_string())
        .and_then(|v| Report::from_json(&v))
        .map_err(|why| {
            CheckError::Unit(format!(
                "the device check's unit sent no report ({why}): journalctl -u 'boxmaker-check@*' \
                 says why"
            ))
        })
}

impl Report {
    /// The report `to_json` wrote.
    pub fn from_json(v: &serde_json::Value) -> Result<Report, String> {
        let checks = v["checks"]
            .as_array()
            .ok_or("no \"checks\" list in the report")?;
        let mut r = Report::default();
        for c in checks {
            let field = |k: &str| {
                c[k].as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("a check without \"{k}\": {c}"))
            };
            let detail = field("detail")?;
            let state = match field(FORM.json_key)?.as_str() {
                w if w == FORM.json_words[0] => State::Ok,
                w if w == FORM.json_words[1] => State::Failed,
                w if w == FORM.json_words[2] => State::Skipped,
                other => return Err(format!("a check whose result is `{other}`")),
            };
            r.add(Check::new(field("check")?, state, detail));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_read_back_from_its_json_renders_the_same() {
        let mut r = report();
        r.add(Check::failed("directory /x", "mode 0755, not 0700"));
        let back = Report::from_json(&r.to_json()).unwrap();
        assert_eq!(back.render(), r.render());
        assert_eq!(back.to_json(), r.to_json());
        assert!(Report::from_json(&serde_json::json!({"ok": true})).is_err());
    }

    fn report() -> Report {
        let mut r = Report::default();
        r.add(Check::ok("unit a.service", "active"));
        r.add(Check::skipped("scripted turn", "the provider is `openai`"));
        r
    }

    #[test]
    fn a_report_of_passes_and_skips_passes_and_counts_the_skips_apart() {
        let r = report();
        assert!(r.passed());
        assert_eq!(
            r.render(),
            "ok   unit a.service: active\n\
             skip scripted turn: the provider is `openai`\n\
             check: ok (1 passed, 1 skipped)\n"
        );
    }

    #[test]
    fn one_failure_fails_the_report_and_points_at_the_runbook() {
        let mut r = report();
        r.add(Check::failed("directory /x", "mode 0755, not 0700"));
        assert!(!r.passed());
        let text = r.render();
        assert!(
            text.contains("FAIL directory /x: mode 0755, not 0700\n"),
            "{text}"
        );
        assert!(
            text.ends_with(&format!(
                "check: FAILED (1 of 3 checks); {}\n",
                pointer("device-check-failed")
            )),
            "{text}"
        );
    }

    #[test]
    fn the_json_report_names_each_result_and_a_skip_is_not_ok() {
        let j = report().to_json();
        assert_eq!(j["ok"], true);
        assert_eq!(j["checks"][0]["result"], "ok");
        assert_eq!(j["checks"][1]["result"], "skip");
        assert_eq!(j["checks"][1]["detail"], "the provider is `openai`");
    }
}
