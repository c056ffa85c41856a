//! A hostile guest's workloads are refused before execution and reported as GPU errors; the
//! hostile vGPU and its neighbours on the same host keep working.

use gmig_cmdparser::build::{self, Rect};
use gmig_cmdparser::{by_name, AddressSpace, Engine, Gen};
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::{HostConfig, PartitionManager, VgpuType};
use gmig_vgpu::gtt::new_guest_ram;
use gmig_vgpu::mmio::{self, EngineId};
use gmig_vgpu::vgpu::{Vgpu, VgpuConfig};
use gmig_vgpu::work::FaultKind;
use gmig_vgpu::workload::{GuestDriver, Profile, WorkloadConfig};

const RAM: usize = 32 << 20;

struct Host {
    vgpus: Vec<(Vgpu, GuestDriver)>,
}

fn host(n: usize, seed: u64) -> Host {
    let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
    let mut vgpus = Vec::new();
    for i in 0..n {
        let (_, s) = pm.place(VgpuType::V5_8).unwrap();
        let mut v = Vgpu::new(
            VgpuConfig::new(VgpuType::V5_8, i as u32 + 1),
            s,
            new_guest_ram(RAM).unwrap(),
        )
        .unwrap();
        let d = GuestDriver::boot(
            &mut v,
            Profile::Desktop,
            WorkloadConfig::small(),
            seed + i as u64,
        )
        .unwrap();
        vgpus.push((v, d));
    }
    Host { vgpus }
}

/// Two hosts of two vGPUs each, every guest two frames in: one for an attack, one without it.
fn warmed_hosts() -> (Host, Host) {
    let mut h = host(2, 40);
    let mut quiet = host(2, 40);
    for hh in [&mut h, &mut quiet] {
        for (v, d) in &mut hh.vgpus {
            d.run_frames(v, 2).unwrap();
        }
    }
    (h, quiet)
}

/// Submits `cmds` from the hostile guest (vGPU 0), checks the refusal, then checks everyone
/// keeps working and the neighbour is exactly where a run without the attack would be.
fn attack(cmds: impl Fn(&Host) -> Vec<u32>, want: FaultKind) -> String {
    let (mut h, mut quiet) = warmed_hosts();
    let bad = cmds(&h);
    let (v0, d0) = &mut h.vgpus[0];
    let executed_before = v0.stats().executed;
    d0.submit_raw_batch(v0, EngineId::Blitter, &bad).unwrap();
    let rep = d0.wait(v0).unwrap();
    assert_eq!(rep.failed, 1, "the guest sees its submission fail");
    let fault = v0.faults().last().cloned().expect("a fault is reported");
    assert_eq!(fault.kind, want, "{fault:?}");
    assert_eq!(
        v0.stats().executed,
        executed_before,
        "nothing of the refused workload ran"
    );
    let fault_reg = v0.mmio_read32(mmio::RING_FAULT_REG).unwrap();
    assert_eq!(fault_reg & 1, 1, "RING_FAULT_REG valid bit");
    assert_eq!((fault_reg >> 12) & 3, EngineId::Blitter.index() as u32);
    goes_on_and_spares_the_neighbour(&mut h, &mut quiet);
    fault.reason
}

/// After an attack by vGPU 0 of `h`: its later frames complete, and the neighbour (vGPU 1) ends
/// identical to the same guest on `quiet`, a host without the attack.
fn goes_on_and_spares_the_neighbour(h: &mut Host, quiet: &mut Host) {
    let (v0, d0) = &mut h.vgpus[0];
    let failures = d0.failures();
    d0.run_frames(v0, 3).unwrap();
    assert_eq!(d0.failures(), failures, "later frames complete");
    for hh in [&mut *h, &mut *quiet] {
        let (v1, d1) = &mut hh.vgpus[1];
        d1.run_frames(v1, 3).unwrap();
    }
    let diff = compare_guest_visible(&h.vgpus[1].0, &quiet.vgpus[1].0);
    assert!(diff.is_identical(), "{diff:?}");
    assert_eq!(h.vgpus[1].1.failures(), 0);
}

