//! `inferproxy serve --config FILE` and `inferproxy check --config FILE`.

fn main() -> std::process::ExitCode {
    inferproxy::daemon::main()
}
