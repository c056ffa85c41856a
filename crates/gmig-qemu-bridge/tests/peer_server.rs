//! gmig's vfio-user client against a server nobody here wrote: the rust-vmm `vfio_user` crate's
//! `Server` (cloud-hypervisor's vfio-user implementation) with a small backend. The base protocol
//! end to end: VERSION, device and region info (a sparse-mmap region with its descriptor), region
//! reads and writes, DMA_MAP with a descriptor (the backend writes into the client's file), IRQs
//! through a passed descriptor, reset, DMA_UNMAP, and an invalid region refused.
//!
//! That crate has no migration commands (16–18) in any release, so migration is not tested
//! against it (gmig's client and server are each other's peers there: `tests/server.rs`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::thread;

use gmig_qemu_bridge::client::{Client, ClientError};
use vfio_bindings::bindings::vfio::{
    vfio_region_info, vfio_region_sparse_mmap_area, VFIO_IRQ_INFO_EVENTFD,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, Server, ServerBackend, ServerRegion};

/// A BAR0 write here makes the backend write "peer" at DMA address `DMA_BASE + 0x10`.
const REG_DMA: u64 = 0;
/// A BAR0 write here makes the backend signal its IRQ descriptor.
const REG_IRQ: u64 = 8;
const DMA_BASE: u64 = 0x8000_0000;

#[derive(Default)]
struct Seen {
    maps: Vec<(u64, u64, u64)>,
    unmaps: Vec<(u64, u64)>,
    resets: u32,
}

struct Backend {
    bar0: [u8; 4096],
    /// Mapped DMA: (address, size, file, offset in the file).
    dma: Vec<(u64, u64, File, u64)>,
    irq: Vec<File>,
    seen: Arc<Mutex<Seen>>,
}

fn io_err(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_owned())
}

impl ServerBackend for Backend {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> std::io::Result<()> {
        if region != 0 {
            return Err(io_err("no such region"));
        }
        let o = usize::try_from(offset).map_err(|_| io_err("offset"))?;
        let src = self
            .bar0
            .get(o..o + data.len())
            .ok_or_else(|| io_err("beyond BAR0"))?;
        data.copy_from_slice(src);
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if region != 0 {
            return Err(io_err("no such region"));
        }
        match offset {
            REG_DMA => {
                let target = DMA_BASE + 0x10;
                let (a, _, f, o) = self
                    .dma
                    .iter()
                    .find(|(a, s, ..)| *a <= target && target + 4 <= a + s)
                    .ok_or_else(|| io_err("not mapped"))?;
                f.write_all_at(b"peer", o + (target - a))?;
            }
            REG_IRQ => {
                let f = self.irq.first_mut().ok_or_else(|| io_err("no IRQ fd"))?;
                f.write_all(&1u64.to_le_bytes())?;
            }
            _ => {}
        }
        let o = usize::try_from(offset).map_err(|_| io_err("offset"))?;
        self.bar0
            .get_mut(o..o + data.len())
            .ok_or_else(|| io_err("beyond BAR0"))?
            .copy_from_slice(data);
        Ok(())
    }

