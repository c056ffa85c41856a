//! Guest RAM the VMM mapped read-only to the device (a vfio-user DMA_MAP without the write
//! flag, mapped `PROT_READ`): the vGPU's writes there are refused and write nothing; its
//! writes to writable RAM beside it land.

use std::os::unix::fs::FileExt;

use gmig_vgpu::gm::{slices_at, Gfn, GgttOffset, PAGE_SIZE};
use gmig_vgpu::gtt::{Ggtt, GpuView, GttError, GuestRam, Space};
use gmig_vgpu::ram::device_writable;
use vm_memory::mmap::{GuestRegionMmap, MmapRegionBuilder};
use vm_memory::{Bytes, FileOffset, GuestAddress};

/// Guest RAM of two 64 KiB regions from one file: the first writable, the second mapped
/// read-only (as the vfio-user server maps a DMA_MAP without the write flag).
fn ram() -> (GuestRam, std::fs::File) {
    let file = tempfile::tempfile().unwrap();
    file.set_len(128 << 10).unwrap();
    let region = |at: u64, prot: i32| {
        let m = MmapRegionBuilder::new(64 << 10)
            .with_file_offset(FileOffset::new(file.try_clone().unwrap(), at))
            .with_mmap_prot(prot)
            .with_mmap_flags(libc::MAP_SHARED)
            .build()
            .unwrap();
        GuestRegionMmap::new(m, GuestAddress(at)).unwrap()
    };
    let mem = GuestRam::from_regions(vec![
        region(0, libc::PROT_READ | libc::PROT_WRITE),
        region(64 << 10, libc::PROT_READ),
    ])
    .unwrap();
    (mem, file)
}

#[test]
fn only_ranges_wholly_in_writable_regions_are_device_writable() {
    let (mem, _file) = ram();
    assert!(device_writable(&mem, GuestAddress(16), 2));
    assert!(!device_writable(&mem, GuestAddress((64 << 10) + 16), 2));
    // From writable RAM into the read-only part.
    assert!(!device_writable(&mem, GuestAddress((64 << 10) - 4), 8));
    // Past guest RAM: left to the write itself, which fails as unbacked.
    assert!(device_writable(&mem, GuestAddress(1 << 30), 8));
    // Reads of the read-only part work.
    let mut rom = [0u8; 4];
    mem.read_slice(&mut rom, GuestAddress((64 << 10) + 16))
        .unwrap();
}

#[test]
fn an_engine_write_through_the_ggtt_into_read_only_ram_is_refused() {
    let (mem, file) = ram();
    let slices = slices_at(0, 64 << 20, 64 << 20, 384 << 20);
    let mut ggtt = Ggtt::new(&slices);
    // GGTT page 0 → frame 1 (writable), page 1 → frame 17 (read-only).
    assert!(ggtt.set_entry(&slices, GgttOffset(0), PAGE_SIZE | 1));
    assert!(ggtt.set_entry(&slices, GgttOffset(PAGE_SIZE), (17 * PAGE_SIZE) | 1));
    let view = GpuView {
        ggtt: &ggtt,
        slices,
        mem: &mem,
        pml4: None,
    };
    let mut pages = Vec::new();
    view.write(Space::Ggtt, 8, b"gpu", &mut pages).unwrap();
    assert_eq!(
        view.write(Space::Ggtt, PAGE_SIZE + 8, b"gpu", &mut pages),
        Err(GttError::ReadOnly(17 * PAGE_SIZE + 8))
    );
    assert_eq!(pages, vec![Gfn(1)], "only the written page is reported");
    let mut got = [0u8; 3];
    file.read_exact_at(&mut got, 17 * PAGE_SIZE + 8).unwrap();
    assert_eq!(got, [0; 3]);
}
