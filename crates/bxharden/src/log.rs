//! Logging: `tracing` into the journal when stderr is the journal, else plain lines on stderr,
//! so a daemon started by hand or by a test writes where its starter reads.
//!
//! Fail-closed lines keep their exact text (the runbook quotes them): `{daemon}: {what}; ` and
//! the anchor's pointer (`bxcore::runbook::pointer`), written with [`runbook!`](crate::runbook),
//! or by [`fail`] for an error that knows its anchor ([`Anchored`]). In the journal they carry
//! `RUNBOOK=<anchor>` and `SYSLOG_IDENTIFIER=<daemon>`, so `journalctl RUNBOOK=<anchor>` finds
//! every occurrence (the journald layer is built with `with_field_prefix(None)`: by default it
//! would write `F_RUNBOOK`).

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

pub use bxcore::runbook::{Anchored, Pointed, pointer};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::Registry;

/// The daemon's name and version: the prefix of its log lines, its journal identifier, and what
/// its `pong` says. Set once by [`init`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Daemon {
    /// `loopd`, `brokerd`, ...
    pub name: &'static str,
    /// The crate version, `env!("CARGO_PKG_VERSION")`.
    pub version: &'static str,
}

static DAEMON: OnceLock<Daemon> = OnceLock::new();

/// The daemon set by [`init`]. Before `init` (a library used on its own): the executable's file
/// name and this crate's version.
pub fn daemon() -> Daemon {
    if let Some(d) = DAEMON.get() {
        return *d;
    }
    static FALLBACK: OnceLock<Daemon> = OnceLock::new();
    *FALLBACK.get_or_init(|| {
        let name = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "boxmaker".to_owned());
        Daemon {
            name: Box::leak(name.into_boxed_str()),
            version: env!("CARGO_PKG_VERSION"),
        }
    })
}

/// Where [`init`] sent the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// The systemd journal, with structured fields.
    Journal,
    /// Plain lines on stderr.
    Stderr,
}

/// Set the daemon's name and version and install the logger: the journal when `JOURNAL_STREAM`
/// names stderr's device and inode (systemd's own rule) and the journal socket answers, else
/// plain lines on stderr. Call it first thing in `main`, before the sandbox (the journal socket is
/// connected here). A second call changes nothing and returns where the first one logs.
pub fn init(daemon: Daemon) -> Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    *SINK.get_or_init(|| {
        let _ = DAEMON.set(daemon);
        let d = self::daemon();
        if stderr_is_journal(std::env::var("JOURNAL_STREAM").ok().as_deref()) {
            if let Ok(layer) = tracing_journald::layer() {
                let layer = layer
                    .with_field_prefix(None)
                    .with_syslog_identifier(d.name.to_owned());
                let subscriber = Registry::default().with(LevelFilter::INFO).with(layer);
                if tracing::subscriber::set_global_default(subscriber).is_ok() {
                    return Sink::Journal;
                }
            }
        }
        let subscriber = Registry::default()
            .with(LevelFilter::INFO)
            .with(StderrLines);
        let _ = tracing::subscriber::set_global_default(subscriber);
        Sink::Stderr
    })
}

/// systemd's rule: stderr is the journal when `JOURNAL_STREAM` is `<device>:<inode>` of fd 2.
pub fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match std::fs::metadata("/proc/self/fd/2").or_else(|_| std::fs::metadata("/dev/stderr")) {
        Ok(m) => m.dev() == dev && m.ino() == ino,
        Err(_) => false,
    }
}

/// Log one fail-closed line exactly as given, with `RUNBOOK=<anchor>` in the journal: what
/// [`runbook!`](crate::runbook) and [`fail`] write through. The line ends with its pointer.
pub fn line(anchor: &str, text: &str) {
    debug_assert!(
        text.ends_with(&pointer(anchor)),
        "a runbook line must end with its pointer: {text}"
    );
    tracing::warn!(RUNBOOK = anchor, "{}", text);
}

/// Log `{daemon}: {what}; ` and the pointer of `anchor`: [`runbook!`](crate::runbook) as a
/// function, for a library that is handed a logger (`bxcore::queue::Log`).
pub fn with_pointer(anchor: &str, what: &str) {
    crate::runbook!(anchor, "{what}");
}

/// Log `{daemon}: {error}` and the error's runbook pointer, with `RUNBOOK=<anchor>` in the
/// journal: the one place a logged error gets its pointer.
pub fn fail(error: &dyn Anchored) {
    line(
        error.anchor(),
        &format!("{}: {}", daemon().name, Pointed(error)),
    );
}

/// [`fail`] with what the error happened to first: `{daemon}: {within}: {error}` and its pointer
/// (`slot main`, `session s1`).
pub fn fail_in(within: &dyn fmt::Display, error: &dyn Anchored) {
    line(
        error.anchor(),
        &format!("{}: {within}: {}", daemon().name, Pointed(error)),
    );
}

/// Log `{daemon}: {text}`: a notice (startup, what is served), no runbook pointer.
pub fn notice(text: &str) {
    tracing::info!("{}: {}", daemon().name, text);
}

/// Log `{daemon}: {what}; ` and the anchor's pointer, with the journal fields
/// `RUNBOOK=<anchor>` and `SYSLOG_IDENTIFIER=<daemon>`. The anchor is a literal or a
/// `const *_ANCHOR` (the runbook check reads the source line by line: when the call spans lines,
/// name the anchor in a constant).
///
/// ```
/// bxharden::runbook!("socket-forbidden", "refused the message kind {} on {}", "ping", "a.sock");
/// ```
#[macro_export]
macro_rules! runbook {
    ($anchor:expr, $($arg:tt)+) => {
        $crate::log::line(
            $anchor,
            &::std::format!(
                "{}: {}; {}",
                $crate::log::daemon().name,
                ::std::format_args!($($arg)+),
                $crate::log::pointer($anchor)
            ),
        )
    };
}

/// Plain lines on stderr: the message, then any other field but `RUNBOOK` as ` key=value`.
struct StderrLines;

#[derive(Default)]
struct LineVisitor {
    message: String,
    rest: String,
}

impl Visit for LineVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            "RUNBOOK" => {}
            name => {
                let _ = write!(self.rest, " {name}={value}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            "RUNBOOK" => {}
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for StderrLines {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut v = LineVisitor::default();
        event.record(&mut v);
        // RFC 3339 first, as a log file read later needs (the journal stamps its own).
        let mut out = bxcore::Timestamp::now().utc_text();
        out.push(' ');
        out.push_str(&v.message);
        out.push_str(&v.rest);
        out.push('\n');
        // One write per line, so lines from threads never interleave.
        let _ = std::io::stderr().lock().write_all(out.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_plain_line_is_read_back_without_its_time() {
        let stamped = format!("{} loopd: serving", bxcore::Timestamp(0).utc_text());
        assert_eq!(bxtest::without_time(&stamped), "loopd: serving");
        assert_eq!(bxtest::without_time("loopd: serving"), "loopd: serving");
    }

    use super::*;

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(!stderr_is_journal(None));
        assert!(!stderr_is_journal(Some("")));
        assert!(!stderr_is_journal(Some("8:x")));
        assert!(!stderr_is_journal(Some("1:1")));
        let m = std::fs::metadata("/proc/self/fd/2").unwrap();
        assert!(stderr_is_journal(Some(&format!("{}:{}", m.dev(), m.ino()))));
        assert!(!stderr_is_journal(Some(&format!(
            "{}:{}",
            m.dev(),
            m.ino() + 1
        ))));
    }
}
