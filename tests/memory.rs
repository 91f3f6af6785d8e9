//! memoryd in the dev box, through the real daemons and `bxctl`: a finished turn is filed to the
//! owner's main memory, recalled into a later session, shown, searched and forgotten by the
//! owner; a stopped memoryd never holds up a turn.

use boxmaker_e2e::{DEADLINE, DevBox, said};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn chat(b: &DevBox, session: &str, text: &str) {
    let out = b.bxctl(&["chat", "--new", "--session", session, text]);
    assert!(out.status.success(), "chat: {}", said(&out));
}

fn memories(b: &DevBox, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["memory"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = b.bxctl(&all);
    assert!(
        out.status.success(),
        "bxctl memory {args:?}: {}",
        said(&out)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["memories"].as_array().unwrap().clone()
}

fn wait_filed(b: &DevBox, route: &str, session: &str) {
    bxtest::wait_for(
        &format!("session {session}'s turn filed to {route}"),
        DEADLINE,
        || {
            memories(b, &["recent", "--route", route])
                .iter()
                .any(|m| m["session"] == session)
        },
    );
}

fn session_log(b: &DevBox, session: &str) -> String {
    std::fs::read_to_string(b.home().join(format!("loop/sessions/{session}.jsonl"))).unwrap()
}

#[test]
fn a_turn_filed_to_main_memory_is_recalled_into_a_later_session() {
    let b = DevBox::new();
    b.up(&[]);
    chat(&b, "cat", "My cat is called Biscuit.");
    wait_filed(&b, "main", "cat");
    chat(&b, "later", "What do you remember about Biscuit?");
    let log = session_log(&b, "later");
    let recall = log
        .lines()
        .find(|l| l.contains(r#""type":"recall""#))
        .unwrap_or_else(|| panic!("no recall record in the new session's log:\n{log}"));
    assert!(recall.contains("My cat is called Biscuit."), "{recall}");
    assert!(recall.contains("[session cat, turn 1]"), "{recall}");
    // The recall comes before the user's text, which still starts the turn.
    let user_at = log.find("What do you remember").unwrap();
    assert!(log.find(r#""type":"recall""#).unwrap() < user_at, "{log}");
}

#[test]
fn the_owner_lists_searches_and_forgets_what_memoryd_filed() {
    let b = DevBox::new();
    b.up(&[]);
    chat(&b, "garden", "The tomatoes in the garden need water.");
    wait_filed(&b, "main", "garden");
    let found = memories(&b, &["search", "tomatoes"]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["route"], "main");
    assert!(memories(&b, &["recent", "--route", "quarantine"]).is_empty());
    let out = b.bxctl(&["memory", "recent"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("garden turn 1 [main, private]"), "{text}");
    let out = b.bxctl(&["memory", "forget", "--session", "garden", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["turns"], 1);
    assert_eq!(v["queued"], false);
    assert!(memories(&b, &["search", "tomatoes"]).is_empty());
}

#[test]
fn bxctl_memory_refuses_a_bad_session_id_or_route_with_usage_and_no_words_with_bad_message() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["memory", "forget", "--session", "../etc"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let out = b.bxctl(&["memory", "recent", "--route", "elsewhere"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let out = b.bxctl(&["memory", "search", "?!", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "bad_message");
}

#[test]
fn status_shows_memoryd_its_store_and_its_outbox() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["status", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let store = v["memory"]["store"].as_str().unwrap();
    assert!(store.contains("memory/local/memory.sqlite3"), "{store}");
    assert_eq!(v["memory"]["outbox"], 0);
    let out = b.bxctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("memory: the embedded store"), "{text}");
    assert!(text.contains("memories.sock"), "{text}");
}

#[test]
fn a_stopped_memoryd_never_holds_up_a_turn_and_its_turns_are_filed_when_it_runs_again() {
    let b = DevBox::new();
    b.up(&[]);
    let pid = Pid::from_raw(b.pid("memoryd").unwrap() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // The turn ends although memoryd answers nothing: recall gives up at `recall_ms`.
    chat(&b, "while-stopped", "Remember the blue boat.");
    kill(pid, Signal::SIGCONT).unwrap();
    let log = std::fs::read_to_string(b.home().join("logs/loopd.log")).unwrap();
    assert_eq!(
        log.matches("see docs/runbook.md#memory-recall-unavailable")
            .count(),
        1,
        "{log}"
    );
    wait_filed(&b, "main", "while-stopped");
}
