//! The reference vGPU served over vfio-user: a client sees an Intel GPU in config space, the PV
//! info page and GGTT entries in BAR0, and the vGPU runs on the client's own RAM; two servers and
//! gmig's client migrate it while its guest-driver workload runs, and the destination — on other
//! GGTT slices, on the destination client's RAM — equals the same workload never migrated.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::thread::JoinHandle;

use gmig_cmdparser::VgpuSlices;
use gmig_qemu_bridge::client::Client;
use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vfio_migration::DeviceState;
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::migratable::VgpuVm;
use gmig_vgpu::mmio;
use gmig_vgpu::workload::{Profile, WorkloadConfig};

mod common;

const RAM: u64 = 32 << 20;
const TY: VgpuType = VgpuType::V5_8;
const SEED: u64 = 17;

/// Commands of each frame the source's GPU runs as the guest submits it: the desktop's first
/// workload has more, so the stop finds it part-way.
const GPU_AHEAD: u64 = 3;

/// A vfio-user server for a vGPU on `slices`, with the guest-driver model `profile` (a source,
/// its GPU [`GPU_AHEAD`] commands into each frame) or none (a destination), restoring with
/// remapping on or (negative controls) off. Its stop runs nothing (`Drain::CARRY`): the workload
/// part-way is preempted and travels with the queued ones; the destination resumes it.
fn spawn(
    slices: VgpuSlices,
    profile: Option<Profile>,
    remap: bool,
) -> (PathBuf, JoinHandle<VgpuBackend>, tempfile::TempDir) {
    let spec = VgpuSpec {
        profile: profile.map(|p| (p, SEED)),
        remap,
        gpu_ahead: if profile.is_some() { GPU_AHEAD } else { 0 },
        ..common::spec(TY, slices, false)
    };
    common::serve(spec, 1)
}

fn attach(path: &std::path::Path) -> (Client, std::fs::File) {
    let mut c = Client::connect(path).unwrap();
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(RAM).unwrap();
    c.dma_map(&ram, 0, 0, RAM).unwrap();
    (c, ram)
}

#[test]
fn a_client_sees_an_intel_gpu_with_the_pv_info_page_on_its_own_ram() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, None, true);
    let (mut c, ram) = attach(&path);
    // The vGPU hashes and executes on guest RAM in place: memory it cannot map (no descriptor, to
    // be reached by DMA_READ / DMA_WRITE messages) is taken, as an IOMMU takes a mapping, and
    // never used (`tests/qemu_interop.rs` has the GPU accesses there).
    c.dma_map_local(RAM, 1 << 20).unwrap();
    assert_eq!(c.dma_requests_served(), 0);
    let id = c.region_read(7, 0, 4).unwrap();
    assert_eq!(u32::from_le_bytes(id.try_into().unwrap()), 0x1912_8086);
    assert_eq!(c.region_info(0).unwrap().1, 16 << 20);
    let magic = c
        .region_read(0, u64::from(mmio::VGT_PVINFO_PAGE), 8)
        .unwrap();
    assert_eq!(
        u64::from_le_bytes(magic.try_into().unwrap()),
        mmio::VGT_MAGIC
    );
    // Map the first aperture page to guest frame 5 through BAR0, write through BAR2 (aperture):
    // the bytes land in the client's RAM file at frame 5.
    let ap = s.aperture.base.0;
    let entry = u64::from(mmio::GTT_MMIO_BASE) + ap / 4096 * 8;
    c.region_write(0, entry, &((5u64 << 12) | 1).to_le_bytes())
        .unwrap();
    c.region_write(2, ap + 0x20, b"vGPU").unwrap();
    let mut got = [0u8; 4];
    ram.read_exact_at(&mut got, 5 * 4096 + 0x20).unwrap();
    assert_eq!(&got, b"vGPU");
    drop(c);
    let backend = server.join().unwrap();
    assert!(backend.vm().is_some(), "the vGPU outlives its client");
}

/// Frames the guest runs on the destination after the switch-over (the guest-driver model moves
/// there with the rest of the guest).
const FRAMES_AFTER: u64 = 3;

/// What a migration between two servers left: the source's and the destination's backends, the
/// source's slices and the destination client's RAM file.
struct Migrated {
    source: VgpuBackend,
    dest: VgpuBackend,
    slices: VgpuSlices,
    dst_ram: std::fs::File,
}

