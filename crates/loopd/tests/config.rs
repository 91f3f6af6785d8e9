//! `loopd.toml`: defaults, every key, refusals, and `[broker]` absent meaning `NoBroker` with one
//! `not_configured_line`.

mod support;

use bxharden::daemon::DaemonConfig;
use std::path::PathBuf;
use std::time::Duration;

use loopd::config::{Config, ConfigError, MAX_TIMEOUT_MS};

fn parse(extra: &str) -> Result<Config, ConfigError> {
    Config::parse(&format!("[paths]\nhome = \"/var/lib/boxmaker\"\n{extra}"))
}

fn refused(extra: &str) -> String {
    match parse(extra) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_fill_every_key_but_home() {
    let c = parse("").unwrap();
    assert_eq!(c.paths.home, PathBuf::from("/var/lib/boxmaker"));
    assert_eq!(c.turns.max_tool_rounds, 8);
    assert_eq!(c.turns.context_tokens, 100_000);
    assert_eq!(c.slots.main, "main");
    assert_eq!(c.broker.socket, None);
    assert_eq!(c.broker.timeout_ms, 120_000);
    assert_eq!(
        c.inference.socket,
        PathBuf::from("/run/boxmaker/loop-infer/infer.sock")
    );
    assert_eq!(c.inference.timeout_ms, 300_000);
    assert_eq!(c.memory.socket, None);
    assert_eq!(
        c.sockets.channel,
        PathBuf::from("/run/boxmaker/channel-loop/loop.sock")
    );
    assert!(c.peers.0.is_empty());
    assert!(c.sandbox.require);
    assert_eq!(
        c.sessions_dir(),
        PathBuf::from("/var/lib/boxmaker/loop/sessions")
    );
    assert_eq!(
        c.outbox_dir(),
        PathBuf::from("/var/lib/boxmaker/loop/outbox")
    );
}

#[test]
fn every_key_is_read() {
    let c = parse(
        r#"
[loop]
max_tool_rounds = 3
context_tokens = 32000
[slots]
main = "big"
[broker]
socket = "/b/broker.sock"
timeout_ms = 5000
[inference]
socket = "/i/infer.sock"
timeout_ms = 6000
[memory]
socket = "/m/memory.sock"
timeout_ms = 7000
[sockets]
channel = "/c/loop.sock"
[peers]
"loop.sock" = ["root", 1000]
[sandbox]
user = "bx-loop"
group = "bx-loop"
require = false
seccomp_log = true
"#,
    )
    .unwrap();
    assert_eq!(c.turns.max_tool_rounds, 3);
    assert_eq!(c.turns.context_tokens, 32_000);
    assert_eq!(c.slots.main, "big");
    assert_eq!(c.broker.socket, Some(PathBuf::from("/b/broker.sock")));
    assert_eq!(c.broker_timeout(), Duration::from_millis(5000));
    assert_eq!(c.inference.socket, PathBuf::from("/i/infer.sock"));
    assert_eq!(c.inference_timeout(), Duration::from_millis(6000));
    assert_eq!(c.memory.socket, Some(PathBuf::from("/m/memory.sock")));
    assert_eq!(c.memory_timeout(), Duration::from_millis(7000));
    assert_eq!(c.sockets.channel, PathBuf::from("/c/loop.sock"));
    assert_eq!(c.peers.0["loop.sock"].len(), 2);
    assert_eq!(c.sandbox.user.as_deref(), Some("bx-loop"));
    assert!(!c.sandbox.require);
    assert!(c.sandbox.seccomp_log);
}

#[test]
fn empty_socket_paths_mean_their_defaults() {
    let c = parse("[sockets]\nchannel = \"\"\n[inference]\nsocket = \"\"\n").unwrap();
    assert_eq!(
        c.sockets.channel,
        PathBuf::from("/run/boxmaker/channel-loop/loop.sock")
    );
    assert_eq!(
        c.inference.socket,
        PathBuf::from("/run/boxmaker/loop-infer/infer.sock")
    );
}

#[test]
fn unknown_keys_are_refused_in_every_table() {
    for extra in [
        "colour = 1\n",
        "[loop]\nmax_rounds = 2\n",
        "[slots]\nmian = \"x\"\n",
        "[broker]\nsocket_path = \"/x\"\n",
        "[inference]\nmodel = \"x\"\n",
        "[sockets]\nloop = \"/x\"\n",
        "[memory]\nurl = \"x\"\n",
        "[sockets]\nchannels = \"/x\"\n",
        "[sandbox]\nusr = \"x\"\n",
        "[nonsense]\n",
    ] {
        let e = refused(extra);
        assert!(e.contains("unknown"), "{extra:?}: {e}");
    }
    assert!(Config::parse("[paths]\nhome = \"/h\"\nextra = 1\n").is_err());
}

#[test]
fn a_missing_or_relative_home_is_refused() {
    assert!(Config::parse("").is_err());
    let e = Config::parse("[paths]\nhome = \"var/lib\"\n").unwrap_err();
    assert!(e.to_string().contains("absolute"), "{e}");
}

#[test]
fn a_broker_timeout_over_24_hours_is_refused() {
    parse(&format!("[broker]\ntimeout_ms = {MAX_TIMEOUT_MS}\n")).unwrap();
    let e = refused(&format!("[broker]\ntimeout_ms = {}\n", MAX_TIMEOUT_MS + 1));
    assert!(
        e.contains("[broker] timeout_ms") && e.contains("24 hours"),
        "{e}"
    );
    let e = refused("[inference]\ntimeout_ms = 99999999999\n");
    assert!(e.contains("[inference] timeout_ms"), "{e}");
}

#[test]
fn zero_timeouts_rounds_and_budgets_are_refused() {
    for (extra, key) in [
        ("[broker]\ntimeout_ms = 0\n", "[broker] timeout_ms"),
        ("[inference]\ntimeout_ms = 0\n", "[inference] timeout_ms"),
        ("[memory]\ntimeout_ms = 0\n", "[memory] timeout_ms"),
        ("[loop]\nmax_tool_rounds = 0\n", "[loop] max_tool_rounds"),
        ("[loop]\ncontext_tokens = 0\n", "[loop] context_tokens"),
        ("[slots]\nmain = \"\"\n", "[slots] main"),
    ] {
        let e = refused(extra);
        assert!(e.contains(key), "{extra:?}: {e}");
    }
}

#[test]
fn an_empty_broker_or_memory_socket_is_refused_not_a_default() {
    assert!(refused("[broker]\nsocket = \"\"\n").contains("[broker] socket"));
    assert!(refused("[memory]\nsocket = \"\"\n").contains("[memory] socket"));
}

#[test]
fn peers_for_a_socket_loopd_does_not_serve_are_refused() {
    let e = refused("[peers]\n\"broker.sock\" = [\"root\"]\n");
    assert!(e.contains("[peers]"), "{e}");
}

#[test]
fn a_file_error_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopd.toml");
    let e = Config::load(&path).unwrap_err();
    assert!(
        e.to_string().starts_with(&path.display().to_string()),
        "{e}"
    );
    std::fs::write(
        &path,
        "[paths]\nhome = \"/h\"\n[loop]\nmax_tool_rounds = 0\n",
    )
    .unwrap();
    let e = Config::load(&path).unwrap_err();
    assert!(
        e.to_string().starts_with(&path.display().to_string()),
        "{e}"
    );
}

#[test]
fn no_broker_section_means_no_broker_and_one_not_configured_line() {
    use support::daemon::{Layout, Loopd, config};
    let home = support::home();
    let _layout = Layout::new(home.path());
    let mut d = Loopd::start(home.path(), &config(home.path(), ""));
    let line = loopd::broker_port::not_configured_line();
    // A turn that asks for a broker tool gets the plain failure and no second line.
    let frames = support::turn(&d.socket, 1, "s", false, "hi");
    assert!(matches!(
        support::last_msg(&frames),
        bxcore::Message::Error(_)
    ));
    let log = d.log_text();
    assert_eq!(log.matches(&line).count(), 1, "{log}");
    d.kill();
}
