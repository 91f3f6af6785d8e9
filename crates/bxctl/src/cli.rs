//! The command line: each subcommand parsed here and run by its module.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::chat::{self, ChatOptions};
use crate::dev::{self, ModelChoice, Provider, UpOptions};
use crate::target::Target;
use crate::{demo, selftest, status};

#[derive(Debug, Parser)]
#[command(name = "bxctl", version, about = "The owner's command for the box")]
pub struct Cli {
    /// The box's home (default: $BOXMAKER_HOME, else /var/lib/boxmaker).
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Print JSON for scripts instead of lines for a person.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send a message to a session and show the turn as it happens.
    Chat(ChatArgs),
    /// Which sockets answer, each daemon's sandbox, the audit chain, pending approvals.
    Status,
    /// Ping every socket you may reach, then loopd's own selftest.
    Selftest,
    /// Run the dev box through one scripted conversation that shows what the broker does.
    Demo,
    /// The local dev box: the whole box on this machine.
    #[command(subcommand)]
    Dev(DevCommand),
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The session (default: `main`, resumed when it exists).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Start a new session.
    #[arg(long)]
    pub new: bool,
    /// The message; without it, a prompt on a terminal, else all of standard input.
    pub text: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Write default configs into a fresh home (or reuse one made before), start every daemon
    /// detached, and wait until each answers.
    Up(UpArgs),
    /// Stop the dev box's daemons (SIGTERM, then SIGKILL after a deadline).
    Down,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// As root: the unprivileged user the daemons run as (created when missing; default bx-dev).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// The model provider.
    #[arg(long, value_enum, default_value_t = Provider::Script)]
    pub provider: Provider,
    /// For the script provider: the script to use instead of the shipped default.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// For openai and anthropic: the endpoint (OpenAI-compatible URLs end in /v1).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// For openai and anthropic: the model of the main slot.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// For openai and anthropic: the file that holds the API key.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
}

/// The dev box's home when `--home` is not given: `$BOXMAKER_HOME`, else
/// `$XDG_STATE_HOME/boxmaker-dev`, else `~/.local/state/boxmaker-dev`.
fn dev_home(home: Option<PathBuf>) -> PathBuf {
    home.or_else(|| std::env::var_os(crate::target::HOME_ENV).map(PathBuf::from))
        .or_else(|| {
            std::env::var_os("XDG_STATE_HOME").map(|d| PathBuf::from(d).join("boxmaker-dev"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".local/state/boxmaker-dev"))
        })
        .unwrap_or_else(|| PathBuf::from("boxmaker-dev"))
}

fn failed(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("{e}");
    ExitCode::from(1)
}

fn usage(why: &str) -> ExitCode {
    eprintln!("bxctl: {why}");
    ExitCode::from(2)
}

/// Run one parsed command.
pub fn run(cli: Cli) -> ExitCode {
    let mut out = io::stdout();
    match cli.command {
        Command::Chat(args) => {
            let target = Target::resolve(cli.home.as_deref());
            let opts = ChatOptions {
                session: args.session,
                new: args.new,
                text: args.text,
                json: cli.json,
            };
            match chat::run(&target.socket(&bxcore::layout::LOOP), &opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(e),
            }
        }
        Command::Status => {
            let target = Target::resolve(cli.home.as_deref());
            let s = status::gather(&target);
            if cli.json {
                let _ = writeln!(out, "{}", serde_json::to_string(&s).unwrap_or_default());
            } else {
                let _ = write!(out, "{}", status::render(&s));
            }
            ExitCode::SUCCESS
        }
        Command::Selftest => {
            let target = Target::resolve(cli.home.as_deref());
            match selftest::run(&target, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(e),
            }
        }
        Command::Demo => match demo::run(&mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed(e),
        },
        Command::Dev(DevCommand::Up(args)) => {
            if args.provider != Provider::Script {
                if args.model.is_none() || args.api_key_file.is_none() {
                    return usage(&format!(
                        "--provider {} needs --model NAME and --api-key-file FILE",
                        args.provider
                    ));
                }
                if args.script.is_some() {
                    return usage("--script goes with --provider script");
                }
            }
            let base_url = args.base_url.or_else(|| match args.provider {
                Provider::Openai => Some("https://api.openai.com/v1".into()),
                Provider::Anthropic => Some("https://api.anthropic.com".into()),
                Provider::Script => None,
            });
            let opts = UpOptions {
                home: dev_home(cli.home),
                user: args.user,
                model: ModelChoice {
                    provider: args.provider,
                    base_url,
                    model: args.model,
                    api_key_file: args.api_key_file,
                    script: args.script,
                },
            };
            match dev::up(&opts, &mut out) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => failed(e),
            }
        }
        Command::Dev(DevCommand::Down) => match dev::down(&dev_home(cli.home), &mut out) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => failed(e),
        },
    }
}
