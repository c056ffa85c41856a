//! The bench's guest model (the guest driver on the reference vGPU) on its own clock
//! ([`ClockedVm`]): it draws during pre-copy while the engine is held and sends nothing, for the
//! profiles the bench runs as fast as the vGPU goes and the one it runs at 60 fps, and the
//! destination, given the driver, ends identical to an unmigrated run of as many frames. Control:
//! the batch-stepped guest draws nothing while the engine is held.

use std::thread;
use std::time::{Duration, Instant};

use gmig_core::migration::{
    migrate_destination, migrate_source, source_handle, ClockedVm, MigrationConfig, MigrationPhase,
    Policy,
};
use gmig_test_support::tcp_pair;
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
use gmig_vgpu::scenario::GuestClock;
use gmig_vgpu::workload::{Profile, WorkloadConfig};

const RAM: u64 = 32 << 20;
const TY: VgpuType = VgpuType::V5_8;

/// Migrates a `profile` guest timed by `clock` with one-shot-narrow; the first pre-copy progress
/// report holds the engine until the guest has drawn two frames, or for `hold` at most. Returns
/// the frames drawn while held and whether the destination, run on two frames, equals an
/// unmigrated run of as many.
fn run(profile: Profile, clock: GuestClock, hold: Duration) -> (u64, bool) {
    let (s, d) = gmig_test_support::moved_slices(TY);
    let boot = || VgpuVm::boot(TY, s, RAM, profile, WorkloadConfig::small(), 5).unwrap();
    let mut vm = boot();
    vm.run_steps(2).unwrap();
    let mut cfg = MigrationConfig::new(Policy::OneShotNarrow);
    cfg.hash_threads = 2;
    cfg.timeout = Duration::from_secs(60);
    cfg.step_every_batches = clock.step_every_batches();
    let clocked = match clock {
        GuestClock::Clocked { .. } => ClockedVm::start(vm, clock.interval()).unwrap(),
        GuestClock::Batches(_) => ClockedVm::stepped(vm),
    };
    let counter = clocked.frame_counter();
    let (a, b) = tcp_pair();
    let dcfg = cfg.clone();
    let factory = VgpuFactory::new(gmig_cmdparser::Gen::Gen9, TY, d, RAM);
    let dest = thread::spawn(move || migrate_destination(factory, b, &dcfg));
    let mut held = None;
    let mut handle = source_handle(clocked, &cfg).unwrap();
    migrate_source(&mut handle, a, &cfg, &mut |p| {
        if held.is_none() && p.phase == MigrationPhase::PreCopy {
            let before = counter.get();
            let until = Instant::now() + hold;
            while counter.get() < before + 2 && Instant::now() < until {
                thread::sleep(Duration::from_millis(1));
            }
            held = Some(counter.get() - before);
        }
    })
    .unwrap();
    let (mut moved, _) = dest.join().unwrap().unwrap();
    let mut src = handle.into_device().into_vm().stop().unwrap();
    moved.attach_driver(src.take_driver().unwrap());
    moved.run_steps(2).unwrap();
    moved.finish().unwrap();
    let mut reference = boot();
    reference.run_steps(moved.frames()).unwrap();
    reference.finish().unwrap();
    let identical = reference.frames() == moved.frames()
        && compare_guest_visible(reference.vgpu(), moved.vgpu()).is_identical();
    (held.expect("pre-copy progress was reported"), identical)
}

#[test]
fn the_guest_model_draws_on_its_own_clock_and_migrates_exactly() {
    for (profile, clock) in [
        (Profile::Desktop, GuestClock::Clocked { fps: Some(60.0) }),
        (Profile::ThreeD, GuestClock::Clocked { fps: None }),
        (Profile::Compute, GuestClock::Clocked { fps: None }),
    ] {
        let (held, identical) = run(profile, clock, Duration::from_secs(30));
        assert!(
            held >= 2,
            "{profile:?}: {held} frames while the engine was held"
        );
        assert!(identical, "{profile:?}: the migrated guest differs");
    }
    // Control: stepped by the engine, the guest waits for it.
    let (held, identical) = run(
        Profile::Desktop,
        GuestClock::Batches(8),
        Duration::from_millis(200),
    );
    assert_eq!(
        held, 0,
        "a batch-stepped guest drew while the engine was held"
    );
    assert!(identical);
}
