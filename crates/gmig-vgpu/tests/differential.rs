//! Differential checks: a workload checkpointed at a random point, restored onto other slices on
//! another host and continued ends byte-identical (guest RAM, registers, GGTT, faults) to the same
//! workload never migrated — and, as a negative control, differs when remapping is turned off.

use gmig_vgpu::checkpoint::{RestoreOptions, VgpuState};
use gmig_vgpu::compare::{compare_guest_visible, StateDiff};
use gmig_vgpu::gm::{Gen, HostConfig, PartitionManager, VgpuSlices, VgpuType};
use gmig_vgpu::gtt::{copy_guest_ram, new_guest_ram};
use gmig_vgpu::vgpu::{Vgpu, VgpuConfig};
use gmig_vgpu::workload::{GuestDriver, Profile, WorkloadConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const RAM: usize = 16 << 20;
const TY: VgpuType = VgpuType::V5_8;

fn source() -> (PartitionManager, VgpuSlices) {
    let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
    let (_, s) = pm.place(TY).unwrap();
    (pm, s)
}

/// A destination host that already runs `others` vGPUs, placing the migrant away from `src`.
fn destination(src: &VgpuSlices, others: usize) -> VgpuSlices {
    let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
    for _ in 0..others {
        pm.place(VgpuType::V5_4).unwrap();
    }
    let (_, d) = pm.place_avoiding(TY, Some(src)).unwrap();
    assert_ne!(d.aperture.base, src.aperture.base);
    assert_ne!(d.hidden.base, src.hidden.base);
    d
}

fn boot(profile: Profile, seed: u64, gen: Gen) -> (Vgpu, GuestDriver) {
    let (_pm, s) = source();
    let cfg = VgpuConfig {
        gen,
        ..VgpuConfig::new(TY, 1)
    };
    let mut v = Vgpu::new(cfg, s, new_guest_ram(RAM).unwrap()).unwrap();
    let d = GuestDriver::boot(&mut v, profile, WorkloadConfig::small(), seed).unwrap();
    (v, d)
}

fn migrate(v: &mut Vgpu, drain: usize, others: usize, remap: bool) -> Vgpu {
    let report = v.pause(drain);
    assert_eq!(report.queued, v.queued());
    let bytes = v.save().to_bytes();
    let state = VgpuState::from_bytes(&bytes).unwrap();
    let dest = destination(&v.host_slices(), others);
    let ram = copy_guest_ram(v.guest_memory()).unwrap();
    let mut w = Vgpu::restore(&state, ram, dest, RestoreOptions { remap }).unwrap();
    w.resume();
    w
}

/// Runs `frames` frames on a `gen` vGPU; before waiting on each frame listed in `cuts`, migrates
/// the vGPU.
fn run_on(
    gen: Gen,
    profile: Profile,
    seed: u64,
    frames: u64,
    cuts: &[(u64, usize, usize)],
    remap: bool,
) -> (Vgpu, GuestDriver) {
    let (v, d, _) = run_counting(gen, profile, seed, frames, cuts, remap);
    (v, d)
}

/// [`run_on`], also returning the workloads the vGPU had completed when it was last restored
/// (`None`: never migrated), so that the work done after the switch-over is
/// `stats().workloads` minus it (the counter travels in the checkpoint).
fn run_counting(
    gen: Gen,
    profile: Profile,
    seed: u64,
    frames: u64,
    cuts: &[(u64, usize, usize)],
    remap: bool,
) -> (Vgpu, GuestDriver, Option<u64>) {
    let (mut v, mut d) = boot(profile, seed, gen);
    let mut at_restore = None;
    for f in 0..frames {
        d.submit_frame(&mut v).unwrap();
        for &(at, drain, others) in cuts {
            if at == f {
                v = migrate(&mut v, drain, others, remap);
                at_restore = Some(v.stats().workloads);
            }
        }
        d.wait(&mut v).unwrap();
    }
    (v, d, at_restore)
}

fn check(profile: Profile, seed: u64) -> (StateDiff, StateDiff) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let frames = 8;
    let at = rng.random_range(0..frames - 1);
    let drain = rng.random_range(0..3);
    let (reference, rd) = run_on(Gen::Gen9, profile, seed, frames, &[], true);
    assert_eq!(rd.failures(), 0, "{profile:?} reference run failed");
    let (migrated, md) = run_on(Gen::Gen9, profile, seed, frames, &[(at, drain, 1)], true);
    let ok = compare_guest_visible(&reference, &migrated);
    assert_eq!(
        md.failures(),
        0,
        "{profile:?} seed {seed}: migrated run failed: {:?}",
        migrated.faults()
    );
    let (broken, _) = run_on(Gen::Gen9, profile, seed, frames, &[(at, drain, 1)], false);
    let bad = compare_guest_visible(&reference, &broken);
    (ok, bad)
}

