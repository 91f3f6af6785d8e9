//! How many threads the process has. Capabilities, credentials and Landlock are per thread, and
//! the environment is not thread-safe to change: the steps that rely on being alone check here.

use std::io;

/// The number of threads of this process, from `/proc/self/task`.
pub fn count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Whether the caller is the process's first thread (its tid is the pid).
pub fn is_first() -> bool {
    nix::unistd::gettid() == nix::unistd::getpid()
}

/// `Ok(())` when the caller is the first thread and no other thread exists; else why not.
pub fn alone() -> Result<(), String> {
    if !is_first() {
        return Err("it is called from a thread other than the first".to_owned());
    }
    match count() {
        Ok(1) => Ok(()),
        Ok(n) => Err(format!(
            "{n} threads exist already (they would keep their privileges and escape Landlock)"
        )),
        Err(e) => Err(format!("cannot count the threads in /proc/self/task: {e}")),
    }
}
