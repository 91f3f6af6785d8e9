//! The command line. Global options come first so that later subcommands (chat, status, dev,
//! demo, selftest) share them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Where the box lives when neither `--home` nor `BOXMAKER_HOME` says.
pub const DEFAULT_HOME: &str = "/var/lib/boxmaker";

#[derive(Debug, Parser)]
#[command(name = "bxctl", version, about = "The owner's command for the box")]
pub struct Cli {
    /// The box's home [default: $BOXMAKER_HOME, else /var/lib/boxmaker].
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// brokerd's admin socket [default: <home>/run/owner-broker/admin.sock].
    #[arg(long, global = true, value_name = "PATH")]
    pub admin: Option<PathBuf>,
    /// Machine-readable output: one JSON document (or one per line for streams).
    #[arg(long, global = true)]
    pub json: bool,
    /// How long to wait for an answer, in seconds.
    #[arg(long, global = true, default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the tool calls waiting for your approval.
    Approvals {
        /// Keep watching, printing the list again whenever it changes.
        #[arg(long)]
        watch: bool,
    },
    /// Approve a pending call: it runs, exactly as shown.
    Approve {
        /// The approval's id (16 hex digits, from `bxctl approvals`).
        id: String,
    },
    /// Deny a pending call: it is answered "the owner denied it".
    Deny {
        /// The approval's id.
        id: String,
    },
    /// The audit chain.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Ask brokerd to verify the whole chain: records, head hash; exit 1 on a break.
    Verify,
    /// Print the last records of the chain.
    Tail {
        /// How many records.
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        /// The chain file [default: <home>/broker/audit/chain.jsonl].
        #[arg(long, value_name = "PATH")]
        chain: Option<PathBuf>,
    },
}

/// What every subcommand needs to know.
#[derive(Debug, Clone)]
pub struct Context {
    pub home: PathBuf,
    pub admin: PathBuf,
    pub json: bool,
    pub timeout: Duration,
}

impl Cli {
    pub fn context(&self) -> Context {
        let home = self
            .home
            .clone()
            .or_else(|| std::env::var_os("BOXMAKER_HOME").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_HOME));
        let admin = self.admin.clone().unwrap_or_else(|| admin_socket(&home));
        Context {
            home,
            admin,
            json: self.json,
            timeout: Duration::from_secs(self.timeout.max(1)),
        }
    }
}

/// `<home>/run/owner-broker/admin.sock`.
pub fn admin_socket(home: &Path) -> PathBuf {
    bxcore::layout::ADMIN.path(home)
}
