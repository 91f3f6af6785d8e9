//! The audit chain on a real brokerd: a clean chain verifies, a torn tail is recovered, every
//! other break refuses start with its runbook line until the owner accepts it, and one home has
//! one brokerd.

mod support;

use std::fs;

use brokerd::ledger::record::{Record, hash_of};
use bxcore::{AuditReport, CallId, Message, SessionId, ToolRequest};
use serde_json::{Value, json};
use support::*;

/// A home whose chain holds a started record and three calls (seven records), brokerd stopped.
fn filled() -> Home {
    let h = Home::new("");
    let mut b = Brokerd::start(&h);
    for i in 1..=3 {
        request(
            &h.broker_sock(),
            i,
            Message::ToolRequest(ToolRequest {
                session: SessionId::new("s").unwrap(),
                call: CallId(i),
                tool: "no_such".into(),
                args: json!({}),
            }),
        );
    }
    b.kill();
    assert_eq!(lines(&h).len(), 7);
    h
}

fn lines(h: &Home) -> Vec<String> {
    fs::read_to_string(h.chain())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(h: &Home, lines: &[String]) {
    let mut s = lines.join("\n");
    s.push('\n');
    fs::write(h.chain(), s).unwrap();
}

fn config(h: &Home) -> String {
    h.config.display().to_string()
}

/// Start brokerd on a broken chain: it must exit 1 with the runbook line naming `at`.
fn refuses_start_at(h: &Home, at: u64, why: &str) {
    let mut b = Brokerd::spawn(h);
    assert_eq!(b.wait_exit(), 1);
    let log = b.stderr();
    let line = log
        .lines()
        .find(|l| l.starts_with(&format!("brokerd: the audit chain is broken at {at}: ")))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(why), "{line}");
    assert!(
        line.ends_with("; see docs/runbook.md#audit-chain-broken"),
        "{line}"
    );
    let (code, out, _) = run(&["audit", "verify", "--config", &config(h)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("broken at {at}")), "{out}");
}

