//! The sandbox of a program a daemon starts (brokerd's `run` tool): prepared in the daemon,
//! entered by the child between `fork` and `execve`.
//!
//! After `fork` in a multi-threaded process the child may only make async-signal-safe calls:
//! no allocation, no user lookup. So everything is built in the parent ([`ChildSandbox::prepare`]:
//! the Landlock ruleset with its rules, the compiled seccomp filters), and the child only makes
//! system calls ([`ChildSandbox::enter`], for `std::process::Command::pre_exec`). Its domain nests
//! in the daemon's: it can only narrow what the daemon may do.

use std::os::fd::OwnedFd;

use seccompiler::BpfProgram;

use crate::landlock_layer::{self, Enforced};
use crate::profiles::Arch;
use crate::sandbox::{Profile, SandboxError};
use crate::seccomp::{self, Mismatch, SeccompError};

/// A child's sandbox, ready to enter.
#[derive(Debug)]
pub struct ChildSandbox {
    ruleset: Option<OwnedFd>,
    landlock: Enforced,
    clone3: BpfProgram,
    main: BpfProgram,
    log: bool,
}

impl ChildSandbox {
    /// Build the child's Landlock ruleset from `profile`'s paths (opened now) and compile its
    /// seccomp list. With `require`, a kernel without Landlock is an error here, before any
    /// child exists.
    pub fn prepare(
        profile: &Profile,
        mismatch: Mismatch,
        require: bool,
    ) -> Result<ChildSandbox, SandboxError> {
        let (ruleset, landlock) = landlock_layer::prepare(
            profile.read_write_paths(),
            profile.read_only_paths(),
            profile.connect_ports(),
        )
        .map_err(|e| SandboxError::Landlock(e.to_string()))?;
        if require && landlock == Enforced::Not {
            return Err(SandboxError::Landlock(
                "Landlock is not enforced: this kernel has none, or it is disabled".to_owned(),
            ));
        }
        let arch = Arch::current().ok_or(SandboxError::Seccomp(SeccompError::Arch))?;
        let filters =
            seccomp::compile(profile.seccomp(), arch, mismatch).map_err(SandboxError::Seccomp)?;
        Ok(ChildSandbox {
            ruleset,
            landlock,
            clone3: filters.clone3,
            main: filters.main,
            log: mismatch == Mismatch::LogEperm,
        })
    }

    /// What Landlock will enforce in the child.
    pub fn landlock(&self) -> Enforced {
        self.landlock
    }

    /// Enter the sandbox: `PR_SET_NO_NEW_PRIVS`, the Landlock ruleset, the `clone3` filter, the
    /// allow-list. System calls only (no allocation): call it in the child after `fork`, e.g.
    /// from `pre_exec`. An error leaves the child to exit; it must not `execve`.
    pub fn enter(&self) -> std::io::Result<()> {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some(fd) = &self.ruleset {
            landlock_layer::restrict_with(fd)?;
        }
        seccomp::install_here(&self.clone3, self.log)?;
        seccomp::install_here(&self.main, self.log)
    }
}
