//! `gmig serve`.

use crate::cli::ServeArgs;
use crate::exit::Failure;

/// Run `gmig serve`.
pub fn run(args: &ServeArgs, json: bool) -> Result<(), Failure> {
    let _ = (args, json);
    Err(Failure::not_built("serve", "the vfio-user bridge"))
}
