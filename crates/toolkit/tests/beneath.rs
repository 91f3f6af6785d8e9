//! Whatever path the model writes, through `..`, `.` and symlinks of every kind, a workspace
//! read either fails or reads a file that lies inside its root.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use bxcore::DataClass;
use proptest::prelude::*;
use serde_json::json;
use tempfile::TempDir;
use toolkit::{Env, Registry, Root, Roots};

/// A root with files, a subdirectory and symlinks that stay in or lead out, beside a directory
/// outside the root with files of the same names.
fn tree() -> (TempDir, PathBuf) {
    let t = TempDir::new().unwrap();
    let base = t.path().canonicalize().unwrap();
    let root = base.join("root");
    let out = base.join("out");
    for d in [&root, &out, &root.join("a"), &out.join("a")] {
        fs::create_dir_all(d).unwrap();
    }
    for d in [&root, &out] {
        let mark = if d == &root { "inside" } else { "outside" };
        fs::write(d.join("f"), mark).unwrap();
        fs::write(d.join("a/f"), mark).unwrap();
    }
    symlink("../f", root.join("a/up")).unwrap();
    symlink("..", root.join("a/parent")).unwrap();
    symlink("../../out", root.join("a/escape")).unwrap();
    symlink(out.join("f"), root.join("abs")).unwrap();
    symlink(root.join("f"), root.join("absin")).unwrap();
    symlink("a/parent/..", root.join("loop")).unwrap();
    (t, root)
}

fn part() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "..", ".", "a", "f", "up", "parent", "escape", "abs", "absin", "loop", "out", "root",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_read_never_returns_what_lies_outside_the_root(parts in prop::collection::vec(part(), 1..7)) {
        let (_t, root) = tree();
        let env = Env {
            roots: Roots::new(vec![Root {
                path: root.clone(),
                class: DataClass::Private,
                writable: false,
                untrusted: false,
            }])
            .unwrap(),
            gateway: None,
            run: None,
        };
        let reg = Registry::new(&Default::default()).unwrap();
        let read = reg.get("workspace_read").unwrap();
        let mut path = root.display().to_string();
        for p in &parts {
            path.push('/');
            path.push_str(p);
        }
        let args = json!({ "path": path });
        let plan = read.plan(&args, &env).unwrap();
        if let Ok(out) = read.run(&args, &plan, &env) {
            // Every file outside the root says "outside" (or is no file of this tree at all).
            prop_assert_eq!(out.content, "inside", "{} read what lies outside", path);
        }
    }
}