/// Two servers (the destination on other slices, restoring with `remap`), a desktop guest running
/// on the source, migrated over their sockets by gmig's client while it runs.
fn migrate_between_servers(remap: bool) -> Migrated {
    let (s, d) = gmig_test_support::moved_slices(TY);
    let (src_path, src, _d1) = spawn(s, Some(Profile::Desktop), true);
    let (dst_path, dst, _d2) = spawn(d, None, remap);
    let (mut sc, _src_ram) = attach(&src_path);
    let (mut dc, dst_ram) = attach(&dst_path);
    // Let the guest run a few frames (one per few messages), then migrate while it runs.
    for _ in 0..12 {
        sc.device_state().unwrap();
    }
    sc.set_device_state(DeviceState::PreCopy).unwrap();
    dc.set_device_state(DeviceState::Resuming).unwrap();
    while let Some(chunk) = sc.mig_read(256 * 1024).unwrap() {
        dc.mig_write(&chunk).unwrap();
    }
    sc.set_device_state(DeviceState::StopCopy).unwrap();
    loop {
        let chunk = sc.mig_read(256 * 1024).unwrap().unwrap();
        if chunk.is_empty() {
            break;
        }
        dc.mig_write(&chunk).unwrap();
    }
    dc.set_device_state(DeviceState::Running).unwrap();
    sc.set_device_state(DeviceState::Stop).unwrap();
    drop((sc, dc));
    Migrated {
        source: src.join().unwrap(),
        dest: dst.join().unwrap(),
        slices: s,
        dst_ram,
    }
}

/// What the destination did after the switch-over.
struct AfterSwitchOver {
    /// Workloads queued in the restored vGPU (carried by the stream).
    carried: usize,
    /// The carried workload the source's GPU had run part-way, and its next command.
    preempted: Option<(u64, u32)>,
    /// Of them, how many `run_queued` ran.
    carried_run: usize,
    /// Workloads the destination completed after the restore (carried ones and the frames run
    /// there), from the vGPU's counter, which travels in its state.
    workloads: u64,
}

/// On the destination: run the carried work, then move the guest-driver model there and run
/// [`FRAMES_AFTER`] more frames and the wait for the last one.
fn continue_on_destination(m: &mut Migrated) -> AfterSwitchOver {
    let driver = m.source.vm_mut().unwrap().take_driver().unwrap();
    let moved = m.dest.vm_mut().unwrap();
    let at_restore = moved.vgpu().stats().workloads;
    let carried = moved.vgpu().queued();
    let preempted = moved.vgpu().preempted();
    let carried_run = moved.run_queued();
    moved.attach_driver(driver);
    moved.run_steps(FRAMES_AFTER).unwrap();
    moved.finish().unwrap();
    AfterSwitchOver {
        carried,
        preempted,
        carried_run,
        workloads: moved.vgpu().stats().workloads - at_restore,
    }
}

/// The same guest never migrated: `steps` frames, the work they queued, then the frames the
/// destination runs.
fn unmigrated(slices: VgpuSlices, steps: u64) -> VgpuVm {
    let mut reference = VgpuVm::boot(
        TY,
        slices,
        RAM,
        Profile::Desktop,
        WorkloadConfig::small(),
        SEED,
    )
    .unwrap();
    reference.run_steps(steps).unwrap();
    reference.run_queued();
    reference.run_steps(FRAMES_AFTER).unwrap();
    reference.finish().unwrap();
    reference
}

#[test]
fn two_servers_migrate_a_running_vgpu_and_the_destination_equals_an_unmigrated_run() {
    let mut m = migrate_between_servers(true);
    let steps = m.source.steps();
    assert!(
        steps >= 3,
        "the workload ran during the migration ({steps} steps)"
    );
    // The destination runs what the stop carried (the desktop's last frame: a client and a
    // compositor batch), then the guest's next frames; so does the reference.
    let after = continue_on_destination(&mut m);
    assert_eq!(
        after.carried, 2,
        "the stop carried the last frame's workloads"
    );
    // The first of them the source's GPU had begun: it travelled preempted, and resumed at the
    // command where the source stopped.
    assert_eq!(
        after.preempted.map(|(_, next)| next),
        Some(GPU_AHEAD as u32),
        "the stop preempted the running workload"
    );
    assert_eq!(after.carried_run, after.carried);
    // Two carried, then two a frame.
    assert!(
        after.workloads >= 2 + 2 * FRAMES_AFTER,
        "the destination completed {} workloads after the switch-over",
        after.workloads
    );
    let moved = m.dest.vm().unwrap();
    assert!(
        moved.vgpu().faults().is_empty(),
        "{:?}",
        moved.vgpu().faults()
    );
    let reference = unmigrated(m.slices, steps);
    let diff = compare_guest_visible(reference.vgpu(), moved.vgpu());
    assert!(diff.is_identical(), "{diff:?}");
    // And the destination's vGPU lives in the destination client's RAM file.
    let mut a = vec![0u8; RAM as usize];
    m.dst_ram.read_exact_at(&mut a, 0).unwrap();
    let mut b = vec![0u8; RAM as usize];
    use vm_memory::{Bytes, GuestAddress};
    reference
        .vgpu()
        .guest_memory()
        .read_slice(&mut b, GuestAddress(0))
        .unwrap();
    assert!(
        a == b,
        "destination client RAM differs from the unmigrated guest's"
    );
}

