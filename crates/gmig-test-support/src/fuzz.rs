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
use gmig_vgpu::gm::{VgpuSlices, VgpuType, PAGE_SIZE};
use gmig_vgpu::gtt::{ram_size, GuestRam};
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
use gmig_vgpu::workload::{GuestDriver, Profile, WorkloadConfig};
use gmig_vgpu::Vgpu;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

mod guest;
mod guest_ops;
mod guest_play;
mod guest_seed;

pub use guest::{vgpu_guest, vgpu_guest_seeds};
pub use guest_ops::GuestOutcome;

/// Guest RAM of the harnesses' vGPUs (small: a stream carries all of it).
pub const FUZZ_RAM: u64 = 4 << 20;
const TY: VgpuType = VgpuType::V5_8;

/// Feeds `data[1..]` to the push decoder in segments of varying length, pulling sections after
/// each, and reads the same bytes with the pull reader. Both must agree on whether the stream is
/// valid and, when it is, on its sections; neither may panic or read past the input.
///
/// `data[0]` seeds the segmentation: segment lengths are drawn from 1 to a maximum of 16 to 4,096
/// bytes, so every split point of a header or record is reached across inputs without feeding a
/// whole stream byte by byte (which made each input cost milliseconds).
pub fn stream_decode(data: &[u8]) {
    let Some((&seg, bytes)) = data.split_first() else {
        return;
    };
    let max = 16usize << (seg % 9);
    let mut rng = u64::from(seg).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let len = 1 + (rng % max as u64) as usize;
        let end = (at + len).min(bytes.len());
        pieces.push(&bytes[at..end]);
        at = end;
    }
    let limits = StreamLimits::default();
    let mut push = StreamDecoder::new(limits, None);
    let mut pushed = Vec::new();
    let mut push_err = false;
    'feed: for piece in pieces {
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

const MAX_DRAIN: gmig_core::migration::Drain = gmig_core::migration::Drain {
    workloads: 2,
    time: None,
};

fn settings() -> SaveSettings {
    let mut c = MigrationConfig::new(Policy::OneShot);
    c.hash_threads = 1;
    c.max_drain = MAX_DRAIN;
    SaveSettings::from(&c)
}

fn factory(d: VgpuSlices) -> VgpuFactory {
    VgpuFactory::new(gmig_cmdparser::Gen::Gen9, TY, d, FUZZ_RAM)
}

/// The harnesses' guest draws a 72×72 screen (the 64×64 cursor must fit) with one window: every
/// kind of state and page a larger guest has, in a 115 KB stream instead of 226 KB.
fn tiny_workload() -> WorkloadConfig {
    WorkloadConfig {
        width: 72,
        height: 72,
        windows: 1,
        compute_bytes: 4096,
        resident_bytes: 0,
    }
}

