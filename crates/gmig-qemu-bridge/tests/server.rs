//! gmig's vfio-user server and client against each other: the base protocol with a small test
//! device (DMA into the client's own memory, by descriptor or by DMA_READ / DMA_WRITE messages;
//! IRQs through passed descriptors; a sparse-mmap region; an ioeventfd), migration v2 between two
//! servers over their sockets, and bad input (each refused with the right errno, or the
//! connection closed, the server serving the next client with the device intact).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread::{self, JoinHandle};

use gmig_qemu_bridge::client::{Client, ClientError};
use gmig_qemu_bridge::proto::{
    Command, DmaAccess, Header, RegionAccess, SparseArea, WriteMultiEntry, FLAG_COMMAND,
    FLAG_ERROR, FLAG_REPLY, HEADER_LEN,
};
use gmig_qemu_bridge::server::{Dma, Errno, IoEventFd, RegionMmap, Server, UserDevice};
use gmig_vfio_migration::testdev::BlobDevice;
use gmig_vfio_migration::{DeviceState, MigrationFeatures, MigrationHandle};
use vm_memory::GuestMemoryMmap;

const CONFIG: u32 = 7;
const BAR0: u32 = 0;
/// A BAR0 write here makes the device write "gmig" into DMA address `DMA_TARGET`.
const REG_DMA: u64 = 0;
/// A BAR0 write here raises vector 0 of MSI (IRQ index 1).
const REG_IRQ: u64 = 8;
/// A BAR0 write of an 8-byte address here makes the device read 4 bytes there (DMA) into BAR0 at
/// `COPY_SLOT`.
const REG_COPY: u64 = 16;
const COPY_SLOT: u64 = 0x100;
/// A BAR0 write of a 4-byte length here makes the device write that many pattern bytes at
/// `DMA_TARGET`.
const REG_FILL: u64 = 24;
/// BAR0 register that counts the doorbell (ioeventfd) signals the device has seen.
const REG_DOORBELLS: u64 = 32;
/// The ioeventfd's offset in BAR0.
const DOORBELL: u64 = 0x200;
/// BAR1: 8 KiB backed by a file; its second page may be mapped by the client.
const BAR1: u32 = 1;
const DMA_BASE: u64 = 0x1_0000_0000;
const DMA_TARGET: u64 = DMA_BASE + 0x2010;

struct TestDevice {
    config: [u8; 256],
    bar: [u8; 4096],
    mem: Option<GuestMemoryMmap>,
    irq: Vec<File>,
    resets: u32,
    mig: MigrationHandle<BlobDevice>,
    accept_remote: bool,
    remote: Vec<(u64, u64)>,
    bar1: File,
    /// The device's end of the doorbell and the end handed to clients.
    doorbell: (UnixStream, File),
    doorbells: u64,
}

fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
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
            accept_remote: true,
            remote: Vec::new(),
            bar1: {
                let f = tempfile::tempfile().unwrap();
                f.set_len(8192).unwrap();
                f
            },
            doorbell: {
                // A socket pair stands in for an eventfd: a signal is an 8-byte write.
                let (dev, client) = UnixStream::pair().unwrap();
                dev.set_nonblocking(true).unwrap();
                (dev, File::from(std::os::fd::OwnedFd::from(client)))
            },
            doorbells: 0,
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
            BAR1 => Some((3, 8192)),
            CONFIG => Some((3, 256)),
            _ => None,
        }
    }
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        if index == BAR1 {
            return self.bar1.read_exact_at(data, offset).map_err(|_| libc::EIO);
        }
        if index == BAR0 && offset == REG_DOORBELLS {
            let mut signal = [0u8; 8];
            while (&self.doorbell.0).read_exact(&mut signal).is_ok() {
                self.doorbells += 1;
            }
            self.bar[REG_DOORBELLS as usize..][..8].copy_from_slice(&self.doorbells.to_le_bytes());
        }
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
        if index == BAR1 {
            return self.bar1.write_all_at(data, offset).map_err(|_| libc::EIO);
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
    fn region_write_dma(
        &mut self,
        index: u32,
        offset: u64,
        data: &[u8],
        dma: &mut dyn Dma,
    ) -> Result<(), Errno> {
        if index == BAR0 {
            let value = |n: usize| {
                let mut b = [0u8; 8];
                b[..n.min(data.len())].copy_from_slice(&data[..n.min(data.len())]);
                u64::from_le_bytes(b)
            };
            match offset {
                REG_DMA => dma.write(DMA_TARGET, b"gmig")?,
                REG_COPY => {
                    let mut got = [0u8; 4];
                    dma.read(value(8), &mut got)?;
                    self.bar[COPY_SLOT as usize..][..4].copy_from_slice(&got);
                }
                REG_FILL => {
                    let fill: Vec<u8> = (0..value(4) as usize).map(pattern).collect();
                    dma.write(DMA_TARGET, &fill)?;
                }
                _ => {}
            }
        }
        self.region_write(index, offset, data)
    }
    fn remote_dma(&self) -> bool {
        self.accept_remote
    }
    fn remote_dma_changed(&mut self, ranges: &[(u64, u64)]) {
        self.remote = ranges.to_vec();
    }
    fn region_mmap(&self, index: u32) -> Option<RegionMmap<'_>> {
        (index == BAR1).then(|| RegionMmap {
            file: &self.bar1,
            offset: 0,
            areas: vec![SparseArea {
                offset: 4096,
                size: 4096,
            }],
        })
    }
    fn region_io_fds(&self, index: u32) -> Vec<IoEventFd<'_>> {
        if index != BAR0 {
            return Vec::new();
        }
        vec![IoEventFd {
            offset: DOORBELL,
            size: 4,
            datamatch: None,
            file: &self.doorbell.1,
        }]
    }
}

