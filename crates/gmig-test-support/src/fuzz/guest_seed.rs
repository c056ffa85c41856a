//! Seeds of the `vgpu_guest` harness ([`super::guest`]): the guest driver's frames recorded as
//! the operations of the harness's input format (its RAM writes, display register writes and ELSP
//! submissions, then a wait), and a few hand-made sequences.

use std::collections::BTreeSet;

use gmig_cmdparser::{build, AddressSpace};
use gmig_vgpu::gm::PAGE_SIZE;
use gmig_vgpu::mmio::{self, lrc, EngineId};
use gmig_vgpu::workload::{GuestDriver, Profile};
use gmig_vgpu::Vgpu;

use super::guest_ops::{ggtt_entry, mode, op, region_bytes, Layout, RAM_BASE};

/// Writes inputs in the harness's format.
pub(super) struct Enc(pub Vec<u8>);

impl Enc {
    /// An input on the vGPU of profile `Profile::ALL[profile]`.
    pub fn new(profile: u8) -> Enc {
        Enc(vec![profile])
    }
    fn put(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn write32(&mut self, off: u32, v: u32) {
        self.put(&[op::WRITE32, mode::REG_RAW])
            .put(&off.to_le_bytes())
            .put(&[mode::V32_RAW])
            .put(&v.to_le_bytes());
    }
    /// Guest CPU writes at a raw guest-physical address, in pieces of up to 255 bytes.
    pub fn ram(&mut self, gpa: u64, data: &[u8]) {
        for (i, c) in data.chunks(255).enumerate() {
            let at = (gpa + 255 * i as u64) as u32;
            self.put(&[op::RAM, mode::ADDR_RAW])
                .put(&at.to_le_bytes())
                .put(&[c.len() as u8])
                .put(c);
        }
    }
    /// A write of 8 bytes into entry `entry` of PPGTT table `table` (the layout's list).
    pub fn table_entry(&mut self, table: u8, entry: u16, value: u64) {
        self.put(&[op::RAM, 3, table])
            .put(&entry.to_le_bytes())
            .put(&[8])
            .put(&value.to_le_bytes());
    }
    pub fn elsp(&mut self, engine: EngineId, d0: u64, d1: u64) {
        self.put(&[op::ELSP, engine.index() as u8, 0, mode::DESC_RAW])
            .put(&d0.to_le_bytes())
            .put(&[mode::DESC_RAW])
            .put(&d1.to_le_bytes());
    }
    pub fn run_idle(&mut self) {
        self.put(&[op::RUN, mode::RUN_IDLE]);
    }
    pub fn advance(&mut self, commands: u16) {
        self.put(&[op::RUN, mode::RUN_ADVANCE])
            .put(&commands.to_le_bytes());
    }
    fn commands(&mut self, opcode: u8, ctx: u8, cmds: &[u32]) {
        assert!(cmds.len() <= 64, "at most 64 dwords an operation");
        self.put(&[opcode, ctx, cmds.len() as u8]);
        for d in cmds {
            self.put(&d.to_le_bytes());
        }
    }
    /// Commands appended to context `ctx`'s ring, submitted.
    pub fn ring(&mut self, ctx: u8, cmds: &[u32]) {
        self.commands(op::RING, ctx, cmds);
    }
    /// Commands into context `ctx`'s batch, started from its ring, submitted.
    pub fn batch(&mut self, ctx: u8, cmds: &[u32]) {
        self.commands(op::BATCH, ctx, cmds);
    }
    pub fn gdrst(&mut self, domains: u8) {
        self.put(&[op::GDRST, domains]);
    }
    /// GGTT entry of mapped page `slot` (the layout's list) to RAM page `page` (its list).
    pub fn ggtt_map(&mut self, slot: u16, page: u8) {
        self.put(&[op::GGTT_MAP])
            .put(&(slot & 0x7fff).to_le_bytes())
            .put(&[1, page, 1]);
    }
    /// An aperture access at `off` into mapped aperture page `page` (the layout's list).
    pub fn aperture(&mut self, page: u8, off: u16, write: Option<&[u8]>, len: u8) {
        let m = if write.is_some() { 2 } else { 0 };
        self.put(&[op::APERTURE, m, page])
            .put(&off.to_le_bytes())
            .put(&[len]);
        if let Some(d) = write {
            self.put(&d[..usize::from(len)]);
        }
    }
    pub fn fence(&mut self, i: u8, lo: u32, hi: u32) {
        self.put(&[op::FENCE, i, mode::V32_RAW])
            .put(&lo.to_le_bytes())
            .put(&[mode::V32_RAW])
            .put(&hi.to_le_bytes());
    }
    /// A PPGTT create notification for table `table` (the layout's list) as a root.
    pub fn ppgtt_create(&mut self, table: u8) {
        self.put(&[op::PPGTT, 0, table]);
    }
}

/// The registers a frame of the driver may write besides ELSP: display planes and fences.
fn display_registers() -> Vec<u32> {
    let mut r: Vec<u32> = [mmio::PLANE_SURF, mmio::CUR_BASE, mmio::PLANE_STRIDE].concat();
    r.extend((0..16).map(|i| mmio::FENCE_REG_BASE + 4 * i));
    r
}

/// Byte runs of `after` that differ from `before` (guest RAM from [`RAM_BASE`]) as
/// `(guest-physical address, bytes)`, outside the pages in `skip` (runs closer than 8 bytes
/// merged).
fn changed_runs<'a>(before: &[u8], after: &'a [u8], skip: &BTreeSet<u64>) -> Vec<(u64, &'a [u8])> {
    let page = PAGE_SIZE as usize;
    let mut out = Vec::new();
    for p in 0..after.len() / page {
        let (b, a) = (&before[p * page..][..page], &after[p * page..][..page]);
        if a == b || skip.contains(&(RAM_BASE / PAGE_SIZE + p as u64)) {
            continue;
        }
        let mut i = 0;
        while i < page {
            if a[i] == b[i] {
                i += 1;
                continue;
            }
            let mut end = i + 1;
            let mut j = end;
            while j < page && j < end + 8 {
                if a[j] != b[j] {
                    end = j + 1;
                }
                j += 1;
            }
            out.push((RAM_BASE + (p * page + i) as u64, &a[i..end]));
            i = end;
        }
    }
    out
}

