//! Every daemon's command line, `bxharden::daemon::Cli`: `serve` and `check` with `--config`,
//! the daemon's own commands beside them, its name, version and words in `--help`, and a usage
//! error (status 2) for anything else.

use std::path::PathBuf;

use bxharden::Daemon;
use bxharden::daemon::{Args, Body, Cli, CliEnd, Cmd, Command, More, NoMore, Spec, Usage};

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

/// A daemon's own commands: one beside `serve` and `check`, and one group of two, as brokerd's
/// `audit verify` and `audit accept`.
#[derive(Debug, PartialEq, Eq)]
enum Own {
    Selftest { config: PathBuf },
    Show { config: PathBuf },
    Mark { config: PathBuf, at: u64 },
}

impl More for Own {
    const COMMANDS: &'static [Cmd] = &[
        Cmd {
            name: "selftest",
            about: "Ask the example socket who answers",
            body: Body::Options(&["config"]),
        },
        Cmd {
            name: "ledger",
            about: "The ledger",
            body: Body::Commands(&[
                Cmd {
                    name: "show",
                    about: "Show the ledger",
                    body: Body::Options(&["config"]),
                },
                Cmd {
                    name: "mark",
                    about: "Mark the record at AT",
                    body: Body::Options(&["config", "at"]),
                },
            ]),
        },
    ];

    fn from_args(args: &Args) -> Result<Self, String> {
        match args.path() {
            ["selftest"] => Ok(Own::Selftest {
                config: args.path_of("config"),
            }),
            ["ledger", "show"] => Ok(Own::Show {
                config: args.path_of("config"),
            }),
            ["ledger", "mark"] => Ok(Own::Mark {
                config: args.path_of("config"),
                at: args.parse("at")?,
            }),
            other => Err(format!("no command {}", other.join(" "))),
        }
    }
}

fn parse<E: More>(args: &[&str]) -> Result<Command<E>, CliEnd> {
    Cli::<E>::try_parse_from(
        SPEC.daemon,
        &USAGE,
        std::iter::once("exampled").chain(args.iter().copied()),
    )
}

/// The text of a usage error, which must be one (status 2).
fn usage_error<E: More + std::fmt::Debug>(args: &[&str]) -> String {
    match parse::<E>(args) {
        Err(CliEnd::Usage(text)) => {
            assert!(text.starts_with("error: "), "{text}");
            assert!(
                text.ends_with("\n\nFor more information, try '--help'.\n"),
                "{text}"
            );
            assert_eq!(CliEnd::Usage(text.clone()).exit_code(), 2);
            text
        }
        other => panic!("{args:?} read as {other:?}, not a usage error"),
    }
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
        parse::<NoMore>(&["check", "--config=x.toml"]).unwrap(),
        Command::Check {
            config: PathBuf::from("x.toml")
        }
    );
}

#[test]
fn a_daemons_own_commands_stand_beside_serve_and_check() {
    assert_eq!(
        parse::<Own>(&["selftest", "--config", "x.toml"]).unwrap(),
        Command::More(Own::Selftest {
            config: PathBuf::from("x.toml")
        })
    );
    assert_eq!(
        parse::<Own>(&["ledger", "show", "--config", "x.toml"]).unwrap(),
        Command::More(Own::Show {
            config: PathBuf::from("x.toml")
        })
    );
    assert_eq!(
        parse::<Own>(&["ledger", "mark", "--at", "7", "--config", "x.toml"]).unwrap(),
        Command::More(Own::Mark {
            config: PathBuf::from("x.toml"),
            at: 7
        })
    );
    let text = usage_error::<NoMore>(&["selftest", "--config", "x.toml"]);
    assert!(
        text.starts_with(
            "error: unrecognized subcommand 'selftest'\n\nUsage: exampled <COMMAND>\n"
        ),
        "{text}"
    );
}