fn running_vgpu(s: VgpuSlices, seed: u64) -> VgpuVm {
    let mut vm = VgpuVm::boot(TY, s, FUZZ_RAM, Profile::Desktop, tiny_workload(), seed)
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

/// The resume harness's starting point, built once per thread: a running vGPU booted the way
/// every input needs it, and a twin of it booted apart and taken through the stop an input's
/// RUNNING -> RESUMING passes.
///
/// Every input gets its own clone of the booted vGPU and guest driver. The clones share one guest
/// RAM, which goes back to its booted bytes before the next input: only the pages the stop's
/// drain wrote after an input the harness verified (refused, and RAM identical to the twin's),
/// all of it after any other (an accepted stream, or a panic). So each input starts from exactly
/// the state a fresh boot gives, without booting.
struct ResumeBase {
    /// The destination slices the vGPU lives in, and the device's settings.
    slices: VgpuSlices,
    settings: SaveSettings,
    /// The booted vGPU (on `ram`) and its driver, cloned for each input.
    vgpu: Vgpu,
    driver: GuestDriver,
    /// The booted vGPU's guest RAM, shared by every clone, and its bytes as booted.
    ram: GuestRam,
    image: Vec<u8>,
    /// The twin after the stop, on its own RAM, and that RAM's bytes: what a refused stream must
    /// leave.
    reference: Vgpu,
    reference_ram: RamImage,
    /// Byte offsets of the pages the twin's stop changed (the drained work's writes).
    drained: Vec<usize>,
    /// Whether `ram` may differ from `image` beyond `drained` (is not known to be the twin's).
    ram_unknown: bool,
}

impl ResumeBase {
    fn boot() -> ResumeBase {
        let (_, slices) = slices();
        let mut booted = running_vgpu(slices, 7);
        let driver = booted
            .take_driver()
            .expect("the harness vGPU has a guest driver");
        let vgpu = booted.vgpu().clone();
        let ram = vgpu.guest_memory().clone();
        let image = ram_bytes(&ram);
        // RUNNING -> RESUMING passes STOP, whose bounded drain lets in-flight work finish; a
        // failed resume must leave exactly that: the vGPU as the stop left it, running again.
        let twin = running_vgpu(slices, 7);
        let mut reference = twin.vgpu().clone();
        let same = compare_guest_visible(&vgpu, &reference);
        assert!(
            same.is_identical(),
            "two boots of the harness vGPU differ: {same:?}"
        );
        reference.pause(MAX_DRAIN);
        reference.resume();
        let reference_ram = RamImage::new(ram_bytes(reference.guest_memory()));
        let page = PAGE_SIZE as usize;
        let drained = (0..image.len())
            .step_by(page)
            .filter(|&at| image[at..at + page] != reference_ram.bytes[at..at + page])
            .collect();
        ResumeBase {
            slices,
            settings: settings(),
            vgpu,
            driver,
            ram,
            image,
            reference,
            reference_ram,
            drained,
            ram_unknown: false,
        }
    }

    /// The booted vGPU, as a fresh boot gives it, for one input.
    fn held(&mut self) -> VgpuVm {
        if std::mem::replace(&mut self.ram_unknown, true) {
            write_ram(&self.ram, &self.image, 0..self.image.len());
        }
        let mut vm =
            VgpuVm::on_memory(TY, self.slices, self.ram.clone()).expect("the harness vGPU");
        *vm.vgpu_mut() = self.vgpu.clone();
        vm.attach_driver(self.driver.clone());
        vm
    }

    /// Whether `v` is identical to the twin after the stop, checked in place (the GGTT tables and
    /// guest RAM compared as they are, not copied): `true` only where [`compare_guest_visible`]
    /// finds nothing (registers, GGTT, faults, every byte of guest RAM); `false` leaves the
    /// verdict, and the report, to it.
    fn same_as_reference(&self, v: &Vgpu) -> bool {
        let r = &self.reference;
        v.guest_registers() == r.guest_registers()
            && v.guest_view() == r.guest_view()
            && v.guest_gpu_view(None).ggtt == r.guest_gpu_view(None).ggtt
            && v.faults() == r.faults()
            && self.reference_ram.held_by(v.guest_memory())
    }

    /// After a refused input left `v` identical to the twin: if `v` lives on the shared RAM,
    /// only the drained pages differ from the booted bytes.
    fn refused_left(&mut self, v: &Vgpu) {
        if v.guest_memory().get_host_address(GuestAddress(0)).ok()
            != self.ram.get_host_address(GuestAddress(0)).ok()
        {
            return;
        }
        for &at in &self.drained {
            write_ram(&self.ram, &self.image, at..at + PAGE_SIZE as usize);
        }
        self.ram_unknown = false;
    }
}

fn ram_bytes(ram: &GuestRam) -> Vec<u8> {
    let mut b = vec![0u8; usize::try_from(ram_size(ram)).expect("guest RAM size")];
    ram.read_slice(&mut b, GuestAddress(0))
        .expect("read the harness guest RAM");
    b
}

/// The bytes of a guest RAM, with which of its chunks are all zero.
struct RamImage {
    bytes: Vec<u8>,
    zero: Vec<bool>,
}

/// [`RamImage`]'s chunk: a zero chunk is checked against [`ZEROS`], which stays in cache, so a
/// guest RAM that is mostly zero pages is compared reading little more than itself.
const CHUNK: usize = 64 << 10;
static ZEROS: [u8; CHUNK] = [0; CHUNK];

impl RamImage {
    fn new(bytes: Vec<u8>) -> RamImage {
        let zero = bytes
            .chunks(CHUNK)
            .map(|c| c == &ZEROS[..c.len()])
            .collect();
        RamImage { bytes, zero }
    }

    /// Whether guest RAM `mem` is exactly this image (same size, same bytes), compared in place.
    fn held_by(&self, mem: &GuestRam) -> bool {
        self.held_at(mem, 0)
    }

    /// Whether guest RAM `mem`, one region from `start`, is exactly this image.
    fn held_at(&self, mem: &GuestRam, start: u64) -> bool {
        let want = &self.bytes;
        if ram_size(mem) != start + want.len() as u64 {
            return false;
        }
        let Ok(slice) = mem.get_slice(GuestAddress(start), want.len()) else {
            return false;
        };
        let guard = slice.ptr_guard();
        // SAFETY: `guard` keeps the `want.len()` mapped bytes at `as_ptr()` alive while `got` is
        // borrowed, and nothing writes them meanwhile: the vGPU is software, runs on this thread
        // only, and its device is idle (no stream open, no DMA logging).
        let got = unsafe { std::slice::from_raw_parts(guard.as_ptr(), want.len()) };
        got.chunks(CHUNK)
            .zip(want.chunks(CHUNK))
            .zip(&self.zero)
            .all(|((g, w), &zero)| g == if zero { &ZEROS[..g.len()] } else { w })
    }
}

fn write_ram(ram: &GuestRam, image: &[u8], range: std::ops::Range<usize>) {
    ram.write_slice(&image[range.clone()], GuestAddress(range.start as u64))
        .expect("write the harness guest RAM");
}

thread_local! {
    static RESUME_BASE: std::cell::RefCell<Option<ResumeBase>> =
        const { std::cell::RefCell::new(None) };
}

/// Resumes `data` into a device that holds a running vGPU (RESUMING, write, STOP). Either the
/// stream is valid and the device now holds a restored vGPU, or the resume fails and, after the
/// VMM's recovery (reset), the device still holds the vGPU it had, identical and running.
/// Returns whether the stream was accepted.
///
/// The vGPU is booted once per thread (`ResumeBase`); each input gets a clone of it, in the
/// state a fresh boot gives, so an input's outcome does not depend on the inputs before it.
pub fn vgpu_resume(data: &[u8]) -> bool {
    RESUME_BASE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let base = cell.get_or_insert_with(ResumeBase::boot);
        resume_into(base, data)
    })
}

