//! gmig's vfio-user server and client against each other: the base protocol with a small test
//! device (DMA into the client's own memory, IRQs through passed descriptors), migration v2 between
//! two servers over their sockets, and bad input (each refused with the right errno, or the
//! connection closed, the server serving the next client with the device intact).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread::{self, JoinHandle};

use gmig_qemu_bridge::client::{Client, ClientError};
use gmig_qemu_bridge::proto::{Command, Header, FLAG_COMMAND, HEADER_LEN};
use gmig_qemu_bridge::server::{Errno, Server, UserDevice};
use gmig_vfio_migration::testdev::BlobDevice;
use gmig_vfio_migration::{DeviceState, MigrationFeatures, MigrationHandle};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const CONFIG: u32 = 7;
const BAR0: u32 = 0;
/// A BAR0 write here makes the device write "gmig" into DMA address `DMA_TARGET`.
const REG_DMA: u64 = 0;
/// A BAR0 write here raises vector 0 of MSI (IRQ index 1).
const REG_IRQ: u64 = 8;
const DMA_BASE: u64 = 0x1_0000_0000;
const DMA_TARGET: u64 = DMA_BASE + 0x2010;

struct TestDevice {
    config: [u8; 256],
    bar: [u8; 4096],
    mem: Option<GuestMemoryMmap>,
    irq: Vec<File>,
    resets: u32,
    mig: MigrationHandle<BlobDevice>,
}

impl TestDevice {
    fn new(seed: u64) -> Self {
        let mut config = [0u8; 256];
        config[0..4].copy_from_slice(&0x1912_8086u32.to_le_bytes());
        TestDevice {
            config,
            bar: [0; 4096],
            mem: None,
            irq: Vec::new(),
            resets: 0,
            mig: MigrationHandle::new(BlobDevice::new(
                64 * 1024,
                512,
                seed,
                MigrationFeatures::ALL,
            ))
            .unwrap(),
        }
    }
}

impl UserDevice for TestDevice {
    type Mig = BlobDevice;
    fn device_info(&self) -> (u32, u32, u32) {
        (2, 9, 5) // VFIO_DEVICE_FLAGS_PCI
    }
    fn region_info(&self, index: u32) -> Option<(u32, u64)> {
        match index {
            BAR0 => Some((3, 4096)),
            CONFIG => Some((3, 256)),
            _ => None,
        }
    }
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        let src: &[u8] = if index == CONFIG {
            &self.config
        } else {
            &self.bar
        };
        let o = offset as usize;
        data.copy_from_slice(&src[o..o + data.len()]);
        Ok(())
    }
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        if index == BAR0 && offset == REG_DMA {
            let mem = self.mem.as_ref().ok_or(libc::EIO)?;
            mem.write_slice(b"gmig", GuestAddress(DMA_TARGET))
                .map_err(|_| libc::EFAULT)?;
        }
        if index == BAR0 && offset == REG_IRQ {
            let f = self.irq.first_mut().ok_or(libc::EIO)?;
            f.write_all(&1u64.to_le_bytes()).map_err(|_| libc::EIO)?;
        }
        let dst: &mut [u8] = if index == CONFIG {
            &mut self.config
        } else {
            &mut self.bar
        };
        let o = offset as usize;
        dst[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn irq_info(&self, index: u32) -> Option<(u32, u32)> {
        (index == 1).then_some((1 << 0, 1)) // MSI, one vector, eventfd
    }
    fn set_irqs(&mut self, _: u32, _: u32, _: u32, _: u32, fds: Vec<File>) -> Result<(), Errno> {
        self.irq = fds;
        Ok(())
    }
    fn reset(&mut self) -> Result<(), Errno> {
        self.resets += 1;
        self.bar = [0; 4096];
        Ok(())
    }
    fn dma_changed(&mut self, mem: Option<&GuestMemoryMmap>) {
        self.mem = mem.cloned();
    }
    fn migration(&mut self) -> Option<&mut MigrationHandle<BlobDevice>> {
        Some(&mut self.mig)
    }
}

/// A server on a fresh socket, serving `clients` clients in turn, returning the device.
fn spawn(seed: u64, clients: usize) -> (PathBuf, JoinHandle<TestDevice>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vfio-user.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let t = thread::spawn(move || {
        let mut server = Server::new(TestDevice::new(seed));
        for _ in 0..clients {
            let (s, _) = listener.accept().unwrap();
            server.serve(s).ok();
        }
        server.into_device()
    });
    (path, t, dir)
}