#[test]
fn a_command_without_its_configuration_is_a_usage_error_with_status_2() {
    let text = usage_error::<NoMore>(&["serve"]);
    assert!(
        text.starts_with(
            "error: the following required arguments were not provided:\n  --config <CONFIG>\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("Usage: exampled serve --config <CONFIG>"),
        "{text}"
    );
    let text = usage_error::<Own>(&["ledger", "mark", "--config", "x.toml"]);
    assert!(text.contains("\n  --at <AT>\n"), "{text}");
    assert!(
        text.contains("Usage: exampled ledger mark --config <CONFIG> --at <AT>"),
        "{text}"
    );
    let text = usage_error::<NoMore>(&["serve", "--config"]);
    assert!(
        text.starts_with(
            "error: a value is required for '--config <CONFIG>' but none was supplied"
        ),
        "{text}"
    );
}

#[test]
fn no_command_is_a_usage_error_with_status_2() {
    let text = usage_error::<NoMore>(&[]);
    assert!(
        text.starts_with("error: a command is required\n\nUsage: exampled <COMMAND>\n"),
        "{text}"
    );
    let text = usage_error::<Own>(&["ledger"]);
    assert!(text.contains("Usage: exampled ledger <COMMAND>"), "{text}");
}

#[test]
fn an_unknown_option_a_repeated_one_or_a_stray_value_is_a_usage_error() {
    let text = usage_error::<NoMore>(&["serve", "--config", "x", "--verbose"]);
    assert!(
        text.starts_with("error: unexpected argument '--verbose' found\n"),
        "{text}"
    );
    let text = usage_error::<NoMore>(&["serve", "--config", "x", "--config", "y"]);
    assert!(
        text.starts_with("error: the argument '--config <CONFIG>' cannot be used multiple times\n"),
        "{text}"
    );
    let text = usage_error::<NoMore>(&["serve", "--config", "x", "extra"]);
    assert!(
        text.starts_with("error: unexpected argument 'extra' found\n"),
        "{text}"
    );
    let text = usage_error::<NoMore>(&["-x"]);
    assert!(
        text.starts_with("error: unexpected argument '-x' found\n"),
        "{text}"
    );
    // `--version` belongs to the daemon, not to a command.
    let text = usage_error::<NoMore>(&["serve", "-V"]);
    assert!(
        text.starts_with("error: unexpected argument '-V' found\n"),
        "{text}"
    );
}

#[test]
fn a_value_that_does_not_read_is_a_usage_error_naming_the_option() {
    let text = usage_error::<Own>(&["ledger", "mark", "--config", "x", "--at", "seven"]);
    assert!(
        text.starts_with(
            "error: invalid value 'seven' for '--at <AT>': invalid digit found in string\n"
        ),
        "{text}"
    );
}

#[test]
fn the_help_names_the_daemon_and_says_what_each_command_does_in_order() {
    let Err(end @ CliEnd::Help(_)) = parse::<Own>(&["--help"]) else {
        panic!("--help is not help");
    };
    assert_eq!(end.exit_code(), 0);
    let text = end.text();
    assert!(text.starts_with("An example daemon\n"), "{text}");
    assert!(text.contains("Usage: exampled <COMMAND>"), "{text}");
    let serve = text.find("  serve     Serve example.sock\n").expect(text);
    let check = text.find("  check     Check example.toml\n").expect(text);
    let own = text
        .find("  selftest  Ask the example socket who answers\n")
        .expect(text);
    let group = text.find("  ledger    The ledger\n").expect(text);
    assert!(serve < check && check < own && own < group, "{text}");
    assert!(text.contains("  -V, --version  Print version\n"), "{text}");
    assert!(!text.lines().any(|l| l.ends_with(' ')), "{text:?}");

    let Err(CliEnd::Help(text)) = parse::<NoMore>(&["serve", "--help"]) else {
        panic!("serve --help is not help");
    };
    assert!(text.starts_with("Serve example.sock\n"), "{text}");
    assert!(
        text.contains("Usage: exampled serve --config <CONFIG>\n"),
        "{text}"
    );
    assert!(text.contains("  --config <CONFIG>\n"), "{text}");

    let Err(CliEnd::Help(text)) = parse::<Own>(&["ledger", "-h"]) else {
        panic!("ledger -h is not help");
    };
    assert!(text.starts_with("The ledger\n"), "{text}");
    assert!(text.contains("  show  Show the ledger\n"), "{text}");
    assert!(text.contains("  mark  Mark the record at AT\n"), "{text}");
}

#[test]
fn the_version_is_the_daemons_name_and_version() {
    for flag in ["-V", "--version"] {
        let end = parse::<NoMore>(&[flag]).unwrap_err();
        assert_eq!(end, CliEnd::Version("exampled 1.2.3\n".into()));
        assert_eq!(end.exit_code(), 0);
    }
}