/// A server on a fresh socket, serving `clients` clients in turn, returning the device.
fn spawn(seed: u64, clients: usize) -> (PathBuf, JoinHandle<TestDevice>, tempfile::TempDir) {
    spawn_device(TestDevice::new(seed), clients)
}

/// A server for `dev` on a fresh socket, serving `clients` clients in turn.
fn spawn_device(
    dev: TestDevice,
    clients: usize,
) -> (PathBuf, JoinHandle<TestDevice>, tempfile::TempDir) {
    spawn_polling(dev, clients, None)
}

/// [`spawn_device`] with the server polling its socket for up to `poll` after each message.
fn spawn_polling(
    dev: TestDevice,
    clients: usize,
    poll: Option<std::time::Duration>,
) -> (PathBuf, JoinHandle<TestDevice>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vfio-user.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let t = thread::spawn(move || {
        let mut server = Server::new(dev);
        server.set_poll(poll);
        for _ in 0..clients {
            let (s, _) = listener.accept().unwrap();
            server.serve(s).ok();
        }
        server.into_device()
    });
    (path, t, dir)
}

/// Maps a fresh file as guest RAM at DMA_BASE (from offset 0x1000), has the device write its
/// DMA pattern, and returns the file and the 4 bytes found at the target.
fn dma_write_into_client_ram(c: &mut Client) -> (File, [u8; 4]) {
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(0x10_0000).unwrap();
    c.dma_map(&ram, 0x1000, DMA_BASE, 0x8000).unwrap();
    c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0]).unwrap();
    let mut got = [0u8; 4];
    ram.read_exact_at(&mut got, 0x1000 + (DMA_TARGET - DMA_BASE))
        .unwrap();
    (ram, got)
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
    let (_ram, mut got) = dma_write_into_client_ram(&mut c);
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
    // Nothing mapped there any more: the device's DMA faults.
    assert_eq!(
        refused(c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0])),
        libc::EFAULT
    );
    // Mapped read-only (DMA_MAP flags: read alone), as QEMU maps ROM: the device's DMA write
    // is refused with EPERM and the client's memory keeps its bytes; its DMA read works.
    let rom = tempfile::tempfile().unwrap();
    rom.set_len(0x8000).unwrap();
    rom.write_all_at(b"ROM!", DMA_TARGET - DMA_BASE).unwrap();
    c.dma_map_flags(&rom, 0, DMA_BASE, 0x8000, 1).unwrap();
    assert_eq!(
        refused(c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0])),
        libc::EPERM
    );
    rom.read_exact_at(&mut got, DMA_TARGET - DMA_BASE).unwrap();
    assert_eq!(&got, b"ROM!");
    c.region_write(BAR0, REG_COPY, &DMA_TARGET.to_le_bytes())
        .unwrap();
    assert_eq!(c.region_read(BAR0, COPY_SLOT, 4).unwrap(), b"ROM!");
    drop(c);
    let dev = server.join().unwrap();
    assert_eq!(dev.resets, 1);
    assert!(dev.mem.is_none(), "mappings are dropped with the client");
}

