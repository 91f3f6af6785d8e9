//! Issue 17, finding 1: `status` and `selftest` tell the truth. A socket that is gone, a model
//! that does not answer, a daemon that is down are named, and the exit is 1; the model's
//! provider, name and base URL are shown; a skipped check is never `ok`; `--json` on both.

use std::fs;
use std::net::TcpListener;

use boxmaker_e2e::{DevBox, said};
use serde_json::Value;

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_healthy_box_exits_0_from_status_and_selftest_and_shows_its_model() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["status"]);
    assert!(out.status.success(), "{}", said(&out));
    let (stdout, _) = text(&out);
    assert!(stdout.contains("model: script "), "{stdout}");
    assert!(stdout.ends_with("status: healthy\n"), "{stdout}");

    let out = b.bxctl(&["selftest", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["model"]["provider"], "script", "{r}");
    let checks = r["checks"].as_array().unwrap();
    for name in [
        "model answers",
        "audit chain",
        "confined loopd",
        "confined brokerd",
        "confined inferproxy",
        "ping loop.sock",
        "loopd selftest",
    ] {
        let c = checks
            .iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {r}"));
        assert_eq!(c["state"], "ok", "{c}");
    }
}

#[test]
fn a_deleted_loop_sock_fails_selftest_and_status_instead_of_being_skipped() {
    let b = DevBox::new();
    b.up(&[]);
    fs::remove_file(b.home().join("run/channel-loop/loop.sock")).unwrap();

    let out = b.bxctl(&["selftest"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (stdout, stderr) = text(&out);
    assert!(!stdout.ends_with("selftest: ok\n"), "{stdout}");
    assert!(!stdout.contains("skipped"), "{stdout}");
    assert!(
        stdout.contains("ping loop.sock") && stdout.contains("FAILED"),
        "{stdout}"
    );
    assert!(
        stderr.starts_with("selftest: FAILED: ping loop.sock: "),
        "{stderr}"
    );
    assert!(
        stderr
            .trim_end()
            .ends_with("see docs/runbook.md#bxctl-selftest-failed"),
        "{stderr}"
    );

    let out = b.bxctl(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["healthy"], false, "{s}");
    assert!(
        s["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("loop.sock is absent")),
        "{s}"
    );
    let (_, stderr) = text(&out);
    assert!(stderr.starts_with("status: DEGRADED: "), "{stderr}");
    assert!(
        stderr
            .trim_end()
            .ends_with("see docs/runbook.md#bxctl-status-degraded"),
        "{stderr}"
    );
}

#[test]
fn status_exits_1_when_every_socket_refuses() {
    let b = DevBox::new();
    b.up(&[]);
    assert!(b.down().status.success());
    let out = b.bxctl(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (stdout, _) = text(&out);
    assert!(stdout.contains("status: DEGRADED"), "{stdout}");
    for d in ["loopd", "brokerd", "inferproxy"] {
        assert!(
            stdout.contains(&format!("  - {d} is not running")),
            "{d}: {stdout}"
        );
    }
}

#[test]
fn a_model_server_that_is_down_fails_selftest_naming_provider_model_and_url() {
    // A port that refuses: bound, then closed again.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let b = DevBox::new();
    let key = b.beside("key");
    fs::write(&key, "sk-test\n").unwrap();
    // A key file must be its owner's alone: inferproxy refuses one others may read.
    fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let url = format!("http://127.0.0.1:{port}/v1");
    b.up(&[
        "--provider",
        "openai",
        "--base-url",
        &url,
        "--model",
        "tiny-model",
        "--api-key-file",
        key.to_str().unwrap(),
    ]);

    let out = b.bxctl(&["status"]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains(&format!("model: openai tiny-model (slot main) at {url}")),
        "{stdout}"
    );

    let out = b.bxctl(&["selftest", "--model-timeout", "30"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (stdout, stderr) = text(&out);
    assert!(!stdout.ends_with("selftest: ok\n"), "{stdout}");
    assert!(
        stderr.contains("model answers: openai tiny-model"),
        "{stderr}"
    );
    assert!(stderr.contains(&url), "{stderr}");
}
