//! `memoryd serve --config FILE` and `memoryd check --config FILE`.

fn main() -> std::process::ExitCode {
    memoryd::daemon::main()
}