#[test]
fn out_of_slice_blit_is_refused() {
    let reason = attack(
        |h| {
            // Fill the neighbour's scanout.
            let victim = h.vgpus[1].0.guest_view().aperture.base.0;
            build::xy_color_blt(
                victim,
                1024,
                4,
                Rect {
                    x1: 0,
                    y1: 0,
                    x2: 256,
                    y2: 16,
                },
                0xdead_beef,
            )
        },
        FaultKind::Audit,
    );
    assert!(reason.contains("XY_COLOR_BLT"), "{reason}");
}

#[test]
fn blit_straddling_the_slice_end_is_refused() {
    let _ = attack(
        |h| {
            let s = h.vgpus[0].0.guest_view().aperture;
            let near_end = s.base.0 + s.size - 4096;
            build::xy_color_blt(
                near_end,
                4096,
                4,
                Rect {
                    x1: 0,
                    y1: 0,
                    x2: 1024,
                    y2: 4,
                },
                1,
            )
        },
        FaultKind::Audit,
    );
}

#[test]
fn forbidden_command_is_refused() {
    let reason = attack(
        |_| {
            let d = by_name(Gen::Gen9, Engine::Blitter, "MI_UPDATE_GTT")
                .expect("MI_UPDATE_GTT in the tables");
            let mut v = vec![d.header(4), 0, 0, 0];
            v[1] = 0x1000;
            v
        },
        FaultKind::Audit,
    );
    assert!(reason.contains("MI_UPDATE_GTT"), "{reason}");
}

/// A batch that chains to itself for ever (a spinner with no way out) spins on its own engine
/// as on hardware: each run of the engines turns the loop once (bounded host work), its context
/// never completes, the guest's engine reset (GDRST, as i915's hang recovery does) clears it,
/// and the neighbour is untouched.
#[test]
fn a_self_looping_batch_spins_its_own_engine_until_reset() {
    let (mut h, mut quiet) = warmed_hosts();
    let (v0, d0) = &mut h.vgpus[0];
    let b = d0.next_batch(EngineId::Blitter);
    let spin = build::mi_batch_buffer_start(AddressSpace::Ggtt, b.gpu, false);
    d0.submit_raw_batch(v0, EngineId::Blitter, &spin).unwrap();
    let before = v0.stats().executed;
    for _ in 0..5 {
        v0.run_until_idle();
    }
    assert_eq!(v0.queued(), 1, "the spinner completed");
    let turns = v0.stats().executed - before;
    assert!(
        (5..=5 * 8).contains(&turns),
        "{turns} commands for five runs of the engines"
    );
    assert!(v0.faults().is_empty(), "{:?}", v0.faults());
    // i915's hang recovery resets the engine: the spinner is gone.
    v0.mmio_write32(0x941c, 1 << 3).unwrap();
    assert_eq!(v0.queued(), 0);
    let rep = d0.wait(v0).unwrap();
    assert_eq!(rep.failed, 1, "the spinner's frame never completed");
    // The neighbour ran on, as on a host without the spinner. (The guest-driver model has no
    // hang recovery: i915 would also move the context's ring head past the hung request.)
    for hh in [&mut h, &mut quiet] {
        let (v1, d1) = &mut hh.vgpus[1];
        d1.run_frames(v1, 3).unwrap();
    }
    let diff = compare_guest_visible(&h.vgpus[1].0, &quiet.vgpus[1].0);
    assert!(diff.is_identical(), "{diff:?}");
    assert_eq!(h.vgpus[1].1.failures(), 0);
}

#[test]
fn register_write_outside_the_whitelist_is_refused() {
    let _ = attack(
        |_| build::mi_load_register_imm(&[(0x2030, 0)]),
        FaultKind::Audit,
    );
}

