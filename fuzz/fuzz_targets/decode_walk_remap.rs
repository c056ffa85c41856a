//! libFuzzer target: decode, audit, walk and remap arbitrary bytes (see `docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gmig_cmdparser_fuzz::run(data);
});
