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
    /// A migration broke during the switch-over and this side is in doubt: it kept a stopped
    /// copy of the vGPU (in a checkpoint file) and did not run it.
    pub const IN_DOUBT: u8 = 4;
}

/// Why a subcommand failed.
#[derive(Debug)]
pub enum Failure {
    /// A verification failed (exit code 3).
    #[allow(dead_code)]
    Check(String),
    /// Any other error (exit code 1).
    #[allow(dead_code)]
    Error(anyhow::Error),
    /// A migration that failed, with what this side holds of the vGPU afterwards (JSON fields
    /// added to the failure object); `in_doubt` gives exit code 4.
    Migration {
        /// The error.
        error: anyhow::Error,
        /// Fields such as `vgpu`, `checkpoint`, `state_digest`.
        fields: serde_json::Map<String, serde_json::Value>,
        /// The side is in doubt.
        in_doubt: bool,
    },
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Error(e)
    }
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Check(_) => code::CHECK_FAILED,
            Failure::Migration { in_doubt: true, .. } => code::IN_DOUBT,
            Failure::Error(_) | Failure::Migration { .. } => code::ERROR,
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::Check(msg) => format!("check failed: {msg}"),
            Failure::Error(e) | Failure::Migration { error: e, .. } => chain(e),
        }
    }

    /// Print the failure and turn it into the process exit code.
    pub fn report(self, json: bool) -> ExitCode {
        let code = self.code();
        let message = self.message();
        if json {
            let mut obj = serde_json::json!({ "ok": false, "exit_code": code, "error": message });
            if let (Failure::Migration { fields, .. }, Some(o)) = (&self, obj.as_object_mut()) {
                o.extend(fields.clone());
            }
            println!("{obj}");
        } else {
            eprintln!("gmig: {message}");
        }
        ExitCode::from(code)
    }
}

/// The fields with which a migrating side says, as it exits, its `role` and what it holds of the
/// device under `key` (`vgpu` for `gmig migrate`, `vm` for `gmig vm migrate`): `running`, `none` or
/// `in-doubt` (docs/reliability.md).
pub fn side_fields(
    role: &str,
    key: &str,
    holds: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("role".into(), role.into());
    m.insert(key.into(), holds.into());
    m
}

/// The error and its causes, each said once: many error types already include their source in
/// their own message, so a cause whose text is already part of what was said is not repeated.
fn chain(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("bad magic")]
    struct Leaf;

    #[derive(Debug, thiserror::Error)]
    #[error("device data operation failed: {0}")]
    struct Wraps(#[source] Leaf);

    #[derive(Debug, thiserror::Error)]
    #[error("reading the stream")]
    struct Context(#[source] Leaf);

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let e = anyhow::Error::new(Wraps(Leaf)).context("incoming migration");
        let msg = Failure::Error(e).message();
        assert_eq!(
            msg,
            "incoming migration: device data operation failed: bad magic"
        );
        assert_eq!(msg.matches("bad magic").count(), 1);
    }

    #[test]
    fn a_cause_not_in_the_message_is_appended() {
        let e = anyhow::Error::new(Context(Leaf));
        assert_eq!(Failure::Error(e).message(), "reading the stream: bad magic");
    }
}