/// The negative control: the same migration with remapping off on the destination. The restored
/// state looks the same either way; the difference shows when the destination executes: every
/// workload it runs (the carried ones and the guest's next frames) uses the source's graphics
/// addresses, which fall outside its slices, so the vGPU faults and refuses them and their writes
/// are missing from guest RAM.
#[test]
fn without_remapping_the_served_destination_faults_and_differs() {
    let mut m = migrate_between_servers(false);
    let steps = m.source.steps();
    let after = continue_on_destination(&mut m);
    assert_eq!(
        after.carried, 2,
        "the stop carried the last frame's workloads"
    );
    assert_eq!(after.carried_run, after.carried);
    assert_eq!(
        after.workloads, 0,
        "with stale addresses no workload completes on the destination"
    );
    let moved = m.dest.vm().unwrap();
    assert!(
        moved.vgpu().stats().refused >= 2 + 2 * FRAMES_AFTER,
        "the destination refused its workloads: {:?}",
        moved.vgpu().stats()
    );
    let reference = unmigrated(m.slices, steps);
    let diff = compare_guest_visible(reference.vgpu(), moved.vgpu());
    assert!(
        diff.faults,
        "stale addresses fault on the destination: {diff:?}"
    );
    assert!(
        !diff.pages.is_empty(),
        "and the writes they were meant to do are missing: {diff:?}"
    );
}

/// A device reset (QEMU resets the device when a VM starts) puts the engines back to power-on:
/// ELSP writes a killed guest left half-way do not merge with the next guest's submission. The
/// control without the reset shows they would: the leftover half and the next guest's first
/// half make a submission of a context outside the vGPU, which faults.
#[test]
fn a_device_reset_clears_an_elsp_submission_left_half_written() {
    let elsp = u64::from(mmio::EngineId::Blitter.mmio_base() + mmio::ring::ELSP);
    for reset in [true, false] {
        let (s, _) = gmig_test_support::moved_slices(TY);
        let (path, server, _dir) = spawn(s, None, true);
        let (mut c, _ram) = attach(&path);
        // The dead guest's half: element 1 of a submission, empty.
        for w in [0u32, 0] {
            c.region_write(0, elsp, &w.to_le_bytes()).unwrap();
        }
        if reset {
            c.reset().unwrap();
        }
        // The next guest's submission: element 1 names context 5 at GGTT 0x1000 (outside the
        // vGPU), element 0 is empty, so nothing runs. Merged with the leftover half, that
        // context would land in element 0 and be submitted.
        for w in [5u32, 0x1000 | 1, 0, 0] {
            c.region_write(0, elsp, &w.to_le_bytes()).unwrap();
        }
        drop(c);
        let backend = server.join().unwrap();
        let faults = backend.vm().unwrap().vgpu().faults().len();
        if reset {
            assert_eq!(faults, 0, "after the reset the submission stands alone");
        } else {
            assert_eq!(faults, 1, "control: the halves merge into a bad context");
        }
    }
}

