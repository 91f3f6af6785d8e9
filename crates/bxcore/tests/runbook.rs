//! The runbook check: every anchor the source points at has its `## <anchor>` entry in
//! `docs/runbook.md`, every entry is pointed at, and every entry says what the line means, how to
//! confirm it and how to fix it.
//!
//! An anchor is found however the source writes it: a literal `docs/runbook.md#<anchor>`, an
//! anchor handed to `pointer("<anchor>")` or to the `runbook!("<anchor>", ...)` macro, or a
//! constant named `*_ANCHOR`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use regex::Regex;

/// Where each anchor is used: anchor → `file:line` places.
type Uses = BTreeMap<String, Vec<String>>;

fn anchors_used(files: &[(String, String)]) -> Uses {
    let patterns = [
        r"docs/runbook\.md#([a-z0-9][a-z0-9-]*)",
        r#"pointer\(\s*"([a-z0-9][a-z0-9-]*)""#,
        r#"runbook!\(\s*"([a-z0-9][a-z0-9-]*)""#,
        r#"[A-Z_]*ANCHOR\s*:\s*&(?:'static\s+)?str\s*=\s*"([a-z0-9][a-z0-9-]*)""#,
    ]
    .map(|p| Regex::new(p).unwrap());
    let mut uses = Uses::new();
    for (name, text) in files {
        for (i, line) in text.lines().enumerate() {
            for re in &patterns {
                for cap in re.captures_iter(line) {
                    uses.entry(cap[1].to_string())
                        .or_default()
                        .push(format!("{name}:{}", i + 1));
                }
            }
        }
    }
    uses
}

/// One `## <anchor>` entry and its text up to the next heading of level 1 or 2.
struct Entry {
    anchor: String,
    body: String,
}

fn entries(runbook: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for line in runbook.lines() {
        if let Some(anchor) = line.strip_prefix("## ") {
            out.push(Entry {
                anchor: anchor.trim().to_string(),
                body: String::new(),
            });
        } else if line.starts_with("# ") {
            // A top-level heading ends the entry before it.
            out.push(Entry {
                anchor: String::new(),
                body: String::new(),
            });
        } else if let Some(e) = out.last_mut() {
            e.body.push_str(line);
            e.body.push('\n');
        }
    }
    out.retain(|e| !e.anchor.is_empty());
    out
}

const PARTS: [&str; 3] = ["**Meaning.**", "**Confirm.**", "**Fix.**"];

fn problems(uses: &Uses, runbook: &str) -> Vec<String> {
    let entries = entries(runbook);
    let mut out = Vec::new();
    let mut seen = BTreeMap::new();
    for e in &entries {
        if *seen.entry(e.anchor.clone()).or_insert(0) > 0 {
            out.push(format!("## {} appears twice in docs/runbook.md", e.anchor));
        }
        *seen.get_mut(&e.anchor).unwrap() += 1;
        if !e
            .anchor
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            out.push(format!("## {} is not a lowercase-kebab anchor", e.anchor));
        }
        for part in PARTS {
            if !e.body.lines().any(|l| l.starts_with(part)) {
                out.push(format!("## {} has no paragraph starting {part}", e.anchor));
            }
        }
        if !uses.contains_key(&e.anchor) {
            out.push(format!(
                "## {} is in docs/runbook.md but no source points at it",
                e.anchor
            ));
        }
    }
    for (anchor, places) in uses {
        if !seen.contains_key(anchor) {
            out.push(format!(
                "{anchor} is pointed at ({}) but docs/runbook.md has no ## {anchor}",
                places.join(", ")
            ));
        }
    }
    out
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The product source: every `.rs` under `crates/*/src`, and the NixOS module.
fn source_files(root: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(crates) = fs::read_dir(root.join("crates")) {
        for c in crates.flatten() {
            dirs.push(c.path().join("src"));
        }
    }
    dirs.push(root.join("nixos-module"));
    for p in walk(dirs) {
        if matches!(
            p.extension().and_then(|x| x.to_str()),
            Some("rs" | "nix" | "sh")
        ) {
            let text = fs::read_to_string(&p).unwrap();
            let name = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            files.push((name, text));
        }
    }
    files.sort();
    files
}

