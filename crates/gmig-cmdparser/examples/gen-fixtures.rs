//! Regenerate the AUB fixtures in `fixtures/` (see `docs/fixtures.md`):
//!
//! ```text
//! cargo run -p gmig-cmdparser --example gen-fixtures            # writes <repo>/fixtures
//! cargo run -p gmig-cmdparser --example gen-fixtures -- OUTDIR  # writes elsewhere
//! ```
//!
//! Generation is deterministic: running it twice gives byte-identical files, and the workspace test
//! `tests/tests/fixtures.rs` checks that the committed fixtures are exactly what it writes.

use std::path::PathBuf;
use std::process::ExitCode;

use gmig_cmdparser::aub::fixture;

fn main() -> ExitCode {
    let out = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"),
        PathBuf::from,
    );
    let mut written = 0usize;
    for spec in fixture::specs() {
        let files = match fixture::generate(&spec) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("gen-fixtures: {e}");
                return ExitCode::FAILURE;
            }
        };
        let dir = out.join(spec.name);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("gen-fixtures: creating {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
        // Remove files a previous generation wrote that this one does not (an outcome change).
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !files.iter().any(|(n, _)| *n == name) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        for (name, bytes) in &files {
            let path = dir.join(name);
            if let Err(e) = std::fs::write(&path, bytes) {
                eprintln!("gen-fixtures: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            written += 1;
        }
        println!(
            "{:<40} {}",
            spec.name,
            files
                .iter()
                .map(|(n, b)| format!("{n} ({} B)", b.len()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!("wrote {written} files under {}", out.display());
    ExitCode::SUCCESS
}
