//! Differential checks: a workload checkpointed at a random point, restored onto other slices on
//! another host and continued ends byte-identical (guest RAM, registers, GGTT, faults) to the same
//! workload never migrated — and, as a negative control, differs when remapping is turned off.

use gmig_vgpu::checkpoint::{RestoreOptions, VgpuState};
use gmig_vgpu::compare::{compare_guest_visible, StateDiff};
use gmig_vgpu::gm::{Gen, HostConfig, PartitionManager, VgpuSlices, VgpuType};
use gmig_vgpu::gtt::{copy_guest_ram, new_guest_ram};
use gmig_vgpu::vgpu::{Vgpu, VgpuConfig};
use gmig_vgpu::work::Drain;
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
    let report = v.pause(Drain::workloads(drain));
    assert_eq!(report.queued, v.queued());
    let bytes = v.save().to_bytes();
    let state = VgpuState::from_bytes(&bytes).unwrap();
    let dest = destination(&v.host_slices(), others);
    let ram = copy_guest_ram(v.guest_memory()).unwrap();
    let mut w = Vgpu::restore(&state, ram, dest, RestoreOptions { remap }).unwrap();
    w.resume();
    w
}

/// A migration in a run: `(frame, workloads drained, vGPUs already on the destination,
/// commands of the frame the engines ran before the stop)`.
type Cut = (u64, usize, usize, u64);

/// Runs `frames` frames on a `gen` vGPU; before waiting on each frame listed in `cuts`, lets the
/// engines run the cut's commands of it and migrates the vGPU.
fn run_on(
    gen: Gen,
    profile: Profile,
    seed: u64,
    frames: u64,
    cuts: &[Cut],
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
    cuts: &[Cut],
    remap: bool,
) -> (Vgpu, GuestDriver, Option<u64>) {
    let (mut v, mut d) = boot(profile, seed, gen);
    let mut at_restore = None;
    for f in 0..frames {
        d.submit_frame(&mut v).unwrap();
        for &(at, drain, others, ahead) in cuts {
            if at == f {
                v.advance(ahead);
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
    let (migrated, md) = run_on(Gen::Gen9, profile, seed, frames, &[(at, drain, 1, 0)], true);
    let ok = compare_guest_visible(&reference, &migrated);
    assert_eq!(
        md.failures(),
        0,
        "{profile:?} seed {seed}: migrated run failed: {:?}",
        migrated.faults()
    );
    let (broken, _) = run_on(
        Gen::Gen9,
        profile,
        seed,
        frames,
        &[(at, drain, 1, 0)],
        false,
    );
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
        let (migrated, d) = run_on(
            Gen::Gen9,
            profile,
            11,
            10,
            &[(2, 0, 1, 3), (6, 0, 2, 0)],
            true,
        );
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
    let report = v.pause(Drain::workloads(1));
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
    /// Any profile, seed, cut point (between frames, or inside a running workload: `ahead`
    /// commands of the frame run before the stop), drain depth and destination crowding. The cut comes at the
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
        ahead in 0u64..24,
    ) {
        let profile = Profile::ALL[p];
        let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][g];
        let (reference, _) = run_on(gen, profile, seed, 6, &[], true);
        let (migrated, d, restored) =
            run_counting(gen, profile, seed, 6, &[(at, drain, others, ahead)], true);
        proptest::prop_assert_eq!(d.failures(), 0);
        let restored = restored.expect("the run was migrated");
        let dest_work = migrated.stats().workloads - restored;
        proptest::prop_assert!(
            dest_work > 0,
            "{:?} {:?} seed {} at {} drain {} ahead {}: the destination ran no workload after the restore",
            gen, profile, seed, at, drain, ahead
        );
        let diff = compare_guest_visible(&reference, &migrated);
        proptest::prop_assert!(diff.is_identical(), "{:?} {:?} seed {} at {} drain {} ahead {}: {:?}", gen, profile, seed, at, drain, ahead, diff);
        // The control: the same migration with remapping off. The restored state alone looks the
        // same either way, so it can only differ through the work the destination runs.
        let (broken, _) = run_on(gen, profile, seed, 6, &[(at, drain, others, ahead)], false);
        proptest::prop_assert!(
            !compare_guest_visible(&reference, &broken).is_identical(),
            "{:?} {:?} seed {} at {} drain {} ahead {}: remapping off is still identical",
            gen, profile, seed, at, drain, ahead
        );
    }
}

/// What a stop inside a running workload leaves for the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carry {
    /// The checkpoint as saved: the preempted workload resumes at its position.
    AsSaved,
    /// Control: the position dropped, as a device that saves none would do: the workload
    /// starts again from its first command on the destination.
    Restart,
    /// Control: the preempted workload dropped, as a device that carries only the work not yet
    /// started would do.
    Lose,
}

