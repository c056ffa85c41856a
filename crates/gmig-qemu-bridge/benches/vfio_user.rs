//! vfio-user costs, measured over a real UNIX socket between gmig's client and server:
//! - the round trip of a 4-byte REGION_READ (criterion, plus p50/p99 over 20,000 round trips),
//!   beside a bare UNIX socket ping-pong of the same sizes (the floor: two wake-ups, no protocol),
//!   and the same with the server polling its socket for 50 us after each message
//!   (`Server::set_poll`, `gmig serve --poll-us 50`: one wake-up less), and with the client
//!   polling for its reply too (`Client::set_poll`: no wake-up at all);
//! - MIG_DATA_READ throughput (a 64 MiB STOP_COPY stream read in 1 MiB messages) against a plain
//!   socket copy of the same bytes in 1 MiB writes, in the same run.
//!
//! `cargo bench -p gmig-qemu-bridge --bench vfio_user`

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use gmig_qemu_bridge::client::Client;
use gmig_qemu_bridge::server::{Errno, Server, UserDevice};
use gmig_vfio_migration::testdev::BlobDevice;
use gmig_vfio_migration::{DeviceState, MigrationFeatures, MigrationHandle};
use vm_memory::GuestMemoryMmap;

const BLOB: usize = 64 << 20;
const XFER: u32 = 1 << 20;

struct Dev {
    mig: MigrationHandle<BlobDevice>,
}

impl UserDevice for Dev {
    type Mig = BlobDevice;
    fn device_info(&self) -> (u32, u32, u32) {
        (2, 9, 5)
    }
    fn region_info(&self, index: u32) -> Option<(u32, u64)> {
        (index == 0).then_some((3, 4096))
    }
    fn region_read(&mut self, _: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        data.fill(offset as u8);
        Ok(())
    }
    fn region_write(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), Errno> {
        Ok(())
    }
    fn irq_info(&self, _: u32) -> Option<(u32, u32)> {
        None
    }
    fn set_irqs(&mut self, _: u32, _: u32, _: u32, _: u32, _: Vec<File>) -> Result<(), Errno> {
        Ok(())
    }
    fn reset(&mut self) -> Result<(), Errno> {
        Ok(())
    }
    fn dma_changed(&mut self, _: Option<&GuestMemoryMmap>) {}
    fn migration(&mut self) -> Option<&mut MigrationHandle<BlobDevice>> {
        Some(&mut self.mig)
    }
}

fn served() -> (Client, tempfile::TempDir) {
    served_polling(None)
}

fn served_polling(poll: Option<Duration>) -> (Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.sock");
    let listener = UnixListener::bind(&path).unwrap();
    thread::spawn(move || {
        let dev = Dev {
            mig: MigrationHandle::new(BlobDevice::new(
                BLOB,
                XFER as usize,
                1,
                MigrationFeatures::ALL,
            ))
            .unwrap(),
        };
        let mut server = Server::new(dev);
        server.set_poll(poll);
        while let Ok((s, _)) = listener.accept() {
            let _ = server.serve(s);
        }
    });
    (Client::connect(&path).unwrap(), dir)
}

/// The floor under any vfio-user round trip on this machine: two threads exchanging a 32-byte
/// request and a 20-byte reply over a blocking UNIX socket pair (one write and one read a side,
/// no protocol at all). p50 and p99 over 20,000 round trips.
fn socket_floor() -> (Duration, Duration) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let echo = thread::spawn(move || {
        let mut req = [0u8; 32];
        let reply = [0u8; 20];
        while b.read_exact(&mut req).is_ok() {
            if b.write_all(&reply).is_err() {
                break;
            }
        }
    });
    let mut reply = [0u8; 20];
    let mut t: Vec<Duration> = (0..20_000)
        .map(|_| {
            let s = Instant::now();
            a.write_all(&[1u8; 32]).unwrap();
            a.read_exact(&mut reply).unwrap();
            s.elapsed()
        })
        .collect();
    drop(a);
    echo.join().unwrap();
    t.sort_unstable();
    (t[t.len() / 2], t[t.len() * 99 / 100])
}

