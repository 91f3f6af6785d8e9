//! The chain's format, pinned: the exact line and hash of known records, as brokerd wrote them
//! before its hashing was made fast, so neither the bytes nor the hash definition can drift.

use brokerd::ledger::chain;
use brokerd::ledger::record::{Draft, Event, GENESIS, Record, hash_of};
use bxcore::{CallId, SessionId, Timestamp};
use serde_json::json;

fn records() -> Vec<Record> {
    let s = SessionId::new("s-1").unwrap();
    let drafts = vec![
        Draft::broker(
            Event::Started,
            json!({"sandbox": "none", "head_found": {"seq": 0, "hash": GENESIS}}),
        ),
        Draft::call(
            &s,
            CallId(3),
            "workspace_read",
            Event::Requested,
            json!({
                "args_digest": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
                "args_summary": "{path: string(23)}",
            }),
        ),
        Draft::call(
            &s,
            CallId(u64::MAX),
            "tool \"quoted\"\n",
            Event::Pending,
            json!({
                "z": [1, -2, 1.5, 1e100, 0.1, -0.0, true, null, u64::MAX, i64::MIN],
                "a\"b\\c": "tab\there\u{1} é 😀 / \u{7f}",
                "B": {"y": {}, "x": []},
                "approval": "0123456789abcdef",
                "": "",
            }),
        ),
    ];
    let mut prev = GENESIS.to_string();
    let mut out = Vec::new();
    for (i, d) in drafts.into_iter().enumerate() {
        let r = Record::seal(
            d,
            i as u64 + 1,
            &prev,
            Timestamp(1_764_489_600_000 + i as u64),
        );
        prev = r.hash.clone();
        out.push(r);
    }
    out
}

// Written by the code before the fast path; the third holds a DEL (0x7f), which JSON does not
// escape.
const LINES: [&str; 3] = [
    r#"{"call":null,"detail":{"head_found":{"hash":"0000000000000000000000000000000000000000000000000000000000000000","seq":0},"sandbox":"none"},"event":"started","hash":"4b1d286a2c922c48d2ec3129f55be4b3e655243741d46a28d07fc30471d18af4","prev":"0000000000000000000000000000000000000000000000000000000000000000","seq":1,"session":null,"time":1764489600000,"tool":null}"#,
    r#"{"call":3,"detail":{"args_digest":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","args_summary":"{path: string(23)}"},"event":"requested","hash":"cdfbba3848a55612f169d2680c087e9667851b6bc72f3f27725a17cc1a83ada1","prev":"4b1d286a2c922c48d2ec3129f55be4b3e655243741d46a28d07fc30471d18af4","seq":2,"session":"s-1","time":1764489600001,"tool":"workspace_read"}"#,
    concat!(
        r#"{"call":18446744073709551615,"detail":{"":"","B":{"x":[],"y":{}},"a\"b\\c":"tab\there\u0001 é 😀 / "#,
        "\u{7f}",
        r#"","approval":"0123456789abcdef","z":[1,-2,1.5,1e+100,0.1,-0.0,true,null,18446744073709551615,-9223372036854775808]},"event":"pending","hash":"b784d29bb949c5da41cbe554547fa1609d1bfe8b491beda7de44987a5180abfb","prev":"cdfbba3848a55612f169d2680c087e9667851b6bc72f3f27725a17cc1a83ada1","seq":3,"session":"s-1","time":1764489600002,"tool":"tool \"quoted\"\n"}"#
    ),
];

const HASHES: [&str; 3] = [
    "4b1d286a2c922c48d2ec3129f55be4b3e655243741d46a28d07fc30471d18af4",
    "cdfbba3848a55612f169d2680c087e9667851b6bc72f3f27725a17cc1a83ada1",
    "b784d29bb949c5da41cbe554547fa1609d1bfe8b491beda7de44987a5180abfb",
];

#[test]
fn known_records_have_their_known_lines_and_hashes() {
    for ((r, line), hash) in records().iter().zip(LINES).zip(HASHES) {
        assert_eq!(r.line(), format!("{line}\n"));
        assert_eq!(r.hash, hash);
        assert_eq!(r.computed_hash(), hash);
        assert_eq!(hash_of(&r.prev, &r.value_without_hash()), hash);
    }
}

#[test]
fn a_hash_is_sha256_of_prev_and_the_line_without_its_hash() {
    use sha2::{Digest, Sha256};
    let mut prev = GENESIS.to_string();
    for (line, hash) in LINES.iter().zip(HASHES) {
        let field = format!("\"hash\":\"{hash}\",");
        let body = line.replacen(&field, "", 1);
        let digest = Sha256::digest(format!("{prev}{body}").as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, hash);
        prev = hash.to_string();
    }
}

#[test]
fn the_known_lines_verify_and_a_pending_approval_is_open() {
    let text: String = LINES.iter().map(|l| format!("{l}\n")).collect();
    let r = chain::report(text.as_bytes());
    assert!(r.ok, "{}", r.detail);
    assert_eq!((r.records, r.head.as_str()), (3, HASHES[2]));
    let s = chain::scan(text.as_bytes(), chain::Threads::One);
    assert_eq!(s.open.len(), 1);
    assert_eq!(s.open[0].approval.as_str(), "0123456789abcdef");
    assert_eq!(s.open[0].draft.tool.as_deref(), Some("tool \"quoted\"\n"));
    assert_eq!(s.open[0].draft.call, Some(CallId(u64::MAX)));
}
