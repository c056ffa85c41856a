//! `gmig`: live migration of mediated Intel vGPUs — the command-line front door.

use std::process::ExitCode;

use clap::Parser;

mod bench;
mod cli;
mod cmd;
mod exit;
mod slots;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let result = match &cli.command {
        Command::Decode(args) => cmd::decode::run(args, cli.json),
        Command::Replay(args) => cmd::replay::run(args, cli.json),
        Command::Migrate(args) => cmd::migrate::run(args, cli.json),
        Command::Bench(args) => cmd::bench::run(args, cli.json),
        Command::Serve(args) => cmd::serve::run(args, cli.json),
        Command::Demo(args) => cmd::demo::run(args, cli.json),
        Command::Vm(vm) => cmd::vm::run(vm, cli.json),
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
    // Colour codes only for a person at a terminal, never into a log file.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