/// p50 and p99 of 20,000 4-byte REGION_READs.
fn region_read_percentiles(c: &mut Client) -> (Duration, Duration) {
    let mut t: Vec<Duration> = (0..20_000)
        .map(|i| {
            let s = Instant::now();
            c.region_read(0, (i % 1024) * 4, 4).unwrap();
            s.elapsed()
        })
        .collect();
    t.sort_unstable();
    (t[t.len() / 2], t[t.len() * 99 / 100])
}

fn percentiles() {
    let (floor50, floor99) = socket_floor();
    let (mut c, _dir) = served();
    let (p50, p99) = region_read_percentiles(&mut c);
    let (mut polled, _pdir) = served_polling(Some(Duration::from_micros(50)));
    let (poll50, poll99) = region_read_percentiles(&mut polled);
    polled.set_poll(Some(Duration::from_micros(50)));
    let (both50, both99) = region_read_percentiles(&mut polled);
    drop(polled);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "REGION_READ 4 B round trip: p50 {:.1} us, p99 {:.1} us (20,000 round trips); \
         the server polling 50 us: p50 {:.1} us, p99 {:.1} us; \
         server and client polling 50 us: p50 {:.1} us, p99 {:.1} us; \
         bare socket ping-pong in the same run: p50 {:.1} us, p99 {:.1} us",
        us(p50),
        us(p99),
        us(poll50),
        us(poll99),
        us(both50),
        us(both99),
        us(floor50),
        us(floor99)
    );

    // MIG_DATA_READ: a whole STOP_COPY stream.
    c.set_device_state(DeviceState::StopCopy).unwrap();
    let s = Instant::now();
    let mut total = 0usize;
    let mut reads = 0u64;
    // One buffer for the whole stream, as a VMM copying into its own migration stream would.
    let mut chunk = Vec::new();
    loop {
        reads += 1;
        let n = c.mig_read_into(XFER, &mut chunk).unwrap().unwrap();
        if n == 0 {
            break;
        }
        total += n;
    }
    let mig = s.elapsed();
    c.set_device_state(DeviceState::Running).unwrap();

    // A plain socket copy of the same bytes, 1 MiB per write.
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let n = total;
    let writer = thread::spawn(move || {
        let buf = vec![7u8; XFER as usize];
        let mut left = n;
        while left > 0 {
            let k = left.min(buf.len());
            a.write_all(&buf[..k]).unwrap();
            left -= k;
        }
    });
    let s = Instant::now();
    let mut buf = vec![0u8; XFER as usize];
    let mut got = 0;
    while got < n {
        got += b.read(&mut buf).unwrap();
    }
    let plain = s.elapsed();
    writer.join().unwrap();
    // The same stream read in process from the device itself: what the device costs without the
    // protocol.
    let mut h = MigrationHandle::new(BlobDevice::new(
        BLOB,
        XFER as usize,
        1,
        MigrationFeatures::ALL,
    ))
    .unwrap();
    let id = h
        .set_state(DeviceState::StopCopy)
        .unwrap()
        .new_stream
        .unwrap()
        .id;
    let s = Instant::now();
    while let gmig_vfio_migration::ReadOutcome::Data(n) = h.read(id, &mut buf).unwrap() {
        if n == 0 {
            break;
        }
    }
    let local = s.elapsed();
    let gbps = |d: Duration| total as f64 / d.as_secs_f64() / 1e9;
    println!(
        "in-process device read of the same stream: {:.2} GB/s",
        gbps(local)
    );
    println!(
        "MIG_DATA_READ: {:.2} GB/s for {} MiB in {reads} reads; plain socket copy {:.2} GB/s; ratio {:.2}; \
         MIG_DATA_READ / in-process device read {:.2}",
        gbps(mig),
        total >> 20,
        gbps(plain),
        gbps(mig) / gbps(plain),
        gbps(mig) / gbps(local)
    );
}

fn bench(cr: &mut Criterion) {
    percentiles();
    let (mut c, _dir) = served();
    cr.bench_function("region_read_4_bytes", |b| {
        b.iter(|| c.region_read(0, 64, 4).unwrap());
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
