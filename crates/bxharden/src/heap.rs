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

/// Fix how the heap takes big buffers, once, before the daemon serves, so that memory a frame
/// used goes back to the system once the frame is done: glibc maps every allocation of 128 KiB
/// and more on its own and unmaps it when freed (by default the threshold rises with the first
/// such free, after which frame-sized buffers stay in the heap), and keeps two arenas, not eight
/// per core, so that a thread per connection does not mean a heap per thread.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets glibc's allocator parameters; it takes plain integers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