#[test]
fn a_server_and_a_client_that_poll_their_socket_serve_reads_writes_dma_and_the_next_client() {
    // Polling for a whole second after each message: every message below comes while the
    // server polls, and a client that leaves must end the session during a poll.
    let poll = Some(std::time::Duration::from_secs(1));
    let (path, server, _dir) = spawn_polling(TestDevice::new(7), 2, poll);
    for round in 0..2u8 {
        let mut c = Client::connect(&path).unwrap();
        if round == 1 {
            // The client polls for each reply as well.
            c.set_poll(poll);
        }
        c.region_write(BAR0, 0x40, &[round, 2, 3, 4]).unwrap();
        assert_eq!(c.region_read(BAR0, 0x40, 4).unwrap(), [round, 2, 3, 4]);
        let (_ram, got) = dma_write_into_client_ram(&mut c);
        assert_eq!(&got, b"gmig", "round {round}");
        let t = std::time::Instant::now();
        for i in 0..200u64 {
            assert_eq!(c.region_read(BAR0, 0x40, 4).unwrap()[0], round, "read {i}");
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(100),
            "each read waited out the poll"
        );
    }
    let dev = server.join().unwrap();
    assert!(
        dev.mem.is_none(),
        "the second client left and the server returned"
    );
}

#[test]
fn bad_requests_get_the_right_errno_and_the_connection_survives() {
    let (path, server, _dir) = spawn(2, 1);
    let mut c = Client::connect(&path).unwrap();
    // DMA_READ / DMA_WRITE go from server to client, never the other way.
    assert_eq!(refused(c.request(Command::DmaRead, &[], &[])), libc::EINVAL);
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
    // Overlapping (EEXIST, as the specification says), wrapping, unaligned, past the end of the
    // file.
    assert_eq!(
        refused(c.dma_map(&ram, 0, DMA_BASE + 0x4000, 0x8000)),
        libc::EEXIST
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

/// Memory the client keeps (mapped without a descriptor) is reached by DMA_READ / DMA_WRITE
/// messages the client serves while it waits for its own replies; large transfers are split at
/// the client's `max_data_xfer_size`; descriptor-backed and message-backed regions mix.
#[test]
fn dma_without_a_descriptor_goes_by_dma_read_and_write_messages() {
    let (path, server, _dir) = spawn(7, 1);
    let mut c = Client::connect(&path).unwrap();
    c.dma_map_local(DMA_BASE, 4 << 20).unwrap();
    c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0]).unwrap();
    assert_eq!(c.local_memory(DMA_TARGET, 4).unwrap(), b"gmig");
    assert_eq!(c.dma_requests_served(), 1);

    // The device reads the client's memory.
    c.local_memory_mut(DMA_BASE + 0x40, 4)
        .unwrap()
        .copy_from_slice(b"abcd");
    c.region_write(BAR0, REG_COPY, &(DMA_BASE + 0x40).to_le_bytes())
        .unwrap();
    assert_eq!(c.region_read(BAR0, COPY_SLOT, 4).unwrap(), b"abcd");
    assert_eq!(c.dma_requests_served(), 2);

    // 2.5 MiB + 3 bytes: three DMA_WRITE messages of at most 1 MiB each.
    let len = (5 << 19) + 3;
    c.region_write(BAR0, REG_FILL, &(len as u32).to_le_bytes())
        .unwrap();
    assert_eq!(c.dma_requests_served(), 5);
    let got = c.local_memory(DMA_TARGET, len).unwrap();
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(i)));

    // A descriptor-backed region beside it is reached in place, with no message.
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(0x10_0000).unwrap();
    ram.write_all_at(b"file", 0x80).unwrap();
    c.dma_map(&ram, 0, DMA_BASE + (16 << 20), 0x1_0000).unwrap();
    c.region_write(
        BAR0,
        REG_COPY,
        &(DMA_BASE + (16 << 20) + 0x80).to_le_bytes(),
    )
    .unwrap();
    assert_eq!(c.region_read(BAR0, COPY_SLOT, 4).unwrap(), b"file");
    assert_eq!(c.dma_requests_served(), 5);

    // Outside every mapping, and straddling the end of one: EFAULT, and nothing sent.
    assert_eq!(
        refused(c.region_write(BAR0, REG_COPY, &0x10u64.to_le_bytes())),
        libc::EFAULT
    );
    assert_eq!(
        refused(c.region_write(BAR0, REG_COPY, &(DMA_BASE + (4 << 20) - 2).to_le_bytes())),
        libc::EFAULT
    );
    assert_eq!(c.dma_requests_served(), 5);
    c.dma_unmap(DMA_BASE, 4 << 20).unwrap();
    assert!(c.local_memory(DMA_BASE, 4).is_none());
    assert_eq!(
        refused(c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0])),
        libc::EFAULT
    );
    drop(c);
    let dev = server.join().unwrap();
    assert!(
        dev.remote.is_empty(),
        "remote ranges are dropped with the client"
    );
}

