//! `gmig decode`.

use crate::cli::DecodeArgs;
use crate::exit::Failure;

/// Run `gmig decode`.
pub fn run(args: &DecodeArgs, json: bool) -> Result<(), Failure> {
    let _ = (args, json);
    Err(Failure::not_built("decode", "issue 3 (gmig-cmdparser)"))
}
