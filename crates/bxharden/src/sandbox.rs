//! `apply`: the whole sandbox, in the design's order, in `main` before any thread exists:
//! privilege drop, `PR_SET_NO_NEW_PRIVS`, Landlock, seccomp last.

use std::fmt;

use bxcore::runbook::Anchored;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};

use crate::config::SandboxConfig;
use crate::identity::{Identity, LookupError};
use crate::landlock_layer::{self, Enforced, LandlockError};
use crate::privdrop::{self, DropError};
use crate::profiles::SeccompProfile;
use crate::seccomp::{self, Mismatch, SeccompError};
use crate::threads;

/// The runbook anchor of every sandbox refusal.
pub const SANDBOX_ANCHOR: &str = "sandbox-unavailable";

/// What one daemon may touch, built from its configuration at start: read-write directories,
/// read-only files and directories, TCP ports it may connect to, and its seccomp list.
///
/// Every profile starts with `/nix/store` read-only when it exists (on NixOS the binary's
/// libraries and the CA files are links into it), the directory of the running executable, and
/// `/dev/null` read-write (what `Stdio::null()` opens; writing it changes nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    seccomp: SeccompProfile,
    read_write: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    connect_tcp: Vec<u16>,
}

/// The resolver and CA files a network client reads: those that exist on this system.
pub const RESOLVER_AND_CA: [&str; 7] = [
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl/certs",
    "/etc/pki/tls/certs",
];

impl Profile {
    /// The Landlock ABI this profile relies on, and for what: 4 (TCP connect rules) for a daemon
    /// that connects over TCP, whose port rule is then its only bound below the unit's own; 1
    /// (its directories) for any other. Best effort holds above it only.
    pub fn landlock_abi_needed(&self) -> (i32, &'static str) {
        if self.connect_tcp.is_empty() && !self.seccomp.inet() {
            (1, "its own directories")
        } else {
            (4, "TCP connect rules, its only bound on where it connects")
        }
    }

    /// With `[sandbox] require = true`: `Err` when what the kernel enforced is below
    /// [`Profile::landlock_abi_needed`].
    pub fn landlock_enough(&self, enforced: Enforced) -> Result<(), SandboxError> {
        let (needed, what) = self.landlock_abi_needed();
        let abi = match enforced {
            Enforced::Fully(abi) | Enforced::Partially(abi) => abi,
            Enforced::Not => 0,
        };
        if abi >= needed {
            return Ok(());
        }
        Err(SandboxError::Landlock(format!(
            "this kernel's Landlock ABI {abi} cannot enforce what this daemon relies on (ABI \
             {needed}: {what}); a kernel with Landlock ABI {needed} or later is needed (Linux \
             6.7 has 4), or [sandbox] require = false to run without it"
        )))
    }

    /// A profile with the seccomp list `seccomp` and only the system's read-only paths.
    pub fn new(seccomp: SeccompProfile) -> Profile {
        let mut read_only = Vec::new();
        if Path::new("/nix/store").is_dir() {
            read_only.push(PathBuf::from("/nix/store"));
        }
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            read_only.push(dir);
        }
        let mut read_write = Vec::new();
        if Path::new("/dev/null").exists() {
            read_write.push(PathBuf::from("/dev/null"));
        }
        Profile {
            seccomp,
            read_write,
            read_only,
            connect_tcp: Vec::new(),
        }
    }

    /// Allow reading (and executing) this process's own code again: every file it has mapped
    /// executable now (its binary, its loader, its libraries, from `/proc/self/maps`) and the
    /// loader's cache. For a daemon that starts its own binary (loopd's monitor, each session's
    /// worker): the loader of the new image opens them again under the daemon's domain. Off
    /// NixOS they are outside `/nix/store`, in the system's library directories, which no
    /// profile holds otherwise.
    pub fn own_code(mut self) -> Profile {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let perms = fields.nth(1).unwrap_or("");
            let Some(path) = fields.nth(3) else { continue };
            let path = PathBuf::from(path);
            if perms.contains('x') && path.is_absolute() && !self.read_only.contains(&path) {
                self.read_only.push(path);
            }
        }
        let cache = PathBuf::from("/etc/ld.so.cache");
        if cache.exists() {
            self.read_only.push(cache);
        }
        self
    }

    /// Allow reading, writing, creating and removing beneath `path` (it must exist).
    pub fn read_write(mut self, path: impl Into<PathBuf>) -> Profile {
        self.read_write.push(path.into());
        self
    }

    /// Allow reading beneath `path` (it must exist).
    pub fn read_only(mut self, path: impl Into<PathBuf>) -> Profile {
        self.read_only.push(path.into());
        self
    }

    /// Allow TCP connect to `port` (only profiles with `AF_INET` sockets can use it).
    pub fn connect_tcp(mut self, port: u16) -> Profile {
        self.connect_tcp.push(port);
        self
    }

    /// Add the resolver and CA files of [`RESOLVER_AND_CA`] that exist here (a file the system
    /// does not have cannot be read anyway; one that exists but cannot be opened is an error at
    /// `apply`).
    pub fn resolver_and_ca(mut self) -> Profile {
        for p in RESOLVER_AND_CA {
            if Path::new(p).exists() {
                self.read_only.push(PathBuf::from(p));
            }
        }
        self
    }

    /// The seccomp list.
    pub fn seccomp(&self) -> SeccompProfile {
        self.seccomp
    }

    /// The read-write paths.
    pub fn read_write_paths(&self) -> &[PathBuf] {
        &self.read_write
    }

    /// The read-only paths.
    pub fn read_only_paths(&self) -> &[PathBuf] {
        &self.read_only
    }

    /// The TCP connect ports.
    pub fn connect_ports(&self) -> &[u16] {
        &self.connect_tcp
    }
}