fn refused(r: Result<impl std::fmt::Debug, ClientError>) -> i32 {
    match r {
        Err(ClientError::Refused { errno, .. }) => errno,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn base_protocol_regions_dma_into_client_memory_irqs_and_reset() {
    let (path, server, _dir) = spawn(1, 1);
    let mut c = Client::connect(&path).unwrap();
    assert!(
        c.capabilities.contains("\"max_data_xfer_size\":1048576"),
        "{}",
        c.capabilities
    );
    assert!(
        c.capabilities.contains("\"migration\""),
        "{}",
        c.capabilities
    );
    assert_eq!(c.device_info().unwrap(), (2, 9, 5));
    assert_eq!(c.region_info(CONFIG).unwrap(), (3, 256));
    assert_eq!(
        c.region_read(CONFIG, 0, 4).unwrap(),
        0x1912_8086u32.to_le_bytes()
    );
    c.region_write(BAR0, 0x40, &[1, 2, 3, 4]).unwrap();
    assert_eq!(c.region_read(BAR0, 0x40, 4).unwrap(), [1, 2, 3, 4]);

    // Guest RAM is the client's file; the device's DMA write lands in it.
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(0x10_0000).unwrap();
    c.dma_map(&ram, 0x1000, DMA_BASE, 0x8000).unwrap();
    c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0]).unwrap();
    let mut got = [0u8; 4];
    ram.read_exact_at(&mut got, 0x1000 + (DMA_TARGET - DMA_BASE))
        .unwrap();
    assert_eq!(&got, b"gmig");

    // An IRQ through a descriptor the client passed.
    let (mut rx, tx) = std::io::pipe().unwrap();
    let tx = File::from(std::os::fd::OwnedFd::from(tx));
    c.set_irq_eventfds(1, 0, &[&tx]).unwrap();
    c.region_write(BAR0, REG_IRQ, &[1, 0, 0, 0]).unwrap();
    let mut n = [0u8; 8];
    rx.read_exact(&mut n).unwrap();
    assert_eq!(u64::from_le_bytes(n), 1);

    c.reset().unwrap();
    assert_eq!(c.region_read(BAR0, 0x40, 4).unwrap(), [0, 0, 0, 0]);
    c.dma_unmap(DMA_BASE, 0x8000).unwrap();
    assert_eq!(
        refused(c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0])),
        libc::EIO
    );
    drop(c);
    let dev = server.join().unwrap();
    assert_eq!(dev.resets, 1);
    assert!(dev.mem.is_none(), "mappings are dropped with the client");
}

#[test]
fn bad_requests_get_the_right_errno_and_the_connection_survives() {
    let (path, server, _dir) = spawn(2, 1);
    let mut c = Client::connect(&path).unwrap();
    assert_eq!(
        refused(c.request(Command::DmaRead, &[], &[])),
        libc::ENOTSUP
    );
    assert_eq!(refused(c.region_read(BAR0, 4094, 4)), libc::EINVAL);
    assert_eq!(refused(c.region_read(BAR0, u64::MAX - 1, 4)), libc::EINVAL);
    assert_eq!(refused(c.region_read(3, 0, 4)), libc::EINVAL);
    assert_eq!(refused(c.region_read(BAR0, 0, 2 << 20)), libc::E2BIG);
    assert_eq!(
        refused(c.request(Command::RegionWrite, &[1, 2, 3], &[])),
        libc::EINVAL
    );
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(0x10_0000).unwrap();
    c.dma_map(&ram, 0, DMA_BASE, 0x8000).unwrap();
    // Overlapping, wrapping, unaligned, past the end of the file, and without a descriptor.
    assert_eq!(
        refused(c.dma_map(&ram, 0, DMA_BASE + 0x4000, 0x8000)),
        libc::EINVAL
    );
    assert_eq!(
        refused(c.dma_map(&ram, 0, u64::MAX - 0xfff, 0x2000)),
        libc::EINVAL
    );
    assert_eq!(
        refused(c.dma_map(&ram, 0, DMA_BASE + 0x10_0001, 0x1000)),
        libc::EINVAL
    );
    assert_eq!(
        refused(c.dma_map(&ram, 0xf_f000, DMA_BASE + 0x20_0000, 0x2000)),
        libc::EINVAL
    );
    let m = gmig_qemu_bridge::proto::DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0,
        address: DMA_BASE + 0x40_0000,
        size: 0x1000,
    };
    assert_eq!(
        refused(c.request(Command::DmaMap, &m.to_bytes(), &[])),
        libc::ENOTSUP
    );
    // A descriptor where none belongs.
    assert_eq!(
        refused(c.request(Command::DeviceReset, &[], &[&ram])),
        libc::EINVAL
    );
    // Migration data outside a migration, a state that does not exist, a feature nobody knows.
    assert_eq!(refused(c.mig_read(64)), libc::EINVAL);
    assert_eq!(refused(c.mig_write(&[1, 2, 3])), libc::EINVAL);
    let mut bad_state = 0xabcdu32.to_le_bytes().to_vec();
    bad_state.extend_from_slice(&u32::MAX.to_le_bytes());
    let f = gmig_qemu_bridge::proto::Feature::to_bytes((1 << 17) | 2, &bad_state);
    assert_eq!(
        refused(c.request(Command::DeviceFeature, &f, &[])),
        libc::EINVAL
    );
    let f = gmig_qemu_bridge::proto::Feature::to_bytes((1 << 16) | 0x77, &[]);
    assert_eq!(
        refused(c.request(Command::DeviceFeature, &f, &[])),
        libc::ENOTSUP
    );
    assert_eq!(c.device_state().unwrap(), DeviceState::Running as u32);
    // Still serving.
    assert_eq!(c.device_info().unwrap().1, 9);
    drop(c);
    server.join().unwrap();
}

