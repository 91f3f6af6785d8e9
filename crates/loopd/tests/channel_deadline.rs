//! The first frame's deadline on loop.sock: a silent peer and a peer that trickles its frame one
//! byte at a time are both answered `bad_frame` (id 0) once the deadline passes, and the server
//! serves others meanwhile. The socket's deadline is shortened to 300 ms.

mod support;

use bxharden::daemon::DaemonConfig;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use bxcore::{ErrorCode, Message};
use loopd::channel::Context;
use loopd::config::Config;
use loopd::infer::Client;
use loopd::tools::Registry;
use support::infer::ScriptedInfer;
use support::{error_code, frame_of, last_msg, read_all, turn};

/// The server on a fresh home, and the scripted inference socket it uses (served until dropped).
fn server() -> (tempfile::TempDir, std::path::PathBuf, ScriptedInfer) {
    let home = support::home();
    let cfg = Config::parse(&format!(
        "[paths]\nhome = {:?}\n",
        home.path().display().to_string()
    ))
    .unwrap();
    let infer = ScriptedInfer::start(&home.path().join("infer.sock"), vec![]);
    let client = Client::new(infer.path.clone(), cfg.inference_timeout());
    let ctx = Arc::new(Context::new(
        cfg,
        client,
        Box::new(loopd::broker_port::NoBroker),
        Registry::new(),
    ));
    let socket = home.path().join("loop.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let limits = bxharden::serve::Limits {
        first_frame: Duration::from_millis(300),
        ..bxharden::serve::Limits::of(&bxcore::layout::LOOP)
    };
    support::serve_turns(listener, ctx, limits);
    (home, socket, infer)
}

#[test]
fn a_silent_peer_gets_bad_frame_at_the_deadline_and_others_are_served() {
    let (_home, socket, _infer) = server();
    let silent = UnixStream::connect(&socket).unwrap();
    // Meanwhile another channel's turn goes through.
    let frames = turn(&socket, 1, "other", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    let frames = read_all(&silent);
    assert_eq!(frames[0].id, 0);
    assert_eq!(error_code(&frames), ErrorCode::BadFrame);
}

#[test]
fn a_peer_that_trickles_its_frame_gets_bad_frame_at_the_deadline() {
    let (home, socket, _infer) = server();
    let mut c = UnixStream::connect(&socket).unwrap();
    let reader = c.try_clone().unwrap();
    let answer = std::thread::spawn(move || read_all(&reader));
    let bytes = frame_of(
        r#"{"v":1,"id":4,"final":true,"msg":{"kind":"turn","session":"s","resume":false,"text":"a long enough text to trickle"}}"#,
    );
    for b in bytes {
        // Each byte well within the deadline, the whole frame far past it.
        if c.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if answer.is_finished() {
            break;
        }
    }
    let frames = bxtest::join(answer, "the reader of the trickling channel's answer");
    assert_eq!(error_code(&frames), ErrorCode::BadFrame);
    assert_eq!(frames[0].id, 0);
    assert!(!home.path().join("loop/sessions/s.jsonl").exists());
}
