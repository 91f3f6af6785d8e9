//! `memoryd.toml` and `[[routes]]`: the defaults route every state as the design says, and a
//! configuration that would file a turn anywhere looser is refused when it loads
//! (`memoryd check` exits 1 with the `memoryd-config-invalid` pointer).

use std::path::Path;
use std::process::Command;

use bxtest::OutputBounded;

use bxcore::{DataClass, Label, MemoryRoute};
use memoryd::Config;
use memoryd::routes::Routes;

fn st(class: DataClass, untrusted: bool) -> Label {
    Label { class, untrusted }
}

#[test]
fn the_default_routes_send_private_main_untrusted_quarantine_and_secret_local() {
    let r = Routes::defaults();
    r.check().unwrap();
    assert_eq!(r.route(st(DataClass::Private, false)), MemoryRoute::Main);
    assert_eq!(r.route(st(DataClass::Public, false)), MemoryRoute::Main);
    assert_eq!(
        r.route(st(DataClass::Private, true)),
        MemoryRoute::Quarantine
    );
    assert_eq!(
        r.route(st(DataClass::Public, true)),
        MemoryRoute::Quarantine
    );
    assert_eq!(r.route(st(DataClass::Secret, false)), MemoryRoute::Local);
    assert_eq!(
        r.route(st(DataClass::Secret, true)),
        MemoryRoute::Local,
        "secret wins over untrusted"
    );
}

fn parse(extra: &str) -> Result<Config, String> {
    bxharden::daemon::parse::<Config>(
        Path::new("memoryd.toml"),
        &format!("[paths]\nhome = \"/tmp/box\"\n{extra}"),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn a_route_table_sending_a_secret_turn_off_the_device_is_refused() {
    let e = parse("[[routes]]\nuntrusted = true\nto = \"quarantine\"\n[[routes]]\nto = \"main\"\n")
        .unwrap_err();
    assert!(e.contains("secret turns are kept local only"), "{e}");
    let e =
        parse("[[routes]]\nclass = \"secret\"\nto = \"quarantine\"\n[[routes]]\nto = \"local\"\n")
            .unwrap_err();
    assert!(e.contains("a secret trusted session to quarantine"), "{e}");
}

#[test]
fn a_route_table_sending_an_untrusted_turn_to_main_is_refused() {
    let e = parse("[[routes]]\nclass = \"secret\"\nto = \"local\"\n[[routes]]\nto = \"main\"\n")
        .unwrap_err();
    assert!(e.contains("untrusted turns are never read back"), "{e}");
}

#[test]
fn a_route_table_that_leaves_a_state_without_a_route_is_refused() {
    let e = parse("[[routes]]\nclass = \"secret\"\nto = \"local\"\n").unwrap_err();
    assert!(e.contains("has no route for"), "{e}");
}

#[test]
fn a_stricter_route_table_is_taken_as_written() {
    let cfg =
        parse("[[routes]]\nclass = \"secret\"\nto = \"local\"\n[[routes]]\nto = \"quarantine\"\n")
            .unwrap();
    assert_eq!(
        cfg.routes().route(st(DataClass::Private, false)),
        MemoryRoute::Quarantine
    );
}

#[test]
fn unknown_keys_relative_paths_and_bounds_out_of_range_are_refused() {
    for (extra, says) in [
        ("[limits]\nnope = 1\n", "unknown field"),
        ("[limits]\nmax_outbox = 0\n", "max_outbox"),
        ("[limits]\nmax_turn_bytes = 10\n", "max_turn_bytes"),
        ("[limits]\nmax_turn_bytes = 2000000\n", "max_turn_bytes"),
        ("[limits]\nmax_store_bytes = 0\n", "max_store_bytes"),
        (
            "[limits]\nmax_turn_bytes = 1048576\nmax_store_bytes = 1048576\n",
            "a sixteenth of max_store_bytes",
        ),
        (
            "[limits]\nmax_session_bytes = 1000\n",
            "max_session_bytes = 1000",
        ),
        (
            "[limits]\nmax_store_bytes = 1048576\nmax_session_bytes = 2097152\n",
            "max_session_bytes = 2097152 is not between",
        ),
        (
            "[limits]\nmax_turn_bytes = 65536\nmax_session_bytes = 65536\n",
            "max_session_bytes = 65536 is not between 131072",
        ),
        ("[limits]\nkeep_days = 40000\n", "keep_days = 40000"),
        (
            "[limits]\nmax_recall_tokens = 1000000\n",
            "max_recall_tokens",
        ),
        ("[limits]\nstate_timeout_ms = 0\n", "state_timeout_ms"),
        (
            "[sockets]\nstate = \"rel/state.sock\"\n",
            "not an absolute path",
        ),
        ("[peers]\n\"admin.sock\" = [\"root\"]\n", "admin.sock"),
    ] {
        let e = parse(extra).unwrap_err();
        assert!(e.contains(says), "{extra}: {e}");
    }
    let e = bxharden::daemon::parse::<Config>(Path::new("m.toml"), "[paths]\nhome = \"rel\"\n")
        .unwrap_err();
    assert!(e.to_string().contains("not an absolute path"));
}

#[test]
fn the_default_sockets_are_the_layouts() {
    let cfg = parse("").unwrap();
    assert_eq!(
        cfg.sockets.memory,
        Path::new("/tmp/box/run/loop-memory/memory.sock")
    );
    assert_eq!(
        cfg.sockets.memories,
        Path::new("/tmp/box/run/owner-memory/memories.sock")
    );
    assert_eq!(
        cfg.sockets.state,
        Path::new("/tmp/box/run/memory-broker/state.sock")
    );
}

#[test]
fn memoryd_check_prints_the_routes_or_exits_1_with_the_pointer() {
    let dir = tempfile::TempDir::new().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[paths]\nhome = \"/tmp/box\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memoryd"))
        .args(["check", "--config"])
        .arg(&good)
        .output_bounded()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("memoryd: route: class secret untrusted any -> local"),
        "{text}"
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[paths]\nhome = \"/tmp/box\"\n[[routes]]\nto = \"main\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memoryd"))
        .args(["check", "--config"])
        .arg(&bad)
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.trim_end()
            .ends_with("see docs/runbook.md#memoryd-config-invalid"),
        "{err}"
    );
}

