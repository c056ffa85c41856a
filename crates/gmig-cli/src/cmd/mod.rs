//! One module per subcommand; `main` dispatches to their `run` functions.

pub mod bench;
pub mod bench_evacuate;
pub mod bench_matrix;
pub mod bench_migrate;
pub mod bench_paper;
pub mod bench_plot;
pub mod bench_report;
pub mod bench_vm;
pub mod decode;
pub mod demo;
pub mod migrate;
pub mod replay;
pub mod serve;
pub mod vm;
