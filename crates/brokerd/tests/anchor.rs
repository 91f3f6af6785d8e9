//! The chain is anchored, on a real brokerd: each start records the head it found, the journal
//! gets the head at start, at stop and every 1000 records, a head the owner kept catches a chain
//! cut short or re-hashed after an edit, and a chain file removed or replaced under brokerd
//! stops it rather than lose records into a file nobody sees.

mod support;

use std::fs;

use brokerd::ledger::record::Record;
use bxcore::{AuditHead, CallId, Message, SessionId, ToolRequest, ToolResponse};
use serde_json::json;
use support::*;

fn home() -> Home {
    let h = Home::new("");
    fs::write(h.dir("notes").join("a.txt"), "private words").unwrap();
    h.write_config(&format!(
        "[[workspace.roots]]\npath = {:?}\nclass = \"private\"\n",
        h.home.join("notes").display().to_string(),
    ));
    h
}

fn read(h: &Home, id: u64) -> Vec<bxcore::Envelope> {
    request(
        &h.broker_sock(),
        id,
        Message::ToolRequest(ToolRequest {
            session: SessionId::new("s").unwrap(),
            call: CallId(id),
            tool: "workspace_read".into(),
            args: json!({"path": h.home.join("notes/a.txt").display().to_string()}),
        }),
    )
}

fn read_ok(h: &Home, id: u64) {
    let r = read(h, id);
    assert!(
        matches!(
            r.last().map(|e| &e.msg),
            Some(Message::ToolResponse(ToolResponse::Result { .. }))
        ),
        "{r:?}"
    );
}

/// The last record's `seq:hash`.
fn last_head(h: &Home) -> (u64, String) {
    let r = records(h).pop().unwrap();
    (
        r["seq"].as_u64().unwrap(),
        r["hash"].as_str().unwrap().to_string(),
    )
}

fn verify_head(h: &Home, seq: u64, hash: &str) -> bxcore::AuditReport {
    let msg = Message::AuditVerifyHead(AuditHead {
        seq,
        hash: hash.to_string(),
    });
    match &request(&h.admin_sock(), 1, msg)[0].msg {
        Message::AuditReport(r) => r.clone(),
        o => panic!("{o:?}"),
    }
}

#[test]
fn each_start_records_the_head_it_found() {
    let h = home();
    let mut b = Brokerd::start(&h);
    read_ok(&h, 1);
    let (seq, hash) = last_head(&h);
    b.kill();
    let _b = Brokerd::start(&h);
    let started = records(&h)
        .into_iter()
        .rfind(|r| r["event"] == "started")
        .unwrap();
    assert_eq!(
        started["detail"]["head_found"],
        json!({"seq": seq, "hash": hash})
    );
}

#[test]
fn the_journal_gets_the_head_at_start_and_at_stop() {
    let h = home();
    let mut b = Brokerd::start(&h);
    let (seq, hash) = last_head(&h);
    b.wait_log(&format!("audit chain head {seq}:{hash} (at start)"));
    read_ok(&h, 1);
    let (seq, hash) = last_head(&h);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(b.wait_exit(), 0);
    b.wait_log(&format!("audit chain head {seq}:{hash} (at stop)"));
}

#[test]
fn a_kept_head_is_found_in_a_chain_that_only_grew() {
    let h = home();
    let _b = Brokerd::start(&h);
    read_ok(&h, 1);
    let (seq, hash) = last_head(&h);
    read_ok(&h, 2);
    let r = verify_head(&h, seq, &hash);
    assert!(r.ok, "{r:?}");
    assert!(r.detail.contains("it holds the head"), "{}", r.detail);
}

#[test]
fn a_chain_cut_short_verifies_alone_but_not_against_the_kept_head() {
    let h = home();
    let mut b = Brokerd::start(&h);
    read_ok(&h, 1);
    read_ok(&h, 2);
    let (seq, hash) = last_head(&h);
    b.kill();
    // Remove the last call's three records: whole lines, so the chain still verifies.
    let text = fs::read_to_string(h.chain()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    fs::write(h.chain(), lines[..lines.len() - 3].join("\n") + "\n").unwrap();
    let _b = Brokerd::start(&h);
    let plain = match &request(&h.admin_sock(), 1, Message::AuditVerify {})[0].msg {
        Message::AuditReport(r) => r.clone(),
        o => panic!("{o:?}"),
    };
    assert!(plain.ok, "{plain:?}");
    let r = verify_head(&h, seq, &hash);
    assert!(!r.ok);
    assert!(r.detail.contains("removed from its end"), "{}", r.detail);
    assert!(r.detail.contains("see docs/runbook.md#audit-chain-broken"));
}

#[test]
fn a_chain_edited_and_rehashed_verifies_alone_but_not_against_the_kept_head() {
    let h = home();
    let mut b = Brokerd::start(&h);
    read_ok(&h, 1);
    read_ok(&h, 2);
    let (seq, hash) = last_head(&h);
    b.kill();
    // Change one record and hash every record after it again.
    let text = fs::read_to_string(h.chain()).unwrap();
    let mut recs: Vec<Record> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at = recs.iter().position(|r| r.call == Some(CallId(1))).unwrap();
    recs[at].detail["args_summary"] = json!("{path: string(1)}");
    let from = recs[at].seq;
    let mut prev = recs[at].prev.clone();
    let mut out = String::new();
    for r in recs.iter_mut() {
        if r.seq >= from {
            r.prev = prev.clone();
            r.hash = r.computed_hash();
        }
        prev = r.hash.clone();
        out.push_str(&r.line());
    }
    fs::write(h.chain(), out).unwrap();
    let _b = Brokerd::start(&h);
    let r = verify_head(&h, seq, &hash);
    assert!(!r.ok);
    assert!(r.detail.contains("was rewritten"), "{}", r.detail);
}

#[test]
fn a_chain_file_replaced_under_brokerd_stops_it_with_a_runbook_pointer() {
    let h = home();
    let mut b = Brokerd::start(&h);
    read_ok(&h, 1);
    // What `sed -i` does: a new file with the same text, renamed over the old one.
    let copy = h.home.join("broker/audit/chain.jsonl.new");
    fs::copy(h.chain(), &copy).unwrap();
    fs::rename(&copy, h.chain()).unwrap();
    let before = fs::read(h.chain()).unwrap();
    let r = read(&h, 2);
    assert!(
        !matches!(
            r.last().map(|e| &e.msg),
            Some(Message::ToolResponse(ToolResponse::Result { .. }))
        ),
        "{r:?}"
    );
    assert_ne!(b.wait_exit(), 0);
    let log = b.stderr();
    assert!(log.contains("was replaced by another file"), "{log}");
    assert!(
        log.contains("see docs/runbook.md#audit-chain-replaced"),
        "{log}"
    );
    assert_eq!(fs::read(h.chain()).unwrap(), before);
}

#[test]
fn a_chain_file_removed_under_brokerd_stops_it_with_a_runbook_pointer() {
    let h = home();
    let mut b = Brokerd::start(&h);
    read_ok(&h, 1);
    fs::remove_file(h.chain()).unwrap();
    read(&h, 2);
    assert_ne!(b.wait_exit(), 0);
    let log = b.stderr();
    assert!(log.contains("was removed"), "{log}");
    assert!(
        log.contains("see docs/runbook.md#audit-chain-replaced"),
        "{log}"
    );
    assert!(!h.chain().exists());
}
