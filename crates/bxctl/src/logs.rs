//! `bxctl logs [-f] [-n N] [DAEMON]`: the daemons' log lines, where the box keeps them
//! ([`Target::logs`]): files of lines each stamped with its time by the daemon (the dev box's
//! `<home>/logs/<daemon>.log`), or the journal of each daemon's unit on the device, whose own
//! times `journalctl` shows.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bxcore::layout::DAEMONS;

use crate::done::{Done, Ended, Failure};
use crate::target::{Log, Target};

/// How often `logs -f` looks for new lines in a dev box's files.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// What `bxctl logs` was asked.
#[derive(Debug, Clone)]
pub struct LogsOptions {
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
    #[error("{} is not a daemon of the box (one of: {})", .0, names().join(", "))]
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

impl From<LogsError> for Failure {
    fn from(e: LogsError) -> Failure {
        Failure::failed(format!("bxctl logs: {e}"))
    }
}

/// Every daemon of the layout.
fn names() -> Vec<&'static str> {
    DAEMONS.iter().map(|d| d.name).collect()
}

fn daemons(opts: &LogsOptions) -> Result<Vec<&'static str>, LogsError> {
    match &opts.daemon {
        None => Ok(names()),
        Some(d) => names()
            .into_iter()
            .find(|x| *x == d.as_str())
            .map(|x| vec![x])
            .ok_or_else(|| LogsError::UnknownDaemon(d.clone())),
    }
}

/// `bxctl logs`: the logs of the box at `target` on `out`: its files, or its units' journal.
pub fn run(target: &dyn Target, opts: &LogsOptions, out: &mut dyn Write) -> Ended {
    let mut files: Vec<(&str, PathBuf)> = Vec::new();
    let mut units: Vec<String> = Vec::new();
    for name in daemons(opts)? {
        match target.logs(name) {
            Log::File(path) => files.push((name, path)),
            Log::Journal(unit) => units.push(unit),
        }
    }
    if units.is_empty() {
        follow_files(files, opts, out);
    } else {
        journal(&units, opts)?;
    }
    Ok(Done)
}

/// The last lines of each file, then (with `-f`) every line added to any of them.
fn follow_files(names: Vec<(&str, PathBuf)>, opts: &LogsOptions, out: &mut dyn Write) {
    let prefix = names.len() > 1;
    let mut files: Vec<(&str, PathBuf, u64)> = Vec::new();
    for (name, path) in names {
        for line in tail(&path, opts.lines) {
            show(out, prefix, name, &line);
        }
        let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        files.push((name, path, len));
    }
    if !opts.follow {
        return;
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
            return;
        }
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(f) = fs::File::open(path) else {
        return Vec::new();
    };
    let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

fn show(out: &mut dyn Write, prefix: bool, name: &str, line: &str) {
    let line = bxcore::visible::escape(line, bxcore::visible::Mode::Line);
    let _ = if prefix {
        writeln!(out, "{name:<10} | {line}")
    } else {
        writeln!(out, "{line}")
    };
}

/// The journal of the box's units, with the journal's own times.
fn journal(units: &[String], opts: &LogsOptions) -> Result<(), LogsError> {
    let mut cmd = Command::new("journalctl");
    cmd.args(["--no-pager", "-o", "short-iso-precise", "-n"])
        .arg(opts.lines.to_string());
    for unit in units {
        cmd.arg("-u").arg(unit);
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