#[test]
fn a_device_that_needs_descriptors_takes_a_map_without_one_and_never_uses_it() {
    let mut dev = TestDevice::new(8);
    dev.accept_remote = false;
    let (path, server, _dir) = spawn_device(dev, 1);
    let mut c = Client::connect(&path).unwrap();
    // As an IOMMU takes a mapping the device never uses (QEMU maps its ROMs so): accepted, and
    // the device's DMA there faults without a message to the client.
    c.dma_map_local(DMA_BASE, 0x4000).unwrap();
    assert_eq!(
        refused(c.region_write(BAR0, REG_DMA, &[1, 0, 0, 0])),
        libc::EFAULT
    );
    assert_eq!(
        refused(c.region_write(BAR0, REG_COPY, &DMA_BASE.to_le_bytes())),
        libc::EFAULT
    );
    assert_eq!(c.dma_requests_served(), 0);
    assert_eq!(c.local_memory(DMA_TARGET, 4).unwrap(), [0; 4]);
    // Overlaps are still refused, and the unmap is taken.
    assert_eq!(refused(c.dma_map_local(DMA_BASE, 0x1000)), libc::EEXIST);
    c.dma_unmap(DMA_BASE, 0x4000).unwrap();
    drop(c);
    let dev = server.join().unwrap();
    assert!(dev.remote.is_empty(), "never offered as remote memory");
    assert!(dev.mem.is_none());
}

fn send_raw(s: &mut UnixStream, id: u16, c: Command, flags: u32, error: u32, p: &[u8]) {
    let h = Header {
        msg_id: id,
        command: c as u16,
        size: (HEADER_LEN + p.len()) as u32,
        flags,
        error,
    };
    let mut m = h.to_bytes().to_vec();
    m.extend_from_slice(p);
    s.write_all(&m).unwrap();
}

fn read_raw(s: &mut UnixStream) -> (Header, Vec<u8>) {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).unwrap();
    let h = Header::parse(&head, 4 << 20).unwrap();
    let mut p = vec![0u8; h.payload_len()];
    s.read_exact(&mut p).unwrap();
    (h, p)
}

/// A raw client: VERSION and a DMA map without a descriptor at `DMA_BASE`.
fn raw_with_remote_map(path: &std::path::Path) -> UnixStream {
    let mut s = raw(path);
    let mut v = vec![0, 0, 2, 0];
    v.extend_from_slice(b"{}\0");
    send_raw(&mut s, 1, Command::Version, FLAG_COMMAND, 0, &v);
    assert!(read_raw(&mut s).0.is_reply());
    let m = gmig_qemu_bridge::proto::DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0,
        address: DMA_BASE,
        size: 0x1000,
    };
    send_raw(&mut s, 2, Command::DmaMap, FLAG_COMMAND, 0, &m.to_bytes());
    let (h, _) = read_raw(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0);
    s
}

/// Sends REGION_WRITE `id` of an address to REG_COPY (the device DMA-reads `DMA_BASE`) and
/// returns the header of the DMA_READ the server sends for it.
fn copy_request(s: &mut UnixStream, id: u16) -> Header {
    let copy = RegionAccess {
        offset: REG_COPY,
        region: BAR0,
        count: 8,
    };
    let w = copy.to_bytes(&DMA_BASE.to_le_bytes());
    send_raw(s, id, Command::RegionWrite, FLAG_COMMAND, 0, &w);
    let (h, _) = read_raw(s);
    assert_eq!(h.command, Command::DmaRead as u16);
    h
}

