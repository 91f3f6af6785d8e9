//! `gatewayd serve --config FILE` and `gatewayd check --config FILE`.

fn main() -> std::process::ExitCode {
    gatewayd::daemon::main()
}
