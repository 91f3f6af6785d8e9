//! Marks: the label a file keeps of who wrote it.
//!
//! A root's flag says whether third parties wrote what it holds; a file an untrusted session
//! wrote (with the owner's approval) into a trusted root holds third-party words all the same.
//! So what such a call writes is marked, durably and before the write takes effect, and every
//! later read, listing and `run` that reaches a marked object is labelled untrusted, whatever
//! root it lies in (`docs/policy.md`, "Marks"). The store is brokerd's (its own state
//! directory); the tools only ask it, through [`Marks`], which the roots carry
//! ([`crate::Roots::with_marks`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// The runbook entry of a mark store that holds no more.
pub const FULL_ANCHOR: &str = "marks-full";

/// The runbook entry of a mark store that cannot be read or written.
pub const STORE_ANCHOR: &str = "marks-store";

/// One object to mark: where the kernel resolved it, the root it lies in and its path there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewMark<'a> {
    /// The object's resolved absolute path.
    pub path: &'a Path,
    /// The name of the deepest root that holds it.
    pub root: &'a str,
    /// Its path relative to that root (empty for the root itself).
    pub rel: &'a Path,
    /// The file's device and inode, for a file (another name of the same file is marked too).
    pub file: Option<(u64, u64)>,
    /// The whole tree beneath the path is marked (a `run` call's writable root).
    pub whole: bool,
}

/// Why an object could not be marked: the write that would have made it is not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkError {
    #[error(
        "the mark store is full ({max} marked paths): a session that has read third-party \
         content may not write into a trusted place until the owner clears marks (bxctl marks)"
    )]
    Full { max: usize },
    #[error("the mark store {0}")]
    Store(String),
}

impl MarkError {
    /// The runbook entry for this error.
    pub fn anchor(&self) -> &'static str {
        match self {
            MarkError::Full { .. } => FULL_ANCHOR,
            MarkError::Store(_) => STORE_ANCHOR,
        }
    }

    /// The error and its runbook pointer, as a refusal line.
    pub fn pointed(&self) -> String {
        format!("{self}; {}", bxcore::runbook::pointer(self.anchor()))
    }
}

/// The store of marks, as the tools ask it. Paths are resolved absolute paths (as the kernel
/// names an opened object).
pub trait Marks: Send + Sync + fmt::Debug {
    /// Whether the object at `path` is marked: a mark names it or a directory above it with
    /// `whole`, or (`file`) the same file under another name.
    fn covers(&self, path: &Path, file: Option<(u64, u64)>) -> bool;
    /// Whether the directory `dir` lists a marked name: a mark lies directly in it (an
    /// untrusted writer chose that name).
    fn names_in(&self, dir: &Path) -> bool;
    /// Whether any mark lies at or beneath `tree`, or covers it (what a `run` call there sees).
    fn any_within(&self, tree: &Path) -> bool;
    /// Mark `m` durably; only then may the write it is for take effect.
    fn mark(&self, m: NewMark<'_>) -> Result<(), MarkError>;
    /// Why no new mark can be made now (the store is full), if so.
    fn full(&self) -> Option<MarkError>;
}

/// The roots' handle on the store: none at all where no broker keeps one (a tool run alone).
#[derive(Clone, Default)]
pub struct MarkSet(pub Option<Arc<dyn Marks>>);

impl fmt::Debug for MarkSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(m) => m.fmt(f),
            None => f.write_str("no marks"),
        }
    }
}

impl PartialEq for MarkSet {
    fn eq(&self, other: &MarkSet) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Eq for MarkSet {}

impl MarkSet {
    pub fn covers(&self, path: &Path, file: Option<(u64, u64)>) -> bool {
        self.0.as_ref().is_some_and(|m| m.covers(path, file))
    }
    pub fn names_in(&self, dir: &Path) -> bool {
        self.0.as_ref().is_some_and(|m| m.names_in(dir))
    }
    pub fn any_within(&self, tree: &Path) -> bool {
        self.0.as_ref().is_some_and(|m| m.any_within(tree))
    }
    /// Mark `m`; with no store there is nothing to keep it in, and nothing to do.
    pub fn mark(&self, m: NewMark<'_>) -> Result<(), MarkError> {
        match &self.0 {
            Some(s) => s.mark(m),
            None => Ok(()),
        }
    }
    pub fn full(&self) -> Option<MarkError> {
        self.0.as_ref().and_then(|m| m.full())
    }
}
