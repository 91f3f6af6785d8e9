//! Where the dev box's memoryd files main memory and quarantine: the embedded store (the
//! default), or a Honcho server (`dev up --honcho-url URL [--honcho-key-file F]`). The choice is
//! made with the home, recorded in its marker, and a later `dev up` that asks for another is
//! refused, as the model choice is. Every flag is checked before anything is written, with the
//! same checks memoryd makes (`honcho::BaseUrl`, `honcho::Token`), so a box never starts to
//! fail later.
//!
//! The key is copied into memoryd's own directory (`<home>/memory/honcho.key`, 0600, as root
//! its user's), as systemd hands `apiKeyFile` to memoryd alone as the credential `honcho_key`
//! on the device: the file memoryd's configuration names is memoryd's, the token never enters a
//! configuration, a log or a line `dev up` prints, and the source may change or go without
//! the box noticing until it is made again.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;

use bxcore::layout;
use bxcore::runbook::Anchored;
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

use super::home::DevHome;

/// The key's copy in memoryd's directory.
pub const KEY_FILE: &str = "honcho.key";

/// The Honcho flags `dev up` was given, each `None` when not given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HonchoFlags {
    pub url: Option<String>,
    pub key_file: Option<PathBuf>,
}

/// A home's Honcho store, as its marker records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HonchoChoice {
    /// The server's base as memoryd reads it (`http://host:port`; memoryd adds `/v3`).
    pub url: String,
    /// Main memory's workspace, this home's own (quarantine is `<it>-quarantine`): two dev
    /// boxes on one Honcho never see each other's memory.
    pub workspace: String,
    /// The key file given (absolute), copied into memoryd's directory when the box came up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// Why the Honcho flags cannot be used. Nothing has been written or started.
#[derive(Debug, thiserror::Error)]
pub enum HonchoFlagError {
    #[error(
        "--honcho-key-file goes with --honcho-url: the key is for a Honcho server, and without \
         one memoryd keeps its embedded store"
    )]
    KeyWithoutUrl,
    #[error("--honcho-url: {0}")]
    Url(#[source] honcho::Error),
    #[error("--honcho-key-file: {0}")]
    Key(#[source] honcho::TokenError),
    #[error("--honcho-key-file {}: {error}", .path.display())]
    Path {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
}

impl Anchored for HonchoFlagError {
    fn anchor(&self) -> &str {
        match self {
            HonchoFlagError::KeyWithoutUrl | HonchoFlagError::Url(_) => honcho::CONFIG_ANCHOR,
            HonchoFlagError::Key(e) => e.anchor(),
            HonchoFlagError::Path { .. } => "honcho-key-missing",
        }
    }
}

/// The flags, checked: the URL parsed, the key file's path absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Checked {
    url: String,
    key_file: Option<PathBuf>,
}

impl HonchoFlags {
    /// Each flag that was given, checked as memoryd would: the URL a server's base (http or
    /// https, a host, a port 1 to 65535, nothing after it), the key file one memoryd would take
    /// (readable, its owner's alone, one token). The token read is dropped (and zeroed) at once.
    fn checked(&self) -> Result<Option<Checked>, HonchoFlagError> {
        let Some(url) = &self.url else {
            return match self.key_file {
                Some(_) => Err(HonchoFlagError::KeyWithoutUrl),
                None => Ok(None),
            };
        };
        let base = honcho::BaseUrl::parse(url).map_err(HonchoFlagError::Url)?;
        let key_file = match &self.key_file {
            Some(k) => {
                let k = std::path::absolute(k).map_err(|error| HonchoFlagError::Path {
                    path: k.clone(),
                    error,
                })?;
                drop(honcho::Token::read(&k).map_err(HonchoFlagError::Key)?);
                Some(k)
            }
            None => None,
        };
        Ok(Some(Checked {
            url: base.to_string(),
            key_file,
        }))
    }

    /// Every flag checked on its own.
    pub fn check_each(&self) -> Result<(), HonchoFlagError> {
        self.checked().map(drop)
    }

    /// The choice for a fresh home, main memory in the workspace `boxmaker-dev-<id>`; `None`:
    /// the embedded store.
    pub fn resolve(&self, id: &str) -> Result<Option<HonchoChoice>, HonchoFlagError> {
        Ok(self.checked()?.map(|c| HonchoChoice {
            url: c.url,
            workspace: format!("boxmaker-dev-{id}"),
            key_file: c.key_file,
        }))
    }

    /// For a reused home whose store is `had`: each given flag that says something else, as
    /// `--flag GIVEN, not HAD` (empty when all agree; no flag keeps what the home has).
    pub fn differences(&self, had: Option<&HonchoChoice>) -> Result<Vec<String>, HonchoFlagError> {
        let Some(c) = self.checked()? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let Some(had) = had else {
            out.push(format!("--honcho-url {}, not the embedded store", c.url));
            return Ok(out);
        };
        if c.url != had.url {
            out.push(format!("--honcho-url {}, not {}", c.url, had.url));
        }
        if let Some(k) = &c.key_file {
            if had.key_file.as_ref() != Some(k) {
                let was = had
                    .key_file
                    .as_ref()
                    .map_or("no key file".to_string(), |p| p.display().to_string());
                out.push(format!("--honcho-key-file {}, not {was}", k.display()));
            }
        }
        Ok(out)
    }
}

/// Where memoryd's copy of the key is.
pub fn key_copy(home: &DevHome) -> PathBuf {
    memory_dir(home).join(KEY_FILE)
}

fn memory_dir(home: &DevHome) -> PathBuf {
    layout::daemon("memoryd")
        .map(|d| d.state_path(home.root()))
        .unwrap_or_else(|| home.root().join("memory"))
}

/// memoryd's `[honcho]` table for `choice`: the base, the workspace, the key's copy.
pub fn table(home: &DevHome, choice: &HonchoChoice) -> Table {
    let mut t = Table::new();
    t.insert("url".into(), Value::String(choice.url.clone()));
    t.insert("workspace".into(), Value::String(choice.workspace.clone()));
    if choice.key_file.is_some() {
        t.insert(
            "key_file".into(),
            Value::String(key_copy(home).display().to_string()),
        );
    }
    t
}

/// Copy the key of `choice` (when it has one) into memoryd's directory, durably and 0600 from
/// its creation (`bxcore::durable`). As root, `dev up` gives the directory to memoryd's user
/// afterwards. The directory may be memoryd's user's already, so nothing in it is followed:
/// the temporary name is removed and created anew (`O_EXCL` does not follow a link), and a
/// rename replaces a link instead of writing through it.
pub fn install_key(home: &DevHome, choice: &HonchoChoice) -> io::Result<()> {
    let Some(source) = &choice.key_file else {
        return Ok(());
    };
    let dir = memory_dir(home);
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let mut key = fs::read(source)?;
    let written = bxcore::durable::replace(&key_copy(home), &key);
    // The token's bytes do not outlive the copy.
    key.iter_mut().for_each(|b| *b = 0);
    std::hint::black_box(&key);
    written.map_err(Into::into)
}

/// What `dev up` says about memoryd's store (never the key).
pub fn describe(choice: Option<&HonchoChoice>) -> String {
    match choice {
        None => "the embedded store".to_string(),
        Some(c) => format!(
            "Honcho at {} (workspaces {} and {}-quarantine{})",
            c.url,
            c.workspace,
            c.workspace,
            if c.key_file.is_some() {
                ", with a key"
            } else {
                ""
            }
        ),
    }
}
