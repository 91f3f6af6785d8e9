//! Which session ids are accepted and which are refused, when made and when deserialized.

use bxcore::{IdError, SessionId};
use serde_json::json;

#[test]
fn accepted_ids() {
    let long = "a".repeat(64);
    for ok in ["s1", "a", "A-Z_09", "--", "__", long.as_str()] {
        assert_eq!(SessionId::new(ok).unwrap().as_str(), ok);
        let de: SessionId = serde_json::from_value(json!(ok)).unwrap();
        assert_eq!(de.as_str(), ok);
    }
}

#[test]
fn refused_ids() {
    let long = "a".repeat(65);
    let table: [(&str, IdError); 9] = [
        ("", IdError::SessionLength(0)),
        (long.as_str(), IdError::SessionLength(65)),
        ("..", IdError::SessionChar('.')),
        ("a/b", IdError::SessionChar('/')),
        ("/etc", IdError::SessionChar('/')),
        ("a b", IdError::SessionChar(' ')),
        ("café", IdError::SessionChar('é')),
        ("a\0b", IdError::SessionChar('\0')),
        ("a.jsonl", IdError::SessionChar('.')),
    ];
    for (bad, why) in table {
        assert_eq!(SessionId::new(bad), Err(why.clone()), "{bad:?}");
        let err = serde_json::from_value::<SessionId>(json!(bad)).unwrap_err();
        assert_eq!(err.to_string(), why.to_string(), "{bad:?}");
    }
}

#[test]
fn a_bad_session_id_makes_the_whole_envelope_a_bad_message() {
    let body = br#"{"v":1,"id":9,"final":true,"msg":{"kind":"session_state","session":"../etc"}}"#;
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    let err = bxcore::read_frame(&mut frame.as_slice()).unwrap_err();
    assert_eq!(err.code(), bxcore::ErrorCode::BadMessage, "{err}");
}
