//! libFuzzer target: `gmig_test_support::fuzz::vgpu_guest` (see `docs/fuzzing.md`): a hostile
//! guest's register, GGTT, RAM and aperture accesses on a vGPU booted once and cloned per input.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: gmig_cmdparser_fuzz::keep_heap(),
    |data: &[u8]| {
        let _ = gmig_test_support::fuzz::vgpu_guest(data);
    }
);
