//! A guest on its own clock ([`ClockedVm`]) on the synthetic VM: it draws during pre-copy while
//! the engine sends nothing, and the migrated guest equals an unmigrated run of as many steps.
//! Controls: a batch-stepped guest does not draw while the engine waits; a VM that reports no
//! written page (dirty tracking off) makes the migrated guest differ.

use std::thread;
use std::time::{Duration, Instant};

use gmig_core::migration::synthetic::{SyntheticConfig, SyntheticFactory, SyntheticVm};
use gmig_core::migration::{
    migrate_destination, migrate_source, source_handle, Candidates, ClockedVm, Drain, MigratableVm,
    MigrationConfig, MigrationPhase, Policy, VmError,
};
use gmig_core::stream::{Gfn, StateKind, StreamHeader};
use gmig_test_support::tcp_pair;
use vm_memory::GuestMemoryMmap;

const SRC_AP: u64 = 0x0400_0000;
const SRC_HID: u64 = 0x4000_0000;
const AFTER: u64 = 20;

fn synth() -> SyntheticConfig {
    SyntheticConfig {
        pages: 4096,
        seed: 11,
        max_cmd_pages: 8,
        opaque_every: 0,
    }
}

/// The negative control: a VM whose dirty tracking reports no page written.
struct Blind(SyntheticVm);

impl MigratableVm for Blind {
    fn stream_header(&self) -> StreamHeader {
        self.0.stream_header()
    }
    fn memory(&self) -> &GuestMemoryMmap {
        self.0.memory()
    }
    fn migratable_pages(&self) -> Vec<Gfn> {
        self.0.migratable_pages()
    }
    fn step(&mut self) -> Result<(), VmError> {
        self.0.step()
    }
    fn start_write_tracking(&mut self) {
        self.0.start_write_tracking();
    }
    fn stop_write_tracking(&mut self) {
        self.0.stop_write_tracking();
    }
    fn write_candidates(&mut self) -> Candidates {
        Candidates::Pages(Vec::new())
    }
    fn quiesce(&mut self, drain: Drain) -> Result<usize, VmError> {
        self.0.quiesce(drain)
    }
    fn unquiesce(&mut self) -> Result<(), VmError> {
        self.0.unquiesce()
    }
    fn save_state(&self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        self.0.save_state()
    }
}

struct Outcome {
    /// Steps the guest ran while the engine was held in its progress callback, sending nothing.
    while_held: u64,
    /// Steps it ran before the stop.
    at_stop: u64,
    /// The destination, run on `AFTER` steps and finished, equals an unmigrated run of as many.
    identical: bool,
}

/// Migrates a synthetic guest with one-shot-narrow; the first time the engine reports pre-copy
/// progress it is held until the guest has run three steps, or for `hold` at most.
fn run<V: MigratableVm + 'static>(
    vm: ClockedVm<V>,
    stepped: bool,
    hold: Duration,
    into_synthetic: impl FnOnce(V) -> SyntheticVm,
) -> Outcome {
    let mut cfg = MigrationConfig::new(Policy::OneShotNarrow);
    cfg.hash_threads = 2;
    cfg.batch_pages = 64;
    cfg.timeout = Duration::from_secs(60);
    cfg.step_every_batches = u64::from(stepped);
    let (a, b) = tcp_pair();
    let dcfg = cfg.clone();
    let factory = SyntheticFactory {
        aperture_base: 0x1000_0000,
        hidden_base: 0x8000_0000,
        skip_remap: false,
    };
    let dest = thread::spawn(move || migrate_destination(factory, b, &dcfg));
    let counter = vm.frame_counter();
    let mut held = None;
    let mut handle = source_handle(vm, &cfg).unwrap();
    let report = migrate_source(&mut handle, a, &cfg, &mut |p| {
        if held.is_none() && p.phase == MigrationPhase::PreCopy {
            let before = counter.get();
            let until = Instant::now() + hold;
            while counter.get() < before + 3 && Instant::now() < until {
                thread::sleep(Duration::from_millis(1));
            }
            held = Some(counter.get() - before);
        }
    })
    .unwrap();
    let (mut moved, _) = dest.join().unwrap().unwrap();
    let src = into_synthetic(handle.into_device().into_vm().stop().unwrap());
    let at_stop = src.submitted();
    assert_eq!(
        report.pages_stop_copy + report.pages_precopy,
        report.pages_total
    );
    for _ in 0..AFTER {
        moved.step().unwrap();
    }
    moved.finish().unwrap();
    let mut reference = SyntheticVm::new(synth(), SRC_AP, SRC_HID).unwrap();
    for _ in 0..at_stop + AFTER {
        reference.step().unwrap();
    }
    reference.finish().unwrap();
    assert_eq!(reference.submitted(), moved.submitted());
    Outcome {
        while_held: held.expect("the engine reported pre-copy progress"),
        at_stop,
        identical: reference.guest_digest().unwrap() == moved.guest_digest().unwrap(),
    }
}

#[test]
fn a_clocked_guest_draws_while_the_engine_sends_nothing_and_migrates_exactly() {
    let vm = SyntheticVm::new(synth(), SRC_AP, SRC_HID).unwrap();
    let clocked = ClockedVm::start(vm, Some(Duration::from_millis(1))).unwrap();
    let o = run(clocked, false, Duration::from_secs(30), |v| v);
    assert!(
        o.while_held >= 3,
        "the guest ran {} steps while the engine was held",
        o.while_held
    );
    assert!(o.at_stop >= 3, "{} steps before the stop", o.at_stop);
    assert!(
        o.identical,
        "the migrated guest differs after {} steps",
        o.at_stop
    );

    // Control: stepped by the engine, the guest stands still while the engine does.
    let vm = SyntheticVm::new(synth(), SRC_AP, SRC_HID).unwrap();
    let o = run(
        ClockedVm::stepped(vm),
        true,
        Duration::from_millis(200),
        |v| v,
    );
    assert_eq!(
        o.while_held, 0,
        "a batch-stepped guest ran while the engine was held"
    );
    assert!(o.at_stop > 0, "the engine stepped it between batches");
    assert!(o.identical);
}

#[test]
fn with_dirty_tracking_off_the_clocked_guest_migrates_wrong() {
    // The guest rewrites its ring (the first pages sent) at every step, and at least three steps
    // land after the first batch went: with no written page reported, they are never resent.
    let vm = Blind(SyntheticVm::new(synth(), SRC_AP, SRC_HID).unwrap());
    let clocked = ClockedVm::start(vm, Some(Duration::from_millis(1))).unwrap();
    let o = run(clocked, false, Duration::from_secs(30), |v| v.0);
    assert!(o.while_held >= 3, "{} steps", o.while_held);
    assert!(
        !o.identical,
        "a blind migration of a running guest came out identical"
    );
}