/// A Y-tiled fast copy whose real extent runs past the end of the guest's aperture slice. Whether
/// the parser's audit catches it or not, nothing lands outside the vGPU: the engine reaches memory
/// only through this vGPU's own GGTT slices.
#[test]
fn tiled_fast_copy_past_the_slice_end_never_escapes() {
    let mut h = host(2, 50);
    let mut quiet = host(2, 50);
    for hh in [&mut h, &mut quiet] {
        for (v, d) in &mut hh.vgpus {
            d.run_frames(v, 1).unwrap();
        }
    }
    let ap = h.vgpus[0].0.guest_view().aperture;
    let src = h.vgpus[0].1.object("cursor").unwrap().gpu;
    let dst = ap.base.0 + ap.size - 64 * 1024;
    let mut cmd = build::xy_fast_copy_blt(
        dst,
        64,
        Rect {
            x1: 0,
            y1: 0,
            x2: 8,
            y2: 1024,
        },
        src,
        256,
        0,
        0,
        4,
    );
    cmd[0] |= 2 << 13; // destination legacy Y-tiled: 32 rows per tile, 256-byte pitch
    let (v0, d0) = &mut h.vgpus[0];
    d0.submit_raw_batch(v0, EngineId::Blitter, &cmd).unwrap();
    let rep = d0.wait(v0).unwrap();
    assert_eq!(rep.failed, 1);
    let kind = v0.faults().last().unwrap().kind;
    // The audit sizes a Y-tiled destination by its tiles, so it refuses this before anything runs
    // (an audit that sized it as linear would let the engine's memory check be the only guard).
    assert_eq!(kind, FaultKind::Audit);
    eprintln!(
        "tiled fast copy past the slice end: {:?}",
        v0.faults().last().unwrap()
    );
    for hh in [&mut h, &mut quiet] {
        let (v1, d1) = &mut hh.vgpus[1];
        d1.run_frames(v1, 2).unwrap();
    }
    assert!(compare_guest_visible(&h.vgpus[1].0, &quiet.vgpus[1].0).is_identical());
    let (v0, d0) = &mut h.vgpus[0];
    let failures = d0.failures();
    d0.run_frames(v0, 2).unwrap();
    assert_eq!(d0.failures(), failures);
}

/// A guest that writes ELSP in a loop without ever waiting: beyond
/// `MAX_PENDING_PER_ENGINE` waiting submissions each one is refused as a flood (before any
/// shadowing) and completed, so the queue, the fault log and the state a migration carries stay
/// bounded; the guest sees its flood fail, goes on working afterwards, and the neighbour ends
/// exactly where it would on a host with no attack.
#[test]
fn elsp_flood_is_refused_beyond_the_pending_bound_and_the_neighbour_is_untouched() {
    use gmig_vgpu::vgpu::{MAX_FAULT_RECORDS, MAX_PENDING_PER_ENGINE};
    let mut h = host(2, 40);
    let mut quiet = host(2, 40);
    for hh in [&mut h, &mut quiet] {
        for (v, d) in &mut hh.vgpus {
            d.run_frames(v, 2).unwrap();
        }
    }
    let (v0, d0) = &mut h.vgpus[0];
    let state_before = v0.save().to_bytes().len();
    let flood = 8 * MAX_PENDING_PER_ENGINE;
    for _ in 0..flood {
        d0.submit_raw_batch(v0, EngineId::Blitter, &build::mi_noop())
            .unwrap();
    }
    assert_eq!(v0.queued(), MAX_PENDING_PER_ENGINE, "the queue is bounded");
    let refused = flood - MAX_PENDING_PER_ENGINE;
    assert_eq!(v0.stats().refused, refused as u64);
    assert_eq!(
        v0.faults().len(),
        MAX_FAULT_RECORDS,
        "the fault log is bounded"
    );
    assert!(v0.faults().iter().all(|f| f.kind == FaultKind::Flood));
    assert!(
        v0.faults()[0].reason.contains("pending"),
        "{:?}",
        v0.faults()[0]
    );
    let fault_reg = v0.mmio_read32(mmio::RING_FAULT_REG).unwrap();
    assert_eq!((fault_reg >> 1) & 0x7ff, 5, "flood code in RING_FAULT_REG");
    // What a migration would carry grows by the bounded queue and log, not by the flood.
    let state_during = v0.save().to_bytes().len();
    let mut bigger = host(2, 40);
    let (vb, db) = &mut bigger.vgpus[0];
    db.run_frames(vb, 2).unwrap();
    for _ in 0..2 * flood {
        db.submit_raw_batch(vb, EngineId::Blitter, &build::mi_noop())
            .unwrap();
    }
    assert_eq!(
        vb.save().to_bytes().len(),
        state_during,
        "twice the flood, same state size"
    );
    assert!(state_during > state_before);
    // The guest sees the flood fail (its last submission never completed), then works again.
    let rep = d0.wait(v0).unwrap();
    assert_eq!(rep.failed, 1);
    assert_eq!(v0.queued(), 0);
    goes_on_and_spares_the_neighbour(&mut h, &mut quiet);
}
