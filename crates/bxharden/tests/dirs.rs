//! `own_dir`: the rules every daemon's own directories follow. Nothing here changes process-wide
//! state (no umask, no credentials), so the cases run in the test harness itself.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown, symlink};

use bxharden::log::Anchored;
use bxharden::{DirError, Owner, own_dir};

fn mode(p: &std::path::Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn a_missing_directory_is_made_0700_under_parents_made_0711() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("home/loop/sessions");
    own_dir(&dir, None).unwrap();
    assert_eq!(mode(&dir), 0o700);
    // Parents may be entered, never listed or written by others (0711 under the usual umask).
    for parent in ["home/loop", "home"] {
        let m = mode(&t.path().join(parent));
        assert_eq!(m & 0o766, 0o700, "{parent}: {m:04o}");
    }
}

#[test]
fn a_wider_directory_is_tightened_and_kept() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("broker");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("kept"), "x").unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    own_dir(&dir, None).unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert!(dir.join("kept").exists(), "nothing in it is touched");
}

#[test]
fn a_symbolic_link_is_refused_and_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let elsewhere = t.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o755)).unwrap();
    let dir = t.path().join("infer");
    symlink(&elsewhere, &dir).unwrap();
    let e = own_dir(&dir, None).unwrap_err();
    assert!(matches!(e, DirError::NotADirectory(_)), "{e}");
    assert_eq!(mode(&elsewhere), 0o755, "the link's target is left alone");
    assert!(
        e.pointed()
            .to_string()
            .ends_with("not a directory (a file or a symbolic link is in its place); see docs/runbook.md#state-dir-refused"),
        "{e}"
    );
}

#[test]
fn a_file_in_its_place_is_refused_and_left_alone() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("loop");
    fs::write(&dir, "mine").unwrap();
    assert!(matches!(
        own_dir(&dir, None),
        Err(DirError::NotADirectory(_))
    ));
    assert_eq!(fs::read_to_string(&dir).unwrap(), "mine");
}

#[test]
fn as_root_a_directory_of_another_user_is_refused_whoever_the_owner() {
    if !is_root() {
        bxtest::skip("needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("broker");
    fs::create_dir(&dir).unwrap();
    chown(&dir, Some(1234), Some(1234)).unwrap();
    let e = own_dir(&dir, None).unwrap_err();
    assert!(
        matches!(
            e,
            DirError::Foreign {
                uid: 1234,
                want: 0,
                ..
            }
        ),
        "{e}"
    );
    let nobody = Owner {
        uid: 65534,
        gid: 65534,
    };
    let e = own_dir(&dir, Some(nobody)).unwrap_err();
    assert!(
        matches!(
            e,
            DirError::Foreign {
                uid: 1234,
                want: 65534,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(fs::metadata(&dir).unwrap().uid(), 1234, "it is not taken");
}

#[test]
fn as_root_a_directory_of_root_or_of_the_owner_is_given_to_the_owner() {
    if !is_root() {
        bxtest::skip("needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let nobody = Owner {
        uid: 65534,
        gid: 65534,
    };
    let made = t.path().join("new");
    own_dir(&made, Some(nobody)).unwrap();
    let rooted = t.path().join("rooted");
    fs::create_dir(&rooted).unwrap();
    own_dir(&rooted, Some(nobody)).unwrap();
    let theirs = t.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    chown(&theirs, Some(65534), Some(65534)).unwrap();
    own_dir(&theirs, Some(nobody)).unwrap();
    for d in [made, rooted, theirs] {
        let m = fs::metadata(&d).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o7777),
            (65534, 65534, 0o700),
            "{}",
            d.display()
        );
    }
}
