//! `gmig replay`: decode, audit and remap a fixture with the slice move its manifest names, and
//! compare everything with the fixture's expected files.

use std::path::{Path, PathBuf};

use gmig_cmdparser::aub::fixture::{self, CheckError, Expect, Outcome};
use serde_json::json;

use crate::cli::ReplayArgs;
use crate::exit::Failure;

/// Run `gmig replay`.
pub fn run(args: &ReplayArgs, json: bool) -> Result<(), Failure> {
    let dirs = fixture_dirs(&args.fixture)?;
    let mut differing = Vec::new();
    for dir in &dirs {
        match fixture::check_dir(dir) {
            Ok(rep) => {
                let m = &rep.manifest;
                let outcome = match &rep.replay.outcome {
                    Outcome::Remapped { ggtt_rewritten, .. } => {
                        format!("remapped ({ggtt_rewritten} GGTT address uses audited in the destination)")
                    }
                    Outcome::Refused { refusal, message } => {
                        format!("refused ({}): {message}", refusal.name())
                    }
                };
                let expect = match m.expect {
                    Expect::Remap => "remap".to_owned(),
                    Expect::Refuse(r) => format!("refuse ({})", r.name()),
                };
                if json {
                    println!(
                        "{}",
                        json!({
                            "ok": true,
                            "fixture": m.name,
                            "gen": fixture::gen_name(m.gen),
                            "engine": fixture::engine_name(m.engine),
                            "expect": expect,
                            "outcome": outcome,
                        })
                    );
                } else {
                    println!(
                        "{}: gen {} {}: {outcome}; matches the manifest ({expect}) and every expected file",
                        m.name,
                        fixture::gen_name(m.gen),
                        fixture::engine_name(m.engine)
                    );
                }
            }
            Err(CheckError::Differs { name, differences }) => {
                if !json {
                    for d in &differences {
                        eprintln!("{name}: {d}");
                    }
                }
                differing.push(format!("{name}: {}", differences.join("; ")));
            }
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", dir.display()).into()),
        }
    }
    if differing.is_empty() {
        Ok(())
    } else {
        Err(Failure::Check(format!(
            "{} of {} fixtures differ from their expected output: {}",
            differing.len(),
            dirs.len(),
            differing.join(" | ")
        )))
    }
}

/// The fixture directories `path` names: itself (a fixture directory or its manifest), or every
/// fixture directory inside it.
fn fixture_dirs(path: &Path) -> Result<Vec<PathBuf>, Failure> {
    if path.is_file() || path.join("manifest.toml").is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a fixture or a directory of fixtures: {e}",
            path.display()
        )
    })?;
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("manifest.toml").is_file())
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        return Err(anyhow::anyhow!("{}: no fixture (manifest.toml) found", path.display()).into());
    }
    Ok(dirs)
}
