//! `gmig migrate`.

use crate::cli::MigrateArgs;
use crate::exit::Failure;

/// Run `gmig migrate`.
pub fn run(args: &MigrateArgs, json: bool) -> Result<(), Failure> {
    let _ = (args, json);
    Err(Failure::not_built(
        "migrate",
        "issue 7 (the migration engine)",
    ))
}
