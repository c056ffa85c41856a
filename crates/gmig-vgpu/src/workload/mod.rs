//! The guest-driver model: a deterministic stand-in for the guest's i915 that drives a [`Vgpu`].
//!
//! It reads the PV info page, keeps to its balloon, allocates objects in its GGTT slices (and in a
//! 4-level PPGTT it builds in guest RAM), writes GGTT entries through the MMIO GTT range, builds
//! context images, rings and batches in guest RAM, submits through ELSP and waits for completion by
//! reading the seqno its ring writes into the hardware status page. Everything is derived from a
//! seed. Profiles and their per-frame dirty sets are documented in `docs/workloads.md`.

use std::collections::{BTreeMap, BTreeSet};

use gmig_cmdparser::build;
use gmig_cmdparser::{by_name, AddressSpace, Gen};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

use crate::gm::{Gfn, VgpuSlices, PAGE_SIZE};
use crate::gtt::Space;
use crate::mmio::{self, desc, lrc, pvinfo, ring, EngineId};
use crate::shadow::parser_engine;
use crate::vgpu::{Vgpu, VgpuError};

/// Errors of the guest-driver model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// The PV info page is missing or has an unknown version.
    #[error("no GVT-g PV info page (magic {0:#x})")]
    NoPvInfo(u64),
    /// The guest ran out of guest RAM for its objects.
    #[error("guest RAM exhausted allocating {0:#x} bytes")]
    OutOfRam(u64),
    /// The guest ran out of graphics memory in its balloon.
    #[error("balloon exhausted allocating {0:#x} bytes")]
    OutOfBalloon(u64),
    /// The vGPU refused an MMIO access.
    #[error("vGPU: {0}")]
    Vgpu(#[from] VgpuError),
    /// A guest RAM access failed.
    #[error("guest RAM access at {0:#x} failed")]
    Ram(u64),
    /// A command the model wanted is not in the parser's tables.
    #[error("command {0} unknown to the parser tables")]
    NoCommand(&'static str),
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, WorkloadError>;

/// Workload profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Profile {
    /// A status-page heartbeat and a blinking cursor.
    Idle,
    /// A compositor blitting damaged windows and a cursor into a double-buffered scanout.
    Desktop,
    /// Full render-target and depth rewrite per frame, plus a texture upload.
    ThreeD,
    /// NV12 frames decoded by the video engine.
    Video,
    /// Large buffer writes by GPGPU walkers.
    Compute,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 5] = [
        Profile::Idle,
        Profile::Desktop,
        Profile::ThreeD,
        Profile::Video,
        Profile::Compute,
    ];

    /// Name as used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Idle => "idle",
            Profile::Desktop => "desktop",
            Profile::ThreeD => "3d",
            Profile::Video => "video",
            Profile::Compute => "compute",
        }
    }

    /// Parses a name.
    pub fn from_name(s: &str) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.name() == s)
    }

    fn engines(self) -> &'static [EngineId] {
        match self {
            Profile::Idle | Profile::Desktop => &[EngineId::Blitter],
            Profile::ThreeD => &[EngineId::Render, EngineId::Blitter],
            Profile::Video => &[EngineId::Video],
            Profile::Compute => &[EngineId::Render],
        }
    }

    fn uses_ppgtt(self) -> bool {
        matches!(self, Profile::ThreeD | Profile::Video | Profile::Compute)
    }
}

/// Size knobs (tests keep them small).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadConfig {
    /// Screen / render-target / video width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Desktop windows.
    pub windows: u32,
    /// Compute buffer size in bytes.
    pub compute_bytes: u64,
    /// Resident graphics memory: objects the guest maps in its GTTs at boot and fills with
    /// non-zero content (textures, vertex buffers, a shader cache, other clients' buffers) that
    /// frames read but do not rewrite. 0 leaves only what the frames use.
    #[serde(default)]
    pub resident_bytes: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            width: 1024,
            height: 768,
            windows: 6,
            compute_bytes: 8 << 20,
            resident_bytes: 0,
        }
    }
}

impl WorkloadConfig {
    /// A small configuration for fast tests.
    pub fn small() -> Self {
        WorkloadConfig {
            width: 256,
            height: 192,
            windows: 4,
            compute_bytes: 1 << 20,
            resident_bytes: 0,
        }
    }
}