/// The frame a stop cuts into, in [`preempted_run`].
const CUT_FRAME: u64 = 2;

/// Runs 5 frames of `profile`; after submitting frame [`CUT_FRAME`] the engines run `ahead`
/// commands of it, the stop preempts what runs there ([`Drain::CARRY`]) and the vGPU is
/// restored onto other slices (`carry` says what of the preempted workload the destination
/// gets), then the guest goes on. Returns the vGPU, the driver and where the stop preempted.
fn preempted_run(
    profile: Profile,
    ahead: u64,
    remap: bool,
    carry: Carry,
) -> (Vgpu, GuestDriver, Option<(u64, u32)>) {
    let (mut v, mut d) = boot(profile, 5, Gen::Gen9);
    let mut preempted = None;
    for f in 0..5 {
        d.submit_frame(&mut v).unwrap();
        if f == CUT_FRAME {
            assert_eq!(
                v.advance(ahead),
                ahead,
                "{profile:?}: the frame has {ahead} commands"
            );
            let report = v.pause(Drain::CARRY);
            assert_eq!(report.executed, 0, "carrying runs nothing in the stop");
            preempted = report.preempted;
            let mut state = VgpuState::from_bytes(&v.save().to_bytes()).unwrap();
            assert_eq!(state.queue.len(), report.queued);
            if let Some((seq, next)) = preempted {
                let head = &state.queue[0];
                assert_eq!(
                    (head.seq, head.preempted.map(|p| p.next)),
                    (seq, Some(next))
                );
                match carry {
                    Carry::AsSaved => {}
                    Carry::Restart => state.queue[0].preempted = None,
                    Carry::Lose => {
                        state.queue.remove(0);
                    }
                }
            }
            let dest = destination(&v.host_slices(), 1);
            let ram = copy_guest_ram(v.guest_memory()).unwrap();
            v = Vgpu::restore(&state, ram, dest, RestoreOptions { remap }).unwrap();
            v.resume();
        }
        d.wait(&mut v).unwrap();
    }
    (v, d, preempted)
}

/// For every profile, stops at several command boundaries inside the running workloads of one
/// frame (the first workload's first, middle and last boundary, and inside the second, the
/// first then completed): the destination resumes the preempted workload where it stopped and
/// runs the queued ones, and the guest ends byte-identical to an unmigrated run, with the same
/// engine clock (no command run twice or skipped). Controls: remapping off differs; a
/// destination that restarts the preempted workload runs exactly the preempted commands again;
/// one that drops it differs.
#[test]
fn a_stop_inside_a_running_workload_resumes_it_there_for_every_profile() {
    for profile in Profile::ALL {
        let (reference, _) = run_on(Gen::Gen9, profile, 5, 5, &[], true);
        let (mut probe, mut d) = boot(profile, 5, Gen::Gen9);
        d.run_frames(&mut probe, CUT_FRAME).unwrap();
        d.submit_frame(&mut probe).unwrap();
        let lens: Vec<u64> = probe
            .save()
            .queue
            .iter()
            .map(|w| w.commands.len() as u64)
            .collect();
        let mut points = vec![1, lens[0] / 2, lens[0] - 1];
        if let Some(second) = lens.get(1) {
            points.push(lens[0] + (second / 2).max(1));
        }
        points.retain(|&k| k > 0);
        points.dedup();
        for k in points {
            let what = format!("{profile:?}, {k} commands into the frame ({lens:?})");
            let (migrated, d, preempted) = preempted_run(profile, k, true, Carry::AsSaved);
            let (seq, next) = preempted.unwrap_or_else(|| panic!("{what}: nothing preempted"));
            let first = lens[0];
            let expected_next = if k < first { k } else { k - first };
            assert_eq!(u64::from(next), expected_next, "{what}: seq {seq}");
            assert_eq!(d.failures(), 0, "{what}: {:?}", migrated.faults());
            let diff = compare_guest_visible(&reference, &migrated);
            assert!(diff.is_identical(), "{what}: {diff:?}");
            assert_eq!(
                migrated.stats().clock,
                reference.stats().clock,
                "{what}: every command ran exactly once"
            );

            let (broken, _, _) = preempted_run(profile, k, false, Carry::AsSaved);
            assert!(
                !compare_guest_visible(&reference, &broken).is_identical(),
                "{what}: remapping off is still identical"
            );
            let (restarted, _, _) = preempted_run(profile, k, true, Carry::Restart);
            assert_eq!(
                restarted.stats().clock,
                reference.stats().clock + u64::from(next),
                "{what}: restarting runs the preempted commands again"
            );
            let (lost, _, _) = preempted_run(profile, k, true, Carry::Lose);
            assert!(
                !compare_guest_visible(&reference, &lost).is_identical()
                    || lost.stats().clock != reference.stats().clock,
                "{what}: dropping the preempted workload changes nothing"
            );
        }
    }
}

