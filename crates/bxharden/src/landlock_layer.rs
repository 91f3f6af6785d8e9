//! Landlock: the files and the network a daemon may reach, enforced by the kernel.
//!
//! The handled access is pinned to [`LANDLOCK_ABI`], a tested constant raised on purpose: asking
//! for "everything this kernel knows" would let a newer kernel start refusing what the daemon
//! needs (from ABI 9 Landlock handles connecting to a Unix socket by path, the journal's
//! included). Each rule is built from a path opened here (`O_PATH`); a path that cannot be opened
//! is an error, never skipped. Landlock is per thread: apply it before any thread exists.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, NetPort,
    PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus,
    Scope,
};

/// The Landlock ABI whose access rights are handled: filesystem (with `ioctl` on devices, ABI
/// 5), TCP bind and connect (ABI 4), and the scoping of abstract Unix sockets and signals (ABI 6).
pub const LANDLOCK_ABI: ABI = ABI::V6;

/// The pinned ABI as a number, for the startup notice and the docs.
pub const LANDLOCK_ABI_NUMBER: i32 = 6;

/// Why Landlock could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// A path of the profile could not be opened.
    #[error("Landlock: cannot open {} for its rule: {}", .0.display(), .1)]
    Path(PathBuf, String),
    /// The kernel refused the ruleset.
    #[error("Landlock: {0}")]
    Ruleset(String),
}

/// What the kernel enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforced {
    /// Every handled right of the pinned ABI.
    Fully(i32),
    /// Only what the running kernel's older ABI knows (the number is that ABI).
    Partially(i32),
    /// Nothing: the kernel has no Landlock, or it is disabled.
    Not,
}

impl fmt::Display for Enforced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Enforced::Fully(abi) => write!(f, "ABI {abi}, fully enforced"),
            Enforced::Partially(abi) => write!(
                f,
                "ABI {abi} of {LANDLOCK_ABI_NUMBER}, partially enforced (an older kernel)"
            ),
            Enforced::Not => write!(f, "not enforced (no Landlock in this kernel)"),
        }
    }
}

/// The kernel's Landlock ABI (0: none), asked directly.
pub fn kernel_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) reads nothing and
    // returns the ABI version or -1.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

fn rule(path: &Path, read_write: bool) -> Result<PathBeneath<PathFd>, LandlockError> {
    let fd = PathFd::new(path).map_err(|e| LandlockError::Path(path.to_owned(), e.to_string()))?;
    let st = nix::sys::stat::fstat(fd.as_fd().as_raw_fd())
        .map_err(|e| LandlockError::Path(path.to_owned(), e.to_string()))?;
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let mut access = if read_write {
        AccessFs::from_all(LANDLOCK_ABI)
    } else {
        AccessFs::from_read(LANDLOCK_ABI)
    };
    if !is_dir {
        access &= AccessFs::from_file(LANDLOCK_ABI);
    }
    Ok(PathBeneath::new(fd, access))
}

fn ruleset(
    read_write: &[PathBuf],
    read_only: &[PathBuf],
    connect_tcp: &[u16],
) -> Result<RulesetCreated, LandlockError> {
    let rules_err = |e: landlock::RulesetError| LandlockError::Ruleset(e.to_string());
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(LANDLOCK_ABI))
        .map_err(rules_err)?
        .handle_access(AccessNet::from_all(LANDLOCK_ABI))
        .map_err(rules_err)?
        .scope(Scope::from_all(LANDLOCK_ABI))
        .map_err(rules_err)?
        .create()
        .map_err(rules_err)?;
    for p in read_write {
        ruleset = ruleset.add_rule(rule(p, true)?).map_err(rules_err)?;
    }
    for p in read_only {
        ruleset = ruleset.add_rule(rule(p, false)?).map_err(rules_err)?;
    }
    for port in connect_tcp {
        ruleset = ruleset
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(rules_err)?;
    }
    Ok(ruleset)
}

/// Restrict the calling thread (and every thread and child it makes from now on): read-write
/// beneath `read_write`, read (and execute) beneath `read_only`, TCP connect to `connect_tcp`
/// only, no TCP bind, abstract Unix sockets and signals scoped to the domain. Sets
/// `PR_SET_NO_NEW_PRIVS` too (Landlock needs it without `CAP_SYS_ADMIN`).
pub fn restrict(
    read_write: &[PathBuf],
    read_only: &[PathBuf],
    connect_tcp: &[u16],
) -> Result<Enforced, LandlockError> {
    let status = ruleset(read_write, read_only, connect_tcp)?
        .restrict_self()
        .map_err(|e| LandlockError::Ruleset(e.to_string()))?;
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
        _ => 0,
    };
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully(abi.min(LANDLOCK_ABI_NUMBER)),
        RulesetStatus::PartiallyEnforced => Enforced::Partially(abi),
        RulesetStatus::NotEnforced => Enforced::Not,
    })
}

/// A ruleset built now, to be enforced later by a process that must not allocate (a child
/// between `fork` and `execve`): its descriptor, and what it will enforce on this kernel.
pub fn prepare(
    read_write: &[PathBuf],
    read_only: &[PathBuf],
    connect_tcp: &[u16],
) -> Result<(Option<OwnedFd>, Enforced), LandlockError> {
    let fd: Option<OwnedFd> = ruleset(read_write, read_only, connect_tcp)?.into();
    let kernel = kernel_abi();
    let enforced = match (&fd, kernel) {
        (None, _) | (_, 0) => Enforced::Not,
        (Some(_), k) if k >= LANDLOCK_ABI_NUMBER => Enforced::Fully(LANDLOCK_ABI_NUMBER),
        (Some(_), k) => Enforced::Partially(k),
    };
    Ok((fd, enforced))
}

/// `landlock_restrict_self(fd, 0)`: only the system call, safe between `fork` and `execve`.
/// `PR_SET_NO_NEW_PRIVS` must be set first.
pub fn restrict_with(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: the descriptor is a Landlock ruleset owned by the caller; the flags are 0.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use landlock::BitFlags;

    #[test]
    fn the_pinned_abi_number_is_the_pinned_abi() {
        assert_eq!(LANDLOCK_ABI as i32, LANDLOCK_ABI_NUMBER);
    }

    #[test]
    fn the_pinned_abi_handles_what_the_design_names() {
        let fs: BitFlags<AccessFs> = AccessFs::from_all(LANDLOCK_ABI);
        assert!(
            fs.contains(AccessFs::Refer),
            "ABI 2: renames across directories"
        );
        assert!(fs.contains(AccessFs::Truncate), "ABI 3");
        assert!(fs.contains(AccessFs::IoctlDev), "ABI 5");
        assert_eq!(
            AccessNet::from_all(LANDLOCK_ABI),
            AccessNet::BindTcp | AccessNet::ConnectTcp
        );
        assert_eq!(
            Scope::from_all(LANDLOCK_ABI),
            Scope::AbstractUnixSocket | Scope::Signal
        );
    }
}
