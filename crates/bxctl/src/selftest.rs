//! `bxctl selftest`: `ping` on every socket the caller may reach, then `loopd selftest` (in the
//! dev box directly; on the device by starting its oneshot unit, which runs as loopd's user),
//! and one verdict.

use std::fmt;
use std::io::{self, Write};
use std::process::Command;
use std::time::Duration;

use bxcore::PROTOCOL_VERSION;
use bxcore::client::{self, ClientError};
use bxcore::layout::SOCKETS;
use bxcore::runbook::pointer;

use crate::dev::procs::find_daemon;
use crate::target::Target;

/// The device's unit that runs `loopd selftest` as loopd's user.
pub const UNIT: &str = "boxmaker-selftest.service";

const PING: Duration = Duration::from_secs(5);

/// Why the selftest failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed(pub String);

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "selftest: FAILED: {}; {}",
            self.0,
            pointer("bxctl-selftest-failed")
        )
    }
}

impl std::error::Error for Failed {}

/// Run the selftest against `target`; one line per check goes to `out`.
pub fn run(target: &Target, out: &mut dyn Write) -> Result<(), Failed> {
    let mut failures = Vec::new();
    let mut answered = 0;
    for spec in SOCKETS {
        let path = target.socket(&spec);
        let line = if !path.exists() {
            "absent (skipped)".to_string()
        } else {
            match client::ping(&path, PING) {
                Ok(p) if p.daemon == spec.server && p.protocol == PROTOCOL_VERSION => {
                    answered += 1;
                    format!("ok ({} {})", p.daemon, p.version)
                }
                Ok(p) => {
                    let why = format!(
                        "{} answered as {} speaking protocol {}, not {} speaking {PROTOCOL_VERSION}",
                        spec.file(),
                        p.daemon,
                        p.protocol,
                        spec.server
                    );
                    failures.push(why.clone());
                    why
                }
                Err(ClientError::Connect { error, .. })
                    if error.kind() == io::ErrorKind::PermissionDenied =>
                {
                    "not yours to reach (skipped)".to_string()
                }
                Err(e) => {
                    failures.push(format!("{}: {e}", spec.file()));
                    format!("FAILED: {e}")
                }
            }
        };
        let _ = writeln!(out, "  ping {:<13} {line}", spec.file());
    }
    if answered == 0 && failures.is_empty() {
        failures.push(format!(
            "no socket of the box under {} answered",
            target.home().display()
        ));
    }
    match loopd_selftest(target) {
        Ok(line) => {
            let _ = writeln!(out, "  loopd selftest: {line}");
        }
        Err(why) => {
            let _ = writeln!(out, "  loopd selftest: FAILED");
            failures.push(why);
        }
    }
    if failures.is_empty() {
        let _ = writeln!(out, "selftest: ok");
        Ok(())
    } else {
        Err(Failed(failures.join("; ")))
    }
}

fn loopd_selftest(target: &Target) -> Result<String, String> {
    let output = if target.is_dev_box() {
        let loopd = find_daemon("loopd").ok_or("cannot find the loopd executable")?;
        let config = target.home().join("etc/loopd.toml");
        Command::new(loopd)
            .arg("selftest")
            .arg("--config")
            .arg(&config)
            .output()
    } else {
        Command::new("systemctl").args(["start", UNIT]).output()
    }
    .map_err(|e| format!("cannot run it: {e}"))?;
    let said = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    if output.status.success() {
        let text = said(&output.stdout);
        Ok(text.lines().last().unwrap_or("ok").to_string())
    } else {
        let mut text = said(&output.stderr);
        if text.is_empty() {
            text = said(&output.stdout);
        }
        Err(format!("loopd selftest {}: {text}", output.status))
    }
}
