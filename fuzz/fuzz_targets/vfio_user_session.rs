//! libFuzzer target: `gmig_test_support::fuzz::vfio_user_session` (see `docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = gmig_test_support::fuzz::vfio_user_session(data);
});
