//! `gmig demo`.

use crate::cli::DemoArgs;
use crate::exit::Failure;

/// Run `gmig demo`.
pub fn run(args: &DemoArgs, json: bool) -> Result<(), Failure> {
    let _ = (args, json);
    Err(Failure::not_built("demo", "issue 7 (the migration engine)"))
}
