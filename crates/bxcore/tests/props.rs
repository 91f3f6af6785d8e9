//! Property tests: any envelope round-trips; any bytes fed to `read_frame` give an error or an
//! envelope, never a panic, and never more than `4 + MAX_FRAME` bytes read.

use std::io::{self, Read};

use bxcore::*;
use proptest::prelude::*;
use serde_json::{Value, json};

fn session() -> impl Strategy<Value = SessionId> {
    "[A-Za-z0-9_-]{1,64}".prop_map(|s| SessionId::new(s).unwrap())
}

fn class() -> impl Strategy<Value = DataClass> {
    prop_oneof![
        Just(DataClass::Public),
        Just(DataClass::Private),
        Just(DataClass::Secret)
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn approval() -> impl Strategy<Value = ApprovalId> {
    "[0-9a-f]{16}".prop_map(|s| ApprovalId::new(s).unwrap())
}

fn chat() -> impl Strategy<Value = ChatMessage> {
    prop_oneof![
        ".{0,20}".prop_map(|text| ChatMessage::System { text }),
        ".{0,20}".prop_map(|text| ChatMessage::User { text }),
        (".{0,20}", any::<u64>(), "[a-z_]{1,12}", json_value()).prop_map(
            |(text, call, tool, args)| ChatMessage::Assistant {
                text,
                tool_calls: vec![ToolCall {
                    call: CallId(call),
                    tool,
                    args
                }],
            }
        ),
        (any::<u64>(), ".{0,20}").prop_map(|(call, text)| ChatMessage::Tool {
            call: CallId(call),
            text
        }),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        Just(Message::Ping {}),
        Just(Message::ToolsList {}),
        (".{0,10}", ".{0,10}").prop_map(|(d, v)| Message::pong(&d, &v)),
        (session(), any::<bool>(), ".{0,40}").prop_map(|(session, resume, text)| {
            Message::Turn(Turn {
                session,
                resume,
                text,
            })
        }),
        ".{0,40}".prop_map(|text| Message::TurnEvent {
            event: TurnEvent::AssistantText { text }
        }),
        (any::<u64>(), approval(), any::<u64>()).prop_map(|(c, a, e)| Message::TurnEvent {
            event: TurnEvent::ToolPending {
                call: CallId(c),
                approval: a,
                expires: Timestamp(e)
            }
        }),
        (session(), any::<u64>(), "[a-z_]{1,16}", json_value()).prop_map(
            |(session, call, tool, args)| Message::ToolRequest(ToolRequest {
                session,
                call: CallId(call),
                tool,
                args
            })
        ),
        (".{0,40}", class(), any::<bool>()).prop_map(|(content, class, untrusted)| {
            Message::ToolResponse(ToolResponse::Result {
                content,
                class,
                untrusted,
            })
        }),
        (approval(), any::<u64>()).prop_map(|(approval, e)| Message::ToolResponse(
            ToolResponse::PendingApproval {
                approval,
                expires: Timestamp(e)
            }
        )),
        (session(), class(), any::<bool>()).prop_map(|(_, class, untrusted)| {
            Message::SessionStateReply(Label { class, untrusted })
        }),
        (
            "[a-z]{1,8}",
            prop::collection::vec(chat(), 0..4),
            any::<u64>()
        )
            .prop_map(
                |(slot, messages, first)| Message::InferRequest(InferRequest {
                    slot,
                    messages,
                    tools: vec![],
                    first_call: CallId(first)
                })
            ),
        (session(), any::<u64>(), prop::collection::vec(chat(), 0..3)).prop_map(
            |(session, turn, messages)| Message::TurnRecord(TurnRecord {
                session,
                turn,
                messages
            })
        ),
        ".{0,40}".prop_map(|d| Message::Error(WireError {
            code: ErrorCode::Internal,
            detail: d
        })),
    ]
}

/// Counts every byte handed out and fails the test past `4 + MAX_FRAME`.
struct Counting<'a> {
    inner: &'a [u8],
    read: usize,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n;
        assert!(self.read <= 4 + MAX_FRAME, "read {} bytes", self.read);
        Ok(n)
    }
}

proptest! {
    #[test]
    fn any_envelope_round_trips(id in any::<u64>(), last in any::<bool>(), msg in message()) {
        let env = Envelope::new(id, last, msg);
        let mut buf = Vec::new();
        write_frame(&mut buf, &env).unwrap();
        prop_assert_eq!(read_frame(&mut buf.as_slice()).unwrap(), env);
    }

    #[test]
    fn any_bytes_give_an_error_or_an_envelope(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut r = Counting { inner: &bytes, read: 0 };
        let res = read_frame(&mut r);
        let read = r.read;
        match res {
            // An envelope: exactly its frame was read, and it is the one its bytes encode.
            Ok(env) => {
                let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
                prop_assert_eq!(read, 4 + len);
                let mut again = Vec::new();
                write_frame(&mut again, &env).unwrap();
                prop_assert_eq!(read_frame(&mut again.as_slice()).unwrap(), env);
            }
            Err(FrameError::Closed) => prop_assert!(bytes.is_empty()),
            Err(FrameError::Io(_)) => {
                // A frame cut short: everything there was read, and it was less than promised.
                prop_assert_eq!(read, bytes.len());
                let short = bytes.len() < 4
                    || bytes.len() - 4 < u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
                prop_assert!(short, "{:?}", bytes);
            }
            Err(FrameError::TooLarge(n)) => {
                prop_assert!(n > MAX_FRAME);
                prop_assert_eq!(read, 4);
            }
            // Refused whole frames: nothing past the frame was read.
            Err(FrameError::BadFrame(_) | FrameError::Json(_) | FrameError::BadVersion(_)) => {
                let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
                prop_assert_eq!(read, 4 + len);
            }
        }
    }

    #[test]
    fn any_length_prefix_never_reads_past_the_limit(len in any::<u32>(), tail in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(&tail);
        let mut r = Counting { inner: &bytes, read: 0 };
        let res = read_frame(&mut r);
        if len as usize > MAX_FRAME {
            prop_assert!(matches!(res, Err(FrameError::TooLarge(_))));
            prop_assert_eq!(r.read, 4);
        }
    }

    #[test]
    fn a_json_body_of_any_shape_gives_an_error_or_an_envelope(v in json_value()) {
        let body = v.to_string();
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body.as_bytes());
        match read_frame(&mut bytes.as_slice()) {
            // Only what parses as an envelope is one, and it is that envelope.
            Ok(env) => {
                let parsed: Envelope = serde_json::from_str(&body).unwrap();
                prop_assert_eq!(env, parsed);
            }
            // A whole frame of JSON is never a transport failure: it is refused as a message
            // (not an envelope, or another version), answered with a code.
            Err(e @ (FrameError::Json(_) | FrameError::BadVersion(_))) => {
                prop_assert!(e.code() != ErrorCode::BadFrame);
            }
            Err(e @ FrameError::BadFrame(_)) => prop_assert!(body.is_empty(), "{e}"),
            Err(e) => prop_assert!(false, "a whole JSON frame read as {e}"),
        }
    }
}

#[test]
fn a_huge_body_behind_a_max_length_is_read_no_further() {
    // A length of exactly MAX_FRAME followed by far more bytes: at most 4 + MAX_FRAME are read.
    let mut bytes = (MAX_FRAME as u32).to_be_bytes().to_vec();
    bytes.resize(4 + 2 * MAX_FRAME, b'7');
    let mut r = Counting {
        inner: &bytes,
        read: 0,
    };
    assert!(read_frame(&mut r).is_err());
    assert_eq!(r.read, 4 + MAX_FRAME);
}