fn resume_into(base: &mut ResumeBase, data: &[u8]) -> bool {
    let held = base.held();
    let dev = VmDevice::new(
        Some(held),
        factory(base.slices),
        StreamLimits::default(),
        base.settings,
    )
    .expect("device");
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
    if !base.same_as_reference(vm.vgpu()) {
        let diff = compare_guest_visible(&base.reference, vm.vgpu());
        assert!(
            diff.is_identical(),
            "a failed resume ({} bytes, written: {written}) changed the held vGPU: {diff:?}",
            data.len()
        );
    }
    base.refused_left(vm.vgpu());
    false
}

/// A small device for the vfio-user harness: one 4 KiB BAR, config space, a blob that migrates;
/// it accepts DMA regions without a descriptor, DMAs on two BAR registers (a write of an address
/// at 0x10 reads 16 bytes there into the BAR, at 0x18 writes 16 BAR bytes there), offers BAR0 for
/// sparse mmap and one ioeventfd (both on `/dev/null`: only the server's handling is fuzzed).
struct FuzzDevice {
    bar: Vec<u8>,
    mig: MigrationHandle<gmig_vfio_migration::testdev::BlobDevice>,
    null: std::fs::File,
}

/// The FuzzDevice register that makes it DMA-read into its BAR.
const FUZZ_REG_DMA_READ: u64 = 0x10;
/// The FuzzDevice register that makes it DMA-write from its BAR.
const FUZZ_REG_DMA_WRITE: u64 = 0x18;

