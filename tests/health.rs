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
        "loopd's own sockets",
        "loopd finds inferproxy",
        "loopd finds the model provider",
        "loopd finds the tool broker",
        "loopd finds memoryd",
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
    // One line: how many did not pass, and the first, the socket that is gone.
    assert!(stderr.starts_with("selftest: FAILED: "), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("ping loop.sock: loop.sock is absent"),
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
fn status_on_a_box_that_is_down_says_down_once_with_how_to_start_it_and_exits_1() {
    let b = DevBox::new();
    b.up(&[]);
    assert!(b.down().status.success());
    let out = b.bxctl(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (stdout, stderr) = text(&out);
    let start = format!("`bxctl dev up --home {}`", b.home().display());
    assert!(
        stdout.contains("status: DOWN: the box is down: none of its daemons runs")
            && stdout.contains(&start),
        "{stdout}"
    );
    // The sockets are still shown as they are, each refusing.
    assert!(
        stdout.contains("loop.sock") && stdout.contains("refuses"),
        "{stdout}"
    );
    assert!(!stdout.contains("DEGRADED"), "{stdout}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("status: DOWN: "), "{stderr}");
    assert!(
        stderr
            .trim_end()
            .ends_with("see docs/runbook.md#bxctl-status-down"),
        "{stderr}"
    );
    let out = b.bxctl(&["status", "--json"]);
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["healthy"], false, "{s}");
    assert!(s["down"].as_str().unwrap().contains(&start), "{s}");
    // One daemon back, and it is degraded again, naming what does not run.
    let up = b.up(&[]);
    assert!(up.status.success(), "{}", said(&up));
    kill9_by_pid(b.pid("loopd").unwrap());
    let out = b.bxctl(&["status"]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("status: DEGRADED"), "{stdout}");
    assert!(stdout.contains("  - loopd is not running"), "{stdout}");
}

fn kill9_by_pid(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    bxtest::wait_for("the killed daemon to end", boxmaker_e2e::DEADLINE, || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    });
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
    // inferproxy refuses a key file its group or others may read.
    fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
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
    // The check says which model, where; the verdict counts it among those that failed.
    let check = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("model answers"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(check.contains("FAILED: openai tiny-model"), "{check}");
    assert!(check.contains(&url), "{check}");
    assert!(stderr.contains("model answers"), "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");
}

/// A loopback port that refuses: bound, then closed again.
fn refusing_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn problems(out: &std::process::Output) -> Vec<String> {
    let s: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    s["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn status_exits_1_naming_the_model_provider_when_its_server_is_down() {
    let b = DevBox::new();
    let url = format!("http://127.0.0.1:{}/v1", refusing_port());
    // Keyless, as a local llama.cpp is: no key file to make.
    b.up(&["--provider", "openai", "--base-url", &url, "--model", "m"]);
    let out = b.bxctl(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let p = problems(&out);
    let provider = p
        .iter()
        .find(|p| p.starts_with("the model provider: "))
        .unwrap_or_else(|| panic!("the provider is named: {p:?}"));
    assert!(
        provider.contains(&url.replace("/v1", "/v1/models")),
        "{provider}"
    );
    assert!(
        provider.ends_with("see docs/runbook.md#inference-unreachable"),
        "{provider}"
    );
    // The human view says it too, under what loopd finds.
    let out = b.bxctl(&["status"]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("the model provider FAILED"), "{stdout}");
    assert!(stdout.contains("status: DEGRADED"), "{stdout}");
}

#[test]
fn status_exits_1_when_a_configured_honcho_does_not_answer() {
    let b = DevBox::new();
    let url = format!("http://127.0.0.1:{}", refusing_port());
    b.up(&["--honcho-url", &url]);
    let out = b.bxctl(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let p = problems(&out);
    assert!(
        p.iter()
            .any(|p| p.starts_with("memory's remote store does not answer: ")
                && p.contains(&url)
                && p.contains("see docs/runbook.md#honcho-")),
        "{p:?}"
    );
}

#[test]
fn chat_with_brokerd_killed_names_the_broker_and_exits_1() {
    let b = DevBox::new();
    b.up(&[]);
    let pid = nix::unistd::Pid::from_raw(b.pid("brokerd").unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    bxtest::wait_for("brokerd to be gone", boxmaker_e2e::DEADLINE, || {
        bxtest::gone(pid.as_raw() as u32)
    });
    let out = b.bxctl(&["chat", "--session", "nob", "what is on my todo list?"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (stdout, stderr) = text(&out);
    assert!(
        stderr.starts_with("bxctl: the turn failed: the tool broker is unavailable"),
        "{stderr}"
    );
    assert!(
        stderr
            .trim_end()
            .ends_with("see docs/runbook.md#broker-unavailable"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("is offered"),
        "no tool call was tried: {stdout}"
    );
    // No session was made: the next turn, with the broker back, starts it new.
    assert!(!b.home().join("loop/sessions/nob.jsonl").exists());
}

#[test]
fn with_loopd_dead_no_check_of_loopd_says_it_passed() {
    let b = DevBox::new();
    b.up(&[]);
    let pid = nix::unistd::Pid::from_raw(b.pid("loopd").unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    bxtest::wait_for("loopd to be gone", boxmaker_e2e::DEADLINE, || {
        bxtest::gone(pid.as_raw() as u32)
    });
    let out = b.bxctl(&["selftest"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (stdout, _) = text(&out);
    for line in stdout.lines() {
        let line = line.trim_start();
        if line.starts_with("ping loop.sock")
            || line.starts_with("confined loopd")
            || line.starts_with("loopd answers health")
        {
            assert!(line.contains("FAILED"), "{line}\n{stdout}");
        }
        assert!(!line.contains("passed"), "{line}");
    }
    // The check that runs loopd's own selftest says what it checked: not loopd itself.
    let own = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("loopd's own sockets"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        own.contains("every socket its configuration names"),
        "{own}"
    );
}
