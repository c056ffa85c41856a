//! The reference vGPU served over vfio-user: a client sees an Intel GPU in config space, the PV
//! info page and GGTT entries in BAR0, and the vGPU runs on the client's own RAM; two servers and
//! gmig's client migrate it while its guest-driver workload runs, and the destination — on other
//! GGTT slices, on the destination client's RAM — equals the same workload never migrated.

use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::thread::{self, JoinHandle};

use gmig_cmdparser::{Gen, VgpuSlices};
use gmig_qemu_bridge::client::Client;
use gmig_qemu_bridge::server::Server;
use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vfio_migration::DeviceState;
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::{HostConfig, VgpuType};
use gmig_vgpu::migratable::VgpuVm;
use gmig_vgpu::mmio;
use gmig_vgpu::workload::{Profile, WorkloadConfig};

const RAM: u64 = 32 << 20;
const TY: VgpuType = VgpuType::V5_8;
const SEED: u64 = 17;

fn spawn(
    slices: VgpuSlices,
    profile: Option<Profile>,
) -> (PathBuf, JoinHandle<VgpuBackend>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gmig.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let spec = VgpuSpec {
        gen: Gen::Gen9,
        ty: TY,
        slices,
        aperture: HostConfig::default().aperture_size,
        profile: profile.map(|p| (p, SEED)),
        gpu_pace: None,
        ram_by_vmm: false,
        remap: true,
    };
    let t = thread::spawn(move || {
        let mut server = Server::new(VgpuBackend::new(spec));
        let (s, _) = listener.accept().unwrap();
        server.serve(s).unwrap();
        server.into_device()
    });
    (path, t, dir)
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
    let (path, server, _dir) = spawn(s, None);
    let (mut c, ram) = attach(&path);
    // The vGPU hashes and executes on guest RAM in place: RAM it cannot map (no descriptor, to be
    // reached by DMA_READ / DMA_WRITE messages) is refused, and the client told why (ENOTSUP).
    match c.dma_map_local(RAM, 1 << 20) {
        Err(gmig_qemu_bridge::client::ClientError::Refused { errno, .. }) => {
            assert_eq!(errno, libc::ENOTSUP);
        }
        other => panic!("a map without a descriptor was not refused: {other:?}"),
    }
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

#[test]
fn two_servers_migrate_a_running_vgpu_and_the_destination_equals_an_unmigrated_run() {
    let (s, d) = gmig_test_support::moved_slices(TY);
    let (src_path, src, _d1) = spawn(s, Some(Profile::Desktop));
    let (dst_path, dst, _d2) = spawn(d, None);
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
    let source = src.join().unwrap();
    let mut dest = dst.join().unwrap();
    let steps = source.steps();
    assert!(
        steps >= 3,
        "the workload ran during the migration ({steps} steps)"
    );
    // The destination runs what the stop carried; so does the reference.
    dest.vm_mut().unwrap().run_queued();
    let mut reference =
        VgpuVm::boot(TY, s, RAM, Profile::Desktop, WorkloadConfig::small(), SEED).unwrap();
    reference.run_steps(steps).unwrap();
    reference.run_queued();
    let moved = dest.vm().unwrap();
    let diff = compare_guest_visible(reference.vgpu(), moved.vgpu());
    assert!(diff.is_identical(), "{diff:?}");
    // And the destination's vGPU lives in the destination client's RAM file.
    let mut a = vec![0u8; RAM as usize];
    dst_ram.read_exact_at(&mut a, 0).unwrap();
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