impl gmig_qemu_bridge::server::UserDevice for FuzzDevice {
    type Mig = gmig_vfio_migration::testdev::BlobDevice;
    fn device_info(&self) -> (u32, u32, u32) {
        (3, 9, 5)
    }
    fn region_info(&self, index: u32) -> Option<(u32, u64)> {
        matches!(index, 0 | 7).then_some((3, 4096))
    }
    fn region_read(&mut self, _: u32, offset: u64, data: &mut [u8]) -> Result<(), i32> {
        let o = usize::try_from(offset).map_err(|_| libc_einval())?;
        let src = self.bar.get(o..o + data.len()).ok_or_else(libc_einval)?;
        data.copy_from_slice(src);
        Ok(())
    }
    fn region_write(&mut self, _: u32, offset: u64, data: &[u8]) -> Result<(), i32> {
        let o = usize::try_from(offset).map_err(|_| libc_einval())?;
        let dst = self
            .bar
            .get_mut(o..o + data.len())
            .ok_or_else(libc_einval)?;
        dst.copy_from_slice(data);
        Ok(())
    }
    fn irq_info(&self, index: u32) -> Option<(u32, u32)> {
        (index == 1).then_some((1, 1))
    }
    fn set_irqs(
        &mut self,
        _: u32,
        _: u32,
        _: u32,
        _: u32,
        _: Vec<std::fs::File>,
    ) -> Result<(), i32> {
        Ok(())
    }
    fn reset(&mut self) -> Result<(), i32> {
        self.bar.fill(0);
        Ok(())
    }
    fn dma_changed(&mut self, _: Option<&vm_memory::GuestMemoryMmap>) {}
    fn migration(&mut self) -> Option<&mut MigrationHandle<Self::Mig>> {
        Some(&mut self.mig)
    }
    fn region_write_dma(
        &mut self,
        index: u32,
        offset: u64,
        data: &[u8],
        dma: &mut dyn gmig_qemu_bridge::server::Dma,
    ) -> Result<(), i32> {
        if index == 0 && data.len() == 8 {
            let mut a = [0u8; 8];
            a.copy_from_slice(data);
            let address = u64::from_le_bytes(a);
            match offset {
                FUZZ_REG_DMA_READ => {
                    let mut b = [0u8; 16];
                    dma.read(address, &mut b)?;
                    self.bar[..16].copy_from_slice(&b);
                }
                FUZZ_REG_DMA_WRITE => dma.write(address, &self.bar[..16])?,
                _ => {}
            }
        }
        self.region_write(index, offset, data)
    }
    fn remote_dma(&self) -> bool {
        true
    }
    fn region_mmap(&self, index: u32) -> Option<gmig_qemu_bridge::server::RegionMmap<'_>> {
        (index == 0).then(|| gmig_qemu_bridge::server::RegionMmap {
            file: &self.null,
            offset: 0,
            areas: vec![gmig_qemu_bridge::proto::SparseArea {
                offset: 0,
                size: 4096,
            }],
        })
    }
    fn region_io_fds(&self, index: u32) -> Vec<gmig_qemu_bridge::server::IoEventFd<'_>> {
        if index != 0 {
            return Vec::new();
        }
        vec![gmig_qemu_bridge::server::IoEventFd {
            offset: 0x100,
            size: 4,
            datamatch: Some(1),
            file: &self.null,
        }]
    }
}

fn libc_einval() -> i32 {
    22
}

