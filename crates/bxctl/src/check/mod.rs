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
use serde::Serialize;
use serde_json::json;

use manifest::Manifest;

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok(String),
    Fail(String),
    Skip(String),
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub check: String,
    pub verdict: Verdict,
}

/// Every line, in the order run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    check: &'a str,
    result: &'static str,
    detail: &'a str,
}

impl Report {
    fn add(&mut self, check: impl Into<String>, verdict: Verdict) {
        self.lines.push(Line {
            check: check.into(),
            verdict,
        });
    }

    pub fn failures(&self) -> usize {
        self.count(|v| matches!(v, Verdict::Fail(_)))
    }

    pub fn skipped(&self) -> usize {
        self.count(|v| matches!(v, Verdict::Skip(_)))
    }

    fn count(&self, f: impl Fn(&Verdict) -> bool) -> usize {
        self.lines.iter().filter(|l| f(&l.verdict)).count()
    }

    pub fn passed(&self) -> bool {
        self.failures() == 0
    }

    /// One line per check, then the verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for l in &self.lines {
            let (word, detail) = match &l.verdict {
                Verdict::Ok(d) => ("ok  ", d),
                Verdict::Fail(d) => ("FAIL", d),
                Verdict::Skip(d) => ("skip", d),
            };
            out.push_str(&format!("{word} {}: {detail}\n", l.check));
        }
        let n = self.lines.len();
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
                pointer("device-check-failed")
            ));
        }
        out
    }

    /// `{"ok": bool, "checks": [{"check", "result": "ok"|"fail"|"skip", "detail"}]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let checks: Vec<JsonLine> = self
            .lines
            .iter()
            .map(|l| {
                let (result, detail) = match &l.verdict {
                    Verdict::Ok(d) => ("ok", d),
                    Verdict::Fail(d) => ("fail", d),
                    Verdict::Skip(d) => ("skip", d),
                };
                JsonLine {
                    check: &l.check,
                    result,
                    detail,
                }
            })
            .collect();
        json!({"ok": self.passed(), "checks": checks})
    }
}

/// Run every check against the box `m` describes. Needs root: it reads each daemon's
/// `/proc/<pid>/task`, and talks to each socket as its client and as a refused peer.
pub fn run(m: &Manifest) -> Report {
    let mut r = Report::default();
    let since = live::now_secs().saturating_sub(1);

    for s in &m.services {
        r.add(format!("unit {}", s.unit), live::active(&s.unit));
    }
    for s in &m.sockets {
        r.add(format!("unit {}", s.unit), live::active(&s.unit));
    }
    for s in &m.services {
        r.add(format!("sandbox {}", s.daemon), live::sandbox(s));
    }
    for d in &m.directories {
        r.add(
            format!("directory {}", d.path.display()),
            files::directory(d),
        );
    }
    for s in &m.sockets {
        r.add(format!("socket {}", s.path.display()), files::socket(s));
    }
    r.add("writable by others", files::nobody_else_writes(m));
    for s in &m.sockets {
        r.add(format!("ping {}", s.file()), live::ping(s));
    }
    for s in &m.sockets {
        r.add(
            format!("peer refused on {}", s.file()),
            live::refuses(s, since),
        );
    }
    match m.socket("broker") {
        Some(s) => r.add("tools_list", live::tools_list(s)),
        None => r.add(
            "tools_list",
            Verdict::Fail("the box has no broker socket".into()),
        ),
    }
    let turn = match (m.service("inferproxy"), m.socket("loop")) {
        (Some(inferproxy), Some(sock)) => match live::provider_kind(&inferproxy.config) {
            Ok(kind) if kind == "script" => live::scripted_turn(m, sock),
            Ok(kind) => Verdict::Skip(format!(
                "the provider is `{kind}`, not `script`: the check makes no real model request"
            )),
            Err(e) => Verdict::Fail(e),
        },
        _ => Verdict::Fail("the box has no inferproxy service or no loop socket".into()),
    };
    r.add("scripted turn", turn);
    match m.socket("admin") {
        Some(s) => r.add("audit chain", live::audit_chain(m, s)),
        None => r.add(
            "audit chain",
            Verdict::Fail("the box has no admin socket".into()),
        ),
    }
    for s in &m.services {
        r.add(
            format!("security {}", s.unit),
            live::security(&s.unit, m.security_threshold),
        );
    }
    r
}

/// How long the device check's unit has for its report when the owner asks for it.
pub const UNIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// `bxctl check`: load the manifest, run the checks, print, and say whether all passed. As
/// anyone but root, the checks run in the owner's on-demand unit (`boxmaker-check@.service`,
/// as root: `crate::ondemand`) and its report is printed here the same way.
pub fn main(manifest: &std::path::Path, json: bool, out: &mut dyn Write) -> Result<bool, String> {
    if !nix::unistd::geteuid().is_root() {
        return through_unit(manifest, json, out);
    }
    let m = Manifest::load(manifest).map_err(|e| e.to_string())?;
    let report = run(&m);
    if json {
        let _ = writeln!(out, "{}", report.to_json());
    } else {
        let _ = write!(out, "{}", report.render());
    }
    Ok(report.passed())
}

/// The device check as its unit runs it: connect to the owner's check socket, read the JSON
/// report (`bxctl check --json`, as root) and print it as this invocation asked.
fn through_unit(
    manifest: &std::path::Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<bool, String> {
    let m = Manifest::load(manifest).map_err(|e| e.to_string())?;
    let Some(socket) = m.ondemand.as_ref().map(|o| o.check.clone()) else {
        return Err(
            "bxctl check reads every daemon's /proc and talks to each socket as its client, and \
             this device has no check unit for its owner: run it as root (sudo bxctl check)"
                .into(),
        );
    };
    let text = crate::ondemand::report(&socket, UNIT_DEADLINE)?;
    let report = serde_json::from_str::<serde_json::Value>(text.trim())
        .map_err(|e| e.to_string())
        .and_then(|v| Report::from_json(&v))
        .map_err(|why| {
            format!(
                "the device check's unit sent no report ({why}): journalctl -u 'boxmaker-check@*' \
                 says why"
            )
        })?;
    if json {
        let _ = writeln!(out, "{}", report.to_json());
    } else {
        let _ = write!(out, "{}", report.render());
    }
    Ok(report.passed())
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
            let verdict = match field("result")?.as_str() {
                "ok" => Verdict::Ok(detail),
                "fail" => Verdict::Fail(detail),
                "skip" => Verdict::Skip(detail),
                other => return Err(format!("a check whose result is `{other}`")),
            };
            r.add(field("check")?, verdict);
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
        r.add("directory /x", Verdict::Fail("mode 0755, not 0700".into()));
        let back = Report::from_json(&r.to_json()).unwrap();
        assert_eq!(back.render(), r.render());
        assert_eq!(back.to_json(), r.to_json());
        assert!(Report::from_json(&serde_json::json!({"ok": true})).is_err());
    }

    fn report() -> Report {
        let mut r = Report::default();
        r.add("unit a.service", Verdict::Ok("active".into()));
        r.add(
            "scripted turn",
            Verdict::Skip("the provider is `openai`".into()),
        );
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
        r.add("directory /x", Verdict::Fail("mode 0755, not 0700".into()));
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
