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

#[test]
fn the_digest_of_a_value_with_every_kind_of_scalar_and_escape() {
    let v = json!({
        "z": [1, -2, 1.5, 1e100, 0.1, -0.0, true, null, u64::MAX, i64::MIN, 5e-324],
        "a\"b\\c": "tab\there\u{1}\u{1f} é 😀 / \u{7f}\u{8}\u{c}\r",
        "B": {"y": {}, "x": []},
        "": "",
    });
    let text = concat!(
        r#"{"":"","B":{"x":[],"y":{}},"a\"b\\c":"tab\there\u0001\u001f é 😀 / "#,
        "\u{7f}",
        r#"\b\f\r","z":[1,-2,1.5,1e+100,0.1,-0.0,true,null,18446744073709551615,-9223372036854775808,5e-324]}"#
    );
    assert_eq!(reference::to_string(&v), text);
    assert_eq!(to_string(&v), text);
    // sha256 of `text`, computed apart from this code.
    assert_eq!(
        digest(&v),
        "f6a75663cf76ed727c8b2e32118de7270efda9ae574246613c4d6dc96403175b"
    );
}

/// The canonical writer as it was first written (a `String` for every key and scalar, through
/// serde_json's own `to_string`), kept as the reference the faster one must equal.
mod reference {
    use serde_json::Value;
    use sha2::{Digest, Sha256};

    pub fn to_string(value: &Value) -> String {
        let mut out = String::new();
        write(&mut out, value);
        out
    }

    fn write(out: &mut String, value: &Value) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(out, v);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(out, v);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }

    pub fn sha256_hex(bytes: &[u8]) -> String {
        let digest = Sha256::digest(bytes);
        let mut s = String::with_capacity(64);
        for b in digest {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

mod props {
    use super::reference;
    use bxcore::canonical::{digest, sha256_hex, to_string, write_str};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// Any string: control characters, quotes, backslashes, DEL and non-ASCII often.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[\\x00-\\x20\"\\\\/\\x7f-\\u{a0}a-zé😀\\u{2028}\\u{fffd}]{0,16}",
            any::<String>(),
        ]
    }

    fn number() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<u64>().prop_map(|n| json!(n)),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)), // NaN and infinities become null
            prop::num::f64::NORMAL.prop_map(|f| json!(f)),
            prop::num::f64::SUBNORMAL.prop_map(|f| json!(f)),
            (-1_000_000i64..1_000_000, 0u32..12)
                .prop_map(|(m, e)| json!(m as f64 / 10f64.powi(e as i32))),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            number(),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((text(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn the_canonical_text_is_the_reference_text(v in value()) {
            prop_assert_eq!(to_string(&v), reference::to_string(&v));
            prop_assert_eq!(digest(&v), reference::sha256_hex(reference::to_string(&v).as_bytes()));
        }

        #[test]
        fn a_string_is_escaped_as_serde_json_escapes_it(s in text()) {
            let mut out = String::from("x");
            write_str(&mut out, &s);
            prop_assert_eq!(&out[1..], serde_json::to_string(&s).unwrap());
        }

        #[test]
        fn the_hex_digest_is_the_reference_hex(
            bytes in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            prop_assert_eq!(sha256_hex(&bytes), reference::sha256_hex(&bytes));
        }
    }
}