/// A graphics object: pages contiguous in guest RAM, mapped at `gpu` in `space`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Obj {
    /// GGTT (guest-view offset) or PPGTT.
    pub space: Space,
    /// GPU address.
    pub gpu: u64,
    /// Guest-physical address of the first page.
    pub gpa: u64,
    /// Size in bytes (page multiple).
    pub size: u64,
}

#[derive(Clone, Debug)]
struct Ctx {
    engine: EngineId,
    image: Obj,
    ring: Obj,
    hws: Obj,
    tail: u32,
    ctx_id: u32,
    ppgtt: bool,
    batches: Vec<Obj>,
    next_batch: usize,
    seqno: u32,
}

/// Dword index of the seqno in each engine's status page (`I915_GEM_HWS_INDEX`).
pub const HWS_SEQNO_INDEX: u64 = 0x30;
const BATCH_BYTES: u64 = 16 * 1024;
const RING_PAGES: u64 = 4;

/// What waiting found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitReport {
    /// Engines whose status page shows the last seqno submitted.
    pub completed: u32,
    /// Engines whose last submission did not complete (refused or faulted).
    pub failed: u32,
}

/// The guest driver (its state is the guest's: it lives in guest RAM and vCPU state, so it is
/// not part of the vGPU checkpoint; a migrated guest simply keeps its driver).
#[derive(Clone, Debug)]
pub struct GuestDriver {
    profile: Profile,
    cfg: WorkloadConfig,
    rng: ChaCha8Rng,
    gen: Gen,
    balloon: VgpuSlices,
    ap_next: u64,
    hid_next: u64,
    ram_next: u64,
    ram_end: u64,
    pml4: Option<u64>,
    pt_tables: BTreeMap<(u8, u64), u64>,
    ppgtt_next: u64,
    ctxs: Vec<Ctx>,
    objs: BTreeMap<String, Obj>,
    frame: u64,
    cpu_dirty: BTreeSet<Gfn>,
    failures: u64,
    windows: Vec<(Obj, u32, u32, u32, u32, bool)>, // obj, w, h, x, y, x-tiled
    damaged_prev: BTreeSet<usize>,
}

fn page_align(n: u64) -> u64 {
    n.div_ceil(PAGE_SIZE) * PAGE_SIZE
}

impl GuestDriver {
    /// Boots the driver on `vgpu`: reads the PV info page, sets up contexts, rings, status pages,
    /// the PPGTT (for profiles that use it) and the profile's objects.
    pub fn boot(
        vgpu: &mut Vgpu,
        profile: Profile,
        cfg: WorkloadConfig,
        seed: u64,
    ) -> Result<GuestDriver> {
        let magic = vgpu.mmio_read64(mmio::VGT_PVINFO_PAGE + pvinfo::MAGIC)?;
        let version = vgpu.mmio_read32(mmio::VGT_PVINFO_PAGE + pvinfo::VERSION_MAJOR)?;
        if magic != mmio::VGT_MAGIC || version & 0xffff != u32::from(mmio::VGT_VERSION_MAJOR) {
            return Err(WorkloadError::NoPvInfo(magic));
        }
        let rd = |f: u32| vgpu.mmio_read32(mmio::VGT_PVINFO_PAGE + f).map(u64::from);
        let balloon = crate::gm::slices_at(
            rd(pvinfo::APERTURE_BASE)?,
            rd(pvinfo::APERTURE_SIZE)?,
            rd(pvinfo::HIDDEN_BASE)?,
            rd(pvinfo::HIDDEN_SIZE)?,
        );
        let mut d = GuestDriver {
            profile,
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
            gen: vgpu.config().gen,
            balloon,
            ap_next: balloon.aperture.base.0,
            hid_next: balloon.hidden.base.0,
            ram_next: 2 << 20,
            ram_end: crate::gtt::ram_size(vgpu.guest_memory()),
            pml4: None,
            pt_tables: BTreeMap::new(),
            ppgtt_next: 1 << 32,
            ctxs: Vec::new(),
            objs: BTreeMap::new(),
            frame: 0,
            cpu_dirty: BTreeSet::new(),
            failures: 0,
            windows: Vec::new(),
            damaged_prev: BTreeSet::new(),
        };
        if profile.uses_ppgtt() {
            let pml4 = d.alloc_ram(PAGE_SIZE)?;
            d.pml4 = Some(pml4);
            // Tell the vGPU about the new PPGTT, as i915 does under GVT-g.
            vgpu.mmio_write32(mmio::VGT_PVINFO_PAGE + pvinfo::PDP0_LO, pml4 as u32)?;
            vgpu.mmio_write32(
                mmio::VGT_PVINFO_PAGE + pvinfo::PDP0_LO + 4,
                (pml4 >> 32) as u32,
            )?;
            vgpu.mmio_write32(
                mmio::VGT_PVINFO_PAGE + pvinfo::G2V_NOTIFY,
                mmio::VGT_G2V_PPGTT_L4_PAGE_TABLE_CREATE,
            )?;
        }
        for (i, &engine) in profile.engines().iter().enumerate() {
            d.setup_context(vgpu, engine, i as u32 + 1)?;
        }
        d.setup_objects(vgpu)?;
        Ok(d)
    }

