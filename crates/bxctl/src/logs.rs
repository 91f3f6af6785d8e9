//! `bxctl logs [-f] [-n N] [DAEMON]`: the daemons' log lines. In a dev box they are the files
//! `<home>/logs/<daemon>.log` (each line stamped with its time by the daemon); on the device
//! they are in the journal, so this runs `journalctl -u boxmaker-<daemon>.service` and the
//! journal's own times are shown.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::dev::{self, DevHome};
use crate::target::Target;

/// How often `logs -f` looks for new lines in a dev box's files.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// What `bxctl logs` was asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// One daemon, or every one of the box.
    pub daemon: Option<String>,
    /// How many of the last lines to show first.
    pub lines: usize,
    pub follow: bool,
}

/// Why the logs could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// Not a daemon of the box.
    #[error("{} is not a daemon of the box (one of: {})", .0, dev::ALL_DAEMONS.join(", "))]
    UnknownDaemon(String),
    #[error("{what}: {error}")]
    Io {
        what: String,
        #[source]
        error: io::Error,
    },
    /// journalctl ended with a failure.
    #[error("journalctl ended with {0}")]
    Journal(std::process::ExitStatus),
}

fn daemons(opts: &Options) -> Result<Vec<&'static str>, LogsError> {
    match &opts.daemon {
        None => Ok(dev::ALL_DAEMONS.to_vec()),
        Some(d) => dev::ALL_DAEMONS
            .iter()
            .find(|x| **x == d.as_str())
            .map(|x| vec![*x])
            .ok_or_else(|| LogsError::UnknownDaemon(d.clone())),
    }
}

/// Show the logs of the box at `target`.
pub fn run(target: &Target, opts: &Options, out: &mut dyn Write) -> Result<(), LogsError> {
    let names = daemons(opts)?;
    if !target.is_dev_box() {
        return journal(&names, opts);
    }
    let home = DevHome::new(target.home()).map_err(|error| LogsError::Io {
        what: target.home().display().to_string(),
        error,
    })?;
    let prefix = names.len() > 1;
    let mut files: Vec<(&str, PathBuf, u64)> = Vec::new();
    for name in names {
        let path = home.log(name);
        for line in dev::procs::tail(&path, opts.lines) {
            show(out, prefix, name, &line);
        }
        let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        files.push((name, path, len));
    }
    if !opts.follow {
        return Ok(());
    }
    let _ = out.flush();
    loop {
        std::thread::sleep(FOLLOW_EVERY);
        for (name, path, from) in &mut files {
            let len = fs::metadata(&*path).map(|m| m.len()).unwrap_or(0);
            if len < *from {
                // A new run truncated or replaced the file: read it from its start.
                *from = 0;
            }
            if len == *from {
                continue;
            }
            let Ok(mut f) = fs::File::open(&*path) else {
                continue;
            };
            if f.seek(SeekFrom::Start(*from)).is_err() {
                continue;
            }
            let mut more = Vec::new();
            if f.read_to_end(&mut more).is_err() {
                continue;
            }
            // Whole lines only; the rest is read again next time.
            let Some(end) = more.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            *from += end as u64 + 1;
            for line in String::from_utf8_lossy(&more[..=end]).lines() {
                show(out, prefix, name, line);
            }
        }
        if out.flush().is_err() {
            return Ok(());
        }
    }
}

fn show(out: &mut dyn Write, prefix: bool, name: &str, line: &str) {
    let line = bxcore::visible::escape(line, bxcore::visible::Mode::Line);
    let _ = if prefix {
        writeln!(out, "{name:<10} | {line}")
    } else {
        writeln!(out, "{line}")
    };
}

/// On the device: the journal of the box's units, with the journal's own times.
fn journal(names: &[&str], opts: &Options) -> Result<(), LogsError> {
    let mut cmd = Command::new("journalctl");
    cmd.args(["--no-pager", "-o", "short-iso-precise", "-n"])
        .arg(opts.lines.to_string());
    for name in names {
        cmd.arg("-u").arg(format!("boxmaker-{name}.service"));
    }
    if opts.follow {
        cmd.arg("-f");
    }
    let status = cmd.status().map_err(|error| LogsError::Io {
        what: "cannot run journalctl".to_string(),
        error,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(LogsError::Journal(status))
    }
}