    fn dma_map(
        &mut self,
        _flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> std::io::Result<()> {
        let f = fd.ok_or_else(|| io_err("no descriptor"))?;
        self.seen.lock().unwrap().maps.push((address, size, offset));
        self.dma.push((address, size, f, offset));
        Ok(())
    }

    fn dma_unmap(&mut self, _flags: DmaUnmapFlags, address: u64, size: u64) -> std::io::Result<()> {
        self.seen.lock().unwrap().unmaps.push((address, size));
        self.dma.retain(|(a, s, ..)| !(*a == address && *s == size));
        Ok(())
    }

    fn reset(&mut self) -> std::io::Result<()> {
        self.seen.lock().unwrap().resets += 1;
        self.bar0 = [0; 4096];
        Ok(())
    }

    fn set_irqs(
        &mut self,
        _index: u32,
        _flags: u32,
        _start: u32,
        _count: u32,
        fds: Vec<File>,
    ) -> std::io::Result<()> {
        self.irq = fds;
        Ok(())
    }
}

fn region(index: u32, flags: u32, size: u64) -> ServerRegion {
    ServerRegion {
        region_info: vfio_region_info {
            argsz: std::mem::size_of::<vfio_region_info>() as u32,
            flags,
            index,
            cap_offset: 0,
            size,
            offset: 0,
        },
        sparse_areas: Vec::new(),
        mmap_fd: None,
    }
}

#[test]
fn gmig_client_drives_the_rust_vmm_vfio_user_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peer.sock");
    let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
    // BAR1: 8 KiB backed by a file, its second page mappable.
    let bar1 = tempfile::tempfile().unwrap();
    bar1.set_len(8192).unwrap();
    bar1.write_all_at(b"bar1", 4096).unwrap();
    let mut regions: Vec<ServerRegion> = (0..9).map(|i| region(i, 0, 0)).collect();
    regions[0] = region(0, rw, 4096);
    regions[1] = region(1, rw | VFIO_REGION_INFO_FLAG_MMAP, 8192);
    regions[1].sparse_areas = vec![vfio_user::SparseArea {
        area: vfio_region_sparse_mmap_area {
            offset: 4096,
            size: 4096,
        },
    }];
    regions[1].mmap_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&bar1));
    regions[7] = region(7, rw, 256);
    let irqs = vec![
        IrqInfo {
            index: 0,
            flags: 0,
            count: 0,
        },
        IrqInfo {
            index: 1,
            flags: VFIO_IRQ_INFO_EVENTFD,
            count: 1,
        },
    ];
    let server = Server::new(&path, true, irqs, regions).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut backend = Backend {
        bar0: [0; 4096],
        dma: Vec::new(),
        irq: Vec::new(),
        seen: Arc::clone(&seen),
    };
    let t = thread::spawn(move || {
        server.run(&mut backend).unwrap();
        drop(bar1);
    });

    let mut c = Client::connect(&path).unwrap();
    assert!(c.capabilities.contains("max_msg_fds"), "{}", c.capabilities);
    let (flags, regions, irqs) = c.device_info().unwrap();
    assert_eq!((flags & 3, regions, irqs), (3, 9, 2), "PCI | RESET");

    // Regions: BAR0 by message; BAR1 mappable, its descriptor and sparse area in the reply.
    assert_eq!(c.region_info(0).unwrap(), (rw, 4096));
    assert_eq!(c.region_info(7).unwrap(), (rw, 256));
    let d = c.region_details(1).unwrap();
    assert_eq!(d.size, 8192);
    assert_ne!(d.flags & VFIO_REGION_INFO_FLAG_MMAP, 0);
    let areas = d.sparse.expect("the sparse-mmap capability");
    assert_eq!(
        (areas.len(), areas[0].offset, areas[0].size),
        (1, 4096, 4096)
    );
    let f = d.file.expect("the region's descriptor");
    let mut got = [0u8; 4];
    f.read_exact_at(&mut got, d.offset + 4096).unwrap();
    assert_eq!(&got, b"bar1", "the descriptor is the server's BAR1 file");

    // Region access.
    c.region_write(0, 0x40, &[1, 2, 3, 4]).unwrap();
    assert_eq!(c.region_read(0, 0x40, 4).unwrap(), [1, 2, 3, 4]);

    // DMA into the client's file through the descriptor it passed.
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(0x10_0000).unwrap();
    c.dma_map(&ram, 0x2000, DMA_BASE, 0x4000).unwrap();
    c.region_write(0, REG_DMA, &[1, 0, 0, 0]).unwrap();
    ram.read_exact_at(&mut got, 0x2000 + 0x10).unwrap();
    assert_eq!(&got, b"peer");

    // An IRQ through a passed descriptor.
    let (mut rx, tx) = std::io::pipe().unwrap();
    let tx = File::from(std::os::fd::OwnedFd::from(tx));
    c.set_irq_eventfds(1, 0, &[&tx]).unwrap();
    c.region_write(0, REG_IRQ, &[1, 0, 0, 0]).unwrap();
    let mut n = [0u8; 8];
    rx.read_exact(&mut n).unwrap();
    assert_eq!(u64::from_le_bytes(n), 1);

    // Reset, unmap, and a refusal (that server says EINVAL for a region it does not have).
    c.reset().unwrap();
    assert_eq!(c.region_read(0, 0x40, 4).unwrap(), [0, 0, 0, 0]);
    c.dma_unmap(DMA_BASE, 0x4000).unwrap();
    match c.region_read(20, 0, 4) {
        Err(ClientError::Refused { errno, .. }) => assert_eq!(errno, libc::EINVAL),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        c.region_read(0, 0x44, 4).unwrap(),
        [0, 0, 0, 0],
        "still serving"
    );
    drop(c);
    t.join().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.maps, [(DMA_BASE, 0x4000, 0x2000)]);
    assert_eq!(seen.unmaps, [(DMA_BASE, 0x4000)]);
    assert_eq!(seen.resets, 1);
}
