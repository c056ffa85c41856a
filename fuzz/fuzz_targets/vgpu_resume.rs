//! libFuzzer target: `gmig_test_support::fuzz::vgpu_resume` (see `docs/fuzzing.md`). The vGPU is
//! booted once (on the first input) and cloned for each input.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: gmig_cmdparser_fuzz::keep_heap(),
    |data: &[u8]| {
        let _ = gmig_test_support::fuzz::vgpu_resume(data);
    }
);
