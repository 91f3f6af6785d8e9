//! `bxctl`: the owner's command. Each subcommand is one module; this file parses the command line
//! and maps outcomes to exit codes: 0 done, 1 refused or failed, 2 usage (clap's own).

mod approvals;
mod audit;
mod cli;
mod output;

use std::process::ExitCode;

use clap::Parser;

use cli::{AuditCommand, Cli, Command};

/// How a subcommand ended.
#[derive(Debug)]
pub enum Outcome {
    Done,
    /// Refused or failed; the reason was printed.
    Failed,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ctx = cli.context();
    let outcome = match &cli.command {
        Command::Approvals { watch } => approvals::list(&ctx, *watch),
        Command::Approve { id } => approvals::decide(&ctx, id, true),
        Command::Deny { id } => approvals::decide(&ctx, id, false),
        Command::Audit {
            command: AuditCommand::Verify,
        } => audit::verify(&ctx),
        Command::Audit {
            command: AuditCommand::Tail { n, chain },
        } => audit::tail(&ctx, *n, chain.as_deref()),
    };
    match outcome {
        Outcome::Done => ExitCode::SUCCESS,
        Outcome::Failed => ExitCode::FAILURE,
    }
}
