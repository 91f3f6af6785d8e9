//! Each tool's typed arguments and the JSON Schema the model is shown agree: samples made from
//! each schema (every bound, every wrong type, a missing and an unknown argument, and random
//! objects) are accepted or refused alike by the tool and by a real JSON Schema validator.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolkit::Registry;

/// A string of `n` characters, some of them wider than a byte (the limits count characters).
fn chars(n: usize) -> String {
    "aé€𝄞".chars().cycle().take(n).collect()
}

/// Strings at and around the bounds of one string schema, and the pattern's edge cases.
fn strings_for(schema: &Value) -> Vec<String> {
    let mut out = vec![String::new(), "/a".into(), "a b".into()];
    let min = schema["minLength"].as_u64().map(|n| n as usize);
    let max = schema["maxLength"].as_u64().map(|n| n as usize);
    for n in [min, max].into_iter().flatten() {
        for m in [n.saturating_sub(1), n, n + 1] {
            out.push(chars(m));
            out.push(format!("/{}", chars(m.saturating_sub(1))));
            out.push(format!("https://{}", chars(m.saturating_sub(8))));
        }
    }
    if schema.get("pattern").is_some() {
        out.push("a\u{0}b".to_string());
        for s in [
            "https://example.org/",
            "https://",
            "https:// x",
            "http://example.org/",
            "HTTPS://example.org/",
            " https://example.org/",
            "https://example.org/\n",
            "https://a\u{85}b",
            "https://a\u{a0}b",
            "https://a\u{feff}b",
            "https://a\u{2028}b",
            "https://a\u{200b}b",
            "https://a\u{1680}b",
            "https://a\u{3000}b",
            "https://a\u{0b}b",
            "https://a\u{1c}b",
            "https://a\u{180e}b",
            "xhttps://a",
        ] {
            out.push(s.to_string());
        }
    }
    out
}

/// Values of every JSON type but string.
fn not_strings() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(7),
        json!(-1.5),
        json!([]),
        json!(["/a"]),
        json!({}),
    ]
}

/// A value one property schema accepts: the base the samples vary one argument at a time.
fn valid_for(schema: &Value) -> Value {
    match schema["type"].as_str() {
        Some("array") => json!([valid_for(&schema["items"])]),
        Some("integer") => json!(schema["minimum"].as_u64().unwrap_or(1)),
        _ => Value::String(
            strings_for(schema)
                .into_iter()
                .find(|c| !c.is_empty())
                .unwrap_or_default(),
        ),
    }
}

/// Values at and around the bounds of one property schema, and of every other type.
fn variants_for(schema: &Value) -> Vec<Value> {
    match schema["type"].as_str() {
        Some("array") => {
            let item = valid_for(&schema["items"]);
            let mut out = vec![
                json!([]),
                json!([item.clone()]),
                json!("a string"),
                json!({}),
                json!(7),
            ];
            for n in [schema["minItems"].as_u64(), schema["maxItems"].as_u64()]
                .into_iter()
                .flatten()
            {
                for m in [n.saturating_sub(1), n, n + 1] {
                    out.push(Value::Array(vec![item.clone(); m as usize]));
                }
            }
            for v in strings_for(&schema["items"])
                .into_iter()
                .map(Value::String)
                .chain(not_strings())
            {
                out.push(json!([item.clone(), v]));
            }
            out
        }
        Some("integer") => {
            let mut out = vec![
                json!(0),
                json!(-1),
                json!(1.5),
                json!(1e300),
                json!("5"),
                Value::Null,
                json!(true),
                json!([1]),
            ];
            for n in [schema["minimum"].as_u64(), schema["maximum"].as_u64()]
                .into_iter()
                .flatten()
            {
                for m in [n.saturating_sub(1), n, n + 1] {
                    out.push(json!(m));
                    out.push(json!(m as f64));
                }
            }
            out
        }
        _ => strings_for(schema)
            .into_iter()
            .map(Value::String)
            .chain(not_strings())
            .collect(),
    }
}

