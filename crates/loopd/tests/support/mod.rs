//! Test doubles and helpers for loopd's tests: a fake broker socket, a scripted inference
//! socket, a fake memoryd, `FakeTools`, the real binary under a guard, and a channel client.
#![allow(dead_code)]

pub mod broker;
pub mod daemon;
pub mod fake_tools;
pub mod infer;
pub mod memory;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bxcore::deadline::Deadline;
use bxcore::{Envelope, Message, SessionId, Turn, read_frame, write_frame};

/// Generous: tests wait for conditions, never for time.
pub const WAIT: Duration = bxtest::DEADLINE;

/// A fresh home with the loop directories.
pub fn home() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("loop/sessions")).unwrap();
    home
}

pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

/// Send raw bytes, read one frame back.
pub fn raw_exchange(socket: &Path, bytes: &[u8]) -> Envelope {
    let mut s = UnixStream::connect(socket).unwrap();
    s.write_all(bytes).unwrap();
    read_frame(&mut Deadline::new(&s, Instant::now() + WAIT)).unwrap()
}

/// One frame of `body` (a raw JSON text).
pub fn frame_of(body: &str) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body.as_bytes());
    v
}

/// A channel: sends one turn and collects every frame of the answer, up to the final one.
pub fn turn(socket: &Path, id: u64, session: &str, resume: bool, text: &str) -> Vec<Envelope> {
    let mut s = UnixStream::connect(socket).unwrap();
    let msg = Message::Turn(Turn {
        session: sid(session),
        resume,
        text: text.to_string(),
    });
    write_frame(&mut s, &Envelope::new(id, true, msg)).unwrap();
    read_all(&s)
}

/// The channel daemon: sends one `channel_turn` keyed `key` on bridge.sock and collects every
/// frame of the answer.
pub fn channel_turn(
    socket: &Path,
    id: u64,
    session: &str,
    resume: bool,
    text: &str,
    key: &str,
) -> Vec<Envelope> {
    let mut s = UnixStream::connect(socket).unwrap();
    let msg = Message::ChannelTurn(bxcore::ChannelTurn {
        session: sid(session),
        resume,
        text: text.to_string(),
        key: bxcore::TurnKey::new(key).unwrap(),
    });
    write_frame(&mut s, &Envelope::new(id, true, msg)).unwrap();
    read_all(&s)
}

/// Every frame until the final one.
pub fn read_all(s: &UnixStream) -> Vec<Envelope> {
    let until = Instant::now() + WAIT;
    let mut out = Vec::new();
    loop {
        let env = read_frame(&mut Deadline::new(s, until)).unwrap();
        let last = env.last;
        out.push(env);
        if last {
            return out;
        }
    }
}

/// The final frame's message.
pub fn last_msg(frames: &[Envelope]) -> &Message {
    &frames.last().unwrap().msg
}

/// The final frame's error code, or a panic saying what came instead.
pub fn error_code(frames: &[Envelope]) -> bxcore::ErrorCode {
    match last_msg(frames) {
        Message::Error(e) => e.code,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Wait until `f` holds, or panic after `WAIT` saying what was awaited.
#[track_caller]
pub fn wait_until(what: &str, f: impl FnMut() -> bool) {
    bxtest::wait_for(what, WAIT, f);
}

/// A socket path in `dir`.
pub fn sock(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Serve loop.sock on `listener` in this process, through the one accept path every daemon uses
/// (`bxharden::serve`), with `limits`, for this user only: every session's turns served here,
/// as one worker serves its one session's.
pub fn serve_turns(
    listener: std::os::unix::net::UnixListener,
    ctx: std::sync::Arc<loopd::channel::Context>,
    limits: bxharden::serve::Limits,
) {
    use bxcore::layout::{LOOP, LoopRequest};
    let policy = bxharden::PeerPolicy::own(&LOOP.file());
    let socket = bxharden::serve::Socket::<LoopRequest>::new(listener, policy, limits);
    std::thread::spawn(move || {
        bxharden::serve::accept_here(socket, move |mut stream, id, request| match request {
            LoopRequest::Turn(turn) => {
                loopd::channel::serve_turn(stream, id, turn, None, &ctx, None)
            }
            LoopRequest::Health => {
                let report = Message::HealthReport(loopd::health::report(&ctx.cfg));
                let _ = bxharden::serve::send(&mut stream, id, true, report);
            }
        })
    });
}