    /// The profile.
    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// Frames submitted so far.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// Submissions the vGPU did not complete (refused or faulted), as the guest saw them.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Guest frames the guest CPU wrote since the last call (what KVM's dirty log would show).
    pub fn take_cpu_dirty(&mut self) -> BTreeSet<Gfn> {
        std::mem::take(&mut self.cpu_dirty)
    }

    /// A named object of the profile (e.g. `"fb0"`, `"rt"`, `"compute"`).
    pub fn object(&self, name: &str) -> Option<Obj> {
        self.objs.get(name).copied()
    }

    // ---- allocation ----

    fn alloc_ram(&mut self, size: u64) -> Result<u64> {
        let size = page_align(size);
        let gpa = self.ram_next;
        let end = gpa
            .checked_add(size)
            .filter(|e| *e <= self.ram_end)
            .ok_or(WorkloadError::OutOfRam(size))?;
        self.ram_next = end;
        Ok(gpa)
    }

    fn alloc_ggtt(&mut self, vgpu: &mut Vgpu, hidden: bool, size: u64) -> Result<Obj> {
        let size = page_align(size);
        let (next, slice) = if hidden {
            (&mut self.hid_next, self.balloon.hidden)
        } else {
            (&mut self.ap_next, self.balloon.aperture)
        };
        let gpu = *next;
        if !slice.contains(gpu, size) {
            return Err(WorkloadError::OutOfBalloon(size));
        }
        *next += size;
        let gpa = self.alloc_ram(size)?;
        for p in 0..size / PAGE_SIZE {
            let entry = (gpu + p * PAGE_SIZE) / PAGE_SIZE;
            let pte = (gpa + p * PAGE_SIZE) | mmio::GTT_PTE_PRESENT;
            vgpu.mmio_write64(mmio::GTT_MMIO_BASE + (entry * 8) as u32, pte)?;
        }
        Ok(Obj {
            space: Space::Ggtt,
            gpu,
            gpa,
            size,
        })
    }

    fn alloc_ppgtt(&mut self, vgpu: &Vgpu, size: u64) -> Result<Obj> {
        let size = page_align(size);
        let gpu = self.ppgtt_next;
        self.ppgtt_next += size.max(64 * 1024).next_multiple_of(64 * 1024);
        let gpa = self.alloc_ram(size)?;
        for p in 0..size / PAGE_SIZE {
            self.map_ppgtt_page(vgpu, gpu + p * PAGE_SIZE, gpa + p * PAGE_SIZE)?;
        }
        Ok(Obj {
            space: Space::Ppgtt,
            gpu,
            gpa,
            size,
        })
    }

    fn map_ppgtt_page(&mut self, vgpu: &Vgpu, va: u64, gpa: u64) -> Result<()> {
        let mut table = self.pml4.ok_or(WorkloadError::NoPvInfo(0))?;
        for level in (2..=4u8).rev() {
            let shift = 12 + 9 * (u32::from(level) - 1);
            let idx = (va >> shift) & 0x1ff;
            let key = (level, va >> shift);
            let next = match self.pt_tables.get(&key) {
                Some(t) => *t,
                None => {
                    let t = self.alloc_ram(PAGE_SIZE)?;
                    self.cpu_write(vgpu, table + idx * 8, &(t | 3).to_le_bytes())?;
                    self.pt_tables.insert(key, t);
                    t
                }
            };
            table = next;
        }
        let idx = (va >> 12) & 0x1ff;
        self.cpu_write(vgpu, table + idx * 8, &(gpa | 3).to_le_bytes())
    }

