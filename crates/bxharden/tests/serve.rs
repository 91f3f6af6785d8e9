//! The shared connection path over real Unix sockets: ping, malformed frames, a silent peer,
//! a refused peer, a forbidden kind, one request per connection. Every wait has a deadline of 10
//! seconds or more. (The log lines are checked in `tests/sandbox.rs`, in child processes.)

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use bxcore::layout::{Requests, SocketSpec};
use bxcore::{Envelope, ErrorCode, Message, PROTOCOL_VERSION, Turn, read_frame, write_frame};
use bxharden::serve::{self, Limits};
use bxharden::{Daemon, PeerPolicy};

const WAIT: Duration = Duration::from_secs(20);

fn setup() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        bxharden::log::init(Daemon {
            name: "testd",
            version: "9.8.7",
        });
    });
}

fn me() -> u32 {
    nix::unistd::Uid::effective().as_raw()
}

bxcore::socket! {
    /// `t.sock`: its table takes `tools_list` only.
    T_SOCK, TRequest {
        name: "t", dir: "test", server: "testd", client: "testd",
        wrong_kind: Forbidden, max_connections: 16,
        accepts: { ToolsList = "tools_list" }
    }
}

bxcore::socket! {
    /// `l.sock`: a table like loop.sock's, which answers a wrong kind `bad_message`.
    L_SOCK, LRequest {
        name: "l", dir: "test", server: "testd", client: "testd",
        wrong_kind: BadMessage, max_connections: 16,
        accepts: { Turn(Turn) = "turn" }
    }
}

/// Limits with a short first-frame deadline (so the silent-peer test does not wait 10 s) and a
/// cap of `cap`.
fn limits(spec: &SocketSpec, cap: usize) -> Limits {
    Limits {
        max_connections: cap,
        first_frame: Duration::from_millis(500),
        write: Duration::from_secs(10),
        ..Limits::of(spec)
    }
}

/// t.sock served by `accept_loop` with `policy`: `tools_list` is answered with `tools {}`.
fn serve_on(dir: &Path, policy: PeerPolicy) -> PathBuf {
    serve_t(dir, policy, 16)
}

fn serve_t(dir: &Path, policy: PeerPolicy, cap: usize) -> PathBuf {
    serve_table::<TRequest>(dir, policy, cap, |mut stream, id, TRequest::ToolsList| {
        let tools = Message::Tools(bxcore::Tools {
            tools: vec![],
            workspace: vec![],
        });
        serve::send(&mut stream, id, true, tools);
    })
}

fn serve_table<R: Requests>(
    dir: &Path,
    policy: PeerPolicy,
    cap: usize,
    handler: impl Fn(UnixStream, u64, R) + Send + Sync + 'static,
) -> PathBuf {
    serve_limited(dir, policy, limits(&R::SPEC, cap), handler)
}

fn serve_limited<R: Requests>(
    dir: &Path,
    policy: PeerPolicy,
    limits: Limits,
    handler: impl Fn(UnixStream, u64, R) + Send + Sync + 'static,
) -> PathBuf {
    setup();
    let path = dir.join(R::SPEC.file());
    let listener = UnixListener::bind(&path).unwrap();
    let socket = serve::Socket::<R>::new(listener, policy, limits);
    serve::accept_loop(socket, handler).unwrap();
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

#[test]
fn a_kind_a_bad_message_table_does_not_list_is_bad_message_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_table::<LRequest>(
        dir.path(),
        PeerPolicy::new("l.sock", [me()]),
        16,
        |_, _, _| {},
    );
    let mut s = connect(&path);
    write_frame(&mut s, &Envelope::new(4, true, Message::ToolsList {})).unwrap();
    let detail = assert_error(&answer(&mut s), 4, ErrorCode::BadMessage);
    assert_eq!(detail, "l.sock takes a turn, not tools_list");
    assert_closed(&mut s);
}