#[test]
fn a_bearer_token_over_plain_http_beyond_loopback_is_refused() {
    let dir = tempfile::TempDir::new().unwrap();
    let key = dir.path().join("honcho.key");
    bxtest::write_private(&key, "tok-7c1e9a3b5d\n");
    let check = |url: &str, with_key: bool| {
        let cfg = dir.path().join("memoryd.toml");
        let key_line = if with_key {
            format!("key_file = {:?}\n", key.display().to_string())
        } else {
            String::new()
        };
        std::fs::write(
            &cfg,
            format!("[paths]\nhome = \"/tmp/box\"\n[honcho]\nurl = {url:?}\n{key_line}"),
        )
        .unwrap();
        Command::new(env!("CARGO_BIN_EXE_memoryd"))
            .args(["check", "--config"])
            .arg(&cfg)
            .env_remove("CREDENTIALS_DIRECTORY")
            .output_bounded()
            .unwrap()
    };
    for url in [
        "http://192.0.2.10:8765",
        "http://honcho.example.org",
        "http://[2001:db8::1]:80",
    ] {
        let out = check(url, true);
        assert_eq!(out.status.code(), Some(1), "{url}: {}", bxtest::said(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is plain http to a host beyond this machine"),
            "{err}"
        );
        assert!(
            err.trim_end()
                .ends_with("see docs/runbook.md#honcho-config"),
            "{err}"
        );
        assert!(!err.contains("tok-7c1e"), "{err}");
        // No token, nothing to read on the path: taken.
        let out = check(url, false);
        assert!(out.status.success(), "{url}: {}", bxtest::said(&out));
    }
    for url in [
        "http://127.0.0.1:8765",
        "http://localhost:8765",
        "http://[::1]:8765",
        "https://honcho.example.org",
    ] {
        let out = check(url, true);
        assert!(out.status.success(), "{url}: {}", bxtest::said(&out));
    }
}