fn raw(path: &std::path::Path) -> UnixStream {
    UnixStream::connect(path).unwrap()
}

#[test]
fn unframeable_messages_close_the_connection_and_the_next_client_is_served() {
    let (path, server, _dir) = spawn(3, 4);
    // 1. A header claiming more than the negotiated maximum.
    let mut s = raw(&path);
    let h = Header {
        msg_id: 1,
        command: Command::Version as u16,
        size: 64 << 20,
        flags: FLAG_COMMAND,
        error: 0,
    };
    s.write_all(&h.to_bytes()).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap(), 0, "closed");
    // 2. A command before VERSION is refused; a truncated message then a vanished client.
    let mut s = raw(&path);
    let h = Header {
        msg_id: 2,
        command: Command::DeviceGetInfo as u16,
        size: HEADER_LEN as u32,
        flags: FLAG_COMMAND,
        error: 0,
    };
    s.write_all(&h.to_bytes()).unwrap();
    let mut reply = [0u8; HEADER_LEN];
    s.read_exact(&mut reply).unwrap();
    let r = Header::parse(&reply, 1 << 20).unwrap();
    assert!(r.is_reply() && r.error == libc::EINVAL as u32);
    s.write_all(&h.to_bytes()[..7]).unwrap();
    drop(s);
    // 3. A client that leaves in the middle of a migration: the device runs again.
    let mut c = Client::connect(&path).unwrap();
    c.set_device_state(DeviceState::PreCopy).unwrap();
    assert!(c.mig_read(4096).unwrap().is_some());
    drop(c);
    // 4. The next client finds it RUNNING.
    let mut c = Client::connect(&path).unwrap();
    assert_eq!(c.device_state().unwrap(), DeviceState::Running as u32);
    drop(c);
    let dev = server.join().unwrap();
    assert_eq!(dev.mig.state(), DeviceState::Running);
}

/// Source and destination are two servers; gmig's client moves the device between them.
#[test]
fn two_servers_migrate_a_changing_device_over_their_sockets() {
    let (src_path, src, _d1) = spawn(5, 1);
    let (dst_path, dst, _d2) = spawn(6, 1);
    let mut s = Client::connect(&src_path).unwrap();
    let mut d = Client::connect(&dst_path).unwrap();
    assert_eq!(
        s.migration_flags().unwrap() & 5,
        5,
        "STOP_COPY and PRE_COPY"
    );
    s.set_device_state(DeviceState::PreCopy).unwrap();
    d.set_device_state(DeviceState::Stop).unwrap();
    d.set_device_state(DeviceState::Resuming).unwrap();
    let mut moved = 0usize;
    // Pre-copy until the device says "no data now".
    while let Some(chunk) = s.mig_read(16 * 1024).unwrap() {
        if chunk.is_empty() {
            break;
        }
        moved += chunk.len();
        d.mig_write(&chunk).unwrap();
    }
    let estimate = s.mig_data_size().unwrap();
    s.set_device_state(DeviceState::StopCopy).unwrap();
    let mut stop_copy = 0u64;
    loop {
        let chunk = s
            .mig_read(16 * 1024)
            .unwrap()
            .expect("STOP_COPY always has data or end");
        if chunk.is_empty() {
            break;
        }
        stop_copy += chunk.len() as u64;
        d.mig_write(&chunk).unwrap();
    }
    assert!(moved > 0 && stop_copy > 0);
    assert!(
        estimate >= stop_copy,
        "MIG_DATA_SIZE {estimate} < {stop_copy}"
    );
    d.set_device_state(DeviceState::Stop).unwrap();
    d.set_device_state(DeviceState::Running).unwrap();
    s.set_device_state(DeviceState::Stop).unwrap();
    drop((s, d));
    let (a, b) = (src.join().unwrap(), dst.join().unwrap());
    assert_eq!(a.mig.device().blob(), b.mig.device().blob());
}