/// Accept the break at `at`, then brokerd starts, says so, and the chain verifies.
fn accept_then_starts(h: &Home, at: u64) {
    let (code, out, err) = run(&[
        "audit",
        "accept",
        "--config",
        &config(h),
        "--at",
        &at.to_string(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("accepted the break at {at}")),
        "{out}"
    );
    let b = Brokerd::start(h);
    b.wait_log(&format!("the audit chain has an accepted break at {at}"));
    let (code, out, _) = run(&["audit", "verify", "--config", &config(h)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 accepted break(s)"), "{out}");
    let accepted = records(h)
        .into_iter()
        .find(|r| r["event"] == "accepted")
        .unwrap();
    assert_eq!(accepted["detail"]["at"], at);
}

#[test]
fn a_clean_chain_verifies_with_its_count_and_head() {
    let h = filled();
    let (code, out, _) = run(&["audit", "verify", "--config", &config(&h)]);
    assert_eq!(code, 0, "{out}");
    let last: Value = serde_json::from_str(lines(&h).last().unwrap()).unwrap();
    assert!(out.contains("records: 7"), "{out}");
    assert!(
        out.contains(&format!("head: {}", last["hash"].as_str().unwrap())),
        "{out}"
    );
    let first: Value = serde_json::from_str(&lines(&h)[0]).unwrap();
    assert_eq!(first["prev"], "0".repeat(64));
    assert_eq!(first["seq"], 1);
    assert_eq!(first["event"], "started");
    // The same over admin.sock, while it runs.
    let _b = Brokerd::start(&h);
    match &request(&h.admin_sock(), 1, Message::AuditVerify {})[0].msg {
        Message::AuditReport(AuditReport { records, ok, .. }) => {
            assert!(*ok);
            assert_eq!(*records, 8);
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn every_record_hash_covers_prev_and_the_canonical_record() {
    let h = filled();
    let mut prev = "0".repeat(64);
    for l in lines(&h) {
        let mut v: Value = serde_json::from_str(&l).unwrap();
        let hash = v.as_object_mut().unwrap().remove("hash").unwrap();
        assert_eq!(v["prev"], prev.as_str());
        assert_eq!(hash_of(&prev, &v), hash.as_str().unwrap());
        assert_eq!(
            l,
            bxcore::canonical::to_string(&serde_json::from_str(&l).unwrap())
        );
        prev = hash.as_str().unwrap().to_string();
    }
}

#[test]
fn a_torn_tail_is_recovered_and_it_serves() {
    let h = filled();
    let mut bytes = fs::read(h.chain()).unwrap();
    bytes.extend_from_slice(br#"{"seq":8,"time":17"#);
    fs::write(h.chain(), &bytes).unwrap();
    let (code, out, _) = run(&["audit", "verify", "--config", &config(&h)]);
    assert_eq!(code, 0, "a torn tail is not a break: {out}");
    assert!(out.contains("a torn tail of 18 bytes"), "{out}");
    let b = Brokerd::start(&h);
    b.wait_log("a torn tail is recovered: 18 bytes");
    let recs = records(&h);
    assert_eq!(recs[7]["event"], "recovered");
    assert_eq!(recs[7]["seq"], 8);
    assert_eq!(recs[7]["detail"]["cut_bytes"], 18);
    assert!(
        recs[7]["detail"]["why"]
            .as_str()
            .unwrap()
            .contains("a torn tail is recovered")
    );
    let (code, out, _) = run(&["audit", "verify", "--config", &config(&h)]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn a_flipped_byte_refuses_start_until_accepted() {
    let h = filled();
    let mut l = lines(&h);
    // One byte: a digit of record 4's time.
    let at = l[3].find("\"time\":").unwrap() + 8;
    let mut bytes = l[3].clone().into_bytes();
    bytes[at] = if bytes[at] == b'1' { b'2' } else { b'1' };
    l[3] = String::from_utf8(bytes).unwrap();
    assert_ne!(l, lines(&h));
    write_lines(&h, &l);
    refuses_start_at(&h, 4, "record 4 does not match its hash");
    accept_then_starts(&h, 4);
}

#[test]
fn a_removed_line_refuses_start_until_accepted() {
    let h = filled();
    let mut l = lines(&h);
    l.remove(2);
    write_lines(&h, &l);
    refuses_start_at(&h, 3, "record 4 is where record 3 should be");
    accept_then_starts(&h, 3);
}

#[test]
fn a_reordered_line_refuses_start_until_accepted() {
    let h = filled();
    let mut l = lines(&h);
    l.swap(2, 3);
    write_lines(&h, &l);
    refuses_start_at(&h, 3, "record 4 is where record 3 should be");
    accept_then_starts(&h, 3);
}

#[test]
fn a_gap_in_seq_refuses_start_even_when_every_hash_is_remade() {
    let h = filled();
    // Forge: record 4 onwards renumbered from 5, every hash recomputed so each record chains.
    let mut prev = "0".repeat(64);
    let mut out = Vec::new();
    for l in lines(&h) {
        let mut r: Record = serde_json::from_str(&l).unwrap();
        if r.seq >= 4 {
            r.seq += 1;
        }
        r.prev = prev.clone();
        r.hash = hash_of(&prev, &r.value_without_hash());
        prev = r.hash.clone();
        out.push(r.line().trim_end().to_string());
    }
    write_lines(&h, &out);
    refuses_start_at(&h, 4, "record 5 is where record 4 should be");
    accept_then_starts(&h, 4);
}

#[test]
fn a_line_that_does_not_parse_refuses_start() {
    let h = filled();
    let mut l = lines(&h);
    l[4] = "this is not json".into();
    write_lines(&h, &l);
    refuses_start_at(&h, 5, "the line does not parse");
}

#[test]
fn accept_at_the_wrong_place_changes_nothing() {
    let h = filled();
    let mut l = lines(&h);
    l.remove(2);
    write_lines(&h, &l);
    let before = fs::read(h.chain()).unwrap();
    let (code, _, err) = run(&["audit", "accept", "--config", &config(&h), "--at", "5"]);
    assert_eq!(code, 1);
    assert!(err.contains("its first break is at 3"), "{err}");
    assert_eq!(fs::read(h.chain()).unwrap(), before);
    let clean = filled();
    let (code, _, err) = run(&["audit", "accept", "--config", &config(&clean), "--at", "2"]);
    assert_eq!(code, 1);
    assert!(err.contains("there is nothing to accept"), "{err}");
}

#[test]
fn a_second_brokerd_on_the_same_home_refuses() {
    let h = Home::new("");
    let _first = Brokerd::start(&h);
    let mut second = Brokerd::spawn(&h);
    assert_eq!(second.wait_exit(), 1);
    let log = second.stderr();
    assert!(
        log.contains("brokerd: another brokerd holds the audit lock")
            && log.contains("see docs/runbook.md#broker-already-running"),
        "{log}"
    );
    // And accept cannot run beside it either.
    let (code, _, err) = run(&["audit", "accept", "--config", &config(&h), "--at", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("broker-already-running"), "{err}");
    // The first still serves.
    assert!(ping(&h.broker_sock()).is_some());
}

#[test]
fn check_reports_a_broken_chain_and_exits_1() {
    let h = filled();
    let mut l = lines(&h);
    l.remove(1);
    write_lines(&h, &l);
    let (code, out, _) = run(&["check", "--config", &config(&h)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("the audit chain is broken at 2"), "{out}");
}

/// brokerd under `RLIMIT_FSIZE` of `limit` bytes, with `SIGXFSZ` ignored (as it is inherited
/// across exec), so a write past the limit fails with `EFBIG` as on a full file system.
fn under_file_size_limit(h: &Home, limit: u64) -> Brokerd {
    use std::os::unix::process::CommandExt;
    let log = h.log(900);
    let mut cmd = bxtest::daemon_command(
        std::path::Path::new(brokerd_bin()),
        "serve",
        &h.config,
        &log,
    );
    // SAFETY: between fork and exec only async-signal-safe calls: setrlimit and signal.
    unsafe {
        cmd.pre_exec(move || {
            let rl = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let daemon = bxtest::Daemon::spawn_command(&mut cmd, &log);
    let mut b = Brokerd { daemon, log };
    b.wait_serving(h);
    b
}

#[test]
fn a_chain_that_cannot_be_written_refuses_every_later_call_with_its_pointer() {
    let h = filled();
    let size = fs::metadata(h.chain()).unwrap().len();
    // Room for the start record and a few calls, not for many.
    let b = under_file_size_limit(&h, size + 4096);
    let call = |i: u64| {
        let r = request(
            &h.broker_sock(),
            100 + i,
            Message::ToolRequest(ToolRequest {
                session: SessionId::new("full").unwrap(),
                call: CallId(100 + i),
                tool: "no_such".into(),
                args: json!({}),
            }),
        );
        format!("{:?}", r.last().map(|e| &e.msg))
    };
    let mut first_refused = None;
    for i in 0..200 {
        let said = call(i);
        if said.contains("audit-write-failed") {
            first_refused = Some(i);
            break;
        }
    }
    let first = first_refused.expect("the chain filled within 200 calls");
    // Every later call is refused the same way, and nothing more is written.
    let len = fs::metadata(h.chain()).unwrap().len();
    for i in first + 1..first + 4 {
        let said = call(i);
        assert!(
            said.contains("see docs/runbook.md#audit-write-failed"),
            "{said}"
        );
    }
    assert_eq!(fs::metadata(h.chain()).unwrap().len(), len);
    b.wait_log("audit-write-failed");
    drop(b);
    // With room again, the chain verifies (a torn tail, if the failed write left one, is
    // recovered) and holds every call answered before the failure.
    let _b = Brokerd::start(&h);
    let report = request(&h.admin_sock(), 1, Message::AuditVerify {});
    match report.last().map(|e| &e.msg) {
        Some(Message::AuditReport(AuditReport { ok, records, .. })) => {
            assert!(*ok, "{report:?}");
            // filled()'s seven, the start record, two per call answered before the failure,
            // and the second start's record.
            assert!(*records >= 8 + 2 * first, "{report:?}");
        }
        other => panic!("{other:?}"),
    }
}