/// A recorded input stops growing after the frame that takes it past this many bytes (a video
/// frame writes tens of kilobytes of bitstream).
const RECORD_BYTES: usize = 4096;
/// Bytes of a video frame's bitstream recorded.
const BITSTREAM_HEAD: u64 = 256;

/// Records up to `frames` frames (at least one) of `driver` on a clone of `base` (sharing its RAM: the caller
/// restores it) as an input: per frame the guest CPU's RAM writes, the display registers it
/// wrote, each submission (the context image's ring tail at that submission, then ELSP), and a
/// wait (run until idle). Returns the input and the descriptors submitted, by engine.
pub(super) fn record_frames(
    profile: u8,
    base: &Vgpu,
    driver: &GuestDriver,
    frames: u64,
) -> (Vec<u8>, Vec<(EngineId, u64)>) {
    let mut v = base.clone();
    let mut d = driver.clone();
    let mut e = Enc::new(profile);
    let mut descs = Vec::new();
    let display = display_registers();
    let bitstream = d.object("bitstream");
    for _ in 0..frames {
        let before = region_bytes(v.guest_memory());
        let regs = v.guest_registers().clone();
        let seq = v.save().next_seq;
        let _ = v.take_write_log();
        d.submit_frame(&mut v).expect("submit a frame");
        let after = region_bytes(v.guest_memory());
        let device: BTreeSet<u64> = v.take_write_log().actual.iter().map(|g| g.0).collect();
        for (at, bytes) in changed_runs(&before, &after, &device) {
            // A video frame's bitstream (up to 32 KiB of random bytes) is kept to its head.
            let keep = match bitstream {
                Some(b) if (b.gpa..b.gpa + b.size).contains(&at) => {
                    (b.gpa + BITSTREAM_HEAD).saturating_sub(at) as usize
                }
                _ => bytes.len(),
            };
            if keep > 0 {
                e.ram(at, &bytes[..keep.min(bytes.len())]);
            }
        }
        for &o in &display {
            let now = v.guest_registers().get(&o).copied();
            if now != regs.get(&o).copied() {
                e.write32(o, now.unwrap_or(0));
            }
        }
        for w in v.save().queue.iter().filter(|w| w.seq >= seq) {
            let image = ggtt_entry(&v, w.lrca.0) & mmio::PTE_ADDR_MASK;
            let tail_at = image + lrc::STATE_OFFSET + 4 * lrc::RING_TAIL as u64;
            e.ram(tail_at, &w.ring_tail.to_le_bytes());
            e.elsp(w.engine, w.desc, 0);
            descs.push((w.engine, w.desc));
        }
        d.wait(&mut v).expect("wait for a frame");
        e.run_idle();
        if e.0.len() > RECORD_BYTES {
            break;
        }
    }
    (e.0, descs)
}

