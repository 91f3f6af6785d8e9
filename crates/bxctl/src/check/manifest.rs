//! What the device check expects, as the NixOS module wrote it: `/etc/boxmaker/device.json`,
//! rendered by `nixos-module/units.nix` (`deviceManifest`) from the same facts as the units and
//! the tmpfiles rules, so the check never keeps a second copy of the layout.

use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group, Uid, User};
use serde::Deserialize;

/// Where the module installs the manifest.
pub const DEFAULT_PATH: &str = crate::target::DEVICE_MANIFEST;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub home: PathBuf,
    /// The most `systemd-analyze security` may score a service unit, times ten.
    #[serde(rename = "securityThreshold")]
    pub security_threshold: u32,
    pub owner: Account,
    pub services: Vec<Service>,
    pub sockets: Vec<Socket>,
    pub directories: Vec<Directory>,
    /// The sockets the owner starts the selftest and the device check on (`crate::ondemand`);
    /// absent in a manifest written before they were.
    #[serde(default)]
    pub ondemand: Option<OnDemand>,
}

pub use crate::ondemand::OnDemand;

/// A user and group, by name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Account {
    pub user: String,
    pub group: String,
}

/// One daemon's service unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub daemon: String,
    pub unit: String,
    pub user: String,
    pub group: String,
    /// Its configuration file.
    pub config: PathBuf,
}

/// One socket: its unit, path, server, and the one client that owns it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Socket {
    pub name: String,
    pub unit: String,
    pub path: PathBuf,
    pub server: String,
    pub user: String,
    pub group: String,
}

impl Socket {
    pub fn file(&self) -> String {
        format!("{}.sock", self.name)
    }
}

/// One directory the tmpfiles rules make.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Directory {
    pub path: PathBuf,
    /// Octal, as tmpfiles.d writes it: `0700`.
    pub mode: String,
    pub user: String,
    pub group: String,
}

impl Directory {
    /// The mode bits, or why the text is not a mode.
    pub fn mode_bits(&self) -> Result<u32, String> {
        u32::from_str_radix(&self.mode, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| format!("`{}` is not an octal mode", self.mode))
    }
}

/// Why the manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "cannot read {}: {error} (the NixOS module installs it; is services.boxmaker enabled?)",
        path.display()
    )]
    Read {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{} is not a device manifest: {error}", path.display())]
    Parse { path: PathBuf, error: String },
}

impl Manifest {
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|error| ManifestError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        serde_json::from_str(&text).map_err(|e| ManifestError::Parse {
            path: path.to_path_buf(),
            error: e.to_string(),
        })
    }

    /// The socket called `name`, if the box has one.
    pub fn socket(&self, name: &str) -> Option<&Socket> {
        self.sockets.iter().find(|s| s.name == name)
    }

    pub fn service(&self, daemon: &str) -> Option<&Service> {
        self.services.iter().find(|s| s.daemon == daemon)
    }
}

/// A user and group resolved to ids (`crate::thread_ids`).
pub use crate::thread_ids::Ids;

/// The ids of `user` and `group`, or why they have none.
pub fn resolve(user: &str, group: &str) -> Result<Ids, String> {
    let uid = match User::from_name(user) {
        Ok(Some(u)) => u.uid,
        Ok(None) => return Err(format!("no user `{user}`")),
        Err(e) => return Err(format!("cannot look up user `{user}`: {e}")),
    };
    let gid = match Group::from_name(group) {
        Ok(Some(g)) => g.gid,
        Ok(None) => return Err(format!("no group `{group}`")),
        Err(e) => return Err(format!("cannot look up group `{group}`: {e}")),
    };
    Ok(Ids {
        uid: uid.as_raw(),
        gid: gid.as_raw(),
    })
}

/// The name of uid `uid`, or the number.
pub fn user_name(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

/// The name of gid `gid`, or the number.
pub fn group_name(gid: u32) -> String {
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(g)) => g.name,
        _ => gid.to_string(),
    }
}