/// While the server waits for the reply to its DMA_READ, a client may pipeline commands (they are
/// handled afterwards, in order), answer with an error (the device's access fails with that
/// errno), answer wrongly (EIO), or vanish (the session ends, the device runs on for the next
/// client).
#[test]
fn a_client_that_pipelines_errs_or_vanishes_during_a_dma_request() {
    let (path, server, _dir) = spawn(9, 2);
    let mut s = raw_with_remote_map(&path);
    let copy = RegionAccess {
        offset: REG_COPY,
        region: BAR0,
        count: 8,
    };
    let info = [16u32, 0, 0, 0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect::<Vec<u8>>();
    // 1. REGION_WRITE that DMAs, with DEVICE_GET_INFO pipelined behind it; the DMA_READ is
    //    answered with an error.
    send_raw(
        &mut s,
        3,
        Command::RegionWrite,
        FLAG_COMMAND,
        0,
        &copy.to_bytes(&DMA_BASE.to_le_bytes()),
    );
    send_raw(&mut s, 4, Command::DeviceGetInfo, FLAG_COMMAND, 0, &info);
    let (h, p) = read_raw(&mut s);
    assert_eq!(h.command, Command::DmaRead as u16);
    assert!(!h.is_reply());
    let (a, rest) = DmaAccess::parse(&p).unwrap();
    assert_eq!((a.address, a.count, rest.len()), (DMA_BASE, 4, 0));
    send_raw(
        &mut s,
        h.msg_id,
        Command::DmaRead,
        FLAG_REPLY | FLAG_ERROR,
        libc::EPERM as u32,
        &[],
    );
    let (h3, _) = read_raw(&mut s);
    assert_eq!((h3.msg_id, h3.error), (3, libc::EPERM as u32));
    let (h4, p4) = read_raw(&mut s);
    assert_eq!((h4.msg_id, h4.flags & FLAG_ERROR, p4.len()), (4, 0, 16));

    // 2. A reply with the wrong count: EIO.
    let h = copy_request(&mut s, 5);
    let bad = DmaAccess {
        address: DMA_BASE,
        count: 3,
    }
    .to_bytes(b"xyz");
    send_raw(&mut s, h.msg_id, Command::DmaRead, FLAG_REPLY, 0, &bad);
    let (h5, _) = read_raw(&mut s);
    assert_eq!((h5.msg_id, h5.error), (5, libc::EIO as u32));

    // 3. A good answer.
    let h = copy_request(&mut s, 6);
    let good = DmaAccess {
        address: DMA_BASE,
        count: 4,
    }
    .to_bytes(b"wxyz");
    send_raw(&mut s, h.msg_id, Command::DmaRead, FLAG_REPLY, 0, &good);
    let (h6, _) = read_raw(&mut s);
    assert_eq!((h6.msg_id, h6.flags & FLAG_ERROR), (6, 0));

    // 4. The client vanishes instead of answering.
    let h = copy_request(&mut s, 7);
    assert_eq!(h.command, Command::DmaRead as u16);
    drop(s);

    // The next client is served; the device kept what the good answer brought.
    let mut c = Client::connect(&path).unwrap();
    assert_eq!(c.region_read(BAR0, COPY_SLOT, 4).unwrap(), b"wxyz");
    assert_eq!(c.device_state().unwrap(), DeviceState::Running as u32);
    drop(c);
    let dev = server.join().unwrap();
    assert!(dev.remote.is_empty());
}

/// A mappable region: its descriptor comes with the region-info reply and the sparse-mmap
/// capability names the part that may be mapped; what the client writes through the descriptor
/// the device reads, and back. An ioeventfd from GET_REGION_IO_FDS signals the device without a
/// REGION_WRITE.
#[test]
fn sparse_mmap_region_and_ioeventfd_reach_the_device_without_messages() {
    let (path, server, _dir) = spawn(10, 1);
    let mut c = Client::connect(&path).unwrap();
    let d = c.region_details(BAR1).unwrap();
    assert_eq!(d.flags, 1 | 2 | 4 | 8, "READ | WRITE | MMAP | CAPS");
    assert_eq!(d.size, 8192);
    assert_eq!(
        d.sparse.as_deref(),
        Some(
            &[SparseArea {
                offset: 4096,
                size: 4096
            }][..]
        )
    );
    let f = d.file.expect("the region's descriptor");
    f.write_all_at(b"mmap", d.offset + 4096).unwrap();
    assert_eq!(c.region_read(BAR1, 4096, 4).unwrap(), b"mmap");
    c.region_write(BAR1, 4100, b"back").unwrap();
    let mut got = [0u8; 4];
    f.read_exact_at(&mut got, d.offset + 4100).unwrap();
    assert_eq!(&got, b"back");
    // A region that is not mappable says so.
    let d0 = c.region_details(BAR0).unwrap();
    assert!(d0.file.is_none() && d0.sparse.is_none() && d0.flags & 4 == 0);

    // Too little room: the reply says how much the chain needs, and names no capability.
    let small = gmig_qemu_bridge::proto::RegionInfo {
        argsz: 32,
        flags: 0,
        index: BAR1,
        cap_offset: 0,
        size: 0,
        offset: 0,
    };
    let (r, _) = c
        .request_fds(Command::DeviceGetRegionInfo, &small.to_bytes(&[]), &[])
        .unwrap();
    let (info, rest) = gmig_qemu_bridge::proto::RegionInfo::parse(&r).unwrap();
    assert_eq!((info.argsz, info.cap_offset, rest.len()), (64, 0, 0));

    // The doorbell: two signals through the descriptor, counted by the device.
    let fds = c.region_io_fds(BAR0).unwrap();
    assert_eq!(fds.len(), 1);
    let (e, mut bell) = fds.into_iter().next().unwrap();
    assert_eq!((e.offset, e.size, e.kind, e.flags), (DOORBELL, 4, 0, 0));
    bell.write_all(&1u64.to_le_bytes()).unwrap();
    bell.write_all(&1u64.to_le_bytes()).unwrap();
    let n = c.region_read(BAR0, REG_DOORBELLS, 8).unwrap();
    assert_eq!(u64::from_le_bytes(n.try_into().unwrap()), 2);
    assert!(c.region_io_fds(BAR1).unwrap().is_empty());
    assert_eq!(refused(c.region_io_fds(99)), libc::EINVAL);
    // Too little room for the entries: count and the size they need, no descriptors.
    let head = gmig_qemu_bridge::proto::IoFdsHead {
        argsz: 16,
        flags: 0,
        index: BAR0,
        count: 0,
    };
    let (r, fds) = c
        .request_fds(Command::DeviceGetRegionIoFds, &head.to_bytes(&[]), &[])
        .unwrap();
    let (h, rest) = gmig_qemu_bridge::proto::IoFdsHead::parse(&r).unwrap();
    assert_eq!((h.argsz, h.count, rest.len(), fds.len()), (56, 1, 0, 0));
    drop(c);
    assert_eq!(server.join().unwrap().doorbells, 2);
}

/// REGION_WRITE_MULTI: every write checked first, then made in order; a bad one refuses all.
#[test]
fn region_write_multi_checks_every_write_then_makes_them_in_order() {
    let (path, server, _dir) = spawn(11, 1);
    let mut c = Client::connect(&path).unwrap();
    assert!(c.capabilities.contains("\"write_multiple\":true"));
    let w = |offset, count, data| WriteMultiEntry {
        offset,
        region: BAR0,
        count,
        data,
    };
    let n = c
        .region_write_multi(&[
            w(0x40, 4, 0x4433_2211),
            w(0x44, 2, 0x6655),
            w(0x40, 1, 0xaa),
        ])
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        c.region_read(BAR0, 0x40, 8).unwrap(),
        [0xaa, 0x22, 0x33, 0x44, 0x55, 0x66, 0, 0]
    );
    // A write of 9 bytes, or past the region's end, refuses the whole request: nothing changes.
    assert_eq!(
        refused(c.region_write_multi(&[w(0x48, 4, 1), w(0x4c, 9, 1)])),
        libc::EINVAL
    );
    assert_eq!(
        refused(c.region_write_multi(&[w(0x48, 4, 1), w(4094, 4, 1)])),
        libc::EINVAL
    );
    assert_eq!(c.region_read(BAR0, 0x48, 4).unwrap(), [0, 0, 0, 0]);
    // A count past the most a request carries.
    let mut big = 201u64.to_le_bytes().to_vec();
    big.resize(8 + 201 * 24, 0);
    assert_eq!(
        refused(c.request(Command::RegionWriteMulti, &big, &[])),
        libc::EINVAL
    );
    drop(c);
    server.join().unwrap();
}

