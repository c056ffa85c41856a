//! Helpers shared by the bench tests: numbers out of `--json` output.

use serde_json::Value;

/// The number at `path` in `v`.
///
/// # Panics
/// When it is not a number.
pub fn f(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

/// The unsigned integer at `key` in `v`.
///
/// # Panics
/// When it is not one.
pub fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an unsigned integer in {v}"))
}