/// Every file under `dirs`, a directory that does not exist passed over.
fn walk(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        let Ok(read) = fs::read_dir(&dir) else {
            continue;
        };
        for e in read.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files
}

/// The tests: every file under `crates/*/tests` and `tests/`, the unit tests of the source (a
/// file's text from its first `#[cfg(test)]` on), and the scripts that test the device
/// (`nixos-module/*.sh`, `*.nix`, `nix/package-check.sh`).
fn test_files(root: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![root.join("tests"), root.join("nixos-module")];
    if let Ok(crates) = fs::read_dir(root.join("crates")) {
        for c in crates.flatten() {
            dirs.push(c.path().join("tests"));
            dirs.push(c.path().join("src"));
        }
    }
    for p in walk(dirs) {
        let name = p.strip_prefix(root).unwrap_or(&p).display().to_string();
        // This check names every entry it lists: it is not their test.
        if name.ends_with("bxcore/tests/runbook.rs") {
            continue;
        }
        let Ok(text) = fs::read_to_string(&p) else {
            continue;
        };
        let unit = name.contains("/src/") && name.ends_with(".rs");
        match text.find("#[cfg(test)]") {
            Some(at) if unit => files.push((name, text[at..].to_string())),
            None if unit => {}
            _ => files.push((name, text)),
        }
    }
    if let Ok(text) = fs::read_to_string(root.join("nix/package-check.sh")) {
        files.push(("nix/package-check.sh".to_string(), text));
    }
    files.sort();
    files
}

/// The entries of `runbook` no test names (by the anchor itself, as a test names a pointer):
/// every refusal comes with the test that meets it.
fn untested(runbook: &str, tests: &[(String, String)]) -> Vec<String> {
    let named = |anchor: &str| tests.iter().any(|(_, t)| t.contains(anchor));
    entries(runbook)
        .into_iter()
        .filter(|e| !named(&e.anchor))
        .map(|e| {
            format!(
                "## {} is named by no test: a test that meets it asserts its pointer",
                e.anchor
            )
        })
        .collect()
}

#[test]
fn an_entry_no_test_names_is_caught() {
    let tests = one("t.rs", "assert!(e.ends_with(\"#broker-unavailable\"));");
    assert!(untested(GOOD, &tests).is_empty());
    let found = untested(GOOD, &one("t.rs", "nothing"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("named by no test"), "{found:?}");
}

#[test]
fn the_runbook_and_the_source_agree() {
    let root = repo_root();
    let runbook = fs::read_to_string(root.join("docs/runbook.md")).expect("docs/runbook.md");
    let uses = anchors_used(&source_files(&root));
    let mut found = problems(&uses, &runbook);
    found.extend(untested(&runbook, &test_files(&root)));
    assert!(
        found.is_empty(),
        "the runbook check found:\n  {}",
        found.join("\n  ")
    );
    println!("runbook: {} anchors, each used and documented", uses.len());
}

// The checker itself, on made-up trees: each way of failing is caught.

fn one(name: &str, text: &str) -> Vec<(String, String)> {
    vec![(name.to_string(), text.to_string())]
}

const GOOD: &str =
    "# Runbook\n\n## broker-unavailable\n\n**Meaning.** m\n\n**Confirm.** c\n\n**Fix.** f\n";

#[test]
fn every_way_of_writing_an_anchor_is_found() {
    // The made-up anchors are spliced in, so that no pointer-finding grep over the tree mistakes
    // this test's input for a real pointer.
    let src = r#"
        let a = "see docs/runbook.md#LITERAL";
        let b = pointer("pointer-two");
        runbook!("macro-three", "x {}", y);
        pub const POINTER_ANCHOR: &str = "const-four";
        const ANCHOR: &'static str = "const-five";
    "#
    .replace("LITERAL", "literal-one");
    let uses = anchors_used(&one("a.rs", &src));
    let names: Vec<&str> = uses.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "const-five",
            "const-four",
            "literal-one",
            "macro-three",
            "pointer-two"
        ]
    );
    assert_eq!(uses["pointer-two"], ["a.rs:3"]);
}

