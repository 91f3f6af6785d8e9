//! The demo's conversation against the real binaries, each step asserted from the frames the
//! channel saw, from the broker's files (session state, the audit chain) and from what memoryd
//! filed (`bxctl memory recent --json`), not from printed text.

use std::fs;
use std::io;

use boxmaker_e2e::{DevBox, bxctl, said};
use bxcore::canonical;
use bxcore::{Outcome, TurnEvent};
use bxctl::demo;
use serde_json::{Value, json};

/// `(session, turn)` of every turn memoryd filed to `route`, by `bxctl memory recent`.
fn filed(b: &DevBox, route: &str) -> Vec<(String, u64)> {
    let out = b.bxctl(&["memory", "recent", "--route", route, "-n", "1000", "--json"]);
    assert!(out.status.success(), "bxctl memory recent: {}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["session"].as_str().unwrap().to_string(),
                m["turn"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn tools_and_outcomes(report: &demo::StepReport) -> (Vec<String>, Vec<Outcome>) {
    let mut tools = Vec::new();
    let mut outcomes = Vec::new();
    for e in &report.turn.events {
        match e {
            TurnEvent::ToolCall { tool, .. } => tools.push(tool.clone()),
            TurnEvent::ToolResult { outcome, .. } => outcomes.push(*outcome),
            _ => {}
        }
    }
    (tools, outcomes)
}

fn state(b: &DevBox, session: &str) -> Value {
    let path = b.home().join(format!("broker/sessions/{session}.json"));
    serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap()
}

fn chain(b: &DevBox) -> Vec<Value> {
    fs::read_to_string(b.home().join("broker/audit/chain.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The events the chain recorded for one session's calls of one tool, in order.
fn events(chain: &[Value], session: &str, tool: &str) -> Vec<String> {
    chain
        .iter()
        .filter(|r| r["session"] == session && r["tool"] == tool)
        .map(|r| r["event"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_demo_conversation_does_what_each_step_says() {
    let b = DevBox::new();
    let script = b.beside("demo.toml");
    fs::write(&script, demo::DEMO_SCRIPT).unwrap();
    b.up(&[
        "--script",
        &script.display().to_string(),
        "--web-host",
        demo::WEB_HOST,
    ]);

    let reports = demo::conversation(b.home(), &mut io::sink()).expect("every step passes");
    assert_eq!(reports.len(), 6);

    // 1. words, no tool.
    let (tools, _) = tools_and_outcomes(&reports[0]);
    assert!(tools.is_empty());
    assert!(
        reports[0]
            .turn
            .events
            .iter()
            .any(|e| matches!(e, TurnEvent::AssistantText { text } if !text.is_empty()))
    );
    // 2 and 3. one allowed read each.
    for r in &reports[1..3] {
        assert_eq!(
            tools_and_outcomes(r),
            (vec!["workspace_read".into()], vec![Outcome::Result])
        );
    }
    // 4. the web, denied.
    assert_eq!(
        tools_and_outcomes(&reports[3]),
        (vec!["web_fetch".into()], vec![Outcome::Denied])
    );
    // 5. read, then a write that waited and was approved; 6. the same, denied.
    for (r, allow, last) in [
        (&reports[4], true, Outcome::Result),
        (&reports[5], false, Outcome::Denied),
    ] {
        assert_eq!(
            tools_and_outcomes(r),
            (
                vec!["workspace_read".into(), "workspace_write".into()],
                vec![Outcome::Result, last]
            )
        );
        assert!(
            r.turn
                .events
                .iter()
                .any(|e| matches!(e, TurnEvent::ToolPending { .. }))
        );
        assert_eq!(r.approval.as_ref().map(|a| a.1), Some(allow));
    }

    // The broker's state files.
    assert_eq!(
        state(&b, "demo"),
        json!({"taint": "secret", "untrusted": false})
    );
    assert_eq!(
        state(&b, "inbox-1"),
        json!({"taint": "private", "untrusted": true})
    );
    assert_eq!(
        state(&b, "inbox-2"),
        json!({"taint": "private", "untrusted": true})
    );

    // The workspace: the approved write happened, the denied one did not.
    let notes = b.home().join("workspace/notes");
    assert_eq!(
        fs::read_to_string(notes.join("meeting.txt")).unwrap(),
        "The meeting moved to Friday.\n"
    );
    assert!(!notes.join("pin.txt").exists());

    // The audit chain: linked and hashed record by record, and what it says happened.
    let chain = chain(&b);
    let mut prev = "0".repeat(64);
    for (i, r) in chain.iter().enumerate() {
        assert_eq!(
            r["seq"],
            json!(i as u64 + chain[0]["seq"].as_u64().unwrap()),
            "{r}"
        );
        assert_eq!(r["prev"], json!(prev), "record {i} links to the one before");
        let mut without = r.clone();
        let hash = without.as_object_mut().unwrap().remove("hash").unwrap();
        let want =
            canonical::sha256_hex(format!("{prev}{}", canonical::to_string(&without)).as_bytes());
        assert_eq!(hash, json!(want), "record {i}'s hash");
        prev = want;
    }
    let web = events(&chain, "demo", "web_fetch");
    assert!(web.contains(&"denied".to_string()), "{web:?}");
    assert!(!web.contains(&"result".to_string()), "{web:?}");
    let approved = events(&chain, "inbox-1", "workspace_write");
    for e in ["pending", "approved", "result"] {
        assert!(
            approved.contains(&e.to_string()),
            "inbox-1's write: {approved:?}"
        );
    }
    let denied = events(&chain, "inbox-2", "workspace_write");
    assert!(
        denied.contains(&"pending".to_string()) && denied.contains(&"denied".to_string()),
        "{denied:?}"
    );
    assert!(!denied.contains(&"result".to_string()), "{denied:?}");
    // No record holds the arguments whole: the PIN the injection asked for is not in the chain.
    let text = fs::read_to_string(b.home().join("broker/audit/chain.jsonl")).unwrap();
    assert!(
        !text.contains("PIN 4711"),
        "the chain holds an argument whole"
    );

    let out = b.bxctl(&["audit", "verify"]);
    assert!(out.status.success(), "bxctl audit verify: {}", said(&out));

    // 8 to 11. What memoryd filed where, as the owner lists it; the recall, in the session log.
    let (main, quarantine, local) = (
        filed(&b, "main"),
        filed(&b, "quarantine"),
        filed(&b, "local"),
    );
    let turn = |s: &str, n: u64| (s.to_string(), n);
    assert!(main.contains(&turn("memory-1", 1)), "main: {main:?}");
    for s in ["inbox-1", "inbox-2"] {
        assert!(
            quarantine.contains(&turn(s, 1)),
            "quarantine: {quarantine:?}"
        );
    }
    assert!(local.contains(&turn("demo", 3)), "local: {local:?}");
    for (s, _) in &main {
        assert!(
            s.starts_with("memory-") || s == "demo",
            "{s} in main: {main:?}"
        );
    }
    assert!(!main.contains(&turn("demo", 3)) && !main.contains(&turn("demo", 4)));
    let log = fs::read_to_string(b.home().join("loop/sessions/memory-2.jsonl")).unwrap();
    let recall = log
        .lines()
        .find(|l| l.contains(r#""type":"recall""#))
        .unwrap_or_else(|| panic!("no recall in memory-2's log:\n{log}"));
    assert!(recall.contains(demo::REMEMBERED), "{recall}");
    assert!(
        !recall.contains("inbox-") && !recall.contains("4711"),
        "{recall}"
    );
}

#[test]
fn the_demo_fails_at_its_first_memory_step_when_memoryd_files_nothing() {
    let b = DevBox::new();
    let script = b.beside("demo.toml");
    fs::write(&script, demo::DEMO_SCRIPT).unwrap();
    b.up(&[
        "--script",
        &script.display().to_string(),
        "--web-host",
        demo::WEB_HOST,
    ]);
    // memoryd gone: every turn still ends (recall is skipped), but nothing is filed.
    let pid = nix::unistd::Pid::from_raw(b.pid("memoryd").unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    match demo::conversation(b.home(), &mut io::sink()) {
        Err(demo::DemoError::Step { n: 8, why, .. }) => {
            assert!(why.contains("memories.sock"), "{why}");
        }
        other => panic!("expected step 8 to fail, got {other:?}"),
    }
}

#[test]
fn bxctl_demo_runs_every_step_and_removes_its_home() {
    let out = bxctl(&["demo"]);
    assert!(out.status.success(), "bxctl demo: {}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    // Its temporary home named in the first line is gone, and so are its daemons.
    let home = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("Starting a dev box on "))
        .and_then(|l| l.strip_suffix(" with the demo script."))
        .expect("the first line names the home");
    assert!(
        !std::path::Path::new(home).exists(),
        "{home} is left behind"
    );
}
