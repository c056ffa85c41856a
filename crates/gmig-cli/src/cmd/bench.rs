//! `gmig bench`.

use crate::cli::BenchArgs;
use crate::exit::Failure;

/// Run `gmig bench`.
pub fn run(args: &BenchArgs, json: bool) -> Result<(), Failure> {
    let _ = (args, json);
    Err(Failure::not_built(
        "bench",
        "issues 4 and 8 (the bench harness)",
    ))
}
