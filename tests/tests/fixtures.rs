//! Every fixture in `fixtures/` replays through the library exactly as its expected files say, and
//! the committed generator reproduces the committed fixtures byte for byte.

use std::collections::BTreeSet;

use gmig_cmdparser::aub::fixture::{self, Expect};
use gmig_tests::repo_root;

fn fixture_dirs() -> Vec<std::path::PathBuf> {
    let root = repo_root().join("fixtures");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("reading {}: {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("manifest.toml").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_fixture_replays_as_expected() {
    let dirs = fixture_dirs();
    assert!(
        dirs.len() >= 12,
        "only {} fixtures in {}",
        dirs.len(),
        repo_root().display()
    );
    let mut failures = Vec::new();
    for dir in &dirs {
        if let Err(e) = fixture::check_dir(dir) {
            failures.push(format!("{}: {e}", dir.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "fixtures differ:\n{}",
        failures.join("\n")
    );
}

#[test]
fn generator_reproduces_committed_fixtures_byte_for_byte() {
    let root = repo_root().join("fixtures");
    let specs = fixture::specs();
    // Hand-made fixtures (real-hardware captures) lack the generator's manifest header.
    let committed: BTreeSet<String> = fixture_dirs()
        .iter()
        .filter(|d| {
            std::fs::read_to_string(d.join("manifest.toml"))
                .is_ok_and(|m| m.starts_with(fixture::GENERATED_HEADER))
        })
        .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let generated: BTreeSet<String> = specs.iter().map(|s| s.name.to_owned()).collect();
    assert_eq!(
        committed, generated,
        "fixture directories and generator disagree"
    );
    for spec in &specs {
        let files = fixture::generate(spec).expect("generator runs");
        let dir = root.join(spec.name);
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
            .expect("fixture dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let made: BTreeSet<String> = files.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(on_disk, made, "{}: file sets differ", spec.name);
        for (name, bytes) in files {
            let disk = std::fs::read(dir.join(&name)).expect("committed file");
            assert!(
                disk == bytes,
                "{}/{name} differs from what the generator writes; run \
                `cargo run -p gmig-cmdparser --example gen-fixtures`",
                spec.name
            );
        }
    }
}

#[test]
fn fixtures_cover_every_engine_generation_and_outcome() {
    let manifests: Vec<_> = fixture_dirs()
        .iter()
        .map(|d| {
            let text = std::fs::read_to_string(d.join("manifest.toml")).expect("manifest");
            fixture::Manifest::parse(&text).expect("manifest parses")
        })
        .collect();
    for gen in ["8", "9", "11"] {
        assert!(
            manifests.iter().any(|m| fixture::gen_name(m.gen) == gen),
            "no gen{gen} fixture"
        );
    }
    for engine in ["render", "blitter", "video", "video-enhance"] {
        assert!(
            manifests
                .iter()
                .any(|m| fixture::engine_name(m.engine) == engine),
            "no {engine} fixture"
        );
    }
    assert!(manifests.iter().any(|m| m.expect == Expect::Remap));
    for r in ["aub", "truncated", "budget", "forbidden", "out-of-slice"] {
        assert!(
            manifests
                .iter()
                .any(|m| matches!(m.expect, Expect::Refuse(x) if x.name() == r)),
            "no fixture refused for {r}"
        );
    }
    // Small: KiBs, not MiBs.
    for d in fixture_dirs() {
        let size: u64 = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert!(size < 256 * 1024, "{} holds {size} bytes", d.display());
    }
}
