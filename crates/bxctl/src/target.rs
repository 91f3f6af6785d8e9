//! Which box a command talks to: `--home DIR`, else `$BOXMAKER_HOME`, else the device's
//! `/var/lib/boxmaker` when it (or the device's `/run/boxmaker`) exists, else the dev box's
//! default home when that exists; its sockets are where `bxcore::layout` puts them for that
//! home (`/run/boxmaker` on the device).

use std::path::{Path, PathBuf};

use bxcore::layout::{self, SocketSpec};

/// The environment variable naming the home when `--home` is not given.
pub const HOME_ENV: &str = "BOXMAKER_HOME";

/// Where the NixOS module puts the daemons' configs on the device.
pub const DEVICE_CONFIGS: &str = "/etc/boxmaker";

/// The box a command talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    home: PathBuf,
}

/// The dev box's home when none is named: `$XDG_STATE_HOME/boxmaker-dev`, else
/// `~/.local/state/boxmaker-dev`.
pub fn dev_default() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .map(|d| PathBuf::from(d).join("boxmaker-dev"))
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".local/state/boxmaker-dev"))
        })
        .unwrap_or_else(|| PathBuf::from("boxmaker-dev"))
}

fn named(home: Option<&Path>) -> Option<PathBuf> {
    home.map(Path::to_path_buf)
        .or_else(|| std::env::var_os(HOME_ENV).map(PathBuf::from))
}

impl Target {
    /// The box the owner means: `--home`, `$BOXMAKER_HOME`, the device's home, or the dev box.
    pub fn resolve(home: Option<&Path>) -> Target {
        let home = named(home).unwrap_or_else(|| {
            let device = PathBuf::from(layout::DEVICE_HOME);
            let dev = dev_default();
            let on_device = device.exists() || Path::new(layout::DEVICE_RUN).exists();
            if !on_device && dev.join("dev/box.toml").exists() {
                dev
            } else {
                device
            }
        });
        Target { home }
    }

    /// The home `bxctl dev` works on: `--home`, `$BOXMAKER_HOME`, else the dev box's default.
    pub fn for_dev(home: Option<&Path>) -> Target {
        Target {
            home: named(home).unwrap_or_else(dev_default),
        }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn socket(&self, spec: &SocketSpec) -> PathBuf {
        spec.path(&self.home)
    }

    /// A daemon's config file: `<home>/etc/<daemon>.toml` in a dev box, else the device's
    /// `/etc/boxmaker/<daemon>.toml` (where the NixOS module puts them).
    pub fn config(&self, daemon: &str) -> PathBuf {
        let dir = if self.is_dev_box() {
            self.home.join("etc")
        } else {
            PathBuf::from(DEVICE_CONFIGS)
        };
        dir.join(format!("{daemon}.toml"))
    }

    /// Whether this home is a dev box (`bxctl dev up` made it).
    pub fn is_dev_box(&self) -> bool {
        self.home.join("dev/box.toml").is_file()
    }
}