/// Plays `data` as everything a vfio-user client sends on a connection, then hangs up. The server
/// must answer or close without panicking, and leave the device RUNNING for the next client.
/// Returns the device's BAR as the session left it.
pub fn vfio_user_session(data: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let (mut client, server_end) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let dev = FuzzDevice {
        null: std::fs::File::open("/dev/null").expect("/dev/null"),
        bar: vec![0; 4096],
        mig: MigrationHandle::new(gmig_vfio_migration::testdev::BlobDevice::new(
            8192,
            1024,
            1,
            gmig_vfio_migration::MigrationFeatures::ALL,
        ))
        .expect("handle"),
    };
    let server = std::thread::spawn(move || {
        let mut s = gmig_qemu_bridge::server::Server::new(dev);
        let _ = s.serve(server_end);
        s.into_device()
    });
    // Replies are drained on this side so the server never blocks on a full socket.
    let mut reader = client.try_clone().expect("clone");
    let drain = std::thread::spawn(move || {
        let mut sink = [0u8; 4096];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    let _ = client.write_all(data);
    let _ = client.shutdown(std::net::Shutdown::Write);
    let dev = server.join().expect("the server never panics");
    drop(client);
    let _ = drain.join();
    let mut dev = dev;
    let state = gmig_qemu_bridge::server::UserDevice::migration(&mut dev).map(|h| h.state());
    assert_eq!(
        state,
        Some(DeviceState::Running),
        "the device runs after the client left"
    );
    dev.bar
}

/// A valid client session (VERSION, info, region accesses, a migration state change and a data
/// read), as the seed of [`vfio_user_session`].
pub fn vfio_user_seed() -> Vec<u8> {
    use gmig_qemu_bridge::proto::{
        Command, DmaAccess, DmaMap, Feature, Header, IoFdsHead, MigData, Put, RegionAccess,
        RegionInfo, WriteMultiEntry, FLAG_REPLY,
    };
    let mut out = Vec::new();
    let mut msg = |id: u16, c: Command, p: &[u8]| {
        // The server's own requests (DMA_READ/WRITE) number from 0x8000: an id there with
        // DMA_READ/WRITE is the client's reply to one.
        let reply = id >= 0x8000;
        let h = Header {
            msg_id: id,
            command: c as u16,
            size: (16 + p.len()) as u32,
            flags: if reply { FLAG_REPLY } else { 0 },
            error: 0,
        };
        out.extend_from_slice(&h.to_bytes());
        out.extend_from_slice(p);
    };
    let mut v = Vec::new();
    v.put16(0);
    v.put16(2);
    v.extend_from_slice(b"{}\0");
    msg(1, Command::Version, &v);
    let mut info = Vec::new();
    for x in [16u32, 0, 0, 0] {
        info.put32(x);
    }
    msg(2, Command::DeviceGetInfo, &info);
    let a = RegionAccess {
        offset: 8,
        region: 0,
        count: 4,
    };
    msg(3, Command::RegionWrite, &a.to_bytes(&[1, 2, 3, 4]));
    msg(4, Command::RegionRead, &a.to_bytes(&[]));
    let mut st = Vec::new();
    st.put32(DeviceState::PreCopy as u32);
    st.put32(u32::MAX);
    msg(
        5,
        Command::DeviceFeature,
        &Feature::to_bytes((1 << 17) | 2, &st),
    );
    msg(6, Command::MigDataRead, &MigData::to_bytes(8, 1024, &[]));
    msg(7, Command::DeviceReset, &[]);
    // A region without a descriptor; the device reads it (DMA_READ, answered below with a
    // pipelined command in between) and writes it back (DMA_WRITE, answered).
    let base = 0x1_0000_0000u64;
    let map = DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0,
        address: base,
        size: 0x1000,
    };
    msg(8, Command::DmaMap, &map.to_bytes());
    let dma = |offset| RegionAccess {
        offset,
        region: 0,
        count: 8,
    };
    msg(
        9,
        Command::RegionWrite,
        &dma(0x10).to_bytes(&base.to_le_bytes()),
    );
    msg(10, Command::DeviceGetInfo, &info);
    let a = DmaAccess {
        address: base,
        count: 16,
    };
    msg(0x8000, Command::DmaRead, &a.to_bytes(&[0x5a; 16]));
    msg(
        11,
        Command::RegionWrite,
        &dma(0x18).to_bytes(&base.to_le_bytes()),
    );
    msg(0x8001, Command::DmaWrite, &a.to_bytes(&[]));
    let ri = RegionInfo {
        argsz: 128,
        flags: 0,
        index: 0,
        cap_offset: 0,
        size: 0,
        offset: 0,
    };
    msg(12, Command::DeviceGetRegionInfo, &ri.to_bytes(&[]));
    let io = IoFdsHead {
        argsz: 128,
        flags: 0,
        index: 0,
        count: 0,
    };
    msg(13, Command::DeviceGetRegionIoFds, &io.to_bytes(&[]));
    let w = WriteMultiEntry {
        offset: 0x20,
        region: 0,
        count: 4,
        data: 0x1234_5678,
    };
    msg(
        14,
        Command::RegionWriteMulti,
        &WriteMultiEntry::request(&[w, w]),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the inputs before it did (accepted, refused, refused after writing), each input
    /// starts from the vGPU a fresh boot gives: registers, GGTT, faults, every byte of guest RAM
    /// and the guest driver's frame count.
    #[test]
    fn every_resume_input_starts_from_a_freshly_booted_vgpu() {
        let stream = seed_stream();
        let mut flipped = stream.clone();
        flipped[stream.len() / 2] ^= 0x20;
        let fresh = running_vgpu(slices().1, 7);
        let half = &stream[..stream.len() / 2];
        for input in [&stream[..], half, &[], &stream[..], &flipped[..], half] {
            vgpu_resume(input);
            RESUME_BASE.with(|cell| {
                let mut cell = cell.borrow_mut();
                let base = cell.as_mut().expect("booted by the first input");
                let vm = base.held();
                let diff = compare_guest_visible(fresh.vgpu(), vm.vgpu());
                assert!(diff.is_identical(), "{diff:?}");
                assert_eq!(vm.frames(), fresh.frames());
            });
        }
        assert!(vgpu_resume(&stream));
        assert!(!vgpu_resume(half));
    }

    /// The cheap identity check agrees with `compare_guest_visible`: it accepts the held vGPU
    /// after the same stop the twin went through, and refuses one RAM byte changed.
    #[test]
    fn the_cheap_check_accepts_only_what_the_comparison_accepts() {
        assert!(!vgpu_resume(&[]));
        RESUME_BASE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let base = cell.as_mut().expect("booted by the first input");
            let mut vm = base.held();
            assert!(!base.same_as_reference(vm.vgpu()), "not stopped yet");
            vm.vgpu_mut().pause(MAX_DRAIN);
            vm.vgpu_mut().resume();
            assert!(base.same_as_reference(vm.vgpu()));
            let at = GuestAddress(3 * PAGE_SIZE + 5);
            let b: u8 = vm.vgpu().guest_memory().read_obj(at).expect("read");
            vm.vgpu()
                .guest_memory()
                .write_obj(b ^ 1, at)
                .expect("write");
            assert!(!base.same_as_reference(vm.vgpu()));
            assert!(!compare_guest_visible(&base.reference, vm.vgpu()).is_identical());
        });
    }
}
