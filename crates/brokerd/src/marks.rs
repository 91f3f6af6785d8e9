//! The mark store: which objects an untrusted session wrote (`toolkit::marks`), in brokerd's
//! own directory (`<home>/broker/marks.json`), replaced whole and durably at each change
//! (`bxcore::durable`). Bounded: when it holds `[workspace] max_marks` marks it takes no more,
//! and a session that has read third-party content may not write into a trusted place until
//! the owner clears marks; a mark is never forgotten to make room. Only the owner clears one
//! (`bxctl marks clear`, recorded in the audit chain).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bxcore::Timestamp;
use bxcore::runbook::Anchored;
use serde::{Deserialize, Serialize};
use toolkit::{MarkError, Marks, NewMark};

/// The default bound on marked paths.
pub const DEFAULT_MAX: usize = 4096;

/// The largest bound: every mark still fits in a listing's frame when paths are ordinary.
pub const MAX_MAX: usize = 65_536;

/// The most bytes of marks one listing carries (the rest are counted, not sent).
pub const LIST_BYTES: usize = bxcore::MAX_FRAME / 2;

/// The store's file in brokerd's directory.
pub const FILE: &str = "marks.json";

/// One marked object, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stored {
    pub path: PathBuf,
    pub root: String,
    pub rel: PathBuf,
    #[serde(default)]
    pub file: Option<(u64, u64)>,
    #[serde(default)]
    pub whole: bool,
    pub marked: Timestamp,
}

impl Stored {
    /// What the owner sees of it.
    pub fn wire(&self) -> bxcore::Mark {
        bxcore::Mark {
            path: self.path.display().to_string(),
            root: self.root.clone(),
            rel: self.rel.display().to_string(),
            whole: self.whole,
            marked: self.marked,
        }
    }

    /// Whether `name` names this mark: its resolved path, or `<root>/<rel>`.
    pub fn named(&self, name: &str) -> bool {
        let short = if self.rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            format!("{}/{}", self.root, self.rel.display())
        };
        Path::new(name) == self.path || name == short
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    v: u32,
    marks: Vec<Stored>,
}

/// A store that cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[error("the mark store {}: {why}", path.display())]
pub struct StoreError {
    pub path: PathBuf,
    pub why: String,
}

impl Anchored for StoreError {
    fn anchor(&self) -> &str {
        toolkit::marks::STORE_ANCHOR
    }
}

/// The marks, held whole in memory and on disk.
#[derive(Debug)]
pub struct MarkStore {
    path: PathBuf,
    max: usize,
    held: Mutex<Vec<Stored>>,
}

impl MarkStore {
    /// The store in `dir`, read whole when it exists (a damaged file is an error, never an
    /// empty store: a mark is never lost to a fault).
    pub fn open(dir: &Path, max: usize) -> Result<MarkStore, StoreError> {
        let path = dir.join(FILE);
        let held = match fs::read(&path) {
            Ok(bytes) => {
                let f: File = serde_json::from_slice(&bytes).map_err(|e| StoreError {
                    path: path.clone(),
                    why: format!("is not a mark store: {e}"),
                })?;
                if f.v != 1 {
                    return Err(StoreError {
                        path,
                        why: format!("is of version {}, which this brokerd cannot read", f.v),
                    });
                }
                f.marks
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(StoreError {
                    path,
                    why: e.to_string(),
                });
            }
        };
        Ok(MarkStore {
            path,
            max,
            held: Mutex::new(held),
        })
    }

    fn held(&self) -> MutexGuard<'_, Vec<Stored>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, marks: &[Stored]) -> Result<(), StoreError> {
        let body =
            serde_json::to_vec(&serde_json::json!({"v": 1, "marks": marks})).map_err(|e| {
                StoreError {
                    path: self.path.clone(),
                    why: e.to_string(),
                }
            })?;
        bxcore::durable::replace(&self.path, &body).map_err(|e| StoreError {
            path: self.path.clone(),
            why: e.to_string(),
        })
    }

    /// Every mark, the oldest first.
    pub fn list(&self) -> Vec<Stored> {
        self.held().clone()
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The marks `name` names (its resolved path, or `<root>/<rel>`), without clearing them.
    pub fn find(&self, name: &str) -> Vec<Stored> {
        self.held()
            .iter()
            .filter(|m| m.named(name))
            .cloned()
            .collect()
    }

    /// Clear the marks `name` names, durably; what was cleared (empty: none was). The caller
    /// records the clearing in the chain first.
    pub fn clear(&self, name: &str) -> Result<Vec<Stored>, StoreError> {
        let mut held = self.held();
        let (gone, kept): (Vec<Stored>, Vec<Stored>) =
            held.iter().cloned().partition(|m| m.named(name));
        if gone.is_empty() {
            return Ok(gone);
        }
        self.write(&kept)?;
        *held = kept;
        Ok(gone)
    }
}

