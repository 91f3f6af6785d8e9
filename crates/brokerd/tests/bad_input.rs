//! Bad input on each of brokerd's three sockets: every kind of malformed frame gets its
//! documented answer, nothing changes, and the daemon keeps serving everyone else.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use bxcore::{ErrorCode, Message};
use support::*;

fn sockets(h: &Home) -> [PathBuf; 3] {
    [h.broker_sock(), h.admin_sock(), h.state_sock()]
}

fn error_of(r: &[bxcore::Envelope]) -> (u64, ErrorCode, String) {
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(r[0].last);
    match &r[0].msg {
        Message::Error(e) => (r[0].id, e.code, e.detail.clone()),
        o => panic!("{o:?}"),
    }
}

/// After each bad peer, every socket still answers.
fn still_serving(h: &Home) {
    for s in sockets(h) {
        assert!(
            matches!(ping(&s), Some(Message::Pong(p)) if p.daemon == "brokerd"),
            "{}",
            s.display()
        );
    }
}

#[test]
fn not_json_unknown_kind_unknown_key_and_another_version() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    let chain = std::fs::read(h.chain()).unwrap();
    for s in sockets(&h) {
        let cases: [(&[u8], ErrorCode); 5] = [
            (b"{nope", ErrorCode::BadMessage),
            (
                br#"{"v":1,"id":3,"final":true,"msg":{"kind":"launch_missiles"}}"#,
                ErrorCode::BadMessage,
            ),
            (
                br#"{"v":1,"id":3,"final":true,"msg":{"kind":"ping"},"extra":1}"#,
                ErrorCode::BadMessage,
            ),
            (
                br#"{"v":1,"id":3,"final":true,"msg":{"kind":"tools_list","x":1}}"#,
                ErrorCode::BadMessage,
            ),
            (
                br#"{"v":9,"id":3,"final":true,"msg":{"kind":"tools_list"}}"#,
                ErrorCode::BadVersion,
            ),
        ];
        for (body, code) in cases {
            let (id, c, _) = error_of(&raw(&s, &frame(body)));
            assert_eq!(
                (id, c),
                (0, code),
                "{}: {}",
                s.display(),
                String::from_utf8_lossy(body)
            );
        }
    }
    assert_eq!(
        std::fs::read(h.chain()).unwrap(),
        chain,
        "bad input records nothing"
    );
    still_serving(&h);
}

#[test]
fn a_zero_length_an_over_long_and_a_truncated_frame() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    for s in sockets(&h) {
        let (id, c, d) = error_of(&raw(&s, &[0, 0, 0, 0]));
        assert_eq!((id, c), (0, ErrorCode::BadFrame), "{d}");
        let (_, c, d) = error_of(&raw(&s, &((1u32 << 20) + 1).to_be_bytes()));
        assert_eq!(c, ErrorCode::BadFrame);
        assert!(d.contains("over the limit"), "{d}");
        // Announces 100 bytes, sends 10, then closes its side.
        let mut conn = UnixStream::connect(&s).unwrap();
        conn.write_all(&100u32.to_be_bytes()).unwrap();
        conn.write_all(b"{\"v\":1,\"id").unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let (id, c, _) = error_of(&read_all(&conn));
        assert_eq!((id, c), (0, ErrorCode::BadFrame));
    }
    still_serving(&h);
}

#[test]
fn a_peer_that_closes_early_gets_nothing_and_harms_nothing() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    for s in sockets(&h) {
        drop(UnixStream::connect(&s).unwrap());
        let mut c = UnixStream::connect(&s).unwrap();
        c.write_all(&[0, 0]).unwrap();
        drop(c);
    }
    still_serving(&h);
}

#[test]
fn a_silent_peer_and_a_trickling_peer_do_not_hold_up_others() {
    let h = Home::new("");
    // The peers below hold their connections inside the 10 s first-frame allowance; the others
    // are answered while they wait.
    let _b = Brokerd::start(&h);
    let mut held = Vec::new();
    for s in sockets(&h) {
        held.push(UnixStream::connect(&s).unwrap());
        let mut t = UnixStream::connect(&s).unwrap();
        t.write_all(&[0]).unwrap();
        held.push(t);
    }
    still_serving(&h);
    // A peer that sends its frame one byte at a time is still answered, within the deadline.
    let body = br#"{"v":1,"id":8,"final":true,"msg":{"kind":"ping"}}"#;
    let bytes = frame(body);
    let mut t = UnixStream::connect(h.state_sock()).unwrap();
    for b in &bytes {
        t.write_all(&[*b]).unwrap();
        thread::sleep(Duration::from_millis(2));
    }
    let r = read_all(&t);
    assert!(matches!(r[0].msg, Message::Pong(_)), "{r:?}");
    assert_eq!(r[0].id, 8);
    drop(held);
}

#[test]
fn a_silent_peer_is_dropped_with_an_error_at_the_first_frame_deadline() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    let mut c = UnixStream::connect(h.admin_sock()).unwrap();
    c.set_read_timeout(Some(WAIT + WAIT)).unwrap();
    let mut buf = Vec::new();
    // The server's 10 s first-frame deadline passes: an error frame, then the close.
    let _ = c.read_to_end(&mut buf); // bounded: the read timeout above
    let env = bxcore::read_frame(&mut &buf[..]).unwrap();
    match env.msg {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::BadFrame);
            assert!(e.detail.contains("no whole frame within"), "{e:?}");
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_huge_tool_name_is_recorded_and_refused_as_a_bounded_summary() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    let name = "x".repeat(200_000);
    let r = request(
        &h.broker_sock(),
        1,
        Message::ToolRequest(bxcore::ToolRequest {
            session: bxcore::SessionId::new("s").unwrap(),
            call: bxcore::CallId(1),
            tool: name.clone(),
            args: serde_json::json!({}),
        }),
    );
    match &r.last().unwrap().msg {
        Message::ToolResponse(bxcore::ToolResponse::Denied { reason }) => {
            assert!(reason.starts_with("no such tool"), "{reason}");
            assert!(reason.contains("(200000 bytes, sha256 "), "{reason}");
            assert!(reason.len() < 200, "{reason}");
        }
        o => panic!("{o:?}"),
    }
    let chain = std::fs::read_to_string(h.chain()).unwrap();
    assert!(
        chain.len() < 10_000,
        "the chain grew by {} bytes",
        chain.len()
    );
    still_serving(&h);
}
