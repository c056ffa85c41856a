//! One module per subcommand; `main` dispatches to their `run` functions.

pub mod bench;
pub mod bench_migrate;
pub mod decode;
pub mod demo;
pub mod migrate;
pub mod replay;
pub mod serve;