/// The rust-vmm `vfio_user` client (cloud-hypervisor's) reads the sparse-mmap capability and the
/// region's descriptor from gmig's server.
#[test]
fn rust_vmm_client_maps_the_sparse_region() {
    let (path, server, _dir) = spawn(12, 1);
    let c = vfio_user::Client::new(&path).unwrap();
    let r = c.region(BAR1).expect("region 1");
    assert_eq!(r.size, 8192);
    assert_eq!(r.sparse_areas.len(), 1);
    assert_eq!(
        (r.sparse_areas[0].offset, r.sparse_areas[0].size),
        (4096, 4096)
    );
    let fo = r
        .file_offset
        .as_ref()
        .expect("a descriptor for the mappable region");
    fo.file().write_all_at(b"peer", fo.start() + 4096).unwrap();
    drop(c);
    let mut dev = server.join().unwrap();
    let mut got = [0u8; 4];
    dev.region_read(BAR1, 4096, &mut got).unwrap();
    assert_eq!(&got, b"peer");
}

fn le32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// What gmig's client sends for migration and DMA logging, captured by a raw server and checked
/// byte for byte against the layouts of the specification (the kernel uAPI's
/// `vfio_device_feature`, `vfio_device_feature_mig_state`, `..._dma_logging_control`,
/// `..._dma_logging_report`; vfio-user's `vfio_user_mig_data`). A GET's `argsz` is the room for
/// its reply.
#[test]
fn the_clients_migration_requests_are_byte_exact() {
    use gmig_qemu_bridge::proto::{Feature, MigData};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let t = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let mut head = [0u8; HEADER_LEN];
        while s.read_exact(&mut head).is_ok() {
            let h = Header::parse(&head, 1 << 20).unwrap();
            let mut p = vec![0u8; h.payload_len()];
            s.read_exact(&mut p).unwrap();
            let reply = match Command::try_from(h.command).unwrap() {
                Command::Version => b"\0\0\x02\0{}\0".to_vec(),
                Command::DeviceFeature => {
                    let (f, data) = Feature::parse(&p).unwrap();
                    if f.flags & (1 << 16) != 0 {
                        Feature::to_bytes(f.flags, &vec![0; f.argsz as usize - Feature::LEN])
                    } else {
                        Feature::to_bytes(f.flags, data)
                    }
                }
                Command::MigDataRead => MigData::to_bytes(8, 0, &[]),
                _ => Vec::new(),
            };
            send_raw(
                &mut s,
                h.msg_id,
                Command::try_from(h.command).unwrap(),
                FLAG_REPLY,
                0,
                &reply,
            );
            got.push((h.command, p));
        }
        got
    });
    let mut c = Client::connect(&path).unwrap();
    c.migration_flags().unwrap();
    c.set_device_state(DeviceState::PreCopy).unwrap();
    c.device_state().unwrap();
    c.mig_data_size().unwrap();
    c.dma_logging_start(4096, &[(0x1_0000_0000, 0x20_0000)])
        .unwrap();
    c.dma_logging_report(0x1_0000_0000, 0x20_0000, 4096)
        .unwrap();
    c.dma_logging_stop().unwrap();
    assert_eq!(c.mig_read(4096).unwrap(), Some(Vec::new()));
    c.mig_write(&[1, 2, 3]).unwrap();
    drop(c);
    let got = t.join().unwrap();
    let feature = |i: usize| {
        assert_eq!(got[i].0, Command::DeviceFeature as u16);
        got[i].1.clone()
    };
    // MIGRATION GET: argsz 16 (8 of reply data), flags GET | 1; nothing else.
    assert_eq!(feature(1), le32(&[16, 0x1_0001]));
    // MIG_DEVICE_STATE SET: argsz 16, flags SET | 2, device_state PRE_COPY (6), data_fd -1.
    assert_eq!(feature(2), le32(&[16, 0x2_0002, 6, u32::MAX]));
    // MIG_DEVICE_STATE GET and MIG_DATA_SIZE GET: argsz 16.
    assert_eq!(feature(3), le32(&[16, 0x1_0002]));
    assert_eq!(feature(4), le32(&[16, 0x1_0009]));
    // DMA_LOGGING_START SET: argsz 40, flags SET | 6, page_size u64, num_ranges u32, reserved,
    // then {iova u64, length u64}.
    let mut start = le32(&[40, 0x2_0006]);
    start.extend_from_slice(&4096u64.to_le_bytes());
    start.extend_from_slice(&le32(&[1, 0]));
    start.extend_from_slice(&0x1_0000_0000u64.to_le_bytes());
    start.extend_from_slice(&0x20_0000u64.to_le_bytes());
    assert_eq!(feature(5), start);
    // DMA_LOGGING_REPORT GET: argsz 8 + 24 + 8 bitmap words (512 pages), flags GET | 8, iova,
    // length, page_size.
    let mut report = le32(&[96, 0x1_0008]);
    for v in [0x1_0000_0000u64, 0x20_0000, 4096] {
        report.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(feature(6), report);
    // DMA_LOGGING_STOP SET: no data.
    assert_eq!(feature(7), le32(&[8, 0x2_0007]));
    // MIG_DATA_READ: argsz the room for the reply (8 + size, as QEMU sends and libvfio-user
    // requires), size; MIG_DATA_WRITE: argsz 8 + 3, size 3, data.
    assert_eq!(
        got[8],
        (Command::MigDataRead as u16, le32(&[8 + 4096, 4096]))
    );
    let mut w = le32(&[11, 3]);
    w.extend_from_slice(&[1, 2, 3]);
    assert_eq!(got[9], (Command::MigDataWrite as u16, w));
}

