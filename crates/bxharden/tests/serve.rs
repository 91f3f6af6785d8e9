//! The shared connection path over real Unix sockets: ping, malformed frames, a silent peer,
//! a refused peer, a forbidden kind, one request per connection. Every wait has a deadline of 10
//! seconds or more. (The log lines are checked in `tests/sandbox.rs`, in child processes.)

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use bxcore::{Envelope, ErrorCode, Message, PROTOCOL_VERSION, read_frame, write_frame};
use bxharden::serve::{self, Timeouts};
use bxharden::{Daemon, PeerPolicy};

const WAIT: Duration = Duration::from_secs(20);

fn setup() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        bxharden::log::init(Daemon {
            name: "testd",
            version: "9.8.7",
        });
        // A short first-frame deadline so the silent-peer test does not wait 10 s.
        assert!(serve::set_timeouts(Timeouts {
            first_frame_ms: 500,
            write_ms: 10_000,
        }));
    });
}

fn me() -> u32 {
    nix::unistd::Uid::effective().as_raw()
}

/// A socket served by `accept_loop` with `policy`, answering every request with `turn_done`-like
/// echo: `tools_list` is answered with `tools {}`, anything else is forbidden.
fn serve_on(dir: &Path, policy: PeerPolicy) -> PathBuf {
    setup();
    let path = dir.join("t.sock");
    let listener = UnixListener::bind(&path).unwrap();
    serve::accept_loop(listener, "t.sock", "accept-t", policy, |mut stream| {
        let Some(env) = serve::read_request(&mut stream) else {
            return;
        };
        match env.msg {
            Message::ToolsList {} => {
                serve::send(
                    &mut stream,
                    env.id,
                    true,
                    Message::Tools(bxcore::Tools { tools: vec![] }),
                );
            }
            other => serve::forbid(&mut stream, env.id, &other, "t.sock"),
        }
    })
    .unwrap();
    path
}

fn connect(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

fn answer(s: &mut UnixStream) -> Envelope {
    read_frame(s).expect("an answer frame")
}

fn raw(s: &mut UnixStream, body: &[u8]) {
    let mut b = (body.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(body);
    s.write_all(&b).unwrap();
}

fn assert_error(env: &Envelope, id: u64, code: ErrorCode) -> String {
    assert_eq!(env.id, id, "{env:?}");
    assert!(env.last);
    match &env.msg {
        Message::Error(e) => {
            assert_eq!(e.code, code, "{env:?}");
            e.detail.clone()
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

fn assert_closed(s: &mut UnixStream) {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the connection closed, got {other:?}"),
    }
}

#[test]
fn ping_is_answered_with_the_daemons_name_version_and_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let pong = bxcore::client::ping(&path, WAIT).unwrap();
    assert_eq!(pong.daemon, "testd");
    assert_eq!(pong.version, "9.8.7");
    assert_eq!(pong.protocol, PROTOCOL_VERSION);
    let mut s = connect(&path);
    write_frame(&mut s, &Envelope::new(42, true, Message::Ping {})).unwrap();
    let env = answer(&mut s);
    assert_eq!(env.id, 42);
    assert!(matches!(env.msg, Message::Pong(_)));
    assert_closed(&mut s);
}

#[test]
fn a_request_is_handed_to_the_handler_and_answered_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    write_frame(&mut s, &Envelope::new(7, true, Message::ToolsList {})).unwrap();
    let env = answer(&mut s);
    assert_eq!(env.id, 7);
    assert!(matches!(env.msg, Message::Tools(_)), "{env:?}");
    assert_closed(&mut s);
}

#[test]
fn a_kind_the_socket_does_not_take_is_forbidden() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    write_frame(&mut s, &Envelope::new(9, true, Message::AuditVerify {})).unwrap();
    let detail = assert_error(&answer(&mut s), 9, ErrorCode::Forbidden);
    assert_eq!(detail, "audit_verify is not accepted on t.sock");
}

#[test]
fn not_json_is_bad_message_with_id_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    raw(&mut s, b"this is not json");
    assert_error(&answer(&mut s), 0, ErrorCode::BadMessage);
    assert_closed(&mut s);
}

#[test]
fn another_version_is_bad_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    raw(
        &mut s,
        br#"{"v":2,"id":3,"final":true,"msg":{"kind":"ping"}}"#,
    );
    assert_error(&answer(&mut s), 0, ErrorCode::BadVersion);
}

#[test]
fn an_unknown_key_is_bad_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    raw(
        &mut s,
        br#"{"v":1,"id":3,"final":true,"msg":{"kind":"ping"},"extra":1}"#,
    );
    assert_error(&answer(&mut s), 0, ErrorCode::BadMessage);
}

#[test]
fn a_zero_length_is_bad_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    s.write_all(&[0, 0, 0, 0]).unwrap();
    assert_error(&answer(&mut s), 0, ErrorCode::BadFrame);
}

#[test]
fn an_over_long_frame_is_bad_frame_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    s.write_all(&((bxcore::MAX_FRAME as u32) + 1).to_be_bytes())
        .unwrap();
    assert_error(&answer(&mut s), 0, ErrorCode::BadFrame);
}

#[test]
fn a_silent_peer_is_answered_and_dropped_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    let detail = assert_error(&answer(&mut s), 0, ErrorCode::BadFrame);
    assert_eq!(detail, "no whole frame within 500 ms");
    assert_closed(&mut s);
}

#[test]
fn a_truncated_frame_then_close_is_bad_frame_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    s.write_all(&[0, 0, 0, 100, b'{']).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_error(&answer(&mut s), 0, ErrorCode::BadFrame);
    assert_eq!(
        bxcore::client::ping(&path, WAIT).unwrap().daemon,
        "testd",
        "the next connection is served"
    );
}

#[test]
fn a_peer_that_closes_before_a_byte_gets_nothing_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    drop(connect(&path));
    let silent = connect(&path);
    assert_eq!(bxcore::client::ping(&path, WAIT).unwrap().daemon, "testd");
    drop(silent);
}

#[test]
fn a_second_request_on_one_connection_is_not_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me()]));
    let mut s = connect(&path);
    write_frame(&mut s, &Envelope::new(1, true, Message::ToolsList {})).unwrap();
    let _ = write_frame(&mut s, &Envelope::new(2, true, Message::ToolsList {}));
    assert_eq!(answer(&mut s).id, 1);
    match read_frame(&mut s) {
        Err(bxcore::FrameError::Closed) => {}
        Err(bxcore::FrameError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the connection closed, got {other:?}"),
    }
}

#[test]
fn a_peer_the_policy_does_not_list_is_refused_before_it_speaks() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_on(dir.path(), PeerPolicy::new("t.sock", [me() + 1]));
    let mut s = connect(&path);
    let detail = assert_error(&answer(&mut s), 0, ErrorCode::Forbidden);
    assert_eq!(detail, format!("uid {} may not connect to t.sock", me()));
    assert_closed(&mut s);
}
