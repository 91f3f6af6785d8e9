//! Giving freed heap back to the system. glibc keeps memory a process freed in its heap, to
//! hand out again; a daemon that is idle most of its life should not keep what its start-up
//! (the configuration, the seccomp filters' compilation, a CA bundle read to check it) or a
//! large request took, so the skeleton trims once when the daemon is ready, and a daemon whose
//! requests can be large (gatewayd) trims after each one (docs/performance.md).

/// Return the free pages of the heap to the system (`malloc_trim(0)`: `madvise` and `brk`,
/// both in every daemon's seccomp list). Nothing on a C library other than glibc.
pub fn give_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own heap, under its own locks.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(target_env = "gnu")]
unsafe extern "C" {
    fn malloc_trim(pad: usize) -> i32;
}