    fn cpu_write(&mut self, vgpu: &Vgpu, gpa: u64, data: &[u8]) -> Result<()> {
        let mem = vgpu.guest_memory();
        if !crate::ram::device_writable(mem, GuestAddress(gpa), data.len()) {
            return Err(WorkloadError::Ram(gpa));
        }
        mem.write_slice(data, GuestAddress(gpa))
            .map_err(|_| WorkloadError::Ram(gpa))?;
        let first = gpa / PAGE_SIZE;
        let last = (gpa + data.len().max(1) as u64 - 1) / PAGE_SIZE;
        self.cpu_dirty.extend((first..=last).map(Gfn));
        Ok(())
    }

    fn cpu_write_dwords(&mut self, vgpu: &Vgpu, gpa: u64, dwords: &[u32]) -> Result<()> {
        let bytes: Vec<u8> = dwords.iter().flat_map(|d| d.to_le_bytes()).collect();
        self.cpu_write(vgpu, gpa, &bytes)
    }

    // ---- setup ----

    fn setup_context(&mut self, vgpu: &mut Vgpu, engine: EngineId, ctx_id: u32) -> Result<()> {
        let hws = self.alloc_ggtt(vgpu, false, PAGE_SIZE)?;
        vgpu.mmio_write32(
            engine.mmio_base_for(self.gen) + ring::HWS_PGA,
            hws.gpu as u32,
        )?;
        let image = self.alloc_ggtt(vgpu, true, lrc::CONTEXT_PAGES * PAGE_SIZE)?;
        let ring_obj = self.alloc_ggtt(vgpu, true, RING_PAGES * PAGE_SIZE)?;
        let ppgtt = self.profile.uses_ppgtt();
        let mut batches = Vec::new();
        for _ in 0..4 {
            batches.push(if ppgtt {
                self.alloc_ppgtt(vgpu, BATCH_BYTES)?
            } else {
                self.alloc_ggtt(vgpu, true, BATCH_BYTES)?
            });
        }
        // Register state page: LRI header and (register, value) pairs as the hardware lays it out.
        let base = engine.mmio_base_for(self.gen);
        let mut state = vec![0u32; lrc::STATE_DWORDS];
        state[1] = (0x22 << 23) | (2 * 14 - 1);
        let mut pair = |i: usize, reg: u32, v: u32| {
            state[i - 1] = base + reg;
            state[i] = v;
        };
        pair(lrc::CONTEXT_CONTROL, 0x244, 0);
        pair(lrc::RING_HEAD, ring::HEAD, 0);
        pair(lrc::RING_TAIL, ring::TAIL, 0);
        pair(lrc::RING_START, ring::START, ring_obj.gpu as u32);
        pair(
            lrc::RING_CTL,
            ring::CTL,
            ((RING_PAGES as u32 - 1) << 12) | 1,
        );
        let pml4 = self.pml4.unwrap_or(0);
        pair(lrc::PDP0_UDW, 0x274, (pml4 >> 32) as u32);
        pair(lrc::PDP0_LDW, 0x270, pml4 as u32);
        self.cpu_write_dwords(vgpu, image.gpa + lrc::STATE_OFFSET, &state)?;
        self.ctxs.push(Ctx {
            engine,
            image,
            ring: ring_obj,
            hws,
            tail: 0,
            ctx_id,
            ppgtt,
            batches,
            next_batch: 0,
            seqno: 0,
        });
        Ok(())
    }

    fn new_obj(&mut self, vgpu: &mut Vgpu, name: &str, hidden: bool, size: u64) -> Result<Obj> {
        let o = if self.profile.uses_ppgtt() {
            self.alloc_ppgtt(vgpu, size)?
        } else {
            self.alloc_ggtt(vgpu, hidden, size)?
        };
        self.objs.insert(name.to_string(), o);
        Ok(o)
    }