/// A GET whose `argsz` names the room for the reply but carries only the header (as
/// libvfio-user's client sends) is answered; one with no room for the reply is refused.
#[test]
fn feature_gets_are_answered_within_the_room_argsz_gives() {
    let (path, server, _dir) = spawn(13, 1);
    let mut s = raw(&path);
    let mut v = vec![0, 0, 2, 0];
    v.extend_from_slice(b"{}\0");
    send_raw(&mut s, 1, Command::Version, FLAG_COMMAND, 0, &v);
    read_raw(&mut s);
    send_raw(
        &mut s,
        2,
        Command::DeviceFeature,
        FLAG_COMMAND,
        0,
        &le32(&[16, 0x1_0002]),
    );
    let (h, p) = read_raw(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0);
    assert_eq!(&p[8..12], &(DeviceState::Running as u32).to_le_bytes());
    // Kernel style: the data area sent along (zeroed).
    send_raw(
        &mut s,
        3,
        Command::DeviceFeature,
        FLAG_COMMAND,
        0,
        &le32(&[16, 0x1_0001, 0, 0]),
    );
    let (h, p) = read_raw(&mut s);
    assert_eq!((h.flags & FLAG_ERROR, p.len()), (0, 16));
    // No room for the reply, and argsz short of what was sent.
    send_raw(
        &mut s,
        4,
        Command::DeviceFeature,
        FLAG_COMMAND,
        0,
        &le32(&[8, 0x1_0002]),
    );
    assert_eq!(read_raw(&mut s).0.error, libc::EINVAL as u32);
    send_raw(
        &mut s,
        5,
        Command::DeviceFeature,
        FLAG_COMMAND,
        0,
        &le32(&[8, 0x2_0002, 2, u32::MAX]),
    );
    assert_eq!(read_raw(&mut s).0.error, libc::EINVAL as u32);
    // A reply to nothing is ignored: no answer, and the next command is served.
    send_raw(&mut s, 0x7777, Command::DeviceGetInfo, FLAG_REPLY, 0, &[]);
    send_raw(
        &mut s,
        6,
        Command::DeviceGetInfo,
        FLAG_COMMAND,
        0,
        &le32(&[16, 0, 0, 0]),
    );
    let (h, _) = read_raw(&mut s);
    assert_eq!((h.msg_id, h.flags & FLAG_ERROR), (6, 0));
    drop(s);
    server.join().unwrap();
}

