//! The command line: `--home` for every subcommand; `--json`, `--admin` and `--timeout` only on
//! the subcommands that use them, so every flag a subcommand lists does what it says. Each
//! subcommand is run by its module.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::channel::ChannelContext;
use crate::chat::{self, ChatOptions};
use crate::context::Context;
#[cfg(feature = "devbox")]
use crate::demo;
#[cfg(feature = "devbox")]
use crate::dev::{self, ModelFlags, Provider, UpOptions};
use crate::memory::MemoryContext;
use crate::target::Target;
use crate::{Outcome, approvals, audit, channel, check, logs, memory, selftest, status};

#[derive(Debug, Parser)]
#[command(name = "bxctl", version, about = "The owner's command for the box")]
pub struct Cli {
    /// The box's home [default: $BOXMAKER_HOME, else /var/lib/boxmaker; for `dev`: else
    /// ~/.local/state/boxmaker-dev].
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// `--json`, on the subcommands that print JSON.
#[derive(Debug, Clone, Copy, Args)]
pub struct Json {
    /// Machine-readable output: one JSON document (or one per line for streams).
    #[arg(long)]
    pub json: bool,
}

impl Json {
    /// `--json` given before a subcommand's own name or after it.
    pub fn either(a: Json, b: Json) -> Json {
        Json {
            json: a.json || b.json,
        }
    }
}

/// How to reach brokerd's admin socket, on the subcommands that talk to it.
#[derive(Debug, Clone, Args)]
pub struct Broker {
    /// brokerd's admin socket [default: <run>/owner-broker/admin.sock, <run> being /run/boxmaker on the device, else <home>/run].
    #[arg(long, value_name = "PATH")]
    pub admin: Option<PathBuf>,
    /// How long to wait for an answer from brokerd, in seconds.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send a message to a session and show the turn as it happens.
    Chat(ChatArgs),
    /// Show the tool calls waiting for your approval (or, with --leases, the leases you gave).
    Approvals {
        /// Keep watching, printing the list again whenever it changes.
        #[arg(long)]
        watch: bool,
        /// The leases ("allow for this session") you gave that still live; `bxctl approvals
        /// revoke LEASE` ends one.
        #[arg(long, conflicts_with = "watch")]
        leases: bool,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        broker: Broker,
        #[command(subcommand)]
        command: Option<ApprovalsCommand>,
    },
    /// Approve a pending call: it runs, exactly as shown.
    Approve {
        /// The approval's id (16 hex digits, from `bxctl approvals`).
        id: String,
        /// Also allow the calls like it for the rest of the session (what the approval's
        /// `lease` line says), until the lease expires or you revoke it.
        #[arg(long)]
        lease: bool,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        broker: Broker,
    },
    /// Deny a pending call: it is answered "the owner denied it".
    Deny {
        /// The approval's id.
        id: String,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        broker: Broker,
    },
    /// The audit chain.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// What memoryd filed: main memory, quarantine, the local store; search it, forget a session.
    Memory {
        #[command(subcommand)]
        command: MemoryCommand,
    },
    /// The Matrix channel: pair the owner's Matrix account, or show how the channel is.
    Channel {
        #[command(subcommand)]
        command: ChannelCommand,
    },
    /// Which sockets answer, each daemon's sandbox, the model, the audit chain, pending
    /// approvals; exit 1 unless every socket answers, every daemon is confined and the chain
    /// verifies.
    Status {
        #[command(flatten)]
        json: Json,
    },
    /// Every socket answers, every daemon is confined, the model answers one minimal request
    /// (not on the device), the audit chain verifies, loopd's own selftest passes; exit 1
    /// unless all of them did.
    Selftest {
        /// How long the model has to answer, in seconds.
        #[arg(long, default_value_t = 120, value_name = "SECONDS")]
        model_timeout: u64,
        #[command(flatten)]
        json: Json,
    },
    /// The daemons' log lines: the dev box's log files (each line with its time), or the
    /// journal on the device.
    Logs {
        /// One daemon (loopd, brokerd, inferproxy) [default: all of them].
        daemon: Option<String>,
        /// How many of the last lines to show.
        #[arg(short = 'n', default_value_t = 50)]
        lines: usize,
        /// Keep showing new lines as they come (until Ctrl-C).
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Print the shell completions for SHELL, generated from this command line (the package
    /// installs them).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page bxctl(1) in roff, generated from this command line (the package
    /// installs it).
    Man,
    /// The device check, after each `nixos-rebuild switch`: units, sandboxes, modes, peers,
    /// answers, the audit chain and each unit's exposure; exit 1 on any failure. As the owner it
    /// runs as root in the owner's check unit and prints its report here.
    Check {
        /// What the module installed [default: /etc/boxmaker/device.json].
        #[arg(long, value_name = "PATH")]
        manifest: Option<PathBuf>,
        #[command(flatten)]
        json: Json,
    },
    /// Run the dev box through one scripted conversation that shows what the broker does.
    #[cfg(feature = "devbox")]
    Demo,
    /// The local dev box: the whole box on this machine.
    #[cfg(feature = "devbox")]
    #[command(subcommand)]
    Dev(DevCommand),
}

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// One pending approval with every argument whole.
    Show {
        /// The approval's id.
        id: String,
        #[command(flatten)]
        json: Json,
    },
    /// End a lease you gave (its id from `bxctl approvals --leases`).
    Revoke {
        /// The lease's id.
        lease: String,
        #[command(flatten)]
        json: Json,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Ask brokerd to verify the whole chain: records, head hash; exit 1 on a break.
    Verify {
        /// Also check that the chain holds this head, kept from the journal's `audit chain head
        /// SEQ:HASH` line: a chain cut short or re-hashed after an edit fails here.
        #[arg(long, value_name = "SEQ:HASH")]
        head: Option<String>,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        broker: Broker,
    },
    /// Print the last records of the chain.
    Tail {
        /// How many records.
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        /// The chain file [default: <home>/broker/audit/chain.jsonl].
        #[arg(long, value_name = "PATH")]
        chain: Option<PathBuf>,
        /// Keep showing new records as they are appended (until Ctrl-C).
        #[arg(short = 'f', long)]
        follow: bool,
        #[command(flatten)]
        json: Json,
    },
}

/// How to reach memoryd's owner socket.
#[derive(Debug, Clone, Args)]
pub struct MemorySocket {
    /// memoryd's owner socket [default: <run>/owner-memory/memories.sock].
    #[arg(long, value_name = "PATH")]
    pub memories: Option<PathBuf>,
    /// How long to wait for an answer from memoryd, in seconds.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,
}

/// A route, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RouteArg {
    Main,
    Quarantine,
    Local,
}

impl From<RouteArg> for bxcore::MemoryRoute {
    fn from(r: RouteArg) -> Self {
        match r {
            RouteArg::Main => bxcore::MemoryRoute::Main,
            RouteArg::Quarantine => bxcore::MemoryRoute::Quarantine,
            RouteArg::Local => bxcore::MemoryRoute::Local,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ChannelCommand {
    /// Print a one-time code to send from your Matrix account in ROOM: that account becomes
    /// the channel's owner.
    Pair {
        /// The room id (!id:server), one of channeld's [matrix] rooms.
        #[arg(long, value_name = "ROOM")]
        room: String,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        socket: ChannelSocket,
    },
    /// How the channel is: its homeserver, whether it syncs, the paired owners, the rooms.
    Status {
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        socket: ChannelSocket,
    },
}

/// Where channeld's owner socket is.
#[derive(Debug, Args)]
pub struct ChannelSocket {
    /// channeld's owner socket [default: <run>/owner-channel/channel.sock].
    #[arg(long, value_name = "PATH")]
    pub channel: Option<PathBuf>,
    /// How long channeld has to answer, in seconds.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// The latest filed turns, newest first.
    Recent {
        /// Only this route [default: every route].
        #[arg(long, value_enum)]
        route: Option<RouteArg>,
        /// How many turns (1 to 1000).
        #[arg(short = 'n', default_value_t = 20)]
        n: u32,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        socket: MemorySocket,
    },
    /// The filed turns that best match QUERY, over every route.
    Search {
        query: String,
        /// How many turns (1 to 1000).
        #[arg(short = 'n', default_value_t = 20)]
        n: u32,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        socket: MemorySocket,
    },
    /// Delete every filed turn of one session (with a remote store: hidden now, deleted later).
    Forget {
        /// The session.
        #[arg(long, value_name = "ID")]
        session: String,
        #[command(flatten)]
        json: Json,
        #[command(flatten)]
        socket: MemorySocket,
    },
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The session [default: `main`, resumed when it exists].
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Start a new session.
    #[arg(long)]
    pub new: bool,
    /// Cancel the turn when the model sends nothing for this many seconds (not counting the
    /// wait for an approval) [default: wait for loopd's own deadline].
    #[arg(long, value_name = "SECONDS")]
    pub model_timeout: Option<u64>,
    /// The message; without it, a prompt on a terminal, else all of standard input.
    pub text: Option<String>,
    #[command(flatten)]
    pub json: Json,
    /// Where approvals asked in an interactive chat are answered.
    #[command(flatten)]
    pub broker: Broker,
}

#[cfg(feature = "devbox")]
#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Write default configs into a fresh home (or reuse one made before), start every daemon
    /// detached, and wait until each answers.
    Up(UpArgs),
    /// Stop the dev box's daemons (SIGTERM, then SIGKILL after a deadline).
    Down,
    /// Stop the dev box, then start it again as it was made.
    Restart,
}

#[cfg(feature = "devbox")]
#[derive(Debug, Args)]
pub struct UpArgs {
    /// The model provider [default: script for a new home; a reused home keeps its own].
    #[arg(long, value_enum)]
    pub provider: Option<Provider>,
    /// For the script provider: the script to use instead of the shipped default.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// For openai and anthropic: the endpoint (OpenAI-compatible URLs end in /v1).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// For openai and anthropic: the model of the main slot.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// For openai and anthropic: the file that holds the API key (mode 0600); stored as an
    /// absolute path. Leave it out for an OpenAI-compatible server that takes no key (a local
    /// llama.cpp or vLLM).
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// File main memory and quarantine into the Honcho server at this base (http://host:port;
    /// memoryd adds /v3) [default: the embedded store for a new home; a reused home keeps its own].
    #[arg(long, value_name = "URL")]
    pub honcho_url: Option<String>,
    /// With --honcho-url: the file that holds Honcho's bearer token (mode 0600); copied into
    /// memoryd's own directory, readable by memoryd alone.
    #[arg(long, value_name = "FILE")]
    pub honcho_key_file: Option<PathBuf>,
    /// A host web_fetch may fetch from (`example.org`, or `*.example.org` for every name below
    /// it), on gatewayd's allow-list; give it once per host [default: none, and web_fetch is
    /// not offered until etc/gatewayd.toml names a host].
    #[arg(long = "web-host", value_name = "HOST")]
    pub web_hosts: Vec<String>,
    /// Add the Matrix channel (channeld): this TOML file holds its [matrix] table (homeserver,
    /// user, token_file, owners, rooms) and may hold [limits]; the rest is filled in
    /// (docs/channels.md). Only for a new home.
    #[arg(long, value_name = "FILE")]
    pub matrix: Option<PathBuf>,
}

impl Cli {
    /// The context of a subcommand with these `--json` and broker options.
    pub fn context(&self, json: Json, broker: Option<&Broker>) -> Context {
        let target = Target::resolve(self.home.as_deref());
        let admin = broker
            .and_then(|b| b.admin.clone())
            .unwrap_or_else(|| target.socket(&bxcore::layout::ADMIN));
        Context {
            home: target.home().to_path_buf(),
            admin,
            json: json.json,
            timeout: Duration::from_secs(broker.map_or(10, |b| b.timeout).max(1)),
        }
    }
}

impl Cli {
    /// The context of a memory subcommand.
    pub fn channel_context(&self, json: Json, socket: &ChannelSocket) -> ChannelContext {
        let target = Target::resolve(self.home.as_deref());
        ChannelContext {
            socket: socket
                .channel
                .clone()
                .unwrap_or_else(|| target.socket(&bxcore::layout::CHANNEL)),
            json: json.json,
            timeout: Duration::from_secs(socket.timeout.max(1)),
        }
    }

    pub fn memory_context(&self, json: Json, socket: &MemorySocket) -> MemoryContext {
        let target = Target::resolve(self.home.as_deref());
        MemoryContext {
            socket: socket
                .memories
                .clone()
                .unwrap_or_else(|| target.socket(&bxcore::layout::MEMORIES)),
            json: json.json,
            timeout: Duration::from_secs(socket.timeout.max(1)),
        }
    }
}

fn exit(outcome: Outcome) -> ExitCode {
    match outcome {
        Outcome::Done => ExitCode::SUCCESS,
        Outcome::Failed => ExitCode::FAILURE,
    }
}

/// An error's text may quote what loopd, a daemon or the model said: escaped like everything
/// else shown to a person (its own line breaks kept).
fn failed(e: impl std::fmt::Display) -> ExitCode {
    let text = e.to_string();
    eprintln!(
        "{}",
        bxcore::visible::Shown(&text, bxcore::visible::Mode::Text)
    );
    ExitCode::FAILURE
}

fn usage(why: &str) -> ExitCode {
    eprintln!("bxctl: {why}");
    ExitCode::from(2)
}

/// Run one parsed command.
pub fn run(cli: Cli) -> ExitCode {
    let target = Target::resolve(cli.home.as_deref());
    if let Some(home) = &cli.home {
        crate::output::set_hint_home(home);
    }
    let mut out = io::stdout();
    match &cli.command {
        Command::Chat(args) => {
            let ctx = cli.context(args.json, Some(&args.broker));
            let opts = ChatOptions {
                session: args.session.clone(),
                new: args.new,
                text: args.text.clone(),
                json: args.json.json,
                model_timeout: args.model_timeout.map(Duration::from_secs),
                home: ctx.home.clone(),
                admin: ctx.admin.clone(),
                broker_timeout: ctx.timeout,
            };
            match chat::run(&target.socket(&bxcore::layout::LOOP), &opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bxctl: {}", e.line());
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Command::Approvals {
            command: Some(ApprovalsCommand::Show { id, json: own }),
            json,
            broker,
            ..
        } => exit(approvals::show_one(
            &cli.context(Json::either(*json, *own), Some(broker)),
            id,
        )),
        Command::Approvals {
            command: Some(ApprovalsCommand::Revoke { lease, json: own }),
            json,
            broker,
            ..
        } => exit(approvals::revoke(
            &cli.context(Json::either(*json, *own), Some(broker)),
            lease,
        )),
        Command::Approvals {
            leases: true,
            json,
            broker,
            command: None,
            ..
        } => exit(approvals::leases(&cli.context(*json, Some(broker)))),
        Command::Approvals {
            watch,
            json,
            broker,
            command: None,
            ..
        } => exit(approvals::list(&cli.context(*json, Some(broker)), *watch)),
        Command::Approve {
            id,
            lease,
            json,
            broker,
        } => exit(approvals::decide(
            &cli.context(*json, Some(broker)),
            id,
            approvals::Answer::Allow { lease: *lease },
        )),
        Command::Deny { id, json, broker } => exit(approvals::decide(
            &cli.context(*json, Some(broker)),
            id,
            approvals::Answer::Deny,
        )),
        Command::Audit {
            command: AuditCommand::Verify { head, json, broker },
        } => exit(audit::verify(
            &cli.context(*json, Some(broker)),
            head.as_deref(),
        )),
        Command::Audit {
            command:
                AuditCommand::Tail {
                    n,
                    chain,
                    follow,
                    json,
                },
        } => exit(audit::tail(
            &cli.context(*json, None),
            *n,
            chain.as_deref(),
            *follow,
        )),
        Command::Channel {
            command: ChannelCommand::Pair { room, json, socket },
        } => exit(channel::pair(&cli.channel_context(*json, socket), room)),
        Command::Channel {
            command: ChannelCommand::Status { json, socket },
        } => exit(channel::status(&cli.channel_context(*json, socket))),
        Command::Memory {
            command:
                MemoryCommand::Recent {
                    route,
                    n,
                    json,
                    socket,
                },
        } => exit(memory::recent(
            &cli.memory_context(*json, socket),
            route.map(Into::into),
            *n,
        )),
        Command::Memory {
            command:
                MemoryCommand::Search {
                    query,
                    n,
                    json,
                    socket,
                },
        } => exit(memory::search(
            &cli.memory_context(*json, socket),
            query,
            *n,
        )),
        Command::Memory {
            command:
                MemoryCommand::Forget {
                    session,
                    json,
                    socket,
                },
        } => match bxcore::SessionId::new(session.clone()) {
            Ok(id) => exit(memory::forget(&cli.memory_context(*json, socket), &id)),
            Err(e) => usage(&format!("--session: {e}")),
        },
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "bxctl", &mut out);
            ExitCode::SUCCESS
        }
        Command::Man => match clap_mangen::Man::new(Cli::command()).render(&mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed(format!("bxctl man: {e}")),
        },
        Command::Logs {
            daemon,
            lines,
            follow,
        } => {
            let opts = logs::Options {
                daemon: daemon.clone(),
                lines: *lines,
                follow: *follow,
            };
            match logs::run(&target, &opts, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(format!("bxctl logs: {e}")),
            }
        }
        Command::Status { json } => {
            let s = status::gather(&target);
            if json.json {
                let _ = writeln!(out, "{}", serde_json::to_string(&s).unwrap_or_default());
            } else {
                let _ = write!(out, "{}", status::render(&s));
            }
            match status::verdict(&s) {
                None => ExitCode::SUCCESS,
                Some(line) => failed(line),
            }
        }
        Command::Selftest {
            model_timeout,
            json,
        } => {
            let opts = selftest::Options {
                json: json.json,
                model_timeout: Duration::from_secs((*model_timeout).max(1)),
            };
            match selftest::run(&target, opts, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(bxcore::runbook::Anchored::pointed(&e)),
            }
        }
        Command::Check { manifest, json } => {
            let path = manifest
                .clone()
                .unwrap_or_else(|| check::manifest::DEFAULT_PATH.into());
            match check::main(&path, json.json, &mut out) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => usage(&e),
            }
        }
        #[cfg(feature = "devbox")]
        Command::Demo => match demo::run(&mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed(e),
        },
        #[cfg(feature = "devbox")]
        Command::Dev(DevCommand::Up(args)) => {
            // dev::up checks every flag before it writes anything.
            let opts = UpOptions {
                home: Target::for_dev(cli.home.as_deref()).home().to_path_buf(),
                model: ModelFlags {
                    provider: args.provider,
                    base_url: args.base_url.clone(),
                    model: args.model.clone(),
                    api_key_file: args.api_key_file.clone(),
                    script: args.script.clone(),
                },
                honcho: dev::HonchoFlags {
                    url: args.honcho_url.clone(),
                    key_file: args.honcho_key_file.clone(),
                },
                web_hosts: args.web_hosts.clone(),
                matrix: args.matrix.clone(),
            };
            match dev::up(&opts, &mut out) {
                Ok(_) => ExitCode::SUCCESS,
                // A flag that is wrong, or does not go with the others: exit 2, as clap's own.
                Err(e @ dev::DevError::Usage(_)) => usage(&e.to_string()),
                Err(e @ dev::DevError::Honcho(_)) => {
                    usage(&bxcore::runbook::Anchored::pointed(&e).to_string())
                }
                Err(e) => failed(bxcore::runbook::Anchored::pointed(&e)),
            }
        }
        #[cfg(feature = "devbox")]
        Command::Dev(DevCommand::Restart) => {
            match dev::restart(Target::for_dev(cli.home.as_deref()).home(), &mut out) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => failed(bxcore::runbook::Anchored::pointed(&e)),
            }
        }
        #[cfg(feature = "devbox")]
        Command::Dev(DevCommand::Down) => {
            match dev::down(Target::for_dev(cli.home.as_deref()).home(), &mut out) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => failed(bxcore::runbook::Anchored::pointed(&e)),
            }
        }
    }
}
