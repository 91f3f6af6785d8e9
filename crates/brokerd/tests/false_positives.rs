//! The leak check stops no ordinary work: after each kind of secret release, every call of the
//! false-positive corpus (code, logs, indented JSON, prose, URLs of popular hosts, the box's own
//! confirmations and framing) is allowed, while the secret itself is still found.

#[path = "../benches/false_positives/mod.rs"]
mod corpus;

use brokerd::fingerprints::Fingerprints;
use serde_json::json;

#[test]
fn the_false_positive_corpus_is_allowed_after_each_kind_of_secret_release() {
    let calls = corpus::corpus(toolkit::web_fetch::without_fixed_host);
    let mut denied = Vec::new();
    for r in corpus::releases() {
        let dir = tempfile::TempDir::new().unwrap();
        let store = Fingerprints::open(dir.path()).unwrap();
        let parts: Vec<&str> = r.parts.iter().map(String::as_str).collect();
        let cut: Vec<&str> = r.cut.iter().map(String::as_str).collect();
        store.release(&parts, &cut).unwrap();
        for (name, args) in &calls {
            if let Some(how) = store.leak(args) {
                denied.push(format!("after {}: {name} ({})", r.kind, how.as_str()));
            }
        }
        // What is secret in it is still found.
        let secret = r.parts[0].trim();
        if !store.is_empty() && !secret.is_empty() {
            assert!(
                store.leak(&json!({ "content": secret })).is_some(),
                "{}: the secret itself passes",
                r.kind
            );
        }
    }
    assert!(denied.is_empty(), "{denied:#?}");
}