fn survives_migration_and_the_control_fails(profile: Profile) {
    for seed in [1u64, 2, 3] {
        let (ok, bad) = check(profile, seed);
        assert!(
            ok.is_identical(),
            "{profile:?} seed {seed}: migrated run differs: {ok:?}"
        );
        assert!(
            !bad.is_identical(),
            "{profile:?} seed {seed}: remapping off still identical"
        );
    }
}

/// One test a profile: `name => Profile`.
macro_rules! survives_migration_tests {
    ($($name:ident => $profile:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                survives_migration_and_the_control_fails(Profile::$profile);
            }
        )*
    };
}

survives_migration_tests! {
    idle_survives_migration => Idle,
    desktop_survives_migration => Desktop,
    three_d_survives_migration => ThreeD,
    video_survives_migration => Video,
    compute_survives_migration => Compute,
}

#[test]
fn migrating_twice_and_with_work_queued_stays_identical() {
    for profile in [Profile::Desktop, Profile::ThreeD] {
        let (reference, _) = run_on(Gen::Gen9, profile, 11, 10, &[], true);
        // Two migrations, the second from a vGPU whose guest view already differs from its slices,
        // each leaving work queued (drain 0).
        let (migrated, d) = run_on(Gen::Gen9, profile, 11, 10, &[(2, 0, 1), (6, 0, 2)], true);
        assert_eq!(d.failures(), 0);
        let diff = compare_guest_visible(&reference, &migrated);
        assert!(diff.is_identical(), "{profile:?}: {diff:?}");
    }
}

#[test]
fn queued_workloads_travel_in_the_checkpoint() {
    let (mut v, mut d) = boot(Profile::Desktop, 5, Gen::Gen9);
    d.run_frames(&mut v, 2).unwrap();
    d.submit_frame(&mut v).unwrap();
    let queued = v.queued();
    assert!(
        queued >= 2,
        "desktop submits a client and a compositor batch per frame"
    );
    let report = v.pause(1);
    assert_eq!(report.executed, 1);
    assert_eq!(report.queued, queued - 1);
    let state = v.save();
    assert_eq!(state.queue.len(), queued - 1);
    let w = migrate(&mut v, 0, 1, true);
    assert_eq!(w.queued(), queued - 1);
    assert_ne!(w.host_slices(), w.guest_view());
}

#[test]
fn without_remapping_the_guest_sees_gpu_errors_and_lost_writes() {
    let (_, bad) = check(Profile::Desktop, 1);
    assert!(bad.faults, "stale addresses fault on the destination");
    assert!(
        !bad.pages.is_empty(),
        "and the writes they were meant to do are missing"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(16))]
    /// Any profile, seed, cut point, drain depth and destination crowding. The cut comes at the
    /// latest in the fifth of six frames, so the destination always runs at least the last whole
    /// frame after the switch-over, whatever the drain.
    #[test]
    fn random_migrations_are_invisible_to_the_guest(
        p in 0usize..5,
        g in 0usize..3,
        seed in 0u64..1_000_000,
        at in 0u64..5,
        drain in 0usize..4,
        others in 0usize..3,
    ) {
        let profile = Profile::ALL[p];
        let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][g];
        let (reference, _) = run_on(gen, profile, seed, 6, &[], true);
        let (migrated, d, restored) =
            run_counting(gen, profile, seed, 6, &[(at, drain, others)], true);
        proptest::prop_assert_eq!(d.failures(), 0);
        let restored = restored.expect("the run was migrated");
        let dest_work = migrated.stats().workloads - restored;
        proptest::prop_assert!(
            dest_work > 0,
            "{:?} {:?} seed {} at {} drain {}: the destination ran no workload after the restore",
            gen, profile, seed, at, drain
        );
        let diff = compare_guest_visible(&reference, &migrated);
        proptest::prop_assert!(diff.is_identical(), "{:?} {:?} seed {} at {} drain {}: {:?}", gen, profile, seed, at, drain, diff);
        // The control: the same migration with remapping off. The restored state alone looks the
        // same either way, so it can only differ through the work the destination runs.
        let (broken, _) = run_on(gen, profile, seed, 6, &[(at, drain, others)], false);
        proptest::prop_assert!(
            !compare_guest_visible(&reference, &broken).is_identical(),
            "{:?} {:?} seed {} at {} drain {}: remapping off is still identical",
            gen, profile, seed, at, drain
        );
    }
}
