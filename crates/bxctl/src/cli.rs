//! The command line: `--home` for every subcommand; `--json`, `--admin` and `--timeout` only on
//! the subcommands that use them, so every flag a subcommand lists does what it says. Each
//! subcommand is run by its module and ends with one [`Ended`]; [`run`] picks the box
//! ([`Cli::target`]), dispatches, and exits as the subcommand ended (`done`).

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bxcore::layout::{self, SocketSpec};
use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::approvals::Answer;
use crate::chat::{self, ChatOptions};
use crate::context::{Context, SocketContext};
#[cfg(feature = "devbox")]
use crate::demo;
#[cfg(feature = "devbox")]
use crate::dev::{self, DevCommand};
use crate::done::{self, Done, Ended, Failure};
use crate::logs::LogsOptions;
use crate::selftest::SelftestOptions;
use crate::target::{Device, Target};
use crate::{approvals, audit, channel, check, logs, marks, memory, selftest, status, tools};

#[derive(Debug, Parser)]
#[command(name = "bxctl", version, about = "The owner's command for the box")]
pub struct Cli {
    #[cfg_attr(
        feature = "devbox",
        doc = "The box's home [default: $BOXMAKER_HOME, else /var/lib/boxmaker; for `dev`: else \
               ~/.local/state/boxmaker-dev]."
    )]
    #[cfg_attr(
        not(feature = "devbox"),
        doc = "The box's home [default: $BOXMAKER_HOME, else /var/lib/boxmaker]."
    )]
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
    Approvals(ApprovalsArgs),
    /// Approve a pending call: it runs, exactly as shown.
    Approve {
        /// The approval's id (16 hex digits, from `bxctl approvals`).
        id: String,
        /// Also allow the calls like it in this session for the lease's time (what the approval's
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
    /// The files a session that had read third-party content wrote: each later read of one is
    /// third-party content too, until you check it and clear its mark (`bxctl marks clear`).
    Marks {
        #[command(subcommand)]
        command: Option<MarksCommand>,
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
    /// The tools the broker offers, built in and declared, and what a declared tool's server
    /// offers (docs/tools.md).
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
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
        /// One daemon of the box (loopd, brokerd, inferproxy, memoryd, gatewayd, channeld)
        /// [default: all of them].
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

#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    /// Keep watching, printing the list again whenever it changes.
    #[arg(long)]
    pub watch: bool,
    /// The leases ("allow for this session") you gave that still live; `bxctl approvals
    /// revoke LEASE` ends one.
    #[arg(long, conflicts_with = "watch")]
    pub leases: bool,
    #[command(flatten)]
    pub json: Json,
    #[command(flatten)]
    pub broker: Broker,
    #[command(subcommand)]
    pub command: Option<ApprovalsCommand>,
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
pub enum MarksCommand {
    /// Clear one mark, after you checked the file: reads of it are trusted again. Recorded in
    /// the audit chain.
    Clear {
        /// The file as `bxctl marks` names it (`ROOT/PATH`), or its full path.
        path: String,
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
pub enum ToolsCommand {
    /// Every tool brokerd's configuration offers, built in or declared: the label its results
    /// carry, its effect, its approval rule (a running brokerd offers what it started with:
    /// restart it after a change).
    List,
    /// Start the declared tools' server NAME as brokerd's user and confined, as a call would,
    /// and print its tools as [[declared_tools]] entries that trust nothing, each with its
    /// digest: review one, choose its label, add it to brokerd's configuration, restart brokerd.
    Ask {
        /// The server, as `[tool_servers.NAME]` in brokerd's configuration names it.
        #[arg(long, value_name = "NAME")]
        server: String,
    },
    /// Declare the server's tool TOOL in brokerd's configuration with your choices: what the
    /// model is told, the label its results carry, its effect and approval rule (its digest and
    /// schema from the server, as `ask` prints them). `brokerd check` must pass the result, or
    /// nothing changes; restart brokerd for it to be offered. On the device, prints the entry
    /// for the NixOS configuration instead.
    Add(Box<tools::Choices>),
    /// Take the declared tool NAME out of brokerd's configuration (`brokerd check` must pass
    /// the result); restart brokerd for it to be offered no more. On the device, says what to
    /// change in the NixOS configuration instead.
    Remove {
        /// The declared tool's name, as `bxctl tools list` shows it.
        #[arg(long, value_name = "NAME")]
        name: String,
    },
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

/// How a memory listing is asked for and shown.
#[derive(Debug, Args)]
pub struct Listing {
    /// How many turns (1 to 1000).
    #[arg(short = 'n', default_value_t = 20)]
    pub n: u32,
    #[command(flatten)]
    pub json: Json,
    #[command(flatten)]
    pub socket: MemorySocket,
}

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// The latest filed turns, newest first.
    Recent {
        /// Only this route [default: every route].
        #[arg(long, value_enum)]
        route: Option<RouteArg>,
        #[command(flatten)]
        listing: Listing,
    },
    /// The filed turns that best match QUERY, over every route.
    Search {
        query: String,
        #[command(flatten)]
        listing: Listing,
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

impl Cli {
    /// The box a command that is not `dev` talks to: a dev box `dev up` made, when the home
    /// (named, or the dev box's default off a device) is one, else the device's.
    pub fn target(&self) -> Box<dyn Target> {
        let home = self.home.as_deref();
        #[cfg(feature = "devbox")]
        if let Some(dev) = dev::find(home) {
            return Box::new(dev);
        }
        Box::new(Device::resolve(home))
    }

    /// The context of a subcommand with these `--json` and broker options.
    pub fn context(&self, json: Json, broker: Option<&Broker>) -> Context {
        let target = self.target();
        let admin = broker
            .and_then(|b| b.admin.clone())
            .unwrap_or_else(|| target.socket(&layout::ADMIN));
        Context {
            home: target.home().to_path_buf(),
            admin,
            json: json.json,
            timeout: Duration::from_secs(broker.map_or(10, |b| b.timeout).max(1)),
        }
    }

    /// The context of a command that asks `daemon` on its owner's socket `spec`, or on the
    /// socket `given` by `flag`.
    fn socket_context(
        &self,
        json: Json,
        given: Option<&PathBuf>,
        timeout: u64,
        (spec, daemon, flag): (&SocketSpec, &'static str, &'static str),
    ) -> SocketContext {
        SocketContext {
            daemon,
            socket: given.cloned().unwrap_or_else(|| self.target().socket(spec)),
            flag,
            json: json.json,
            timeout: Duration::from_secs(timeout.max(1)),
        }
    }

    /// The context of a channel subcommand.
    pub fn channel_context(&self, json: Json, socket: &ChannelSocket) -> SocketContext {
        let asked = (&layout::CHANNEL, "channeld", "--channel");
        self.socket_context(json, socket.channel.as_ref(), socket.timeout, asked)
    }

    /// The context of a memory subcommand.
    pub fn memory_context(&self, json: Json, socket: &MemorySocket) -> SocketContext {
        let asked = (&layout::MEMORIES, "memoryd", "--memories");
        self.socket_context(json, socket.memories.as_ref(), socket.timeout, asked)
    }

    /// Run the subcommand; what it prints goes to `out`.
    pub fn dispatch(&self, out: &mut dyn Write) -> Ended {
        match &self.command {
            Command::Chat(a) => a.run(self),
            Command::Approvals(a) => a.run(self),
            Command::Approve {
                id,
                lease,
                json,
                broker,
            } => approvals::decide(
                &self.context(*json, Some(broker)),
                id,
                Answer::Allow { lease: *lease },
            ),
            Command::Deny { id, json, broker } => {
                approvals::decide(&self.context(*json, Some(broker)), id, Answer::Deny)
            }
            Command::Marks {
                command,
                json,
                broker,
            } => match command {
                Some(MarksCommand::Clear { path, json: own }) => {
                    marks::clear(&self.context(Json::either(*json, *own), Some(broker)), path)
                }
                None => marks::list(&self.context(*json, Some(broker))),
            },
            Command::Audit { command } => command.run(self),
            Command::Memory { command } => command.run(self),
            Command::Tools { command } => match command {
                ToolsCommand::List => tools::run(&*self.target(), "list", None),
                ToolsCommand::Ask { server } => tools::run(&*self.target(), "ask", Some(server)),
                ToolsCommand::Add(choices) => tools::add(&*self.target(), choices),
                ToolsCommand::Remove { name } => tools::remove(&*self.target(), name),
            },
            Command::Channel { command } => command.run(self),
            Command::Status { json } => status::run(&*self.target(), json.json, out),
            Command::Selftest {
                model_timeout,
                json,
            } => {
                let opts = SelftestOptions {
                    json: json.json,
                    model_timeout: Duration::from_secs((*model_timeout).max(1)),
                };
                selftest::run(&*self.target(), opts, out)
            }
            Command::Logs {
                daemon,
                lines,
                follow,
            } => {
                let opts = LogsOptions {
                    daemon: daemon.clone(),
                    lines: *lines,
                    follow: *follow,
                };
                logs::run(&*self.target(), &opts, out)
            }
            Command::Completions { shell } => {
                clap_complete::generate(*shell, &mut Cli::command(), "bxctl", out);
                Ok(Done)
            }
            Command::Man => clap_mangen::Man::new(Cli::command())
                .render(out)
                .map(|()| Done)
                .map_err(|e| Failure::failed(format!("bxctl man: {e}"))),
            Command::Check { manifest, json } => {
                let path = manifest
                    .clone()
                    .unwrap_or_else(|| check::manifest::DEFAULT_PATH.into());
                check::main(&path, json.json, out)
            }
            #[cfg(feature = "devbox")]
            Command::Demo => demo::run(out),
            #[cfg(feature = "devbox")]
            Command::Dev(command) => dev::command::run(command, self.home.as_deref(), out),
        }
    }
}

impl ChatArgs {
    fn run(&self, cli: &Cli) -> Ended {
        let ctx = cli.context(self.json, Some(&self.broker));
        let opts = ChatOptions {
            session: self.session.clone(),
            new: self.new,
            text: self.text.clone(),
            json: self.json.json,
            model_timeout: self.model_timeout.map(Duration::from_secs),
            home: ctx.home.clone(),
            admin: ctx.admin.clone(),
            broker_timeout: ctx.timeout,
        };
        chat::run(&cli.target().socket(&layout::LOOP), &opts)
    }
}

impl ApprovalsArgs {
    fn run(&self, cli: &Cli) -> Ended {
        // `--json` given before `show ID` or after it.
        let json = |own: &Json| cli.context(Json::either(self.json, *own), Some(&self.broker));
        match &self.command {
            Some(ApprovalsCommand::Show { id, json: own }) => approvals::show_one(&json(own), id),
            Some(ApprovalsCommand::Revoke { lease, json: own }) => {
                approvals::revoke(&json(own), lease)
            }
            None if self.leases => approvals::leases(&cli.context(self.json, Some(&self.broker))),
            None => approvals::list(&cli.context(self.json, Some(&self.broker)), self.watch),
        }
    }
}

impl AuditCommand {
    fn run(&self, cli: &Cli) -> Ended {
        match self {
            AuditCommand::Verify { head, json, broker } => {
                audit::verify(&cli.context(*json, Some(broker)), head.as_deref())
            }
            AuditCommand::Tail {
                n,
                chain,
                follow,
                json,
            } => audit::tail(&cli.context(*json, None), *n, chain.as_deref(), *follow),
        }
    }
}

impl ChannelCommand {
    fn run(&self, cli: &Cli) -> Ended {
        match self {
            ChannelCommand::Pair { room, json, socket } => {
                channel::pair(&cli.channel_context(*json, socket), room)
            }
            ChannelCommand::Status { json, socket } => {
                channel::status(&cli.channel_context(*json, socket))
            }
        }
    }
}

impl MemoryCommand {
    fn run(&self, cli: &Cli) -> Ended {
        match self {
            MemoryCommand::Recent { route, listing: l } => memory::recent(
                &cli.memory_context(l.json, &l.socket),
                route.map(Into::into),
                l.n,
            ),
            MemoryCommand::Search { query, listing: l } => {
                memory::search(&cli.memory_context(l.json, &l.socket), query, l.n)
            }
            MemoryCommand::Forget {
                session,
                json,
                socket,
            } => {
                let id = bxcore::SessionId::new(session.clone())
                    .map_err(|e| Failure::usage(format!("bxctl: --session: {e}")))?;
                memory::forget(&cli.memory_context(*json, socket), &id)
            }
        }
    }
}

/// Run one parsed command, and exit as it ended.
pub fn run(cli: Cli) -> ExitCode {
    if let Some(home) = &cli.home {
        crate::output::set_hint_home(home);
    }
    done::exit(cli.dispatch(&mut io::stdout()))
}