/// A breadcrumb store into the first mapped GGTT page (the first context's status page), past
/// the slots the driver and the CSB use.
fn store(l: &Layout, value: u32) -> Vec<u32> {
    let at = l.ggtt_pages.first().copied().unwrap_or(0) + 0x800;
    let mut c = build::mi_store_data_imm(AddressSpace::Ggtt, at, &[value]);
    c.extend(build::mi_user_interrupt());
    c
}

/// Hand-made inputs for profile `index`: ring and batch submissions with a GDRST between them,
/// GGTT remapping, aperture and fence accesses, a PPGTT root announced and its table edited.
pub(super) fn hand_made(index: u8, profile: Profile, l: &Layout) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let name = |what: &str| format!("{what}-{}", profile.name());
    match profile {
        Profile::Desktop => {
            let mut e = Enc::new(index);
            let pattern: Vec<u8> = (0..=255u8).collect();
            e.aperture(1, 0x40, Some(&pattern), 255);
            e.aperture(1, 0x40, None, 255);
            let fb = l.aperture_pages.get(1).copied().unwrap_or(0) as u32;
            e.fence(1, fb | 1, (fb + 3 * PAGE_SIZE as u32) | 1);
            e.aperture(1, 0x1f0, Some(&pattern), 64);
            e.ggtt_map(1, 3);
            e.aperture(1, 0x10, Some(&pattern[16..]), 200);
            e.ring(0, &store(l, 0x5eed));
            e.run_idle();
            out.push((name("aperture-fence"), e.0));
        }
        Profile::ThreeD => {
            let mut e = Enc::new(index);
            e.ring(0, &store(l, 1));
            e.ring(1, &store(l, 2));
            e.advance(1);
            e.gdrst(1 << 1);
            e.ring(0, &store(l, 3));
            e.run_idle();
            out.push((name("ring-gdrst"), e.0));
            let mut e = Enc::new(index);
            let batch = l.ctxs.first().map_or(0, |c| c.batch.gpu);
            e.ppgtt_create(0);
            e.batch(
                0,
                &build::mi_store_data_imm(AddressSpace::Ppgtt, batch + 0x800, &[7]),
            );
            e.run_idle();
            let page = l.ram_pages.get(5).copied().unwrap_or(0);
            e.table_entry(3, 0, page | 3);
            e.batch(
                0,
                &build::mi_store_data_imm(AddressSpace::Ppgtt, batch + 0x804, &[8]),
            );
            e.ggtt_map(2, 4);
            e.run_idle();
            out.push((name("ppgtt-batch"), e.0));
            // A batch that starts itself: the engine spins until GDRST ends it.
            let mut e = Enc::new(index);
            if let Some(c) = l.ctxs.first() {
                e.batch(
                    0,
                    &build::mi_batch_buffer_start(c.batch.space, c.batch.gpu, false),
                );
                e.run_idle();
                e.ring(1, &store(l, 9));
                e.run_idle();
            }
            out.push((name("endless-batch"), e.0));
        }
        _ => {}
    }
    out
}
