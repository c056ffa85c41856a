//! The `vgpu_guest` harness's shared definitions: the input format's opcodes and operand modes,
//! what an input did, the set-up's layout, the guest RAM's placement, and small accessors. See
//! [`super::guest`] for the harness.

use gmig_vgpu::gm::PAGE_SIZE;
use gmig_vgpu::gtt::{ram_size, GuestRam};
use gmig_vgpu::mmio::{self, EngineId};
use gmig_vgpu::workload::Obj;
use gmig_vgpu::Vgpu;
use vm_memory::{Bytes, GuestAddress};

/// Guest RAM is one region from here (below it a hole, as a VMM's memory map has them): the
/// driver model allocates from 2 MiB up, and the harness compares every byte of RAM after each
/// input, so RAM the set-up never uses would only cost time.
pub const RAM_BASE: u64 = 2 << 20;
/// End of the fuzzed vGPU's guest RAM (the 3D profile's set-up ends below 2.7 MiB; the probe
/// takes the top pages).
pub const GUEST_RAM_END: u64 = 3 << 20;
/// End of the neighbour's guest RAM (a desktop guest, whose set-up ends below 2.2 MiB).
pub(super) const NEIGHBOUR_RAM_END: u64 = 0x24_0000;
/// The neighbour's RAM, mapped read-only, is also compared byte for byte every this many
/// inputs.
pub(super) const NEIGHBOUR_COMPARE_EVERY: u64 = 64;
/// `GDRST`'s whole-GPU domain.
pub(super) const GRDOM_FULL: u32 = 1;
/// Operations an input may make (the rest of it is ignored).
pub const MAX_OPS: usize = 256;
/// `GEN6_GDRST`.
pub(super) const GDRST: u32 = 0x941c;
/// The probe's pages, at the top of guest RAM and of the hidden slice: per engine a context
/// image (2 pages) and a ring (1 page), then the breadcrumb page.
pub(super) const PROBE_PAGES: u64 = 13;
pub(super) const PROBE_MAGIC: u32 = 0x600d_0000;

/// Opcodes (`byte % COUNT`).
pub mod op {
    /// 32-bit BAR0 write: register, 32-bit value.
    pub const WRITE32: u8 = 0;
    /// 64-bit BAR0 write: register, 64-bit value.
    pub const WRITE64: u8 = 1;
    /// BAR0 read: register, width byte (32, 64, or a 1/2-byte read through `pci::bar0_read`).
    pub const READ: u8 = 2;
    /// Any BAR0 access through `pci::bar0_write`/`bar0_read`: raw offset, width, bytes.
    pub const BAR0: u8 = 3;
    /// ELSP: engine, a byte (bit 1: a partial submission of 1–3 writes), two descriptors.
    pub const ELSP: u8 = 4;
    /// Guest CPU write into its RAM: address, length byte, bytes.
    pub const RAM: u8 = 5;
    /// Commands appended to a set-up context's ring (its image's tail moved), then ELSP.
    pub const RING: u8 = 6;
    /// Commands into a set-up context's batch buffer, started from its ring, then ELSP.
    pub const BATCH: u8 = 7;
    /// Aperture (BAR2) read or write through `pci::aperture_read`/`aperture_write`.
    pub const APERTURE: u8 = 8;
    /// Run the engines: until idle, `run(n)` or `advance(n)`.
    pub const RUN: u8 = 9;
    /// `GDRST` with a domain byte.
    pub const GDRST: u8 = 10;
    /// A GGTT entry (biased to the slices) written with a page-table entry.
    pub const GGTT_MAP: u8 = 11;
    /// PPGTT create or destroy notification (PV info `pdp[0]`, `g2v_notify`).
    pub const PPGTT: u8 = 12;
    /// A fence register pair.
    pub const FENCE: u8 = 13;
    /// Number of opcodes.
    pub const COUNT: u8 = 14;
}

/// Operand modes the seed encoder uses (raw values).
pub(super) mod mode {
    pub const REG_RAW: u8 = 1;
    pub const V32_RAW: u8 = 0;
    pub const DESC_RAW: u8 = 1;
    pub const ADDR_RAW: u8 = 1;
    pub const RUN_IDLE: u8 = 0;
    pub const RUN_ADVANCE: u8 = 2;
}

/// What one input did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestOutcome {
    /// Operations decoded.
    pub ops: usize,
    /// Workloads the engines completed (before the probe).
    pub completed: u64,
    /// Submissions the vGPU refused or that faulted (before the probe).
    pub refused: u64,
    /// The probe's submissions completed after `GDRST` alone (else a device reset was needed).
    pub gdrst_recovers: bool,
}

/// Where a set-up context lives (guest-physical addresses; its ring and image are contiguous).
#[derive(Clone, Copy, Debug)]
pub(super) struct CtxLayout {
    pub engine: EngineId,
    pub desc: u64,
    pub image: u64,
    pub ring: u64,
    pub ring_size: u32,
    pub batch: Obj,
}

/// What the booted guest set up, found from the vGPU and the driver's frames.
#[derive(Clone, Debug, Default)]
pub(super) struct Layout {
    pub ctxs: Vec<CtxLayout>,
    /// Guest-physical pages the GGTT or PPGTT maps.
    pub ram_pages: Vec<u64>,
    /// Guest-view GGTT offsets of mapped pages (aperture ones also in `aperture_pages`).
    pub ggtt_pages: Vec<u64>,
    pub aperture_pages: Vec<u64>,
    /// Guest-physical pages of the PPGTT's tables.
    pub tables: Vec<u64>,
}

/// The bytes of guest RAM `ram` (one region from [`RAM_BASE`]).
pub(super) fn region_bytes(ram: &GuestRam) -> Vec<u8> {
    let mut b = vec![0u8; (ram_size(ram) - RAM_BASE) as usize];
    ram.read_slice(&mut b, GuestAddress(RAM_BASE))
        .expect("read the harness guest RAM");
    b
}

/// Writes `image[range]` back into `ram` (offsets from [`RAM_BASE`]).
pub(super) fn restore(ram: &GuestRam, image: &[u8], range: std::ops::Range<usize>) {
    ram.write_slice(
        &image[range.clone()],
        GuestAddress(RAM_BASE + range.start as u64),
    )
    .expect("write the harness guest RAM");
}

pub(super) fn read_u32(ram: &GuestRam, gpa: u64) -> u32 {
    ram.read_obj(GuestAddress(gpa)).unwrap_or(0)
}

pub(super) fn ggtt_entry(v: &Vgpu, off: u64) -> u64 {
    u32::try_from(off / PAGE_SIZE * 8)
        .ok()
        .and_then(|e| e.checked_add(mmio::GTT_MMIO_BASE))
        .and_then(|reg| v.mmio_read64(reg).ok())
        .unwrap_or(0)
}
