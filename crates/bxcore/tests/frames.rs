//! Every `FrameError`, and what each one refuses.

use std::io::{self, Read};

use bxcore::*;
use serde_json::json;

fn framed(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// A reader that holds `data` and fails the test if anyone reads past `limit` bytes.
struct Fence {
    data: Vec<u8>,
    pos: usize,
    limit: usize,
}

impl Read for Fence {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.data.len() - self.pos);
        assert!(
            self.pos + n <= self.limit || n == 0,
            "read past byte {} (asked for {} at {})",
            self.limit,
            buf.len(),
            self.pos
        );
        let n = n.min(self.limit - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn eof_before_a_frame_is_closed() {
    let err = read_frame(&mut io::empty()).unwrap_err();
    assert!(matches!(err, FrameError::Closed), "{err:?}");
}

#[test]
fn eof_inside_the_length_is_io() {
    let err = read_frame(&mut [0u8, 0].as_slice()).unwrap_err();
    assert!(
        matches!(&err, FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
        "{err:?}"
    );
    assert_eq!(err.code(), ErrorCode::BadFrame);
}

#[test]
fn eof_inside_the_body_is_io() {
    let mut f = framed(br#"{"v":1,"id":0,"final":true,"msg":{"kind":"ping"}}"#);
    f.truncate(f.len() - 3);
    let err = read_frame(&mut f.as_slice()).unwrap_err();
    assert!(
        matches!(&err, FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
        "{err:?}"
    );
}

#[test]
fn zero_length_is_bad_frame() {
    let err = read_frame(&mut [0u8, 0, 0, 0].as_slice()).unwrap_err();
    assert!(matches!(err, FrameError::BadFrame(_)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::BadFrame);
}

#[test]
fn over_max_frame_is_too_large_and_the_body_is_not_read() {
    let n = MAX_FRAME + 1;
    let mut data = (n as u32).to_be_bytes().to_vec();
    data.resize(4 + n, b'x');
    let mut fence = Fence {
        data,
        pos: 0,
        limit: 4,
    };
    let err = read_frame(&mut fence).unwrap_err();
    assert!(matches!(err, FrameError::TooLarge(m) if m == n), "{err:?}");
    assert_eq!(fence.pos, 4, "only the length was read");
    assert_eq!(err.code(), ErrorCode::BadFrame);
}

#[test]
fn exactly_max_frame_is_read() {
    // A valid envelope padded with spaces to exactly MAX_FRAME bytes.
    let mut body = br#"{"v":1,"id":0,"final":true,"msg":{"kind":"ping"}}"#.to_vec();
    body.resize(MAX_FRAME, b' ');
    let env = read_frame(&mut framed(&body).as_slice()).unwrap();
    assert_eq!(env.msg, Message::Ping {});
}

#[test]
fn non_utf8_is_bad_frame() {
    let err = read_frame(&mut framed(b"{\"v\":1,\xff}").as_slice()).unwrap_err();
    assert!(
        matches!(&err, FrameError::BadFrame(why) if why.contains("UTF-8")),
        "{err:?}"
    );
}

#[test]
fn not_json_is_json() {
    let err = read_frame(&mut framed(b"hello").as_slice()).unwrap_err();
    assert!(matches!(err, FrameError::Json(_)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::BadMessage);
}

#[test]
fn json_that_is_not_an_envelope_is_json() {
    for body in [
        &br#"[1,2,3]"#[..],
        br#"{"v":1,"id":0,"final":true}"#,
        br#"{"v":1,"id":-1,"final":true,"msg":{"kind":"ping"}}"#,
        br#"{"v":1,"id":0,"final":true,"msg":{"kind":"launch_missiles"}}"#,
        br#"{"v":"1","id":0,"final":true,"msg":{"kind":"ping"}}"#,
    ] {
        let err = read_frame(&mut framed(body).as_slice()).unwrap_err();
        assert!(
            matches!(err, FrameError::Json(_)),
            "{}: {err:?}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn another_version_with_an_otherwise_garbage_body_is_bad_version() {
    let err =
        read_frame(&mut framed(br#"{"v":2,"garbage":[1,{"x":null}]}"#).as_slice()).unwrap_err();
    assert!(matches!(err, FrameError::BadVersion(2)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::BadVersion);
    let err = read_frame(&mut framed(br#"{"v":99999999999}"#).as_slice()).unwrap_err();
    assert!(matches!(err, FrameError::BadVersion(u32::MAX)), "{err:?}");
}

#[test]
fn an_unknown_key_at_each_level_is_json() {
    let bodies = [
        // the envelope
        json!({"v":1,"id":0,"final":true,"msg":{"kind":"ping"},"extra":1}),
        // a message with no fields
        json!({"v":1,"id":0,"final":true,"msg":{"kind":"ping","extra":1}}),
        // a message struct
        json!({"v":1,"id":9,"final":true,"msg":{"kind":"session_state","session":"s1","extra":1}}),
        // a struct variant of a nested tag
        json!({"v":1,"id":3,"final":true,"msg":{"kind":"tool_response","outcome":"failed","message":"m","extra":1}}),
        // the turn event inside turn_event
        json!({"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"assistant_text","text":"t","extra":1}}}),
        // turn_event itself
        json!({"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"assistant_text","text":"t"},"extra":1}}),
        // usage inside turn_done
        json!({"v":1,"id":7,"final":true,"msg":{"kind":"turn_done","session":"s1","usage":{"input_tokens":1,"output_tokens":2,"extra":1}}}),
        // a chat message inside infer_request
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"infer_request","slot":"main","messages":[{"role":"user","text":"t","extra":1}],"tools":[],"first_call":1}}),
        // a tool call inside an assistant message
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"infer_reply","message":{"role":"assistant","text":"","tool_calls":[{"call":1,"tool":"x","args":{},"extra":1}]},"usage":{"input_tokens":0,"output_tokens":0}}}),
        // a tool definition inside tools
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"tools","tools":[{"name":"x","description":"d","parameters":{},"extra":1}]}}),
        // an approval inside approvals
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"approvals","pending":[{"approval":"9f2c4a1b0d3e5f67","session":"s1","call":3,"tool":"t","args_bytes":0,"digest":"d","taint":"private","untrusted":false,"rule":"r","reason":"r","requested":1,"expires":2,"extra":1}]}}),
        // a whole approval
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"approval","approval":"9f2c4a1b0d3e5f67","session":"s1","call":3,"tool":"t","args":{},"digest":"d","taint":"private","untrusted":false,"rule":"r","reason":"r","requested":1,"expires":2,"extra":1}}),
        // a header inside fetch_request
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"fetch_request","url":"u","method":"GET","headers":[{"name":"a","value":"b","extra":1}],"body":"","max_bytes":1}}),
        // the error body
        json!({"v":1,"id":0,"final":true,"msg":{"kind":"error","code":"internal","detail":"d","extra":1}}),
    ];
    for body in bodies {
        let text = body.to_string();
        let err = read_frame(&mut framed(text.as_bytes()).as_slice()).unwrap_err();
        assert!(matches!(err, FrameError::Json(_)), "{text}: {err:?}");
        assert!(err.to_string().contains("extra"), "{text}: {err}");
    }
}