/// A device reset resets the vGPU as GVT-g resets one on a device-level reset: GGTT entries
/// invalidated, registers (fences, status page address) back to their reset values; the PV
/// info page still describes the vGPU. The control without the reset reads them as written.
#[test]
fn a_device_reset_clears_the_ggtt_and_the_registers() {
    let hws = u64::from(mmio::EngineId::Render.mmio_base() + mmio::ring::HWS_PGA);
    let fence = u64::from(mmio::FENCE_REG_BASE);
    for reset in [true, false] {
        let (s, _) = gmig_test_support::moved_slices(TY);
        let (path, server, _dir) = spawn(s, None, true);
        let (mut c, _ram) = attach(&path);
        let entry = u64::from(mmio::GTT_MMIO_BASE) + s.aperture.base.0 / 4096 * 8;
        let page = s.aperture.base.0 as u32;
        c.region_write(0, entry, &((5u64 << 12) | 1).to_le_bytes())
            .unwrap();
        c.region_write(0, hws, &page.to_le_bytes()).unwrap();
        c.region_write(0, fence, &(page | 1).to_le_bytes()).unwrap();
        if reset {
            c.reset().unwrap();
        }
        let r64 = |c: &mut Client, at: u64| {
            u64::from_le_bytes(c.region_read(0, at, 8).unwrap().try_into().unwrap())
        };
        let r32 = |c: &mut Client, at: u64| {
            u32::from_le_bytes(c.region_read(0, at, 4).unwrap().try_into().unwrap())
        };
        let got = (r64(&mut c, entry), r32(&mut c, hws), r32(&mut c, fence));
        if reset {
            assert_eq!(got, (0, 0, 0), "after the reset");
        } else {
            assert_eq!(got, ((5 << 12) | 1, page, page | 1), "control: no reset");
        }
        assert_eq!(
            r64(&mut c, u64::from(mmio::VGT_PVINFO_PAGE)),
            mmio::VGT_MAGIC
        );
        drop(c);
        server.join().unwrap();
    }
}

/// A DMA_MAP without the write flag is read-only to the vGPU, as an IOMMU mapping is: a write
/// it makes there (a CPU write through the aperture onto a GGTT entry that names such a frame)
/// is refused and the client's memory keeps its bytes, while the writable map beside it takes
/// the same write; reading the read-only map works. The control maps the range writable: the
/// write lands. A map the device may not read, or with unknown flags, is refused.
#[test]
fn a_read_only_dma_map_stays_read_only_to_the_vgpu() {
    use gmig_qemu_bridge::client::ClientError;
    const HALF: u64 = RAM / 2;
    for writable in [false, true] {
        let (s, _) = gmig_test_support::moved_slices(TY);
        let (path, server, _dir) = spawn(s, None, true);
        let mut c = Client::connect(&path).unwrap();
        let ram = tempfile::tempfile().unwrap();
        ram.set_len(RAM).unwrap();
        ram.write_all_at(b"ROM!", HALF + 0x20).unwrap();
        for bad in [0, 2, 1 | 4] {
            match c.dma_map_flags(&ram, 0, 0, HALF, bad) {
                Err(ClientError::Refused { errno, .. }) => assert_eq!(errno, libc::EINVAL),
                other => panic!("flags {bad}: expected a refusal, got {other:?}"),
            }
        }
        c.dma_map(&ram, 0, 0, HALF).unwrap();
        c.dma_map_flags(&ram, HALF, HALF, HALF, if writable { 3 } else { 1 })
            .unwrap();
        // Aperture page 0 onto frame 5 (writable map), page 1 onto the second map's first frame.
        let ap = s.aperture.base.0;
        let entry = |page: u64| u64::from(mmio::GTT_MMIO_BASE) + (ap / 4096 + page) * 8;
        c.region_write(0, entry(0), &((5u64 << 12) | 1).to_le_bytes())
            .unwrap();
        c.region_write(0, entry(1), &(HALF | 1).to_le_bytes())
            .unwrap();
        assert_eq!(c.region_read(2, ap + 4096 + 0x20, 4).unwrap(), b"ROM!");
        c.region_write(2, ap + 0x20, b"vGPU").unwrap();
        c.region_write(2, ap + 4096 + 0x20, b"vGPU").unwrap();
        let mut got = [0u8; 4];
        ram.read_exact_at(&mut got, 5 * 4096 + 0x20).unwrap();
        assert_eq!(&got, b"vGPU", "the writable map takes the write");
        ram.read_exact_at(&mut got, HALF + 0x20).unwrap();
        if writable {
            assert_eq!(&got, b"vGPU", "control: mapped writable, the write lands");
        } else {
            assert_eq!(&got, b"ROM!", "the read-only map keeps its bytes");
        }
        drop(c);
        let backend = server.join().unwrap();
        assert!(backend.vm().is_some(), "the vGPU is still there");
    }
}
