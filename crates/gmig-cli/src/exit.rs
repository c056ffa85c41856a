//! Exit codes and how failures are reported (human text on stderr, or one JSON object on stdout).

use std::process::ExitCode;

/// Exit codes, documented in `gmig --help`.
pub mod code {
    /// A runtime error: bad input, I/O failure, a rejected or broken migration.
    pub const ERROR: u8 = 1;
    /// Command-line usage error (reported by clap).
    #[allow(dead_code)]
    pub const USAGE: u8 = 2;
    /// The command ran but its check failed: a replay differed from the fixture's expectation, or a
    /// migrated run was not identical to the unmigrated reference.
    #[allow(dead_code)]
    pub const CHECK_FAILED: u8 = 3;
    /// The subcommand is not built in this version of gmig.
    pub const NOT_BUILT: u8 = 4;
}

/// Why a subcommand failed.
#[derive(Debug)]
pub enum Failure {
    /// The subcommand is declared but not implemented yet.
    NotBuilt { what: String, by: String },
    /// A verification failed (exit code 3).
    #[allow(dead_code)]
    Check(String),
    /// Any other error (exit code 1).
    #[allow(dead_code)]
    Error(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Error(e)
    }
}

impl Failure {
    /// The subcommand `what` is declared but arrives with `by`.
    pub fn not_built(what: &str, by: &str) -> Self {
        Failure::NotBuilt {
            what: what.to_owned(),
            by: by.to_owned(),
        }
    }

    fn code(&self) -> u8 {
        match self {
            Failure::NotBuilt { .. } => code::NOT_BUILT,
            Failure::Check(_) => code::CHECK_FAILED,
            Failure::Error(_) => code::ERROR,
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::NotBuilt { what, by } => format!(
                "`gmig {what}` is not built yet in this version (it arrives with {by}); nothing was done"
            ),
            Failure::Check(msg) => format!("check failed: {msg}"),
            Failure::Error(e) => format!("{e:#}"),
        }
    }

    /// Print the failure and turn it into the process exit code.
    pub fn report(self, json: bool) -> ExitCode {
        let code = self.code();
        let message = self.message();
        if json {
            let obj = serde_json::json!({ "ok": false, "exit_code": code, "error": message });
            println!("{obj}");
        } else {
            eprintln!("gmig: {message}");
        }
        ExitCode::from(code)
    }
}
