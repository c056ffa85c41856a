//! `gmig replay`.

use crate::cli::ReplayArgs;
use crate::exit::Failure;

/// Run `gmig replay`.
pub fn run(args: &ReplayArgs, json: bool) -> Result<(), Failure> {
    let _ = (args, json);
    Err(Failure::not_built("replay", "issue 3 (gmig-cmdparser)"))
}