/// Samples made from one object schema: a valid base varied one argument at a time.
fn samples_for(schema: &Value) -> Vec<Value> {
    let props = schema["properties"].as_object().expect("an object schema");
    let base: Map<String, Value> = props
        .iter()
        .map(|(k, s)| (k.clone(), valid_for(s)))
        .collect();
    let mut out = vec![
        Value::Object(base.clone()),
        json!(null),
        json!("https://x"),
        json!(["/a"]),
        json!(1),
        json!({}),
    ];
    for (key, s) in props {
        for v in variants_for(s) {
            let mut one = base.clone();
            one.insert(key.clone(), v);
            out.push(Value::Object(one));
        }
        let mut missing = base.clone();
        missing.remove(key);
        out.push(Value::Object(missing));
    }
    let mut extra = base.clone();
    extra.insert("mode".into(), json!(1));
    out.push(Value::Object(extra));
    out
}

fn judges() -> Vec<(String, jsonschema::Validator, &'static toolkit::Entry)> {
    let reg: &'static Registry = Box::leak(Box::new(Registry::new(&BTreeMap::new()).unwrap()));
    reg.entries()
        .iter()
        .map(|e| {
            let schema = e.def().parameters;
            let v = jsonschema::validator_for(&schema).expect("the schema compiles");
            (e.name().to_string(), v, e)
        })
        .collect()
}

fn agree(name: &str, validator: &jsonschema::Validator, entry: &toolkit::Entry, v: &Value) {
    let schema_ok = validator.is_valid(v);
    let typed = entry.validate(v);
    let shown = v.to_string();
    let shown = &shown[..shown.floor_char_boundary_compat(200)];
    assert_eq!(
        schema_ok,
        typed.is_ok(),
        "{name}: the schema {} {shown} but the typed arguments {}",
        if schema_ok { "accepts" } else { "refuses" },
        match &typed {
            Ok(()) => "accept it".to_string(),
            Err(e) => format!("refuse it: {e}"),
        }
    );
}

trait FloorCompat {
    fn floor_char_boundary_compat(&self, at: usize) -> usize;
}

impl FloorCompat for str {
    fn floor_char_boundary_compat(&self, at: usize) -> usize {
        let mut at = at.min(self.len());
        while !self.is_char_boundary(at) {
            at -= 1;
        }
        at
    }
}

#[test]
fn every_tool_and_its_schema_accept_and_refuse_the_same_samples() {
    let mut seen = 0;
    for (name, validator, entry) in judges() {
        let samples = samples_for(&entry.def().parameters);
        let (mut yes, mut no) = (0, 0);
        for v in &samples {
            agree(&name, &validator, entry, v);
            if validator.is_valid(v) {
                yes += 1
            } else {
                no += 1
            }
        }
        assert!(
            yes > 0 && no > 0,
            "{name}: the samples must include both kinds"
        );
        seen += 1;
    }
    assert_eq!(seen, toolkit::TOOL_NAMES.len());
}

#[test]
fn a_refusal_names_the_argument_and_the_tool() {
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let read = reg.get("workspace_read").unwrap();
    let wrong = read.validate(&json!({"path": 7})).unwrap_err();
    assert!(
        wrong.starts_with(
            "the arguments do not match workspace_read's schema: the argument \"path\""
        ),
        "{wrong}"
    );
    let long = read
        .validate(&json!({ "path": chars(toolkit::args::MAX_PATH + 1) }))
        .unwrap_err();
    assert!(long.contains("longer than 4096 characters"), "{long}");
    // A hostile argument is not echoed whole into the message.
    let huge = read.validate(&json!(chars(1 << 20))).unwrap_err();
    assert!(huge.len() < 1024, "{} bytes", huge.len());
}

fn any_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,12}",
        "https://[a-z./ \t\u{85}\u{a0}\u{feff}\u{2028}]{0,6}",
        "/[a-zé€/]{0,8}",
        Just(String::new()),
    ]
}

fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => any_string().prop_map(Value::String),
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::from),
        1 => any::<i32>().prop_map(Value::from),
        1 => prop::collection::vec(any_string().prop_map(Value::String), 0..2).prop_map(Value::from),
    ]
}

fn any_args() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => prop::collection::btree_map(
            prop_oneof![
                Just("path".to_string()),
                Just("content".to_string()),
                Just("url".to_string()),
                Just("argv".to_string()),
                Just("cwd".to_string()),
                Just("stdin".to_string()),
                Just("timeout_ms".to_string()),
                "[a-z]{1,5}",
            ],
            any_value(),
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => any_value(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_arguments_are_judged_alike_by_each_tool_and_its_schema(v in any_args()) {
        for (name, validator, entry) in judges() {
            agree(&name, &validator, entry, &v);
        }
    }
}
