//! Workspace-level end-to-end tests for gmig live in `tests/tests/`; this library is empty on purpose.
//!
//! Helpers shared by several end-to-end tests go here.

/// Path of the repository root, for tests that read `fixtures/` or `docs/`.
#[must_use]
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Path of `../shared` beside the repository, if it is there.
#[must_use]
pub fn shared_dir() -> Option<std::path::PathBuf> {
    let p = repo_root().parent()?.join("shared");
    p.is_dir().then_some(p)
}
