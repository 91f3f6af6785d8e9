//! Which box a command talks to: `--home DIR`, else `$BOXMAKER_HOME`, else the device's
//! `/var/lib/boxmaker`; its sockets are where `bxcore::layout` puts them under that home.

use std::path::{Path, PathBuf};

use bxcore::layout::{self, SocketSpec};

/// The environment variable naming the home when `--home` is not given.
pub const HOME_ENV: &str = "BOXMAKER_HOME";

/// The box a command talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    home: PathBuf,
}

impl Target {
    /// `--home`, else `$BOXMAKER_HOME`, else the device's home.
    pub fn resolve(home: Option<&Path>) -> Target {
        let home = home
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os(HOME_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(layout::DEVICE_HOME));
        Target { home }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn socket(&self, spec: &SocketSpec) -> PathBuf {
        spec.path(&self.home)
    }

    /// Whether this home is a dev box (`bxctl dev up` made it).
    pub fn is_dev_box(&self) -> bool {
        self.home.join("dev/box.toml").is_file()
    }
}
