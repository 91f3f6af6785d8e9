//! `bxctl dev up|down|restart`: the command line of the dev box, and how each ends.

use std::io::Write;
use std::path::{Path, PathBuf};

use bxcore::runbook::Anchored;
use clap::{Args, Subcommand};

use super::{DevError, HonchoFlags, ModelFlags, Provider, UpOptions, target};
use crate::done::{Done, Ended, Failure};

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

impl UpArgs {
    /// What `dev up` on `home` is asked to do.
    pub fn options(&self, home: PathBuf) -> UpOptions {
        UpOptions {
            home,
            model: ModelFlags {
                provider: self.provider,
                base_url: self.base_url.clone(),
                model: self.model.clone(),
                api_key_file: self.api_key_file.clone(),
                script: self.script.clone(),
            },
            honcho: HonchoFlags {
                url: self.honcho_url.clone(),
                key_file: self.honcho_key_file.clone(),
            },
            web_hosts: self.web_hosts.clone(),
            matrix: self.matrix.clone(),
        }
    }
}

/// A dev command that failed: a flag that is wrong, or does not go with the others, is a usage
/// error (exit 2, as clap's own), its line pointing at the entry that lists the flags' rules;
/// anything else is a refusal or a box that did not come up (exit 1), its line pointing at its
/// runbook entry.
impl From<DevError> for Failure {
    fn from(e: DevError) -> Failure {
        match &e {
            // A flag refused by what it names (a key file open to others) points there already.
            DevError::Usage(text) if bxcore::runbook::split_pointer(text).is_some() => {
                Failure::usage(format!("bxctl: {e}"))
            }
            DevError::Usage(_) | DevError::Honcho(_) => {
                Failure::usage(format!("bxctl: {e}")).pointing(Some(e.anchor()))
            }
            _ => Failure::anchored(&e),
        }
    }
}

/// Run a dev command on the home `--home` or `$BOXMAKER_HOME` names, else the dev box's
/// default home; its progress lines go to `out`.
pub fn run(command: &DevCommand, home: Option<&Path>, out: &mut dyn Write) -> Ended {
    let home = target::home_for_dev(home);
    match command {
        // `dev::up` checks every flag before it writes anything.
        DevCommand::Up(args) => super::up(&args.options(home), out).map(drop)?,
        DevCommand::Down => super::down(&home, out).map(drop)?,
        DevCommand::Restart => super::restart(&home, out).map(drop)?,
    }
    Ok(Done)
}