/// Why the sandbox could not be applied: the daemon refuses to start. Its runbook entry is
/// [`SANDBOX_ANCHOR`].
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// `apply` ran beside other threads, or not on the first one.
    #[error("cannot apply the sandbox: {0}")]
    Threads(String),
    /// `[sandbox] user` or `group` names nobody.
    #[error("cannot apply the sandbox: [sandbox]: {0}")]
    Lookup(#[source] LookupError),
    /// Started as root with no `[sandbox] user` while the sandbox is required.
    #[error(
        "cannot apply the sandbox: started as root with no [sandbox] user (other than root) to \
         drop to (require = true)"
    )]
    RootWithoutUser,
    /// A `[sandbox] user` other than the running one, without root to switch.
    #[error(
        "cannot apply the sandbox: [sandbox] user is uid {wanted}, but this process runs as uid \
         {running} without the privilege to switch"
    )]
    NotRoot {
        /// The configured uid.
        wanted: u32,
        /// The running uid.
        running: u32,
    },
    /// A `[sandbox] group` other than the running one, without root to switch.
    #[error(
        "cannot apply the sandbox: [sandbox] group is gid {wanted}, but this process runs as gid \
         {running} without the privilege to switch"
    )]
    NotRootGroup {
        /// The configured gid.
        wanted: u32,
        /// The running gid.
        running: u32,
    },
    /// The privilege drop failed (always fatal: a half-dropped process must not run).
    #[error("cannot apply the sandbox: privilege drop: {0}")]
    Drop(#[source] DropError),
    /// `PR_SET_NO_NEW_PRIVS` failed.
    #[error("cannot apply the sandbox: PR_SET_NO_NEW_PRIVS: {0}")]
    NoNewPrivs(#[source] std::io::Error),
    /// Landlock failed, or enforced nothing, while required.
    #[error("cannot apply the sandbox: {0}")]
    Landlock(String),
    /// seccomp failed while required.
    #[error("cannot apply the sandbox: {0}")]
    Seccomp(#[source] SeccompError),
}

impl Anchored for SandboxError {
    fn anchor(&self) -> &str {
        SANDBOX_ANCHOR
    }
}

/// What is in force after [`apply`], for the startup notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The uid the daemon runs as.
    pub uid: u32,
    /// The gid the daemon runs as.
    pub gid: u32,
    /// Whether privileges were dropped from root here.
    pub dropped: bool,
    /// What Landlock enforces (`None`: skipped, `require = false`).
    pub landlock: Option<Enforced>,
    /// The seccomp profile and how many system calls it names (`None`: skipped).
    pub seccomp: Option<(SeccompProfile, usize)>,
    /// What happens on a system call off the list.
    pub mismatch: Mismatch,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sandbox: uid {} gid {}", self.uid, self.gid)?;
        if self.dropped {
            f.write_str(" (dropped from root)")?;
        }
        match self.landlock {
            Some(e) => write!(f, ", Landlock {e}")?,
            None => f.write_str(", Landlock NOT APPLIED")?,
        }
        match self.seccomp {
            Some((p, n)) => {
                let action = match self.mismatch {
                    Mismatch::KillProcess => "kill",
                    Mismatch::LogEperm => "EPERM and log",
                };
                write!(f, ", seccomp {p} ({n} system calls, otherwise {action})")
            }
            None => f.write_str(", seccomp NOT APPLIED"),
        }
    }
}

fn skipped(what: &str) {
    crate::runbook!(
        SANDBOX_ANCHOR,
        "{what}, and [sandbox] require = false runs on without it"
    );
}

