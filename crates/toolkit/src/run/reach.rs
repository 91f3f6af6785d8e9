//! What one call of `run` reaches, and so what its result is labelled with.
//!
//! Landlock grants a directory's whole tree, and a program reads whatever file it opens there by
//! whatever name. So the labels a call starts from (the session's, joined with those of its
//! `cwd`) are not yet what it can read: a root nested inside a root it sees is inside the grant
//! too, and a file with more than one name may be another root's file under a name in this tree
//! (a hard link: `notes/copy.txt` the same file as `vault/pin.txt`). So [`reach`] grants a root
//! only when every root nested in it may be read as well, the root the call runs in brings its
//! nested roots' labels along, and [`sees`] joins in every root a hard link may lead to, until
//! nothing more is reached: a call labelled private can read nothing but private files.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bxcore::Label;

use crate::workspace::{Root, Roots};

/// The most directory entries one call's hard-link walk looks at. A tree with more is not
/// searched to its end: the call is then labelled with every root, as if any of its files could
/// be any root's.
pub const WALK_LIMIT: usize = 100_000;

/// The roots one call reaches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    pub read_only: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
}

/// The roots a call labelled `label` may read, and of those the ones it may write: see the
/// module's documentation. Roots whose directory is not there are left out.
pub fn reach(roots: &Roots, label: Label, write: bool) -> Reach {
    let all: Vec<&Root> = roots.iter().collect();
    // The roots that contain `r` (itself included): its labels are theirs, joined.
    let around = |r: &Root| -> Vec<&Root> {
        all.iter()
            .copied()
            .filter(|o| r.path.starts_with(&o.path))
            .collect()
    };
    // Landlock grants a root with its whole tree: so a root is seen only when every root around
    // it and every root nested inside it may be read by this call.
    let visible = |r: &Root| {
        all.iter()
            .filter(|o| r.path.starts_with(&o.path) || o.path.starts_with(&r.path))
            .all(|o| o.label().flows_to(label))
    };
    let writable_here = |r: &Root| {
        visible(r)
            && around(r).iter().all(|o| o.writable)
            && around(r).iter().map(|o| o.class).max() == Some(label.class)
    };
    let mut out = Reach::default();
    for r in &all {
        if !visible(r) || !r.path.is_dir() {
            continue;
        }
        let nested_ok = all
            .iter()
            .filter(|o| o.path != r.path && o.path.starts_with(&r.path))
            .all(|o| writable_here(o));
        if write && writable_here(r) && nested_ok {
            out.read_write.push(r.path.clone());
        } else {
            out.read_only.push(r.path.clone());
        }
    }
    out
}

/// The label of a call that starts from `label` with its `cwd` in the root at `cwd_root`: joined with every root nested in that root (the program must see the tree it runs
/// in, and Landlock grants it whole), then with every root on the file system of a hard-linked
/// file in what it sees, again and again while that lets it see more.
pub fn sees(roots: &Roots, cwd_root: &Path, label: Label) -> Label {
    let mut label = label;
    for o in roots.iter().filter(|o| o.path.starts_with(cwd_root)) {
        label.raise(o.label());
    }
    let mut walked: Vec<PathBuf> = Vec::new();
    let mut budget = WALK_LIMIT;
    loop {
        let before = label;
        let mut join = |o: &Root| {
            label.raise(o.label());
        };
        for tree in reach(roots, before, false).read_only {
            if walked.iter().any(|w| tree.starts_with(w)) {
                continue;
            }
            match linked_file_systems(&tree, &mut budget) {
                Some(devices) => roots
                    .iter()
                    .filter(|o| device(&o.path).is_some_and(|d| devices.contains(&d)))
                    .for_each(&mut join),
                None => roots.iter().for_each(&mut join),
            }
            walked.push(tree);
        }
        if label == before {
            return before;
        }
    }
}

fn device(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.dev())
}

/// The file systems (devices) that hold a non-directory with more than one link somewhere in
/// `tree`, symlinks not followed; `None` when the walk would pass `budget` entries, or a
/// directory the program could enter cannot be listed (what was not looked at cannot be
/// vouched for). The program runs as brokerd's user, so a directory brokerd may not enter is
/// closed to it too, and one that is gone holds nothing.
fn linked_file_systems(tree: &Path, budget: &mut usize) -> Option<BTreeSet<u64>> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![tree.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) if nix::unistd::access(&dir, nix::unistd::AccessFlags::X_OK).is_err() => {
                continue;
            }
            Err(_) => return None,
        };
        for entry in entries {
            *budget = budget.checked_sub(1)?;
            let entry = entry.ok()?;
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.nlink() > 1 {
                found.insert(meta.dev());
            }
        }
    }
    Some(found)
}
