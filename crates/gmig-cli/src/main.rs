//! `gmig`: live migration of mediated Intel vGPUs — the command-line front door.

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod exit;

use cli::{Cli, Command};
use exit::Failure;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let result = match &cli.command {
        Command::Decode(args) => not_built("decode", "issue 3 (gmig-cmdparser)", args),
        Command::Replay(args) => not_built("replay", "issue 3 (gmig-cmdparser)", args),
        Command::Migrate(args) => not_built("migrate", "issue 7 (migration engine)", args),
        Command::Bench(args) => not_built("bench", "issues 4 and 8 (bench harness)", args),
        Command::Serve(args) => not_built("serve", "the vfio-user bridge", args),
        Command::Demo(args) => not_built("demo", "issue 7 (migration engine)", args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(cli.json),
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `warn`), so stdout stays machine-readable.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn not_built<A: std::fmt::Debug>(name: &str, issue: &str, args: &A) -> Result<(), Failure> {
    tracing::debug!(?args, "subcommand {name} requested");
    Err(Failure::NotBuilt {
        what: name.to_owned(),
        by: issue.to_owned(),
    })
}
