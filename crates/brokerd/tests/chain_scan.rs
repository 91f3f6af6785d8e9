//! The scan over the cores (`audit verify`) against the scan on one thread (at start), on a
//! chain of several blocks of lines: the same records, head, breaks and open approvals, wherever
//! a break falls.

use brokerd::ledger::chain::{self, Scan, Threads};
use brokerd::ledger::record::{Draft, Event, GENESIS, Record};
use bxcore::{CallId, SessionId, Timestamp};
use serde_json::json;

/// A chain of `n` records: calls, and an approval opened every 100 records, closed for the
/// first half of them.
fn chain(n: u64) -> Vec<String> {
    let s = SessionId::new("s-1").unwrap();
    let mut prev = GENESIS.to_string();
    let mut lines = Vec::new();
    for seq in 1..=n {
        let approval = format!("{:016x}", seq / 100);
        let (event, detail) = match seq % 100 {
            1 => (Event::Pending, json!({"approval": approval, "rule": "ask"})),
            2 if seq < n / 2 => (Event::Approved, json!({"approval": approval, "by": 1000})),
            _ => (
                Event::Requested,
                json!({"args_digest": "ab".repeat(32), "args_summary": "{path: string(23)}"}),
            ),
        };
        let d = Draft::call(&s, CallId(seq), "workspace_read", event, detail);
        let r = Record::seal(d, seq, &prev, Timestamp(1_764_489_600_000 + seq));
        lines.push(r.line());
        prev = r.hash;
    }
    lines
}

fn same(a: &Scan, b: &Scan) {
    assert_eq!(
        (a.records, a.next_seq, &a.head, a.len, &a.torn, &a.breaks),
        (b.records, b.next_seq, &b.head, b.len, &b.torn, &b.breaks)
    );
    assert_eq!((&a.open, &a.accepted), (&b.open, &b.accepted));
}

/// Scan both ways; the scan on one thread.
fn both(text: &str) -> Scan {
    let one = chain::scan(text.as_bytes(), Threads::One);
    let cores = chain::scan(text.as_bytes(), Threads::Cores);
    same(&one, &cores);
    one
}

/// The index of the line that holds byte `at`.
fn line_at(lines: &[String], at: usize) -> usize {
    let mut end = 0;
    lines
        .iter()
        .position(|l| {
            end += l.len();
            end > at
        })
        .unwrap()
}

#[test]
fn a_chain_of_many_blocks_scans_the_same_over_the_cores() {
    let lines = chain(12_000);
    let text: String = lines.concat();
    assert!(text.len() > 4 << 20, "several blocks of 1 MiB");
    let s = both(&text);
    assert_eq!(s.records, 12_000);
    assert!(s.breaks.is_empty());
    // Approvals 60 to 119 were never closed.
    assert_eq!(s.open.len(), 60);
    let last: serde_json::Value = serde_json::from_str(&lines[11_999]).unwrap();
    assert_eq!(s.head, last["hash"].as_str().unwrap());
}

#[test]
fn breaks_at_and_around_block_edges_scan_the_same_over_the_cores() {
    let lines = chain(12_000);
    for at in [1 << 20, (3 << 20) + 1] {
        let i = line_at(&lines, at);
        for j in [i.saturating_sub(1), i, i + 1] {
            // A changed byte, a line removed, a line that does not parse, two lines swapped.
            // (Whitespace added is no break: the record still hashes as its canonical form.)
            let mut flipped = lines.clone();
            flipped[j] = flipped[j].replacen("workspace_read", "workspace_reaD", 1);
            let mut removed = lines.clone();
            removed.remove(j);
            let mut garbage = lines.clone();
            garbage.insert(j, "not json\n".to_string());
            let mut swapped = lines.clone();
            swapped.swap(j, j + 1);
            for (what, l) in [
                ("flipped", flipped),
                ("removed", removed),
                ("garbage", garbage),
                ("swapped", swapped),
            ] {
                let s = both(&l.concat());
                let first = s.first_unaccepted().map(|b| b.at);
                assert_eq!(first, Some(j as u64 + 1), "{what} at line {j}");
            }
        }
    }
}

#[test]
fn a_torn_tail_after_many_blocks_scans_the_same_over_the_cores() {
    let mut text: String = chain(8_000).concat();
    text.push_str("{\"call\":1,\"det");
    let s = both(&text);
    assert_eq!(s.records, 8_000);
    assert_eq!(s.torn.as_ref().map(|t| t.len), Some(14));
}
