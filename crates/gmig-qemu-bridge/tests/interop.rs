//! Interop with a vfio-user implementation nobody here wrote: the rust-vmm `vfio_user` crate's
//! `Client` (what cloud-hypervisor attaches vfio-user devices with) attaches to gmig's server
//! serving the reference vGPU: it negotiates, enumerates the regions, reads config space and BAR0,
//! maps guest RAM with a file descriptor, writes a GGTT entry and the aperture, sets an IRQ with a
//! passed descriptor, resets and unmaps. That crate (0.1.7) has no migration commands (16–18);
//! migration is tested between gmig's own client and server (`tests/vgpu.rs`).

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use gmig_qemu_bridge::vgpu_backend::VgpuSpec;
use gmig_vgpu::gm::{HostConfig, VgpuType};
use gmig_vgpu::mmio;

mod common;

const RAM: u64 = 32 << 20;

#[test]
fn the_rust_vmm_vfio_user_client_attaches_to_the_served_vgpu() {
    let (s, _) = gmig_test_support::moved_slices(VgpuType::V5_8);
    let spec = VgpuSpec {
        max_drain: gmig_core::migration::MigrationConfig::new(
            gmig_core::migration::Policy::OneShotNarrow,
        )
        .max_drain,
        ..common::spec(VgpuType::V5_8, s, false)
    };
    let (path, server, _dir) = common::serve(spec, 1);

    let mut c = vfio_user::Client::new(&path).expect("rust-vmm client attaches");
    // Regions as it enumerated them: BAR0 16 MiB, BAR2 the aperture, config space 256 bytes,
    // the others absent (size 0).
    assert_eq!(c.region(0).unwrap().size, 16 << 20);
    assert_eq!(
        c.region(2).unwrap().size,
        HostConfig::default().aperture_size
    );
    assert_eq!(c.region(7).unwrap().size, 256);
    assert_eq!(c.region(1).unwrap().size, 0);
    let mut id = [0u8; 4];
    c.region_read(7, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x1912_8086);

    let ram = tempfile::tempfile().unwrap();
    ram.set_len(RAM).unwrap();
    c.dma_map(0, 0, RAM, ram.as_raw_fd()).unwrap();
    let mut magic = [0u8; 8];
    c.region_read(0, u64::from(mmio::VGT_PVINFO_PAGE), &mut magic)
        .unwrap();
    assert_eq!(u64::from_le_bytes(magic), mmio::VGT_MAGIC);
    // A GGTT entry through BAR0, then a CPU write through the aperture into the client's RAM.
    let ap = s.aperture.base.0;
    let entry = u64::from(mmio::GTT_MMIO_BASE) + ap / 4096 * 8;
    c.region_write(0, entry, &((9u64 << 12) | 1).to_le_bytes())
        .unwrap();
    let mut back = [0u8; 8];
    c.region_read(0, entry, &mut back).unwrap();
    assert_eq!(u64::from_le_bytes(back), (9 << 12) | 1);
    c.region_write(2, ap + 4, b"interop").unwrap();
    let mut got = [0u8; 7];
    ram.read_exact_at(&mut got, 9 * 4096 + 4).unwrap();
    assert_eq!(&got, b"interop");

    let msi = c.get_irq_info(1).unwrap();
    assert_eq!((msi.index, msi.count), (1, 1));
    let (_rx, tx) = std::io::pipe().unwrap();
    c.set_irqs(1, (1 << 5) | (1 << 2), 0, 1, &[tx.as_raw_fd()])
        .unwrap();
    c.reset().unwrap();
    c.dma_unmap(0, RAM).unwrap();
    c.shutdown().unwrap();
    drop(c);
    let backend = server.join().unwrap();
    assert!(backend.vm().is_some(), "the vGPU survives its client");
}
