//! Canonical JSON: sorted keys, no whitespace, and a known digest.

use bxcore::canonical::{digest, sha256_hex, to_string};
use serde_json::json;

#[test]
fn keys_are_sorted_by_their_bytes_at_every_level() {
    let v = json!({"b": 1, "a": {"z": [3, {"y": 1, "x": 2}], "B": true}, "é": null, "Z": "s"});
    // 'B' (0x42) < 'Z' (0x5a) < 'a' (0x61) < 'b' < 'é' (0xc3 0xa9)
    assert_eq!(
        to_string(&v),
        r#"{"Z":"s","a":{"B":true,"z":[3,{"x":2,"y":1}]},"b":1,"é":null}"#
    );
}

#[test]
fn there_is_no_whitespace_and_strings_are_escaped_as_serde_json_does() {
    let v = json!({"k": "a \"quoted\"\nline\t/", "n": [1.5, -2, 1e100]});
    assert_eq!(
        to_string(&v),
        r#"{"k":"a \"quoted\"\nline\t/","n":[1.5,-2,1e+100]}"#
    );
}

#[test]
fn the_digest_of_a_known_value() {
    // sha256 of the 30 bytes {"content":"x","path":"/w/a"}
    let v = json!({"path": "/w/a", "content": "x"});
    assert_eq!(to_string(&v), r#"{"content":"x","path":"/w/a"}"#);
    assert_eq!(digest(&v), sha256_hex(br#"{"content":"x","path":"/w/a"}"#));
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        digest(&json!({})),
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
}

#[test]
fn key_order_of_the_input_does_not_change_the_digest() {
    let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap();
    let b: serde_json::Value =
        serde_json::from_str(r#"{ "b" : { "d":3, "c":2 }, "a" : 1 }"#).unwrap();
    assert_eq!(digest(&a), digest(&b));
}
