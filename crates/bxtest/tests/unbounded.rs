//! No test waits without a deadline: this reads every test and test-support file of the
//! workspace (`crates/*/tests`, `tests/`, and the `#[cfg(test)]` part of each source file) for
//! the forms that wait for ever, so that a new one cannot come back unnoticed. Each has a
//! bounded replacement in `bxtest`; where a form is bounded anyway (a stream with a read
//! timeout, a child killed just before), a comment `bounded: <why>` on the line or the line
//! above says so.

use std::fs;
use std::path::{Path, PathBuf};

/// The forms that wait for ever, and what to use instead.
const UNBOUNDED: &[(&str, &str)] = &[
    (
        ".wait()",
        "Child::wait, Barrier::wait and Condvar::wait wait for ever: bxtest::Bounded::finish, \
         bxtest::reap (after a kill), bxtest::Barrier, Condvar::wait_timeout",
    ),
    (
        ".wait_with_output()",
        "reads a child's output to its end: bxtest::run or bxtest::Bounded",
    ),
    (
        ".output()",
        "Command::output has no deadline: bxtest::OutputBounded::output_bounded or bxtest::run",
    ),
    (".status()", "Command::status has no deadline: bxtest::run"),
    (
        ".recv()",
        "Receiver::recv waits for ever: bxtest::recv or bxtest::gate",
    ),
    (".join()", "JoinHandle::join waits for ever: bxtest::join"),
    (
        ".accept()",
        "accept waits for ever: bxtest::accept or a bxtest::Server",
    ),
    (
        ".incoming()",
        "an accept loop that never ends: a bxtest::Server, which stops with its test",
    ),
    (
        "read_to_end(",
        "on a socket or a pipe this waits for its end: a read timeout first, or bxtest::run",
    ),
    (
        ".read_to_string(",
        "on a socket or a pipe this waits for its end: a read timeout first, or bxtest::run",
    ),
    (
        "read_line(",
        "on a socket or a pipe this waits for a line: a read timeout first",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every file with test code, and the line its test code starts at (0: all of it).
fn test_code() -> Vec<(PathBuf, usize)> {
    let root = root();
    let mut out = Vec::new();
    let mut whole = Vec::new();
    rust_files(&root.join("tests"), &mut whole);
    let mut crates: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    crates.sort();
    for krate in &crates {
        rust_files(&krate.join("tests"), &mut whole);
        // This file names the forms it looks for.
        whole.retain(|f| !f.ends_with("bxtest/tests/unbounded.rs"));
        // bxtest's own source is where the bounded forms live.
        if krate.ends_with("bxtest") {
            continue;
        }
        let mut src = Vec::new();
        rust_files(&krate.join("src"), &mut src);
        for f in src {
            let text = fs::read_to_string(&f).unwrap();
            if let Some(i) = text.lines().position(|l| l.trim() == "#[cfg(test)]") {
                out.push((f, i));
            }
        }
    }
    out.extend(whole.into_iter().map(|f| (f, 0)));
    out
}

/// Each unbounded form in `text` from line `from` on: (line number, form, what instead).
fn findings(text: &str, from: usize) -> Vec<(usize, &'static str, &'static str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(from) {
        let code = line.split("//").next().unwrap_or("");
        let said = line.contains("bounded:") || (i > 0 && lines[i - 1].contains("bounded:"));
        for (form, instead) in UNBOUNDED {
            if code.contains(form) && !said {
                out.push((i + 1, *form, *instead));
            }
        }
    }
    out
}

#[test]
fn no_test_waits_without_a_deadline() {
    let root = root();
    let files = test_code();
    assert!(
        files.len() > 50,
        "the test tree was not found under {root:?}"
    );
    let mut found = Vec::new();
    for (f, from) in files {
        let text = fs::read_to_string(&f).unwrap();
        let shown = f.strip_prefix(&root).unwrap_or(&f).display().to_string();
        for (n, form, instead) in findings(&text, from) {
            found.push(format!("{shown}:{n}: `{form}`: {instead}"));
        }
    }
    assert!(
        found.is_empty(),
        "waits without a deadline (docs/testing.md#waits-and-deadlines); where one is bounded \
         anyway, say why in a `bounded:` comment:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_an_unbounded_wait_and_accepts_a_bounded_one() {
    let text = "fn t() {\n    let out = cmd.output().unwrap();\n    \
                let v = rx.recv().unwrap();\n    // bounded: killed first\n    \
                let _ = child.wait();\n    let _ = h.join(); // bounded: ends at once\n}\n";
    let got: Vec<(usize, &str)> = findings(text, 0).iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(got, vec![(2, ".output()"), (3, ".recv()")]);
    // Only the test part of a source file counts.
    assert!(findings(text, 3).is_empty());
}
