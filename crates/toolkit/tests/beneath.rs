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
                name: None,
                class: DataClass::Private,
                writable: false,
                untrusted: false,
            }])
            .unwrap(),
            gateway: None,
            run: None,
            servers: Default::default(),
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
        if let Ok(out) = read.run(&args, &plan, &env, &bxcore::SessionId::new("s").unwrap()) {
            // Every file outside the root says "outside" (or is no file of this tree at all).
            prop_assert_eq!(out.content, "inside", "{} read what lies outside", path);
        }
    }
}

/// The file behind a descriptor, as (device, inode).
fn ident(fd: &std::os::fd::OwnedFd) -> (u64, u64) {
    use std::os::fd::AsRawFd;
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).unwrap();
    (st.st_dev, st.st_ino)
}

fn open_dir(p: &std::path::Path) -> std::os::fd::OwnedFd {
    use nix::fcntl::OFlag;
    std::os::fd::OwnedFd::from(
        fs::File::options()
            .read(true)
            .custom_flags((OFlag::O_PATH | OFlag::O_DIRECTORY).bits())
            .open(p)
            .unwrap(),
    )
}

use std::os::unix::fs::OpenOptionsExt;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Where `openat2` is refused (a unit with `RestrictSUIDSGID=`), the walk one component at a
    /// time opens exactly what the kernel's beneath walk opens, and refuses what it refuses.
    #[test]
    fn the_walk_without_openat2_opens_what_openat2_opens(parts in prop::collection::vec(part(), 1..7)) {
        use nix::fcntl::OFlag;
        use nix::sys::stat::Mode;
        use toolkit::workspace::{open_beneath, walk_beneath};
        let (_t, root) = tree();
        let dir = open_dir(&root);
        let rest: PathBuf = parts.iter().collect();
        for flags in [OFlag::O_RDONLY, OFlag::O_DIRECTORY | OFlag::O_RDONLY] {
            let kernel = open_beneath(&dir, &rest, flags, Mode::empty());
            let walked = walk_beneath(&dir, &rest, flags, Mode::empty());
            match (&kernel, &walked) {
                (Ok(k), Ok(w)) => prop_assert_eq!(ident(k), ident(w), "{:?}", rest),
                (Err(_), Err(_)) => {}
                _ => prop_assert!(false, "{:?} ({:?}): openat2 {:?}, the walk {:?}", rest, flags, kernel.as_ref().map(ident), walked.as_ref().map(ident)),
            }
        }
    }
}

#[test]
fn the_walk_without_openat2_never_creates_through_a_symlink() {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    use toolkit::workspace::walk_beneath;
    let (_t, root) = tree();
    let dir = open_dir(&root);
    let out = root.parent().unwrap().join("out");
    std::os::unix::fs::symlink(out.join("new"), root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("a/../../out/new2", root.join("rel")).unwrap();
    for name in ["dangling", "rel", "a/escape/new3", "abs"] {
        let r = walk_beneath(
            &dir,
            std::path::Path::new(name),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            Mode::from_bits_truncate(0o600),
        );
        assert!(r.is_err(), "{name} was created");
    }
    for made in ["new", "new2", "new3"] {
        assert!(!out.join(made).exists(), "{made} was made outside the root");
    }
    assert_eq!(fs::read_to_string(out.join("f")).unwrap(), "outside");
    // Inside, it creates as openat2 would.
    let fd = walk_beneath(
        &dir,
        std::path::Path::new("a/made"),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    drop(fd);
    assert!(root.join("a/made").exists());
}