/// A checkpoint whose preemption point is not a command boundary of its workload (past the
/// end, at the start, or a ring head that disagrees with the command list) is refused, not run.
#[test]
fn a_tampered_preemption_point_is_refused() {
    let (mut v, mut d) = boot(Profile::ThreeD, 5, Gen::Gen9);
    d.run_frames(&mut v, 1).unwrap();
    d.submit_frame(&mut v).unwrap();
    v.advance(3);
    v.pause(Drain::CARRY);
    let state = v.save();
    let p = state.queue[0]
        .preempted
        .expect("preempted after 3 commands");
    let dest = destination(&v.host_slices(), 1);
    let len = state.queue[0].commands.len() as u32;
    let tampered = [
        gmig_vgpu::work::Preemption { next: len, ..p },
        gmig_vgpu::work::Preemption { next: 0, ..p },
        gmig_vgpu::work::Preemption {
            ring_head: p.ring_head + 4,
            ..p
        },
    ];
    for bad in tampered {
        let mut s = state.clone();
        s.queue[0].preempted = Some(bad);
        let ram = copy_guest_ram(v.guest_memory()).unwrap();
        let err = Vgpu::restore(&s, ram, dest, RestoreOptions { remap: true }).unwrap_err();
        assert!(
            err.to_string().contains("preemption point"),
            "{bad:?}: {err}"
        );
    }
    let mut s = state.clone();
    s.queue[1].preempted = Some(p);
    let ram = copy_guest_ram(v.guest_memory()).unwrap();
    assert!(Vgpu::restore(&s, ram, dest, RestoreOptions { remap: true }).is_err());
}

/// A drain bounded by time: out of time, it completes nothing and leaves the work queued; with
/// time, it completes up to its count. Whatever it ran, the guest ends as an unmigrated one.
#[test]
fn a_drain_is_bounded_by_time_as_well_as_count() {
    let (reference, _) = run_on(Gen::Gen9, Profile::ThreeD, 5, 5, &[], true);
    for (drain, expect) in [
        (
            Drain {
                workloads: usize::MAX,
                time: Some(std::time::Duration::ZERO),
            },
            Some(0),
        ),
        (
            Drain {
                workloads: 1,
                time: Some(std::time::Duration::from_secs(60)),
            },
            Some(1),
        ),
        (
            Drain {
                workloads: 2,
                time: Some(std::time::Duration::from_micros(20)),
            },
            None,
        ),
    ] {
        let (mut v, mut d) = boot(Profile::ThreeD, 5, Gen::Gen9);
        for f in 0..5 {
            d.submit_frame(&mut v).unwrap();
            if f == CUT_FRAME {
                let queued = v.queued();
                let report = v.pause(drain);
                if let Some(n) = expect {
                    assert_eq!(report.executed, n, "{drain:?}");
                }
                assert_eq!(report.executed + report.queued, queued, "{drain:?}");
                let state = VgpuState::from_bytes(&v.save().to_bytes()).unwrap();
                let dest = destination(&v.host_slices(), 1);
                let ram = copy_guest_ram(v.guest_memory()).unwrap();
                v = Vgpu::restore(&state, ram, dest, RestoreOptions { remap: true }).unwrap();
                v.resume();
            }
            d.wait(&mut v).unwrap();
        }
        let diff = compare_guest_visible(&reference, &v);
        assert!(diff.is_identical(), "{drain:?}: {diff:?}");
        assert_eq!(v.stats().clock, reference.stats().clock, "{drain:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// Engines that run the queued work in arbitrary slices of commands (each slice continuing
    /// the last one's state, a preempted workload resumed where it stopped) leave the guest
    /// exactly as engines that run each workload whole.
    #[test]
    fn running_work_in_slices_equals_running_it_whole(
        p in 0usize..5,
        seed in 0u64..1_000_000,
        slices in proptest::collection::vec(1u64..9, 1..12),
    ) {
        let profile = Profile::ALL[p];
        let (reference, _) = run_on(Gen::Gen9, profile, seed, 4, &[], true);
        let (mut v, mut d) = boot(profile, seed, Gen::Gen9);
        for _ in 0..4 {
            d.submit_frame(&mut v).unwrap();
            for &n in &slices {
                v.advance(n);
            }
            d.wait(&mut v).unwrap();
        }
        proptest::prop_assert_eq!(d.failures(), 0);
        let diff = compare_guest_visible(&reference, &v);
        proptest::prop_assert!(diff.is_identical(), "{:?} seed {} {:?}: {:?}", profile, seed, slices, diff);
        proptest::prop_assert_eq!(v.stats().clock, reference.stats().clock);
        proptest::prop_assert_eq!(v.stats().workloads, reference.stats().workloads);
    }
}
