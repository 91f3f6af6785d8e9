//! The baseline a new session starts with: the box's own part (`crate::prompt`: the workspace,
//! the tools, the rules), then `<home>/loop/system.md` (the owner's own words on how the box
//! behaves) and `<home>/loop/memory/core.md` (what it always remembers about its owner).
//!
//! Both are read when a session is created and written into its first record, so a session keeps
//! the baseline it began with even when the files change later. A file that is absent is empty
//! (a fresh box has no core memory yet); a file that exists but cannot be read refuses the
//! session, because starting without the owner's core memory would quietly change who the box is.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use bxcore::ErrorCode;
use bxcore::runbook::Anchored;

/// The largest `system.md` or `core.md`, in bytes: the whole baseline travels in every
/// inference request, which is one frame of at most 1 MiB.
pub const MAX_FILE: u64 = 256 * 1024;

/// The heading that separates the system prompt from the core memory.
pub const CORE_HEADING: &str = "# Core memory";

/// The assembled baseline: the system message a new session starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Baseline {
    pub system: String,
}

/// Why the baseline could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// `system.md` exists but could not be read.
    #[error("{}: {}", .0.display(), .1)]
    Read(PathBuf, #[source] io::Error),
    /// `memory/core.md` exists but could not be read.
    #[error("{}: {}", .0.display(), .1)]
    Core(PathBuf, #[source] io::Error),
}

/// The runbook entry of a `system.md` that exists and cannot be read.
pub const SYSTEM_ANCHOR: &str = "system-prompt-unreadable";
/// The runbook entry of a `memory/core.md` that exists and cannot be read.
pub const CORE_ANCHOR: &str = "core-memory-unreadable";

impl Anchored for BaselineError {
    fn anchor(&self) -> &str {
        match self {
            BaselineError::Read(..) => SYSTEM_ANCHOR,
            BaselineError::Core(..) => CORE_ANCHOR,
        }
    }

    fn code(&self) -> ErrorCode {
        ErrorCode::Internal
    }
}

/// The owner's part of a new session's baseline: `system.md` and `memory/core.md` as they are
/// when the session's worker starts. loopd's monitor reads them, so a worker reaches no file of
/// loopd's directory but its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    pub system: String,
    pub core: String,
}

impl Owner {
    /// `<loop_dir>/system.md` and `<loop_dir>/memory/core.md`; an absent file is empty.
    pub fn read(loop_dir: &Path) -> Result<Owner, BaselineError> {
        let system_path = loop_dir.join("system.md");
        let core_path = loop_dir.join("memory").join("core.md");
        let system =
            read_optional(&system_path).map_err(|e| BaselineError::Read(system_path, e))?;
        let core = read_optional(&core_path).map_err(|e| BaselineError::Core(core_path, e))?;
        Ok(Owner { system, core })
    }
}

impl Baseline {
    /// The box's part `about`, then `<loop_dir>/system.md` and `<loop_dir>/memory/core.md`.
    pub fn assemble(loop_dir: &Path, about: &str) -> Result<Baseline, BaselineError> {
        Ok(Baseline::compose(&Owner::read(loop_dir)?, about))
    }

    /// The box's part `about`, then the owner's.
    pub fn compose(owner: &Owner, about: &str) -> Baseline {
        let (system, core) = (&owner.system, &owner.core);
        let mut text = about.trim_end().to_string();
        if !system.trim().is_empty() {
            if !text.is_empty() {
                text.push_str("\n\n");
                text.push_str(crate::prompt::OWNER_HEADING);
                text.push_str("\n\n");
            }
            text.push_str(system.trim_end());
        }
        if !core.trim().is_empty() {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(CORE_HEADING);
            text.push_str("\n\n");
            text.push_str(core.trim_end());
        }
        Baseline { system: text }
    }
}

/// The file's text; an absent file is empty. Over `MAX_FILE` or not UTF-8 is an error.
fn read_optional(path: &Path) -> io::Result<String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_FILE} bytes"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8: {e}")))
}