/// MIG_DATA_READ's `argsz` is the room for the reply (the fixed part and `size` bytes): a request
/// with less is refused, as libvfio-user refuses it; with the room it is read.
#[test]
fn a_mig_data_read_without_room_for_its_reply_is_refused() {
    use gmig_qemu_bridge::proto::MigData;
    let (path, server, _dir) = spawn(21, 1);
    let mut c = Client::connect(&path).unwrap();
    c.set_device_state(DeviceState::StopCopy).unwrap();
    let short = MigData::to_bytes(MigData::LEN as u32, 4096, &[]);
    assert_eq!(
        refused(c.request(Command::MigDataRead, &short, &[])),
        libc::EINVAL
    );
    let roomy = MigData::to_bytes(MigData::LEN as u32 + 4096, 4096, &[]);
    let reply = c.request(Command::MigDataRead, &roomy, &[]).unwrap();
    let (m, data) = MigData::parse(&reply).unwrap();
    assert!(m.size > 0 && m.size as usize == data.len(), "{m:?}");
    drop(c);
    server.join().unwrap();
}

/// DMA_UNMAP with `VFIO_DMA_UNMAP_FLAG_ALL` (address and size 0) unmaps every region: the same
/// ranges map again afterwards (a map over a live one is EEXIST), a region is gone; the flag
/// with a range is EINVAL, an unknown flag ENOTSUP.
#[test]
fn dma_unmap_all_unmaps_every_region() {
    use gmig_qemu_bridge::proto::DmaUnmap;
    let (path, server, _dir) = spawn(22, 1);
    let mut c = Client::connect(&path).unwrap();
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(2 << 20).unwrap();
    c.dma_map(&ram, 0, 0, 1 << 20).unwrap();
    c.dma_map(&ram, 1 << 20, 1 << 20, 1 << 20).unwrap();
    assert_eq!(refused(c.dma_map(&ram, 0, 0, 1 << 20)), libc::EEXIST);
    let unmap = |flags: u32, address: u64, size: u64| {
        DmaUnmap {
            argsz: DmaUnmap::LEN as u32,
            flags,
            address,
            size,
        }
        .to_bytes()
    };
    assert_eq!(
        refused(c.request(Command::DmaUnmap, &unmap(2, 0, 1 << 20), &[])),
        libc::EINVAL
    );
    assert_eq!(
        refused(c.request(Command::DmaUnmap, &unmap(4, 0, 0), &[])),
        libc::ENOTSUP
    );
    c.request(Command::DmaUnmap, &unmap(2, 0, 0), &[]).unwrap();
    assert_eq!(refused(c.dma_unmap(1 << 20, 1 << 20)), libc::EINVAL);
    c.dma_map(&ram, 0, 0, 1 << 20).unwrap();
    c.dma_map(&ram, 1 << 20, 1 << 20, 1 << 20).unwrap();
    drop(c);
    server.join().unwrap();
}
