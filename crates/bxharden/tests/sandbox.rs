//! The sandbox, tried for real. Every case runs in a child process (this binary re-run with
//! `BXH_CHILD`), single-threaded from `main`, since the sandbox, credentials, the umask and the
//! environment must change only there, never in a test harness's threads.
//!
//! The proof matrix: for each daemon's profile, each forbidden thing works before the sandbox
//! and fails after it with the expected errno (or the child dies of `SIGSYS` in kill mode); and
//! what the daemon needs still works inside. Cases that need root print `skipped: needs root`.

#[path = "sandbox/cases.rs"]
mod cases;
#[path = "sandbox/child.rs"]
mod child;

fn main() {
    if let Ok(scenario) = std::env::var("BXH_CHILD") {
        std::process::exit(child::run(&scenario));
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    std::process::exit(cases::run_all(&filters));
}
