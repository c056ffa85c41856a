//! Fuzz harnesses for the decoders that read untrusted bytes, shared by the `cargo fuzz` targets
//! in `fuzz/` and by the smoke tests CI runs (`tests/fuzz_smoke.rs`), so that a harness that
//! stops compiling or starts panicking is caught on every push, not only in a fuzz campaign.
//!
//! Each harness panics only when a guarantee is broken; every error it sees is an expected,
//! reported refusal.

use gmig_cmdparser::aub::listing::{list_capture, LISTING_BUDGET};
use gmig_cmdparser::aub::AubReader;
use gmig_core::migration::{record_stream, MigrationConfig, Policy, SaveSettings, VmDevice};
use gmig_core::stream::{load, Section, StreamDecoder, StreamLimits};
use gmig_vfio_migration::{DeviceState, MigrationHandle};
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::{VgpuSlices, VgpuType};
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
use gmig_vgpu::workload::{Profile, WorkloadConfig};

/// Guest RAM of the harnesses' vGPUs (small: one is built per input).
pub const FUZZ_RAM: u64 = 4 << 20;
const TY: VgpuType = VgpuType::V5_8;

/// Feeds `data[1..]` to the push decoder in segments of `data[0] + 1` bytes, pulling sections
/// after each, and reads the same bytes with the pull reader. Both must agree on whether the
/// stream is valid and, when it is, on its sections; neither may panic or read past the input.
pub fn stream_decode(data: &[u8]) {
    let Some((&seg, bytes)) = data.split_first() else {
        return;
    };
    let seg = usize::from(seg) + 1;
    let limits = StreamLimits::default();
    let mut push = StreamDecoder::new(limits, None);
    let mut pushed = Vec::new();
    let mut push_err = false;
    'feed: for piece in bytes.chunks(seg) {
        if push.feed(piece).is_err() {
            push_err = true;
            break;
        }
        loop {
            match push.next_section() {
                Ok(Some(s)) => pushed.push(s),
                Ok(None) => break,
                Err(_) => {
                    push_err = true;
                    break 'feed;
                }
            }
        }
    }
    let complete = !push_err && push.finished().is_some();
    let pulled = load(bytes, limits, None);
    assert_eq!(
        complete,
        pulled.is_ok(),
        "push decoder and pull reader disagree on a {}-byte input",
        bytes.len()
    );
    if let Ok(l) = pulled {
        let states = pushed
            .iter()
            .filter(|s| matches!(s, Section::State { .. }))
            .count();
        let batches = pushed
            .iter()
            .filter(|s| matches!(s, Section::Pages(_)))
            .count();
        assert_eq!(states, l.states.len());
        assert_eq!(batches, l.batches.len());
    }
}

/// Reads an AUB capture to its end, event by event (bounded), then lists it.
pub fn aub_read(data: &[u8]) {
    let mut r = AubReader::new(data);
    for _ in 0..100_000 {
        match r.next_event() {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    // After the end or an error, the reader yields nothing more.
    assert!(matches!(r.next_event(), Ok(None)));
    let _ = list_capture(data, None, LISTING_BUDGET);
}

fn slices() -> (VgpuSlices, VgpuSlices) {
    crate::moved_slices(TY)
}

const MAX_DRAIN: usize = 2;

fn settings() -> SaveSettings {
    let mut c = MigrationConfig::new(Policy::OneShot);
    c.hash_threads = 1;
    c.max_drain = MAX_DRAIN;
    SaveSettings::from(&c)
}

fn factory(d: VgpuSlices) -> VgpuFactory {
    VgpuFactory::new(gmig_cmdparser::Gen::Gen9, TY, d, FUZZ_RAM)
}

fn running_vgpu(s: VgpuSlices, seed: u64) -> VgpuVm {
    let mut vm = VgpuVm::boot(
        TY,
        s,
        FUZZ_RAM,
        Profile::Desktop,
        WorkloadConfig::small(),
        seed,
    )
    .expect("boot the harness vGPU");
    vm.run_steps(2).expect("run the harness vGPU");
    vm
}

/// A valid migration stream of a small running vGPU, as the seed of the resume harness.
pub fn seed_stream() -> Vec<u8> {
    let (s, _) = slices();
    let mut c = MigrationConfig::new(Policy::OneShot);
    c.hash_threads = 1;
    let (stream, _) = record_stream(running_vgpu(s, 3), &c).expect("record a seed stream");
    stream
}

/// Resumes `data` into a device that holds a running vGPU (RESUMING, write, STOP). Either the
/// stream is valid and the device now holds a restored vGPU, or the resume fails and, after the
/// VMM's recovery (reset), the device still holds the vGPU it had, identical and running.
/// Returns whether the stream was accepted.
pub fn vgpu_resume(data: &[u8]) -> bool {
    let (_, d) = slices();
    let held = running_vgpu(d, 7);
    // RUNNING -> RESUMING passes STOP, whose bounded drain lets in-flight work finish; a failed
    // resume must leave exactly that: the vGPU as the stop left it, running again.
    let mut reference = held.vgpu().clone();
    reference.pause(MAX_DRAIN);
    reference.resume();
    let dev =
        VmDevice::new(Some(held), factory(d), StreamLimits::default(), settings()).expect("device");
    let mut h = MigrationHandle::new(dev).expect("handle");
    let Some(id) = h
        .set_state(DeviceState::Resuming)
        .ok()
        .and_then(|t| t.new_stream)
        .map(|s| s.id)
    else {
        panic!("RUNNING -> RESUMING refused");
    };
    let written = h.write(id, data).is_ok();
    if written && h.set_state(DeviceState::Stop).is_ok() {
        assert!(h.device().vm().is_some(), "a resumed stream left no vGPU");
        return true;
    }
    // Recovery as a VMM does it: back to RUNNING, through a reset if the device is in ERROR.
    if h.set_state(DeviceState::Running).is_err() {
        h.reset().expect("reset after a failed resume");
        h.set_state(DeviceState::Running)
            .expect("RUNNING after the reset");
    }
    let vm = h
        .device()
        .vm()
        .expect("the held vGPU survives a failed resume");
    let diff = compare_guest_visible(&reference, vm.vgpu());
    assert!(
        diff.is_identical(),
        "a failed resume ({} bytes, written: {written}) changed the held vGPU: {diff:?}",
        data.len()
    );
    false
}