impl Marks for MarkStore {
    fn covers(&self, path: &Path, file: Option<(u64, u64)>) -> bool {
        self.held().iter().any(|m| {
            m.path == path
                || (m.whole && path.starts_with(&m.path))
                || (file.is_some() && m.file == file)
        })
    }

    fn names_in(&self, dir: &Path) -> bool {
        self.held()
            .iter()
            .any(|m| m.path.parent() == Some(dir) || (m.whole && dir.starts_with(&m.path)))
    }

    fn any_within(&self, tree: &Path) -> bool {
        self.held()
            .iter()
            .any(|m| m.path.starts_with(tree) || (m.whole && tree.starts_with(&m.path)))
    }

    fn mark(&self, new: NewMark<'_>) -> Result<(), MarkError> {
        let mut held = self.held();
        let mut next = held.clone();
        match next.iter_mut().find(|m| m.path == new.path) {
            Some(m) => {
                if m.file == new.file && m.whole >= new.whole {
                    return Ok(());
                }
                // The same name written again: the new file is the one marked now (the old one
                // had only this name, or a run that could link it marked its root).
                m.file = new.file;
                m.whole |= new.whole;
                m.marked = Timestamp::now();
            }
            None => {
                if next.len() >= self.max {
                    return Err(MarkError::Full { max: self.max });
                }
                next.push(Stored {
                    path: new.path.to_path_buf(),
                    root: new.root.to_string(),
                    rel: new.rel.to_path_buf(),
                    file: new.file,
                    whole: new.whole,
                    marked: Timestamp::now(),
                });
            }
        }
        self.write(&next).map_err(|e| MarkError::Store(e.why))?;
        *held = next;
        Ok(())
    }

    fn full(&self) -> Option<MarkError> {
        (self.held().len() >= self.max).then_some(MarkError::Full { max: self.max })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new<'a>(path: &'a Path, whole: bool) -> NewMark<'a> {
        NewMark {
            path,
            root: "notes",
            rel: Path::new("x"),
            file: None,
            whole,
        }
    }

    #[test]
    fn a_mark_survives_reopening_and_a_full_store_takes_no_more() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = MarkStore::open(dir.path(), 2).unwrap();
        s.mark(new(Path::new("/w/notes/a"), false)).unwrap();
        s.mark(new(Path::new("/w/notes/b"), false)).unwrap();
        // The same again takes no room.
        s.mark(new(Path::new("/w/notes/a"), false)).unwrap();
        assert!(matches!(
            s.mark(new(Path::new("/w/notes/c"), false)),
            Err(MarkError::Full { max: 2 })
        ));
        assert!(s.full().is_some());
        let again = MarkStore::open(dir.path(), 2).unwrap();
        assert!(again.covers(Path::new("/w/notes/a"), None));
        assert!(!again.covers(Path::new("/w/notes/c"), None));
        assert!(again.names_in(Path::new("/w/notes")));
        assert_eq!(again.clear("/w/notes/a").unwrap().len(), 1);
        assert!(
            !MarkStore::open(dir.path(), 2)
                .unwrap()
                .covers(Path::new("/w/notes/a"), None)
        );
    }

    #[test]
    fn a_whole_mark_covers_its_tree_and_a_damaged_store_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = MarkStore::open(dir.path(), 8).unwrap();
        s.mark(new(Path::new("/w/notes"), true)).unwrap();
        assert!(s.covers(Path::new("/w/notes/deep/file"), None));
        assert!(s.any_within(Path::new("/w")));
        assert!(!s.covers(Path::new("/w/other"), None));
        fs::write(dir.path().join(FILE), b"{not json").unwrap();
        assert!(MarkStore::open(dir.path(), 8).is_err());
    }
}