#[test]
fn a_socket_at_its_cap_answers_unavailable_with_its_runbook_pointer_and_serves_again_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_t(dir.path(), PeerPolicy::new("t.sock", [me()]), 2);
    // Two silent connections hold the socket's two places until their first-frame deadline.
    let held: Vec<UnixStream> = (0..2).map(|_| connect(&path)).collect();
    // The server counts a connection once it accepted it: wait until the next is refused.
    let until = std::time::Instant::now() + WAIT;
    let detail = loop {
        let mut s = connect(&path);
        let env = answer(&mut s);
        match &env.msg {
            Message::Error(e) if e.code == ErrorCode::Unavailable => {
                assert_eq!(env.id, 0);
                assert_closed(&mut s);
                break e.detail.clone();
            }
            _ => assert!(
                std::time::Instant::now() < until,
                "no unavailable answer within {WAIT:?}: {env:?}"
            ),
        }
    };
    assert_eq!(
        detail,
        format!(
            "t.sock is serving 2 connections, its cap; {}",
            bxcore::runbook::pointer("socket-busy")
        )
    );
    drop(held);
    // Below the cap again, a request is served (the held ones end at their deadline or close).
    let until = std::time::Instant::now() + WAIT;
    loop {
        match bxcore::client::ping(&path, WAIT) {
            Ok(p) => {
                assert_eq!(p.daemon, "testd");
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < until,
                "not served again within {WAIT:?}: {e}"
            ),
        }
    }
}

/// A frame of `size` bytes whose body is a `tools_list` with a key no envelope has: read whole,
/// then answered `bad_message`.
fn padded_frame(size: usize) -> Vec<u8> {
    let head = br#"{"v":1,"id":3,"final":true,"msg":{"kind":"tools_list","pad":""#;
    let tail = br#""}}"#;
    let mut body = head.to_vec();
    body.resize(size - 4 - tail.len(), b'x');
    body.extend_from_slice(tail);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

#[test]
fn two_reads_that_would_wait_for_each_other_s_budget_do_not_stall_one_gives_way() {
    let dir = tempfile::tempdir().unwrap();
    // A budget of one whole frame, and a first-frame deadline far beyond the test's own wait: a
    // stall would be ended by nothing but that deadline.
    let limits = Limits {
        first_frame: Duration::from_secs(600),
        frame_budget: bxcore::MAX_FRAME,
        ..Limits::of(&T_SOCK)
    };
    let policy = PeerPolicy::new("t.sock", [me()]);
    let path = serve_limited::<TRequest>(dir.path(), policy, limits, |_, _, _| {});
    let frame = std::sync::Arc::new(padded_frame(bxcore::MAX_FRAME));
    let half = frame.len() / 2;
    // Two whole frames of the budget's size, their first halves both sent before either's
    // second: together they need more than the budget before either is whole.
    let halfway = std::sync::Arc::new(bxtest::Barrier::new(2));
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (frame, halfway) = (
                std::sync::Arc::clone(&frame),
                std::sync::Arc::clone(&halfway),
            );
            let mut s = connect(&path);
            std::thread::spawn(move || {
                s.set_write_timeout(Some(WAIT)).unwrap();
                s.write_all(&frame[..half]).unwrap();
                halfway.wait("both first halves to be sent");
                // A read that gave way answers before it takes the rest.
                let _ = s.write_all(&frame[half..]);
                answer(&mut s)
            })
        })
        .collect();
    let answers: Vec<Envelope> = senders
        .into_iter()
        .map(|h| bxtest::join(h, "a sender of half a frame, then the other half"))
        .collect();
    let mut read_whole = 0;
    for env in &answers {
        match &env.msg {
            Message::Error(e) if e.code == ErrorCode::Unavailable => {
                assert!(
                    e.detail.contains("its whole budget of 1048576 bytes")
                        && e.detail.ends_with(&bxcore::runbook::pointer("socket-busy")),
                    "{}",
                    e.detail
                );
            }
            Message::Error(e) if e.code == ErrorCode::BadMessage => read_whole += 1,
            other => panic!("a frame was answered {other:?}"),
        }
    }
    // At least one is read whole: what the other held went back to the budget.
    assert!(read_whole >= 1, "{answers:?}");
}
