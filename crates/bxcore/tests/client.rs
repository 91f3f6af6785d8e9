//! The generic client against a real socket served by a thread in the test.

use std::os::unix::net::UnixListener;
use std::thread;
use std::time::Duration;

use bxcore::client::{ClientError, call, ping};
use bxcore::*;

/// Serve one connection on a fresh socket: read the request, then write `answers` (each with the
/// request's id unless it names its own).
fn serve_once(
    answers: Vec<(Option<u64>, bool, Message)>,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    thread::JoinHandle<Envelope>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let h = thread::spawn(move || {
        let mut s = bxtest::accept(&listener, "the client");
        let req = read_frame(&mut s).unwrap();
        for (id, last, msg) in answers {
            write_frame(&mut s, &Envelope::new(id.unwrap_or(req.id), last, msg)).unwrap();
        }
        req
    });
    (dir, path, h)
}

const T: Duration = Duration::from_secs(30);

#[test]
fn ping_returns_the_pong() {
    let (_d, path, h) = serve_once(vec![(None, true, Message::pong("brokerd", "0.1.0"))]);
    let pong = ping(&path, T).unwrap();
    assert_eq!(pong.daemon, "brokerd");
    assert_eq!(pong.protocol, PROTOCOL_VERSION);
    assert_eq!(bxtest::join(h, "the server").msg, Message::Ping {});
}

#[test]
fn interim_frames_are_handed_over_and_the_final_one_returned() {
    let (_d, path, _h) = serve_once(vec![
        (
            None,
            false,
            Message::InferDelta(InferDelta { text: "a".into() }),
        ),
        (
            None,
            false,
            Message::InferDelta(InferDelta { text: "b".into() }),
        ),
        (None, true, Message::pong("x", "1")),
    ]);
    let mut seen = String::new();
    let last = call(&path, T, 5, Message::Ping {}, |m| {
        if let Message::InferDelta(d) = m {
            seen.push_str(&d.text)
        }
    })
    .unwrap();
    assert_eq!(seen, "ab");
    assert_eq!(last.kind(), "pong");
}

#[test]
fn an_error_frame_is_remote() {
    let (_d, path, _h) = serve_once(vec![(
        Some(0),
        true,
        Message::Error(WireError {
            code: ErrorCode::Forbidden,
            detail: "no".into(),
        }),
    )]);
    let err = call(&path, T, 5, Message::ToolsList {}, |_| {}).unwrap_err();
    assert!(
        matches!(err, ClientError::Remote(ref e) if e.code == ErrorCode::Forbidden),
        "{err}"
    );
}

#[test]
fn a_frame_for_another_request_is_refused() {
    let (_d, path, _h) = serve_once(vec![(Some(9), true, Message::pong("x", "1"))]);
    let err = call(&path, T, 5, Message::Ping {}, |_| {}).unwrap_err();
    assert_eq!(err.to_string(), "an answer for request 9, not 5");
}

#[test]
fn a_server_that_closes_early_is_reported() {
    let (_d, path, _h) = serve_once(vec![]);
    let err = call(&path, T, 5, Message::Ping {}, |_| {}).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the connection closed before the final answer"
    );
}

#[test]
fn a_silent_server_is_no_answer_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    let err = call(
        &path,
        Duration::from_millis(200),
        5,
        Message::Ping {},
        |_| {},
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "no answer in time");
}

#[test]
fn a_missing_socket_cannot_connect() {
    let dir = tempfile::tempdir().unwrap();
    let err = ping(&dir.path().join("none.sock"), T).unwrap_err();
    assert!(err.to_string().starts_with("cannot connect to "), "{err}");
}

#[test]
fn a_wrong_final_kind_is_unexpected() {
    let (_d, path, _h) = serve_once(vec![(None, true, Message::ToolsList {})]);
    let err = ping(&path, T).unwrap_err();
    assert_eq!(err.to_string(), "an unexpected tools_list message");
}
