//! The sandbox of a program a daemon starts (brokerd's `run` tool): prepared in the daemon,
//! entered by the child between `fork` and `execve`.
//!
//! After `fork` in a multi-threaded process the child may only make async-signal-safe calls:
//! no allocation, no user lookup. So everything is built in the parent ([`ChildSandbox::prepare`]:
//! the Landlock ruleset with its rules, the compiled seccomp filters), and the child only makes
//! system calls ([`ChildSandbox::enter`], for `std::process::Command::pre_exec`). Its domain nests
//! in the daemon's: it can only narrow what the daemon may do.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::landlock_layer::{self, Enforced};
use crate::profiles::Arch;
use crate::sandbox::{Profile, SandboxError};
use crate::seccomp::{self, Mismatch, SeccompError};

/// A child's sandbox, ready to enter.
#[derive(Debug)]
pub struct ChildSandbox {
    /// The profile's own paths, which every narrower sandbox made from this one keeps.
    read_write: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    require: bool,
    ruleset: Option<OwnedFd>,
    landlock: Enforced,
    clone3: Vec<libc::sock_filter>,
    /// The calls refused with an errno (every `socket` for the `run` tool's child); may be empty.
    errno: Vec<libc::sock_filter>,
    /// The calls refused besides ([`ChildSandbox::refusing`]); may be empty.
    more: Vec<libc::sock_filter>,
    /// The allow-list with [`seccomp::SELF_PID`] where the child's own pid goes.
    main: Vec<libc::sock_filter>,
    self_places: usize,
    log: bool,
}

/// The longest program the kernel takes (`BPF_MAXINSNS`): the child copies the list onto its
/// stack to put its pid in, since it may not allocate.
const MAX_PROGRAM: usize = 4096;

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
        if filters.main.len() > MAX_PROGRAM {
            return Err(SandboxError::Seccomp(SeccompError::Compile(format!(
                "{} instructions, more than the kernel's {MAX_PROGRAM}",
                filters.main.len()
            ))));
        }
        Ok(ChildSandbox {
            read_write: profile.read_write_paths().to_vec(),
            read_only: profile.read_only_paths().to_vec(),
            require,
            ruleset,
            landlock,
            clone3: seccomp::to_kernel(&filters.clone3),
            errno: filters
                .refused
                .as_ref()
                .map(seccomp::to_kernel)
                .unwrap_or_default(),
            more: Vec::new(),
            main: seccomp::to_kernel(&filters.main),
            self_places: seccomp::self_pid_places(profile.seccomp()),
            log: mismatch == Mismatch::LogEperm,
        })
    }

    /// The same seccomp filters with a Landlock ruleset of its own: the profile's paths plus
    /// `read_write` and `read_only` (opened now; a path that cannot be opened is an error). For a
    /// daemon whose every child may reach different places (the `run` tool: the roots of one
    /// call), prepared per child while the filters are compiled once.
    pub fn with_paths(
        &self,
        read_write: &[PathBuf],
        read_only: &[PathBuf],
    ) -> Result<ChildSandbox, SandboxError> {
        let rw: Vec<PathBuf> = self.read_write.iter().chain(read_write).cloned().collect();
        let ro: Vec<PathBuf> = self.read_only.iter().chain(read_only).cloned().collect();
        let (ruleset, landlock) = landlock_layer::prepare(&rw, &ro, &[])
            .map_err(|e| SandboxError::Landlock(e.to_string()))?;
        if self.require && landlock == Enforced::Not {
            return Err(SandboxError::Landlock(
                "Landlock is not enforced: this kernel has none, or it is disabled".to_owned(),
            ));
        }
        Ok(ChildSandbox {
            read_write: rw,
            read_only: ro,
            require: self.require,
            ruleset,
            landlock,
            clone3: self.clone3.clone(),
            errno: self.errno.clone(),
            more: self.more.clone(),
            main: self.main.clone(),
            self_places: self.self_places,
            log: self.log,
        })
    }

    /// The same sandbox refusing `calls` besides, each with `EACCES`: for a child that must not
    /// make what the profile allows ordinary programs (a declared tool's server changes no
    /// file's mode or owner: [`seccomp::mode_changes`]).
    pub fn refusing(mut self, calls: &[&str]) -> Result<ChildSandbox, SandboxError> {
        let arch = Arch::current().ok_or(SandboxError::Seccomp(SeccompError::Arch))?;
        let program = seccomp::refusal(calls, arch).map_err(SandboxError::Seccomp)?;
        self.more = seccomp::to_kernel(&program);
        Ok(self)
    }

    /// What Landlock will enforce in the child.
    pub fn landlock(&self) -> Enforced {
        self.landlock
    }

    /// Enter the sandbox: `PR_SET_NO_NEW_PRIVS`, the Landlock ruleset, the `clone3` filter, the
    /// errno filters (if any), the allow-list bound to the child's own pid. System calls only (no allocation): call it in
    /// the child after `fork`, e.g. from `pre_exec`. An error leaves the child to exit; it must
    /// not `execve`.
    pub fn enter(&self) -> std::io::Result<()> {
        let n = self.main.len();
        let mut main = [libc::sock_filter {
            code: 0,
            jt: 0,
            jf: 0,
            k: 0,
        }; MAX_PROGRAM];
        main[..n].copy_from_slice(&self.main);
        // SAFETY: getpid has no arguments and cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        if seccomp::bind_self(&mut main[..n], pid) != self.self_places {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some(fd) = &self.ruleset {
            landlock_layer::restrict_with(fd)?;
        }
        seccomp::install_here(&self.clone3, self.log)?;
        if !self.errno.is_empty() {
            seccomp::install_here(&self.errno, self.log)?;
        }
        if !self.more.is_empty() {
            seccomp::install_here(&self.more, self.log)?;
        }
        seccomp::install_here(&main[..n], self.log)
    }
}