/// Apply the whole sandbox, in order: drop privileges to `[sandbox] user, group` (when root),
/// `PR_SET_NO_NEW_PRIVS`, Landlock with `profile`'s paths and ports, then seccomp with its list.
/// Call it in `main` once the configuration, secrets, the journal and the listening sockets are
/// open, before any thread exists: it refuses otherwise.
///
/// With `require = true` (the default) a layer that cannot be applied is an error; with
/// `false` each skipped layer is logged once with the `sandbox-unavailable` pointer. A failed
/// privilege drop is an error either way.
pub fn apply(cfg: &SandboxConfig, profile: &Profile) -> Result<Report, SandboxError> {
    threads::alone().map_err(|why| SandboxError::Threads(format!("apply: {why}")))?;
    let id = if profile.seccomp.nested() {
        Identity::current()
    } else {
        Identity::resolve(cfg).map_err(SandboxError::Lookup)?
    };
    if let Err(e) = crate::notify::prepare() {
        tracing::warn!(
            "{}: NOTIFY_SOCKET cannot be reached: {e}",
            crate::log::daemon().name
        );
    }
    let euid = Uid::effective().as_raw();

    // 1. Privileges: none to drop in a session's worker, which its monitor started after its
    // own drop, holding what the monitor holds and no more (no new privileges).
    if profile.seccomp.nested() {
    } else if id.drops {
        privdrop::drop_to(&id).map_err(SandboxError::Drop)?;
    } else {
        if euid == 0 {
            if cfg.require {
                return Err(SandboxError::RootWithoutUser);
            }
            skipped("started as root with no [sandbox] user, it keeps running as root");
        } else if id.uid != euid {
            let e = SandboxError::NotRoot {
                wanted: id.uid,
                running: euid,
            };
            if cfg.require {
                return Err(e);
            }
            skipped(&format!(
                "[sandbox] user is uid {}, not the running uid {euid}",
                id.uid
            ));
        }
        let egid = Gid::effective().as_raw();
        if euid != 0 && id.gid != egid {
            let e = SandboxError::NotRootGroup {
                wanted: id.gid,
                running: egid,
            };
            if cfg.require {
                return Err(e);
            }
            skipped(&format!(
                "[sandbox] group is gid {}, not the running gid {egid}",
                id.gid
            ));
        }
        privdrop::clear_inheritable().map_err(SandboxError::Drop)?;
    }

    // 2. No new privileges: nothing exec'd later gains any.
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(SandboxError::NoNewPrivs(std::io::Error::last_os_error()));
    }

    // 3. Landlock.
    let landlock = match landlock_layer::restrict(
        &profile.read_write,
        &profile.read_only,
        &profile.connect_tcp,
    ) {
        Ok(Enforced::Not) if cfg.require => {
            return Err(SandboxError::Landlock(
                "Landlock is not enforced: this kernel has none, or it is disabled".to_owned(),
            ));
        }
        Ok(Enforced::Not) => {
            skipped("Landlock is not enforced (this kernel has none, or it is disabled)");
            None
        }
        Ok(e) if cfg.require => {
            profile.landlock_enough(e)?;
            Some(e)
        }
        Ok(e) => Some(e),
        Err(e) if cfg.require => return Err(SandboxError::Landlock(e.to_string())),
        Err(e @ (LandlockError::Path(..) | LandlockError::Ruleset(_))) => {
            skipped(&e.to_string());
            None
        }
    };

    // 4. seccomp, last: its list has no `seccomp` or `landlock_*` for the steps above.
    let mismatch = if cfg.seccomp_log {
        Mismatch::LogEperm
    } else {
        Mismatch::KillProcess
    };
    let seccomp = match seccomp::apply(profile.seccomp, mismatch) {
        Ok(n) => Some((profile.seccomp, n)),
        Err(e) if cfg.require => return Err(SandboxError::Seccomp(e)),
        Err(e) => {
            skipped(&e.to_string());
            None
        }
    };

    Ok(Report {
        uid: Uid::effective().as_raw(),
        gid: Gid::effective().as_raw(),
        dropped: id.drops,
        landlock,
        seccomp,
        mismatch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_daemon_needs_landlock_s_tcp_rules_when_the_sandbox_is_required() {
        let net = Profile::new(SeccompProfile::Inferproxy).connect_tcp(443);
        for abi in [1, 2, 3] {
            let e = net
                .landlock_enough(Enforced::Partially(abi))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("Landlock ABI {abi} cannot enforce")) && e.contains("ABI 4"),
                "{e}"
            );
        }
        assert!(net.landlock_enough(Enforced::Partially(4)).is_ok());
        assert!(net.landlock_enough(Enforced::Fully(6)).is_ok());
        assert!(net.landlock_enough(Enforced::Not).is_err());
    }

    #[test]
    fn a_unix_socket_daemon_needs_landlock_s_first_abi_only() {
        let local = Profile::new(SeccompProfile::Loopd);
        assert_eq!(local.landlock_abi_needed().0, 1);
        assert!(local.landlock_enough(Enforced::Partially(1)).is_ok());
        assert!(local.landlock_enough(Enforced::Not).is_err());
        // memoryd with a remote Honcho connects over TCP.
        let remote = Profile::new(SeccompProfile::Memoryd { remote: true });
        assert_eq!(remote.landlock_abi_needed().0, 4);
    }
}
