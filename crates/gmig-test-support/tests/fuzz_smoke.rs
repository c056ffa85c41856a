//! Smoke runs of the fuzz harnesses (`gmig_test_support::fuzz`) on every CI run: each harness on
//! a valid seed and on deterministic mutations of it (bit flips, truncations, splices, garbage).
//! The campaigns with coverage feedback run under `cargo fuzz` (docs/fuzzing.md); these runs
//! prove the harnesses build, accept their seeds and refuse broken input without panicking.

use std::path::Path;

use gmig_test_support::fuzz;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `n` mutations of `seed`: flipped bytes, a truncation, a duplicated range, or random bytes.
fn mutations(seed: &[u8], n: usize, rng_seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng(rng_seed);
    (0..n)
        .map(|i| {
            let mut v = seed.to_vec();
            match i % 4 {
                0 => {
                    for _ in 0..1 + rng.below(4) {
                        let at = rng.below(v.len());
                        if let Some(b) = v.get_mut(at) {
                            *b ^= 1 << rng.below(8);
                        }
                    }
                }
                1 => v.truncate(rng.below(v.len())),
                2 if !v.is_empty() => {
                    let a = rng.below(v.len());
                    let b = (a + rng.below(256)).min(v.len());
                    let piece = v[a..b].to_vec();
                    let at = rng.below(v.len());
                    v.splice(at..at, piece);
                }
                _ => v = (0..rng.below(512)).map(|_| rng.next() as u8).collect(),
            }
            v
        })
        .collect()
}

/// With `GMIG_FUZZ_SEED_DIR` set, each test also leaves its valid seed in
/// `$GMIG_FUZZ_SEED_DIR/<target>/seed`, the starting corpus of a libFuzzer campaign
/// (docs/fuzzing.md).
fn keep_seed(target: &str, seed: &[u8]) {
    if let Some(dir) = std::env::var_os("GMIG_FUZZ_SEED_DIR") {
        let dir = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("seed"), seed).unwrap();
    }
}

/// With `GMIG_FUZZ_SEED_DIR` set, leaves a named seed in `$GMIG_FUZZ_SEED_DIR/<target>/seed-<name>`.
fn keep_named_seed(target: &str, name: &str, seed: &[u8]) {
    if let Some(dir) = std::env::var_os("GMIG_FUZZ_SEED_DIR") {
        let dir = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), seed).unwrap();
    }
}

#[test]
fn the_stream_decoders_agree_and_never_panic() {
    let stream = fuzz::seed_stream();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&stream);
    keep_seed("stream_decode", &framed);
    for seg in [0u8, 6, 255] {
        let mut input = vec![seg];
        input.extend_from_slice(&stream);
        fuzz::stream_decode(&input);
    }
    for (i, m) in mutations(&stream, 400, 0x5eed).into_iter().enumerate() {
        let mut input = vec![(i * 37) as u8];
        input.extend_from_slice(&m);
        fuzz::stream_decode(&input);
    }
}

#[test]
fn the_aub_reader_never_panics() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&fixtures).expect("fixtures/") {
        let capture = entry.expect("entry").path().join("capture.aub");
        let Ok(bytes) = std::fs::read(&capture) else {
            continue;
        };
        seeds += 1;
        fuzz::aub_read(&bytes);
        for m in mutations(&bytes, 60, seeds) {
            fuzz::aub_read(&m);
        }
    }
    assert!(
        seeds >= 5,
        "expected the committed captures under fixtures/"
    );
}

#[test]
fn a_resume_either_restores_or_leaves_the_held_vgpu_untouched() {
    let stream = fuzz::seed_stream();
    keep_seed("vgpu_resume", &stream);
    // The valid seed resumes (the harness's success path); truncations and garbage do not.
    assert!(fuzz::vgpu_resume(&stream));
    let ms = mutations(&stream, 24, 0xfeed);
    let outcomes: Vec<bool> = ms.iter().map(|m| fuzz::vgpu_resume(m)).collect();
    let refused = outcomes.iter().filter(|&&accepted| !accepted).count();
    assert!(
        refused >= 12,
        "only {refused} of 24 mutated streams were refused"
    );
    assert!(!fuzz::vgpu_resume(&[]));
    // The harness boots its vGPU once and clones it for each input: an input's outcome must not
    // depend on the inputs before it.
    let mut backwards: Vec<bool> = ms.iter().rev().map(|m| fuzz::vgpu_resume(m)).collect();
    backwards.reverse();
    assert_eq!(
        outcomes, backwards,
        "outcomes depend on the order of the inputs"
    );
    assert!(fuzz::vgpu_resume(&stream));
}

#[test]
fn the_vfio_user_server_answers_or_closes_and_never_panics() {
    let seed = fuzz::vfio_user_seed();
    keep_seed("vfio_user_session", &seed);
    // The seed reaches the remote-DMA path: the device read the client's answer to its DMA_READ
    // into its BAR (through a command pipelined in between), and WRITE_MULTI made its writes.
    let bar = fuzz::vfio_user_session(&seed);
    assert_eq!(
        &bar[..16],
        &[0x5a; 16],
        "the DMA_READ reply reached the device"
    );
    assert_eq!(&bar[0x20..0x24], &0x1234_5678u32.to_le_bytes());
    for m in mutations(&seed, 200, 0xc0de) {
        fuzz::vfio_user_session(&m);
    }
}

#[test]
fn a_hostile_guest_neither_escapes_nor_silences_its_vgpu() {
    // The seeds: each profile's driver frames as BAR0 and RAM writes (they submit real work:
    // every submission completes), and hand-made sequences (one spins an engine until GDRST).
    let seeds = fuzz::vgpu_guest_seeds();
    assert!(seeds.len() >= 5, "a seed per profile");
    for (name, seed) in &seeds {
        keep_named_seed("vgpu_guest", name, seed);
        let o = fuzz::vgpu_guest(seed);
        assert!(o.gdrst_recovers, "{name}: {o:?}");
        if name.starts_with("frames-") {
            assert!(o.completed >= 1 && o.refused == 0, "{name}: {o:?}");
        }
    }
    // Mutations: each harness run checks containment (RAM, write log, slices, the neighbour) and
    // that the vGPU answers after a reset; a broken guarantee panics.
    let mut ms = Vec::new();
    for (i, (_, seed)) in seeds.iter().enumerate() {
        ms.extend(mutations(seed, 48, 0x9e57 + i as u64));
    }
    let outcomes: Vec<_> = ms.iter().map(|m| fuzz::vgpu_guest(m)).collect();
    assert!(
        outcomes.iter().any(|o| o.refused > 0),
        "no mutation was refused by the vGPU"
    );
    // Each input starts from the booted vGPU: outcomes do not depend on the inputs before.
    let mut backwards: Vec<_> = ms.iter().rev().map(|m| fuzz::vgpu_guest(m)).collect();
    backwards.reverse();
    assert_eq!(
        outcomes, backwards,
        "outcomes depend on the order of the inputs"
    );
}