    fn setup_objects(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        let (w, h) = (u64::from(self.cfg.width), u64::from(self.cfg.height));
        // Every profile has a scanout in the aperture, a plane pointing at it, and a fence over it.
        let fb0 = self.alloc_ggtt(vgpu, false, w * h * 4)?;
        self.objs.insert("fb0".into(), fb0);
        vgpu.mmio_write32(mmio::PLANE_SURF[0], fb0.gpu as u32)?;
        vgpu.mmio_write32(mmio::PLANE_STRIDE[0], (w * 4 / 64) as u32)?;
        let fence_lo = (fb0.gpu as u32 & 0xffff_f000) | 1;
        let fence_hi = ((fb0.gpu + fb0.size - PAGE_SIZE) as u32 & 0xffff_f000)
            | ((w * 4 / 128).max(1) as u32 - 1);
        vgpu.mmio_write32(mmio::FENCE_REG_BASE, fence_lo)?;
        vgpu.mmio_write32(mmio::FENCE_REG_BASE + 4, fence_hi)?;
        let timeline = self.alloc_ggtt(vgpu, true, PAGE_SIZE)?;
        self.objs.insert("timeline".into(), timeline);
        match self.profile {
            Profile::Idle => {
                let cursor = self.alloc_ggtt(vgpu, false, 64 * 64 * 4)?;
                self.objs.insert("cursor".into(), cursor);
                vgpu.mmio_write32(mmio::CUR_BASE[0], cursor.gpu as u32)?;
            }
            Profile::Desktop => {
                let fb1 = self.alloc_ggtt(vgpu, false, w * h * 4)?;
                self.objs.insert("fb1".into(), fb1);
                let cursor = self.alloc_ggtt(vgpu, false, 64 * 64 * 4)?;
                self.objs.insert("cursor".into(), cursor);
                vgpu.mmio_write32(mmio::CUR_BASE[0], cursor.gpu as u32)?;
                let pattern: Vec<u8> = (0..64 * 64 * 4).map(|i| (i * 7 % 251) as u8).collect();
                self.cpu_write(vgpu, cursor.gpa, &pattern)?;
                for i in 0..self.cfg.windows {
                    let ww = self.rng.random_range(w / 8..=w / 2).max(16) as u32;
                    let wh = self.rng.random_range(h / 8..=h / 2).max(8) as u32;
                    let x = self.rng.random_range(0..=(w as u32 - ww));
                    let y = self.rng.random_range(0..=(h as u32 - wh));
                    let tiled = i == 0;
                    // X-tiled surfaces need a pitch of whole 512-byte tiles and whole 8-row tiles.
                    let pitch = if tiled {
                        (u64::from(ww) * 4).next_multiple_of(512)
                    } else {
                        u64::from(ww) * 4
                    };
                    let rows = if tiled {
                        u64::from(wh).next_multiple_of(8)
                    } else {
                        u64::from(wh)
                    };
                    let o = self.alloc_ggtt(vgpu, true, pitch * rows)?;
                    self.objs.insert(format!("window{i}"), o);
                    self.windows.push((o, ww, wh, x, y, tiled));
                }
            }
            Profile::ThreeD => {
                let rt = self.new_obj(vgpu, "rt", true, w * h * 4)?;
                self.new_obj(vgpu, "depth", true, w * h * 4)?;
                let mut textures = Vec::new();
                for t in 0..4 {
                    textures.push(self.new_obj(
                        vgpu,
                        &format!("texture{t}"),
                        true,
                        128 * 128 * 4,
                    )?);
                }
                self.new_obj(vgpu, "staging", true, 128 * 128 * 4)?;
                self.new_obj(vgpu, "query", true, PAGE_SIZE)?;
                self.setup_heaps(vgpu)?;
                // Surface 0: the render target; 1..=4: the textures. Binding table k (at 64 k in
                // the binder) pairs the render target with texture k.
                let ss = pipeline::surface_2d(rt.gpu, w as u32, h as u32, w as u32 * 4);
                self.write_surface(vgpu, 0, &ss)?;
                for (k, t) in textures.iter().enumerate() {
                    let k = k as u64;
                    self.write_surface(vgpu, 1 + k, &pipeline::surface_2d(t.gpu, 128, 128, 512))?;
                    self.write_binding_table(vgpu, 64 * k, &[0, 1 + k])?;
                }
            }
            Profile::Video => {
                for f in 0..3 {
                    self.new_obj(vgpu, &format!("nv12_{f}"), true, w * h * 3 / 2)?;
                }
                self.new_obj(vgpu, "bitstream", true, 64 * 1024)?;
                self.new_obj(vgpu, "status", true, PAGE_SIZE)?;
                // Intra, deblocking, BSD/MPC and MPR row stores: 4 cache lines per macroblock
                // column, as the media driver sizes its largest.
                let row_store = w.div_ceil(16) * 4 * 64;
                for r in ["intra_rows", "deblock_rows", "bsd_rows", "mpr_rows"] {
                    self.new_obj(vgpu, r, true, row_store)?;
                }
            }
            Profile::Compute => {
                let bytes = page_align(self.cfg.compute_bytes);
                let buf = self.new_obj(vgpu, "compute", true, bytes)?;
                self.new_obj(vgpu, "results", true, PAGE_SIZE)?;
                self.setup_heaps(vgpu)?;
                // The buffer in slices: surface 8 + k is slice k, bound by compute binding
                // table k, which interface descriptor k names.
                let slice = page_align(bytes / pipeline::COMPUTE_SLICES);
                for k in 0..pipeline::COMPUTE_SLICES {
                    let at = buf.gpu + (k * slice).min(bytes - slice);
                    let ss = pipeline::surface_buffer(at, slice);
                    self.write_surface(vgpu, 8 + k, &ss)?;
                    self.write_binding_table(vgpu, Self::compute_table(k), &[8 + k])?;
                }
            }
        }
        if self.cfg.resident_bytes > 0 {
            // Resident objects in 1 MiB pieces (GGTT hidden slice or PPGTT, as the profile
            // allocates), each page a distinct non-zero pattern.
            // At most half of the guest RAM still free (the bench asks for a share of the vGPU
            // type; a smaller guest gets what fits).
            let free = self.ram_end.saturating_sub(self.ram_next) / 2;
            let mut left = page_align(self.cfg.resident_bytes).min(free / PAGE_SIZE * PAGE_SIZE);
            let mut i = 0;
            while left > 0 {
                let n = left.min(1 << 20);
                let o = self.new_obj(vgpu, &format!("resident{i}"), true, n)?;
                let mut data = vec![0u8; n as usize];
                for (p, page) in data.chunks_exact_mut(PAGE_SIZE as usize).enumerate() {
                    let seed = (o.gpa / PAGE_SIZE + p as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    for (k, w) in page.chunks_exact_mut(8).enumerate() {
                        w.copy_from_slice(
                            &(seed ^ (k as u64).wrapping_mul(0xff51_afd7)).to_le_bytes(),
                        );
                    }
                }
                self.cpu_write(vgpu, o.gpa, &data)?;
                left -= n;
                i += 1;
            }
        }
        Ok(())
    }

    fn header(&self, engine: EngineId, name: &'static str, len: u32) -> Result<u32> {
        by_name(self.gen, parser_engine(engine), name)
            .map(|d| d.header(len))
            .ok_or(WorkloadError::NoCommand(name))
    }

    // ---- submission ----

    fn ctx_index(&self, engine: EngineId) -> usize {
        self.ctxs
            .iter()
            .position(|c| c.engine == engine)
            .unwrap_or(0)
    }

    /// Writes `cmds` (ending in MI_BATCH_BUFFER_END) into the context's next batch buffer and
    /// returns its address.
    fn write_batch(&mut self, vgpu: &Vgpu, ci: usize, cmds: &[u32]) -> Result<Obj> {
        let c = &mut self.ctxs[ci];
        let b = c.batches[c.next_batch % c.batches.len()];
        c.next_batch += 1;
        if cmds.len() as u64 * 4 > b.size {
            return Err(WorkloadError::OutOfRam(cmds.len() as u64 * 4));
        }
        self.cpu_write_dwords(vgpu, b.gpa, cmds)?;
        Ok(b)
    }

    /// Appends ring commands (BB_START of `batch`, extra ring commands, the seqno breadcrumb and a
    /// user interrupt), updates the context image's tail and writes the ELSP.
    fn submit(
        &mut self,
        vgpu: &mut Vgpu,
        ci: usize,
        batch: Option<Obj>,
        extra: &[u32],
    ) -> Result<()> {
        let mut cmds = Vec::new();
        if let Some(b) = batch {
            cmds.extend(build::mi_batch_buffer_start(b.space, b.gpu, false));
        }
        cmds.extend_from_slice(extra);
        let c = &mut self.ctxs[ci];
        c.seqno = c.seqno.wrapping_add(1);
        let seqno = c.seqno;
        let hws = c.hws.gpu + 4 * HWS_SEQNO_INDEX;
        cmds.extend(build::mi_store_data_imm(AddressSpace::Ggtt, hws, &[seqno]));
        cmds.extend(build::mi_user_interrupt());
        if cmds.len() % 2 == 1 {
            cmds.extend(build::mi_noop());
        }
        let ring_size = c.ring.size as u32;
        let mut tail = c.tail;
        let (ring_gpa, image_gpa, engine, ctx_id, ppgtt) =
            (c.ring.gpa, c.image.gpa, c.engine, c.ctx_id, c.ppgtt);
        let bytes = cmds.len() as u32 * 4;
        if tail + bytes >= ring_size {
            // Pad to the end with MI_NOOP and wrap.
            let pad = vec![0u32; ((ring_size - tail) / 4) as usize];
            self.cpu_write_dwords(vgpu, ring_gpa + u64::from(tail), &pad)?;
            tail = 0;
        }
        self.cpu_write_dwords(vgpu, ring_gpa + u64::from(tail), &cmds)?;
        tail = (tail + bytes) % ring_size;
        self.ctxs[ci].tail = tail;
        self.cpu_write_dwords(
            vgpu,
            image_gpa + lrc::STATE_OFFSET + 4 * lrc::RING_TAIL as u64,
            &[tail],
        )?;
        let lrca = self.ctxs[ci].image.gpu;
        let mut d =
            desc::VALID | (lrca & desc::LRCA_MASK) | (u64::from(ctx_id) << desc::CTX_ID_SHIFT);
        d |= if ppgtt {
            3 << desc::ADDRESSING_SHIFT
        } else {
            (1 << desc::ADDRESSING_SHIFT) | desc::PRIVILEGE
        };
        let elsp = engine.mmio_base_for(self.gen) + ring::ELSP;
        vgpu.mmio_write32(elsp, 0)?;
        vgpu.mmio_write32(elsp, 0)?;
        vgpu.mmio_write32(elsp, (d >> 32) as u32)?;
        vgpu.mmio_write32(elsp, d as u32)?;
        Ok(())
    }

    /// The batch buffer the next submission on `engine` will use.
    pub fn next_batch(&self, engine: EngineId) -> Obj {
        let c = &self.ctxs[self.ctx_index(engine)];
        c.batches[c.next_batch % c.batches.len()]
    }

    /// Submits a batch of raw commands on `engine` (tests use this to play a hostile guest). A
    /// final MI_BATCH_BUFFER_END is appended.
    pub fn submit_raw_batch(
        &mut self,
        vgpu: &mut Vgpu,
        engine: EngineId,
        cmds: &[u32],
    ) -> Result<Obj> {
        let ci = self.ctx_index(engine);
        let mut all = cmds.to_vec();
        all.extend(build::mi_batch_buffer_end());
        let b = self.write_batch(vgpu, ci, &all)?;
        self.submit(vgpu, ci, Some(b), &[])?;
        Ok(b)
    }

    /// Builds and submits one frame of the profile (does not wait).
    pub fn submit_frame(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        match self.profile {
            Profile::Idle => self.frame_idle(vgpu)?,
            Profile::Desktop => self.frame_desktop(vgpu)?,
            Profile::ThreeD => self.frame_3d(vgpu)?,
            Profile::Video => self.frame_video(vgpu)?,
            Profile::Compute => self.frame_compute(vgpu)?,
        }
        self.frame += 1;
        Ok(())
    }

    /// Lets the vGPU run everything queued, then checks each engine's status page for the last
    /// seqno submitted, as i915 waits on a request.
    pub fn wait(&mut self, vgpu: &mut Vgpu) -> Result<WaitReport> {
        vgpu.run_until_idle();
        let mut rep = WaitReport::default();
        for c in &self.ctxs {
            let mut b = [0u8; 4];
            vgpu.guest_memory()
                .read_slice(&mut b, GuestAddress(c.hws.gpa + 4 * HWS_SEQNO_INDEX))
                .map_err(|_| WorkloadError::Ram(c.hws.gpa))?;
            if u32::from_le_bytes(b) == c.seqno {
                rep.completed += 1;
            } else {
                rep.failed += 1;
            }
        }
        self.failures += u64::from(rep.failed);
        Ok(rep)
    }

    /// Submits and waits for `n` frames.
    pub fn run_frames(&mut self, vgpu: &mut Vgpu, n: u64) -> Result<()> {
        for _ in 0..n {
            self.submit_frame(vgpu)?;
            self.wait(vgpu)?;
        }
        Ok(())
    }
}

mod frames;
mod pipeline;