#[test]
fn write_frame_of_an_over_large_envelope_writes_nothing() {
    let env = Envelope::new(
        1,
        true,
        Message::InferDelta(InferDelta {
            text: "x".repeat(MAX_FRAME),
        }),
    );
    let mut out = Vec::new();
    let err = write_frame(&mut out, &env).unwrap_err();
    assert!(
        matches!(err, FrameError::TooLarge(n) if n > MAX_FRAME),
        "{err:?}"
    );
    assert!(out.is_empty(), "{} bytes were written", out.len());
}

#[test]
fn write_frame_writes_a_big_endian_length_then_the_body() {
    let env = Envelope::new(0, true, Message::Ping {});
    let mut out = Vec::new();
    write_frame(&mut out, &env).unwrap();
    let body = br#"{"v":1,"id":0,"final":true,"msg":{"kind":"ping"}}"#;
    assert_eq!(&out[..4], &(body.len() as u32).to_be_bytes());
    assert_eq!(&out[4..], body);
}

#[test]
fn two_frames_in_a_row_are_read_one_at_a_time() {
    let mut data = Vec::new();
    write_frame(&mut data, &Envelope::new(1, false, Message::Ping {})).unwrap();
    write_frame(&mut data, &Envelope::new(2, true, Message::ToolsList {})).unwrap();
    let mut r = data.as_slice();
    assert_eq!(read_frame(&mut r).unwrap().id, 1);
    assert_eq!(read_frame(&mut r).unwrap().id, 2);
    assert!(matches!(read_frame(&mut r), Err(FrameError::Closed)));
}

#[test]
fn frame_errors_say_what_happened() {
    assert_eq!(
        FrameError::TooLarge(2_000_000).to_string(),
        "a frame of 2000000 bytes is over the limit of 1048576"
    );
    assert!(FrameError::BadVersion(2).to_string().contains("version 2"));
}
