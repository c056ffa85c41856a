//! libFuzzer target: `gmig_test_support::fuzz::aub_read` (see `docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = gmig_test_support::fuzz::aub_read(data);
});
