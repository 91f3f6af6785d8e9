//! The ledger in process: the state store's atomic replace and its refusals, group commit under
//! concurrent appends, raises that never lose each other, and the scan's verdicts.

use std::fs;
use std::sync::Arc;
use std::thread;

use brokerd::ledger::Ledger;
use brokerd::ledger::chain::{self, OnBreak};
use brokerd::ledger::record::{Draft, Event, summary};
use brokerd::state::StateStore;
use bxcore::runbook::Anchored;
use bxcore::{CallId, DataClass, Label, SessionId};
use serde_json::json;
use tempfile::TempDir;

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

#[test]
fn a_missing_state_is_the_default_and_reading_writes_nothing() {
    let d = TempDir::new().unwrap();
    let store = StateStore::new(d.path());
    assert_eq!(store.read(&sid("s")).unwrap(), Label::FRESH);
    assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
}

#[test]
fn a_write_replaces_the_file_whole_and_leaves_no_temporary() {
    let d = TempDir::new().unwrap();
    let store = StateStore::new(d.path());
    let s = Label::new(DataClass::Secret, true);
    store.write(&sid("s"), s).unwrap();
    assert_eq!(store.read(&sid("s")).unwrap(), s);
    assert_eq!(
        fs::read_to_string(d.path().join("s.json")).unwrap(),
        r#"{"taint":"secret","untrusted":true}"#
    );
    assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
}

#[test]
fn a_damaged_state_is_an_error_that_names_the_file_and_the_runbook() {
    let d = TempDir::new().unwrap();
    let store = StateStore::new(d.path());
    for (name, body) in [
        ("a", "{"),
        ("b", r#"{"taint":"public","untrusted":false}"#),
        ("c", r#"{"taint":"private"}"#),
        ("e", r#"{"taint":"private","untrusted":false,"more":1}"#),
    ] {
        fs::write(d.path().join(format!("{name}.json")), body).unwrap();
        let e = store.read(&sid(name)).unwrap_err().pointed().to_string();
        assert!(
            e.starts_with(&d.path().join(format!("{name}.json")).display().to_string()),
            "{e}"
        );
        assert!(
            e.ends_with("; see docs/runbook.md#broker-state-damaged"),
            "{e}"
        );
    }
    fs::create_dir(d.path().join("dir.json")).unwrap();
    assert!(store.read(&sid("dir")).is_err());
}

fn open(d: &TempDir) -> Ledger {
    let (audit, _) = chain::open(&d.path().join("chain.jsonl"), OnBreak::Refuse).unwrap();
    Ledger::new(StateStore::new(d.path()), audit)
}

#[test]
fn concurrent_raises_of_one_session_never_lose_each_other() {
    let d = TempDir::new().unwrap();
    let ledger = Arc::new(open(&d));
    let mut threads = Vec::new();
    for i in 0..16u64 {
        let l = Arc::clone(&ledger);
        threads.push(thread::spawn(move || {
            let p = if i % 2 == 0 {
                Label::new(DataClass::Secret, false)
            } else {
                Label::new(DataClass::Public, true)
            };
            l.raise(&sid("s"), CallId(i), "t", p, Event::Result, json!({}))
                .unwrap();
        }));
    }
    for t in threads {
        bxtest::join(t, "a thread writing to the ledger");
    }
    assert_eq!(
        ledger.state(&sid("s")).unwrap(),
        Label::new(DataClass::Secret, true)
    );
}

#[test]
fn group_commit_keeps_every_record_in_one_unbroken_chain() {
    let d = TempDir::new().unwrap();
    let ledger = Arc::new(open(&d));
    let mut threads = Vec::new();
    for t in 0..8u64 {
        let l = Arc::clone(&ledger);
        threads.push(thread::spawn(move || {
            for n in 0..50u64 {
                l.record(vec![
                    Draft::call(
                        &sid("s"),
                        CallId(t * 100 + n),
                        "x",
                        Event::Requested,
                        json!({}),
                    ),
                    Draft::call(
                        &sid("s"),
                        CallId(t * 100 + n),
                        "x",
                        Event::Denied,
                        json!({}),
                    ),
                ])
                .unwrap();
            }
        }));
    }
    for t in threads {
        bxtest::join(t, "a thread writing to the ledger");
    }
    let bytes = fs::read(d.path().join("chain.jsonl")).unwrap();
    let r = chain::report(&bytes);
    assert!(r.ok, "{}", r.detail);
    assert_eq!(r.records, 800);
    // Each call's two records are adjacent: one write per commit.
    let recs: Vec<serde_json::Value> = String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for pair in recs.chunks(2) {
        assert_eq!(pair[0]["call"], pair[1]["call"]);
    }
    assert_eq!(
        ledger.audit().written_len(),
        fs::metadata(d.path().join("chain.jsonl")).unwrap().len()
    );
}

#[test]
fn the_summary_names_keys_and_shapes_never_values() {
    let s = summary(&json!({"token": "sk-very-secret", "n": 3, "list": [1, 2], "o": {}}));
    assert_eq!(
        s,
        "{list: array(2), n: number, o: object(0), token: string(14)}"
    );
    assert!(!s.contains("sk-"));
    let long = json!({ "k".repeat(300): 1 });
    assert!(summary(&long).chars().count() <= 201);
}

#[test]
fn an_empty_chain_verifies_with_the_zero_head() {
    let r = chain::report(b"");
    assert!(r.ok);
    assert_eq!(r.records, 0);
    assert_eq!(r.head, "0".repeat(64));
}

#[test]
fn a_state_file_is_0600() {
    use std::os::unix::fs::PermissionsExt;
    let d = TempDir::new().unwrap();
    let store = StateStore::new(d.path());
    store.write(&sid("s"), Label::FRESH).unwrap();
    let mode = fs::metadata(d.path().join("s.json"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn every_single_byte_change_is_a_break_or_a_torn_tail() {
    use brokerd::ledger::record::{GENESIS, Record};
    use bxcore::Timestamp;
    let mut prev = GENESIS.to_string();
    let mut text = String::new();
    for seq in 1..=6u64 {
        let d = Draft::call(
            &sid("s-1"),
            CallId(seq),
            "workspace_read",
            if seq % 2 == 1 {
                Event::Requested
            } else {
                Event::Denied
            },
            json!({"args_digest": "ab".repeat(32), "reason": "the owner denied it", "n": seq}),
        );
        let r = Record::seal(d, seq, &prev, Timestamp(1_764_489_600_000 + seq));
        text.push_str(&r.line());
        prev = r.hash;
    }
    let clean = chain::report(text.as_bytes());
    assert!(clean.ok && clean.records == 6);
    let bytes = text.into_bytes();
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x01;
        let r = chain::report(&b);
        if i == bytes.len() - 1 {
            // The last newline changed: the last record is a torn tail, cut and recorded at start.
            assert!(
                r.ok && r.records == 5 && r.detail.contains("torn tail"),
                "{}",
                r.detail
            );
        } else {
            assert!(!r.ok, "a change at byte {i} went unnoticed");
        }
    }
}
