//! Every daemon's command line, `bxharden::daemon::Cli`: `serve` and `check` with `--config`,
//! the daemon's own commands beside them, its name, version and words in `--help`.

use std::path::PathBuf;

use bxharden::Daemon;
use bxharden::daemon::{Cli, Command, NoMore, Spec, Usage};
use clap::error::ErrorKind;

const SPEC: Spec = Spec {
    daemon: Daemon {
        name: "exampled",
        version: "1.2.3",
    },
    config_anchor: "exampled-config-refused",
};

const USAGE: Usage = Usage {
    about: "An example daemon",
    serve: "Serve example.sock",
    check: "Check example.toml",
};

#[derive(Debug, PartialEq, Eq, clap::Subcommand)]
enum More {
    /// Ask the example socket who answers
    Selftest {
        #[arg(long)]
        config: PathBuf,
    },
}

fn parse<E: clap::Subcommand>(args: &[&str]) -> Result<Command<E>, clap::Error> {
    Cli::<E>::try_parse_from(
        SPEC,
        &USAGE,
        std::iter::once("exampled").chain(args.iter().copied()),
    )
}

#[test]
fn serve_and_check_each_take_the_configuration_file() {
    assert_eq!(
        parse::<NoMore>(&["serve", "--config", "/etc/x.toml"]).unwrap(),
        Command::Serve {
            config: PathBuf::from("/etc/x.toml")
        }
    );
    assert_eq!(
        parse::<NoMore>(&["check", "--config", "x.toml"]).unwrap(),
        Command::Check {
            config: PathBuf::from("x.toml")
        }
    );
}

#[test]
fn a_daemons_own_command_stands_beside_serve_and_check() {
    assert_eq!(
        parse::<More>(&["selftest", "--config", "x.toml"]).unwrap(),
        Command::More(More::Selftest {
            config: PathBuf::from("x.toml")
        })
    );
    let e = parse::<NoMore>(&["selftest", "--config", "x.toml"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSubcommand);
}

#[test]
fn a_command_without_its_configuration_is_a_usage_error_with_status_2() {
    let e = parse::<NoMore>(&["serve"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    assert_eq!(e.exit_code(), 2);
    let text = e.render().to_string();
    assert!(
        text.contains("Usage: exampled serve --config <CONFIG>"),
        "{text}"
    );
    let e = parse::<NoMore>(&[]).unwrap_err();
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn the_help_names_the_daemon_and_says_what_each_command_does_in_order() {
    let e = parse::<More>(&["--help"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DisplayHelp);
    assert_eq!(e.exit_code(), 0);
    let text = e.render().to_string();
    assert!(text.starts_with("An example daemon\n"), "{text}");
    assert!(text.contains("Usage: exampled <COMMAND>"), "{text}");
    let serve = text.find("  serve     Serve example.sock").expect(&text);
    let check = text.find("  check     Check example.toml").expect(&text);
    let own = text
        .find("  selftest  Ask the example socket who answers")
        .expect(&text);
    assert!(serve < check && check < own, "{text}");

    let e = parse::<NoMore>(&["serve", "--help"]).unwrap_err();
    let text = e.render().to_string();
    assert!(text.starts_with("Serve example.sock\n"), "{text}");
}

#[test]
fn the_version_is_the_daemons_name_and_version() {
    let e = parse::<NoMore>(&["-V"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DisplayVersion);
    assert_eq!(e.render().to_string(), "exampled 1.2.3\n");
}
