//! libFuzzer target: `gmig_test_support::fuzz::vgpu_resume` (see `docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = gmig_test_support::fuzz::vgpu_resume(data);
});