#[test]
fn a_clean_tree_has_no_problems() {
    let uses = anchors_used(&one("a.rs", r#"pointer("broker-unavailable")"#));
    assert!(problems(&uses, GOOD).is_empty());
}

#[test]
fn an_anchor_without_an_entry_is_caught() {
    let uses = anchors_used(&one(
        "a.rs",
        &format!(
            "docs/runbook.md#broker-unavailable docs/runbook.md#{}",
            "nowhere"
        ),
    ));
    let p = problems(&uses, GOOD);
    assert_eq!(
        p,
        ["nowhere is pointed at (a.rs:1) but docs/runbook.md has no ## nowhere"]
    );
}

#[test]
fn an_entry_nothing_points_at_is_caught() {
    let p = problems(&Uses::new(), GOOD);
    assert_eq!(
        p,
        ["## broker-unavailable is in docs/runbook.md but no source points at it"]
    );
}

#[test]
fn an_entry_without_meaning_confirm_or_fix_is_caught() {
    let uses = anchors_used(&one("a.rs", r#"pointer("broker-unavailable")"#));
    for part in PARTS {
        let damaged = GOOD.replace(part, "Something.");
        let p = problems(&uses, &damaged);
        assert_eq!(
            p,
            [format!(
                "## broker-unavailable has no paragraph starting {part}"
            )]
        );
    }
}

#[test]
fn a_repeated_entry_is_caught() {
    let uses = anchors_used(&one("a.rs", r#"pointer("broker-unavailable")"#));
    let twice = format!("{GOOD}{}", GOOD.replace("# Runbook\n", ""));
    assert_eq!(
        problems(&uses, &twice),
        ["## broker-unavailable appears twice in docs/runbook.md"]
    );
}

/// The one file of `crates/*/src` where `docs/runbook.md#` may stand: `bxcore::runbook`, which
/// writes every pointer (`pointer`, `Pointed`). Everywhere else an error knows its anchor
/// (`Anchored`) and the pointer is added where the line is written.
const ONE_PLACE: &str = "crates/bxcore/src/runbook.rs";

/// The files of `tree` other than [`ONE_PLACE`] with a hand-typed pointer, and its lines.
fn typed_by_hand(tree: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, text) in tree {
        if !name.starts_with("crates/") || name == ONE_PLACE {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            if line.contains("docs/runbook.md#") {
                out.push(format!(
                    "{name}:{}: a hand-typed runbook pointer: give the error its anchor \
                     (bxcore::runbook::Anchored) and write it with `pointed()` or \
                     bxharden::log::fail, or use runbook!",
                    i + 1
                ));
            }
        }
    }
    out
}

#[test]
fn runbook_pointers_are_written_in_one_place_only() {
    let found = typed_by_hand(&source_files(&repo_root()));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_pointer_typed_by_hand_is_caught_wherever_it_stands() {
    let typed = format!("see docs/runbook.md#{}", "broker-unavailable");
    let tree = vec![
        (ONE_PLACE.to_string(), format!("/// `{typed}`\n")),
        (
            "crates/loopd/src/x.rs".to_string(),
            format!("fn f() {{}}\n// {typed}\n"),
        ),
        (
            "crates/brokerd/src/y.rs".to_string(),
            format!("let s = \"{typed}\";\n"),
        ),
        ("nixos-module/z.nix".to_string(), typed.clone()),
    ];
    let found = typed_by_hand(&tree);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("crates/loopd/src/x.rs:2: "),
        "{found:?}"
    );
    assert!(
        found[1].starts_with("crates/brokerd/src/y.rs:1: "),
        "{found:?}"
    );
}
