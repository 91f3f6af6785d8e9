//! `channeld serve --config FILE` and `channeld check --config FILE`.

fn main() -> std::process::ExitCode {
    channeld::daemon::main()
}
