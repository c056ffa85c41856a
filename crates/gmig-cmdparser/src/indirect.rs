//! Indirect state: the surfaces a draw, a dispatch or a video decode reads and writes.
//!
//! A 3D draw or a GPGPU dispatch names no memory in its own dwords. What it touches is reached
//! through state set earlier in the same submission: STATE_BASE_ADDRESS gives the heaps, the
//! binding-table pointers (relative to the surface-state base, or to the binding-table pool on
//! GEN11) give binding tables, whose entries point at RENDER_SURFACE_STATEs, which describe the
//! surfaces; the shader kernels (relative to the instruction base) say, through their SEND
//! messages ([`crate::isa`]), which binding-table entries they read and write; the depth,
//! stencil, HiZ and stream-output buffers are written by the fixed-function pipeline. Video decode
//! writes the destinations MFX_PIPE_BUF_ADDR_STATE names, sized by MFX_SURFACE_STATE.
//!
//! [`IndirectState`] follows that state command by command, reading binding tables, surface
//! states, interface descriptors and kernels through the caller's [`GpuMemory`], and gives each
//! work command a [`Footprint`]. Everything is bounded and total: a bad pointer, an unmapped
//! heap, an oversized surface or a kernel it cannot follow never panics; it makes the footprint
//! fall back to the **GTT reach** of the context ([`Reach`]). A GPU writes guest memory only
//! through its GTTs, so "anywhere this context's GTTs map" is a sound bound for whatever the state
//! does not name.
//!
//! State is tracked per submission: a draw whose pipeline state was set by an earlier submission
//! (kept in the hardware context image, not in this submission's commands) is bounded by the reach,
//! never guessed. State lives in the space the buffer that sets it addresses implicitly: a
//! privileged (GGTT) batch's heaps are GGTT addresses, an unprivileged one's PPGTT addresses; when
//! execution moves between the two, the state recorded so far is dropped (what follows falls back
//! to the reach until it is stated again).
//!
//! A privileged batch's surface states hold GGTT addresses the command audit cannot see: each
//! footprint lists the surface states it read ([`Footprint::surface_states`]) and
//! [`surface_state_addresses`] names the GGTT address fields inside one, so the walk audits them
//! against the vGPU's slices and remaps them with the commands ([`mod@crate::walk`]).

use std::cell::RefCell;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::addr::{AddressSpace, MAX_SURFACE_BYTES};
use crate::decode::{BatchContext, Decoded};
use crate::isa::{scan_kernel, KernelScan, MAX_KERNEL_BYTES};
use crate::memory::GpuMemory;
use crate::table::{Flags, Gen};
use crate::writeset::{AddressRange, Reach, WriteSet};

/// Shader stages with a binding table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Vertex shader.
    Vs,
    /// Hull shader.
    Hs,
    /// Domain shader.
    Ds,
    /// Geometry shader.
    Gs,
    /// Pixel shader.
    Ps,
    /// A GPGPU / media kernel (interface descriptor).
    Compute,
}

impl Stage {
    const GRAPHICS: [Stage; 5] = [Stage::Vs, Stage::Hs, Stage::Ds, Stage::Gs, Stage::Ps];

    fn index(self) -> usize {
        self as usize
    }
}

/// What a surface is to the work that uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SurfaceRole {
    /// Binding-table entry `index` of `stage` (render target, texture, image or buffer).
    Bound {
        /// Stage.
        stage: Stage,
        /// Binding-table index.
        index: u8,
    },
    /// The auxiliary surface (CCS, MCS or HiZ) of a bound surface.
    Aux {
        /// Stage.
        stage: Stage,
        /// Binding-table index.
        index: u8,
    },
    /// The depth buffer.
    Depth,
    /// The separate stencil buffer.
    Stencil,
    /// The hierarchical-depth buffer.
    HierDepth,
    /// A stream-output buffer.
    StreamOut {
        /// SO buffer index.
        index: u8,
    },
    /// A stream-output buffer's write-offset dword.
    StreamOutOffset {
        /// SO buffer index.
        index: u8,
    },
    /// The general-state buffer stateless messages address (bounded by STATE_BASE_ADDRESS).
    Stateless,
    /// A video decode destination (pre- or post-deblocking).
    VideoDestination,
    /// A video decoder's row-store scratch buffer.
    VideoRowStore,
    /// The compressed bitstream a video decode reads.
    Bitstream,
}

/// The pixels of a surface the state describes: `rows` rows of `row_bytes` bytes, `pitch` apart
/// (no alignment padding, so always inside the surface's range). The reference GPU writes this
/// shape when it renders to a surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    /// Bytes written per row (at most `pitch`).
    pub row_bytes: u64,
    /// Distance between rows.
    pub pitch: u64,
    /// Rows.
    pub rows: u64,
}

impl Shape {
    /// A contiguous run of `len` bytes.
    pub fn linear(len: u64) -> Shape {
        Shape {
            row_bytes: len,
            pitch: len,
            rows: 1,
        }
    }

    /// `rows` rows of `width_bytes` (clamped to the pitch) `pitch` apart.
    pub fn rows(width_bytes: u64, pitch: u64, rows: u64) -> Shape {
        Shape {
            row_bytes: width_bytes.min(pitch),
            pitch,
            rows,
        }
    }

    /// Bytes from the first to the last byte of the shape.
    pub fn span(&self) -> u64 {
        match self.rows {
            0 => 0,
            r => (r - 1)
                .saturating_mul(self.pitch)
                .saturating_add(self.row_bytes),
        }
    }
}

/// One surface a work command uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SurfaceUse {
    /// Role.
    #[serde(flatten)]
    pub role: SurfaceRole,
    /// Translation it goes through.
    pub space: AddressSpace,
    /// First byte.
    pub start: u64,
    /// Length in bytes (an upper bound derived from the state; `>= 1`).
    pub len: u64,
    /// Whether the work may write it.
    pub writes: bool,
    /// The pixels the state describes, inside `start .. start + len`.
    pub shape: Shape,
}

/// What one work command (a draw, a dispatch, a video decode) may read and write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footprint {
    /// Surfaces resolved from the state.
    pub surfaces: Vec<SurfaceUse>,
    /// Why the work may also write memory the state does not name (so the write set is bounded
    /// by the context's GTT reach); empty when the surfaces are the whole story.
    pub reach: Vec<String>,
    /// Every RENDER_SURFACE_STATE read to resolve the surfaces (each once), whatever it held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surface_states: Vec<SurfaceStateAt>,
}

/// Where a RENDER_SURFACE_STATE a work command uses lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SurfaceStateAt {
    /// Stage whose binding table names it.
    pub stage: Stage,
    /// Binding-table index.
    pub index: u8,
    /// Space it was read through.
    pub space: AddressSpace,
    /// Address of its first dword.
    pub addr: u64,
}

impl Footprint {
    fn widen(&mut self, why: impl Into<String>) {
        let why = why.into();
        if !self.reach.contains(&why) {
            self.reach.push(why);
        }
    }

    fn add(
        &mut self,
        role: SurfaceRole,
        space: AddressSpace,
        start: u64,
        len: u64,
        shape: Shape,
        writes: bool,
    ) {
        if len == 0 {
            return;
        }
        let shape = if shape.span() <= len {
            shape
        } else {
            Shape::linear(len)
        };
        if len > MAX_SURFACE_BYTES || start.checked_add(len).is_none() {
            self.widen(format!(
                "{role:?} at {start:#x} spans {len:#x} bytes, beyond any surface"
            ));
            return;
        }
        self.surfaces.push(SurfaceUse {
            role,
            space,
            start,
            len,
            writes,
            shape,
        });
    }

    /// The ranges the work may write, with the reach when the state does not bound it.
    pub fn write_set(&self, reach: Reach) -> WriteSet {
        let ranges: Vec<AddressRange> = self
            .surfaces
            .iter()
            .filter(|s| s.writes)
            .map(|s| AddressRange {
                space: s.space,
                start: s.start,
                len: s.len,
            })
            .collect();
        if !self.reach.is_empty() {
            WriteSet::WithinReach { ranges, reach }
        } else if ranges.is_empty() {
            WriteSet::Nothing
        } else {
            WriteSet::Ranges(ranges)
        }
    }

    /// The written surfaces.
    pub fn writes(&self) -> impl Iterator<Item = &SurfaceUse> {
        self.surfaces.iter().filter(|s| s.writes)
    }
}

/// A heap base from STATE_BASE_ADDRESS (or the binding-table pool), with its size when bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Base {
    addr: u64,
    size: Option<u64>,
}

impl Base {
    /// `base + off .. + len`, if inside the heap's bound (when it has one).
    fn at(&self, off: u64, len: u64) -> Option<u64> {
        let end = off.checked_add(len)?;
        if self.size.is_some_and(|s| end > s) {
            return None;
        }
        self.addr.checked_add(off)
    }
}

/// A shader stage's state (3DSTATE_VS/HS/DS/GS/PS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StageState {
    enabled: bool,
    /// Kernel start pointers (instruction-base relative); the PS has three.
    ksp: [Option<u64>; 3],
}

/// 3DSTATE_DEPTH_BUFFER, as far as sizing needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DepthState {
    addr: u64,
    pitch: u64,
    width: u64,
    height: u64,
    rows: u64,
    slices: u64,
    null: bool,
    depth_write: bool,
    stencil_write: bool,
    hiz: bool,
}

/// MFX_SURFACE_STATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MfxSurface {
    width: u64,
    height: u64,
    pitch: u64,
    uv_row: u64,
}

/// Per-submission 3D, GPGPU and video state.
#[derive(Clone, Debug)]
pub struct IndirectState {
    gen: Gen,
    /// The context's own space (its PPGTT, or the GGTT without one): what bounds the reach.
    context: AddressSpace,
    /// The space the recorded state addresses: that of the buffer that set it.
    space: AddressSpace,
    general: Option<Base>,
    surface: Option<u64>,
    dynamic: Option<Base>,
    instruction: Option<Base>,
    bindless: Option<Base>,
    /// `Some(None)`: the pool was explicitly disabled.
    bt_pool: Option<Option<Base>>,
    bt: [Option<u64>; 5],
    stages: [Option<StageState>; 5],
    depth: Option<DepthState>,
    stencil: Option<Option<(u64, u64)>>,
    hiz: Option<Option<(u64, u64)>>,
    /// 3DSTATE_STREAMOUT's SO Function Enable.
    streamout: Option<bool>,
    so: [Option<(u64, u64, Option<u64>)>; 4],
    idd: Option<(u64, u64)>,
    mfx_surface: Option<MfxSurface>,
    mfx_dest: Vec<u64>,
    mfx_row_store: Vec<u64>,
    mfx_other_writes: bool,
    mfx_bitstream: Option<u64>,
    /// An MFX state command naming buffers this module does not size.
    mfx_unmodelled: Option<&'static str>,
    /// Kernels scanned in this submission: (address, bytes the scan may have read, scan). A
    /// command that may write over one drops it (any unbounded write drops them all).
    kernels: RefCell<Vec<(u64, u64, Arc<KernelScan>)>>,
}

/// Most kernel scans kept per submission.
const MAX_CACHED_KERNELS: usize = 64;

/// How many binding-table entries a kernel can name (240 and up are special indices).
const MAX_BINDING_TABLE_ENTRIES: u64 = 240;
/// Bytes of RENDER_SURFACE_STATE read (16 dwords on GEN8–GEN11).
pub const SURFACE_STATE_BYTES: usize = 64;
/// Bytes per interface descriptor.
const INTERFACE_DESCRIPTOR_BYTES: u64 = 32;

fn dw(d: &Decoded<'_>, i: usize) -> u32 {
    d.dword(i).unwrap_or(0)
}

/// The interface descriptor a dispatch runs (its offset field).
fn dispatch_index(d: &Decoded<'_>) -> u64 {
    u64::from(dw(d, 1) & 0x3f)
}

/// See [`IndirectState::surface_key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SurfaceKey {
    space: AddressSpace,
    instruction: Option<Base>,
    surface: Option<u64>,
    bt_pool: Option<Option<Base>>,
    of: SurfaceWork,
}

/// The part of a [`SurfaceKey`] that depends on the kind of work.
// Keys are built and compared in place, one per work command; boxing the draw's would allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SurfaceWork {
    Draw {
        bt: [Option<u64>; 5],
        stages: [Option<StageState>; 5],
    },
    Dispatch {
        idd: Option<(u64, u64)>,
        dynamic: Option<Base>,
        index: u64,
    },
}

fn addr64(lo: u32, hi: u32, low_bits: u32) -> u64 {
    (u64::from(hi & 0xffff) << 32) | u64::from(lo & !((1u32 << low_bits) - 1))
}

fn bit(v: u32, b: u32) -> bool {
    (v >> b) & 1 == 1
}

fn bits(v: u32, lo: u32, n: u32) -> u64 {
    u64::from((v >> lo) & ((1u32 << n) - 1))
}

impl IndirectState {
    /// Fresh state for one submission of a context that addresses memory through `space`.
    pub fn new(gen: Gen, space: AddressSpace) -> IndirectState {
        IndirectState {
            gen,
            context: space,
            space,
            general: None,
            surface: None,
            dynamic: None,
            instruction: None,
            bindless: None,
            bt_pool: None,
            bt: [None; 5],
            stages: [None; 5],
            depth: None,
            stencil: None,
            hiz: None,
            streamout: None,
            so: [None; 4],
            idd: None,
            mfx_surface: None,
            mfx_dest: Vec::new(),
            mfx_row_store: Vec::new(),
            mfx_other_writes: false,
            mfx_bitstream: None,
            mfx_unmodelled: None,
            kernels: RefCell::new(Vec::new()),
        }
    }

    /// The recorded state, for tests: everything but the caches.
    #[cfg(test)]
    fn recorded_state(&self) -> String {
        let mut s = self.clone();
        s.kernels = RefCell::new(Vec::new());
        format!("{s:?}")
    }

    /// The space the recorded state addresses (that of the last buffer a command ran from).
    pub fn space(&self) -> AddressSpace {
        self.space
    }

    /// Feeds one command, in execution order, run from a buffer of context `ctx`. Returns its
    /// write set with indirect state followed and, for work commands, its footprint. The reach
    /// of a command is the context's space, plus the GGTT for a privileged buffer.
    pub fn step(
        &mut self,
        d: &Decoded<'_>,
        ctx: &BatchContext,
        mem: &dyn GpuMemory,
    ) -> (WriteSet, Option<Footprint>) {
        self.enter(ctx);
        let role = role(d.desc);
        if role == Role::Inert {
            // Most of a batch. Kept out of the call below, whose frame is large.
            return (WriteSet::Nothing, None);
        }
        self.step_other(d, role, ctx, mem)
    }

    /// Moves to the space a buffer of context `ctx` addresses implicitly: state set through the
    /// other space says nothing about this one's heaps, so it is dropped.
    #[inline]
    fn enter(&mut self, ctx: &BatchContext) {
        let here = ctx.implicit_space();
        if here != self.space {
            self.reset_to(here);
        }
    }

    /// Drops the recorded state, which now addresses `space`.
    #[cold]
    #[inline(never)]
    fn reset_to(&mut self, space: AddressSpace) {
        *self = IndirectState {
            context: self.context,
            ..IndirectState::new(self.gen, space)
        };
    }

    /// Feeds one command like [`IndirectState::step`] but works out no write set: state is
    /// recorded, and a work command's kind is returned. For readers of memory that does not
    /// change while they walk (the audit and the remap): the kernel scans are not dropped when a
    /// command may write over them.
    #[inline]
    pub(crate) fn advance(&mut self, d: &Decoded<'_>, ctx: &BatchContext) -> Option<Work> {
        self.enter(ctx);
        match role(d.desc) {
            Role::Work(work) => Some(work),
            Role::Inert => None,
            role => {
                self.observe(d, role);
                None
            }
        }
    }

    /// Everything besides memory that the surface states of work `work` (command `d`) depend
    /// on; `None` when that work reads no surface state. Two commands with equal keys, stepped
    /// over the same memory, use the same surface states ([`IndirectState::surface_states`]).
    ///
    /// Keep in step with [`IndirectState::shader_with_table`], [`IndirectState::bound_surface`]
    /// and [`IndirectState::dispatch`]: every field they read to find a surface state is here.
    pub(crate) fn surface_key(&self, d: &Decoded<'_>, work: Work) -> Option<SurfaceKey> {
        let of = match work {
            Work::Draw => SurfaceWork::Draw {
                bt: self.bt,
                stages: self.stages,
            },
            Work::Dispatch => SurfaceWork::Dispatch {
                idd: self.idd,
                dynamic: self.dynamic,
                index: dispatch_index(d),
            },
            Work::DepthOp | Work::Decode | Work::Unmodelled => return None,
        };
        Some(SurfaceKey {
            space: self.space,
            instruction: self.instruction,
            surface: self.surface,
            bt_pool: self.bt_pool,
            of,
        })
    }

    /// The surface states work `work` (command `d`) reads: its footprint's
    /// [`Footprint::surface_states`].
    pub(crate) fn surface_states(
        &self,
        d: &Decoded<'_>,
        work: Work,
        mem: &dyn GpuMemory,
    ) -> Vec<SurfaceStateAt> {
        self.footprint(d, work, mem).surface_states
    }

    /// [`IndirectState::step`] for anything but state without addresses.
    #[inline(never)]
    fn step_other(
        &mut self,
        d: &Decoded<'_>,
        role: Role,
        ctx: &BatchContext,
        mem: &dyn GpuMemory,
    ) -> (WriteSet, Option<Footprint>) {
        let reach = Reach::of(self.context, ctx);
        if self.observe(d, role) {
            return (WriteSet::Nothing, None);
        }
        let (set, fp) = self.work(d, role, ctx, reach, mem);
        self.forget_kernels(&set);
        (set, fp)
    }

    /// The write set and footprint of a command that is not state.
    fn work(
        &self,
        d: &Decoded<'_>,
        role: Role,
        ctx: &BatchContext,
        reach: Reach,
        mem: &dyn GpuMemory,
    ) -> (WriteSet, Option<Footprint>) {
        if let Role::Work(work) = role {
            let fp = self.footprint(d, work, mem);
            // A work command's own address fields (none in the tables today) add to its
            // footprint; its "unbounded" flag is what the footprint resolves.
            let own = if d.desc.addrs.is_empty() {
                WriteSet::Nothing
            } else {
                d.write_set(ctx).bounded_by(reach)
            };
            return (fp.write_set(Reach::shader(self.space)).union(own), Some(fp));
        }
        (d.write_set(ctx).bounded_by(reach), None)
    }

    /// Drops the kernel scans a command writing `set` may have made stale.
    fn forget_kernels(&self, set: &WriteSet) {
        let mut k = self.kernels.borrow_mut();
        if k.is_empty() {
            return;
        }
        match set {
            WriteSet::Nothing => {}
            WriteSet::Ranges(r) => k.retain(|&(at, len, _)| {
                !r.iter().any(|r| {
                    r.space == self.space
                        && r.start < at.saturating_add(len)
                        && at < r.start.saturating_add(r.len)
                })
            }),
            WriteSet::WithinReach { .. } | WriteSet::Unknown => k.clear(),
        }
    }

    /// The scan of the kernel at `kernel` (at most `limit` bytes), from this submission's cache
    /// when it was scanned before and nothing has written over it since.
    fn kernel_scan(&self, kernel: u64, limit: Option<u64>, mem: &dyn GpuMemory) -> Arc<KernelScan> {
        let span = limit.unwrap_or(MAX_KERNEL_BYTES).min(MAX_KERNEL_BYTES);
        if let Some((_, _, s)) = self
            .kernels
            .borrow()
            .iter()
            .find(|(at, len, _)| *at == kernel && *len == span)
        {
            return Arc::clone(s);
        }
        let scan = Arc::new(scan_kernel(self.gen, mem, self.space, kernel, limit));
        let mut k = self.kernels.borrow_mut();
        if k.len() >= MAX_CACHED_KERNELS {
            k.remove(0);
        }
        k.push((kernel, span, Arc::clone(&scan)));
        scan
    }

    /// Records a state command; `true` when `d` was one (state commands write no memory).
    fn observe(&mut self, d: &Decoded<'_>, role: Role) -> bool {
        let obs = match role {
            Role::Work(_) => return false,
            Role::Plain | Role::Inert => return self.observe_plain(d),
            Role::Named(obs) => obs,
        };
        match obs {
            Obs::StateBaseAddress => {
                let base = |lo: usize, size_dw: Option<usize>| -> Option<Base> {
                    bit(dw(d, lo), 0).then(|| Base {
                        addr: addr64(dw(d, lo), dw(d, lo + 1), 12),
                        size: size_dw
                            .filter(|s| bit(dw(d, *s), 0))
                            .map(|s| bits(dw(d, s), 12, 20) * 4096),
                    })
                };
                if let Some(b) = base(1, Some(12)) {
                    self.general = Some(b);
                }
                if bit(dw(d, 4), 0) {
                    self.surface = Some(addr64(dw(d, 4), dw(d, 5), 12));
                }
                if let Some(b) = base(6, Some(13)) {
                    self.dynamic = Some(b);
                }
                if let Some(b) = base(10, Some(15)) {
                    self.instruction = Some(b);
                }
                if d.len() >= 19 && bit(dw(d, 16), 0) {
                    self.bindless = Some(Base {
                        addr: addr64(dw(d, 16), dw(d, 17), 12),
                        size: Some(bits(dw(d, 18), 12, 20) * 4096),
                    });
                }
                true
            }
            Obs::BindingTablePool => {
                self.bt_pool = Some(bit(dw(d, 1), 11).then(|| Base {
                    addr: addr64(dw(d, 1), dw(d, 2), 12),
                    size: Some(bits(dw(d, 3), 12, 20) * 4096),
                }));
                true
            }
            Obs::BindingTable(stage) => {
                // Bits 15:5 on GEN8–9; GEN11's pool lets the pointer use bits 20:5.
                let mask = if self.gen == Gen::Gen11 {
                    0x1f_ffe0
                } else {
                    0xffe0
                };
                self.bt[stage.index()] = Some(u64::from(dw(d, 1) & mask));
                true
            }
            Obs::Shader(stage) => {
                self.stages[stage.index()] = Some(StageState {
                    enabled: bit(dw(d, 7), 0),
                    ksp: [Some(addr64(dw(d, 1), dw(d, 2), 6)), None, None],
                });
                true
            }
            Obs::Hull => {
                self.stages[Stage::Hs.index()] = Some(StageState {
                    enabled: bit(dw(d, 2), 31),
                    ksp: [Some(addr64(dw(d, 3), dw(d, 4), 6)), None, None],
                });
                true
            }
            Obs::Pixel => {
                let k = |i: usize| addr64(dw(d, i), dw(d, i + 1), 6);
                self.stages[Stage::Ps.index()] = Some(StageState {
                    enabled: dw(d, 6) & 7 != 0,
                    // KSP0 always; KSP1 and KSP2 serve the 16- and 32-pixel dispatches.
                    ksp: if dw(d, 6) & 6 != 0 {
                        [Some(k(1)), Some(k(8)), Some(k(10))]
                    } else {
                        [Some(k(1)), None, None]
                    },
                });
                true
            }
            Obs::Depth => {
                let d1 = dw(d, 1);
                let pitch = bits(d1, 0, 18) + 1;
                let height = bits(dw(d, 4), 18, 14) + 1;
                let lod = bits(dw(d, 4), 0, 4);
                let slices = bits(dw(d, 5), 21, 11) + 1;
                let qpitch = bits(dw(d, 7), 0, 15);
                self.depth = Some(DepthState {
                    addr: addr64(dw(d, 2), dw(d, 3), 0),
                    pitch,
                    width: bits(dw(d, 4), 4, 14) + 1,
                    height,
                    // Depth buffers are Y-tiled.
                    rows: tiled_rows(height, 64, lod, qpitch, slices > 1),
                    slices,
                    null: bits(d1, 29, 3) == 7,
                    depth_write: bit(d1, 28),
                    stencil_write: bit(d1, 27),
                    hiz: bit(d1, 22),
                });
                true
            }
            Obs::Stencil | Obs::HierDepth => {
                let pitch = bits(dw(d, 1), 0, 17) + 1;
                let addr = addr64(dw(d, 2), dw(d, 3), 0);
                let on = if obs == Obs::Stencil {
                    bit(dw(d, 1), 31)
                } else {
                    addr != 0
                };
                let v = Some(on.then_some((addr, pitch)));
                if obs == Obs::Stencil {
                    self.stencil = v;
                } else {
                    self.hiz = v;
                }
                true
            }
            Obs::StreamOut => {
                self.streamout = Some(bit(dw(d, 1), 31));
                true
            }
            Obs::SoBuffer => {
                let d1 = dw(d, 1);
                let index = bits(d1, 29, 2) as usize;
                self.so[index] = bit(d1, 31).then(|| {
                    (
                        addr64(dw(d, 2), dw(d, 3), 2),
                        (bits(dw(d, 4), 0, 30) + 1) * 4,
                        bit(d1, 20).then(|| addr64(dw(d, 5), dw(d, 6), 2)),
                    )
                });
                true
            }
            // Media pipe state: scratch (reached only through kernels' scratch messages), CURBE
            // and gateway state write nothing.
            Obs::MediaWritesNothing => true,
            Obs::InterfaceDescriptors => {
                self.idd = Some((u64::from(dw(d, 3)), bits(dw(d, 2), 0, 17)));
                true
            }
            Obs::MfxSurface => {
                let width = bits(dw(d, 2), 4, 14) + 1;
                let height = bits(dw(d, 2), 18, 14) + 1;
                let pitch = bits(dw(d, 3), 3, 17) + 1;
                self.mfx_surface = Some(MfxSurface {
                    width,
                    height,
                    pitch,
                    uv_row: bits(dw(d, 4), 0, 15),
                });
                true
            }
            Obs::MfxPipeBuffers => {
                // Pre- and post-deblocking destinations (DW1, DW4), stream-out (DW10), the
                // intra and deblocking row stores (DW13, DW16); everything after DW19 is read
                // (reference pictures) except the status / ILDB stream-out buffers.
                let at = |i: usize| addr64(dw(d, i), dw(d, i + 1), 6);
                self.mfx_dest = [1, 4].into_iter().map(at).filter(|a| *a != 0).collect();
                self.mfx_row_store = [13, 16].into_iter().map(at).filter(|a| *a != 0).collect();
                self.mfx_other_writes = at(10) != 0 || (52..d.len()).any(|i| dw(d, i) & !0x3f != 0);
                true
            }
            Obs::MfxBspBuffers => {
                let at = |i: usize| addr64(dw(d, i), dw(d, i + 1), 6);
                self.mfx_row_store
                    .extend([1, 4].into_iter().map(at).filter(|a| *a != 0));
                true
            }
            Obs::MfxIndirectObjects => {
                let a = addr64(dw(d, 1), dw(d, 2), 12);
                self.mfx_bitstream = (a != 0).then_some(a);
                true
            }
        }
    }

    /// A command [`observe`](Self::observe) has no arm for: whether it is state that writes
    /// nothing.
    fn observe_plain(&mut self, d: &Decoded<'_>) -> bool {
        use crate::table::Class;
        let class = d.desc.class;
        if class == Class::Mi {
            return false;
        }
        if matches!(class, Class::Mfx | Class::Vebox) {
            // Video state commands write nothing themselves; the object commands do, into
            // buffers the state names. Those named by commands not modelled here bound the
            // next decode by the reach.
            if !MFX_STATE_WITHOUT_BUFFERS.contains(&d.desc.name) {
                self.mfx_unmodelled = Some(d.desc.name);
            }
            return true;
        }
        // 3D and media state without address fields writes nothing; the rest (vertex and index
        // buffers, PIPE_CONTROL, ...) keeps its commands-only write set.
        let f = d.desc.flags;
        d.desc.addrs.is_empty() && !f.has(Flags::UNBOUNDED_WRITES) && !f.has(Flags::OPAQUE)
    }

    /// The footprint of a work command of kind `work`.
    fn footprint(&self, d: &Decoded<'_>, work: Work, mem: &dyn GpuMemory) -> Footprint {
        let mut fp = Footprint::default();
        match work {
            Work::Draw => self.draw(&mut fp, mem),
            Work::DepthOp => self.depth_surfaces(&mut fp, true),
            Work::Dispatch => self.dispatch(&mut fp, dispatch_index(d), mem),
            Work::Decode => self.decode(&mut fp),
            Work::Unmodelled => {
                fp.widen(format!(
                    "{}: its write targets are not modelled",
                    d.desc.name
                ));
            }
        }
        fp
    }

    fn draw(&self, fp: &mut Footprint, mem: &dyn GpuMemory) {
        for stage in Stage::GRAPHICS {
            match self.stages[stage.index()] {
                None => fp.widen(format!(
                    "{stage:?} state inherited from an earlier submission"
                )),
                Some(s) if !s.enabled => {}
                Some(s) => {
                    for ksp in s.ksp.iter().flatten() {
                        self.shader(fp, stage, *ksp, mem);
                    }
                }
            }
        }
        self.depth_surfaces(fp, false);
        match self.streamout {
            None => fp.widen("stream output state inherited from an earlier submission"),
            Some(false) => {}
            Some(true) if self.so.iter().all(Option::is_none) => {
                fp.widen("stream output enabled with buffers from an earlier submission");
            }
            Some(true) => self.stream_out(fp),
        }
    }

    fn stream_out(&self, fp: &mut Footprint) {
        for (i, so) in self.so.iter().enumerate() {
            if let Some((addr, len, off)) = *so {
                fp.add(
                    SurfaceRole::StreamOut { index: i as u8 },
                    self.space,
                    addr,
                    len,
                    Shape::linear(len),
                    true,
                );
                if let Some(o) = off {
                    fp.add(
                        SurfaceRole::StreamOutOffset { index: i as u8 },
                        self.space,
                        o,
                        4,
                        Shape::linear(4),
                        true,
                    );
                }
            }
        }
    }

    /// Depth, stencil and HiZ (a depth/HiZ op writes all three when enabled).
    fn depth_surfaces(&self, fp: &mut Footprint, hz_op: bool) {
        let Some(db) = self.depth else {
            fp.widen("depth buffer state inherited from an earlier submission");
            return;
        };
        if db.null {
            return;
        }
        let len = db.pitch.saturating_mul(db.rows).saturating_mul(db.slices);
        // 32-bit depth samples (the widest GEN8–GEN11 depth format).
        let shape = Shape::rows(db.width * 4, db.pitch, db.height);
        fp.add(
            SurfaceRole::Depth,
            self.space,
            db.addr,
            len,
            shape,
            db.depth_write || hz_op,
        );
        // Stencil and HiZ share the depth buffer's dimensions.
        let aux = |fp: &mut Footprint, role, v: Option<Option<(u64, u64)>>, writes: bool| match v {
            None => fp.widen(format!(
                "{role:?} state inherited from an earlier submission"
            )),
            Some(None) => {}
            Some(Some((addr, pitch))) => {
                let len = pitch.saturating_mul(db.rows).saturating_mul(db.slices);
                fp.add(
                    role,
                    self.space,
                    addr,
                    len,
                    Shape::rows(pitch, pitch, db.height),
                    writes,
                );
            }
        };
        aux(
            fp,
            SurfaceRole::Stencil,
            self.stencil,
            db.stencil_write || hz_op,
        );
        if db.hiz || hz_op {
            aux(
                fp,
                SurfaceRole::HierDepth,
                self.hiz,
                db.depth_write || hz_op,
            );
        }
    }

    fn dispatch(&self, fp: &mut Footprint, index: u64, mem: &dyn GpuMemory) {
        let (Some((start, total)), Some(dynamic)) = (self.idd, self.dynamic) else {
            fp.widen("interface descriptors inherited from an earlier submission");
            return;
        };
        let off = index * INTERFACE_DESCRIPTOR_BYTES;
        if off + INTERFACE_DESCRIPTOR_BYTES > total {
            fp.widen(format!(
                "interface descriptor {index} outside the {total} bytes loaded"
            ));
            return;
        }
        let Some(addr) = start
            .checked_add(off)
            .and_then(|o| dynamic.at(o, INTERFACE_DESCRIPTOR_BYTES))
        else {
            fp.widen("interface descriptor outside the dynamic-state heap");
            return;
        };
        let mut id = [0u32; 8];
        if let Err(e) = mem.read_dwords(self.space, addr, &mut id) {
            fp.widen(format!("interface descriptor: {e}"));
            return;
        }
        let ksp = addr64(id[0], id[1], 6);
        let bt = u64::from(id[4] & 0xffe0);
        self.shader_with_table(fp, Stage::Compute, ksp, Some(bt), mem);
    }

    fn shader(&self, fp: &mut Footprint, stage: Stage, ksp: u64, mem: &dyn GpuMemory) {
        self.shader_with_table(fp, stage, ksp, self.bt[stage.index()], mem);
    }

    fn shader_with_table(
        &self,
        fp: &mut Footprint,
        stage: Stage,
        ksp: u64,
        bt: Option<u64>,
        mem: &dyn GpuMemory,
    ) {
        let Some(ib) = self.instruction else {
            fp.widen("instruction base inherited from an earlier submission");
            return;
        };
        let Some(kernel) = ib.addr.checked_add(ksp) else {
            fp.widen(format!("{stage:?} kernel pointer overflows"));
            return;
        };
        let limit = ib.size.map(|s| s.saturating_sub(ksp));
        let scan = self.kernel_scan(kernel, limit, mem);
        let KernelScan {
            reads,
            writes,
            stateless,
            reach,
        } = &*scan;
        if let Some(why) = reach {
            fp.widen(format!("{stage:?} kernel at {kernel:#x}: {why}"));
        }
        if *stateless {
            match self.general {
                Some(Base {
                    addr,
                    size: Some(size),
                }) if size > 0 => fp.add(
                    SurfaceRole::Stateless,
                    self.space,
                    addr,
                    size,
                    Shape::linear(size),
                    true,
                ),
                _ => fp.widen(format!(
                    "{stage:?} kernel at {kernel:#x} sends stateless messages and the general \
                     state buffer is unbounded"
                )),
            }
        }
        if reads.is_empty() && writes.is_empty() {
            return;
        }
        let Some(bt) = bt else {
            fp.widen(format!(
                "{stage:?} binding table inherited from an earlier submission"
            ));
            return;
        };
        for index in reads.union(writes) {
            let w = writes.contains(index);
            self.bound_surface(fp, stage, bt, *index, w, mem);
        }
    }

    /// Resolves binding-table entry `index` of the table at `bt` and adds its surface.
    fn bound_surface(
        &self,
        fp: &mut Footprint,
        stage: Stage,
        bt: u64,
        index: u8,
        writes: bool,
        mem: &dyn GpuMemory,
    ) {
        let Some(ss_base) = self.surface else {
            fp.widen("surface-state base inherited from an earlier submission");
            return;
        };
        if u64::from(index) >= MAX_BINDING_TABLE_ENTRIES {
            fp.widen(format!("{stage:?} binding-table index {index} is special"));
            return;
        }
        let table = match self.bt_pool {
            Some(Some(pool)) => pool.at(bt + u64::from(index) * 4, 4),
            _ => ss_base.checked_add(bt + u64::from(index) * 4),
        };
        let Some(entry_addr) = table else {
            fp.widen(format!("{stage:?} binding table outside its pool"));
            return;
        };
        let mut entry = [0u32; 1];
        if let Err(e) = mem.read_dwords(self.space, entry_addr, &mut entry) {
            fp.widen(format!("{stage:?} binding table: {e}"));
            return;
        }
        let Some(ss_addr) = ss_base.checked_add(u64::from(entry[0] & !0x3f)) else {
            fp.widen("surface state pointer overflows");
            return;
        };
        let mut ss = [0u32; SURFACE_STATE_BYTES / 4];
        if let Err(e) = mem.read_dwords(self.space, ss_addr, &mut ss) {
            fp.widen(format!("{stage:?} surface state {index}: {e}"));
            return;
        }
        let at = SurfaceStateAt {
            stage,
            index,
            space: self.space,
            addr: ss_addr,
        };
        if !fp.surface_states.iter().any(|s| s.addr == ss_addr) {
            fp.surface_states.push(at);
        }
        match surface_extent(self.gen, &ss) {
            Extent::Null => {}
            Extent::Bytes {
                start,
                len,
                shape,
                aux,
            } => {
                fp.add(
                    SurfaceRole::Bound { stage, index },
                    self.space,
                    start,
                    len,
                    shape,
                    writes,
                );
                if let Some((a, l)) = aux {
                    fp.add(
                        SurfaceRole::Aux { stage, index },
                        self.space,
                        a,
                        l,
                        Shape::linear(l),
                        writes,
                    );
                }
            }
            Extent::Unsized(why) => fp.widen(format!("{stage:?} surface {index}: {why}")),
        }
    }

    fn decode(&self, fp: &mut Footprint) {
        let Some(s) = self.mfx_surface else {
            fp.widen("MFX surface state inherited from an earlier submission");
            return;
        };
        if self.mfx_dest.is_empty() && self.mfx_row_store.is_empty() && !self.mfx_other_writes {
            fp.widen("MFX buffer addresses inherited from an earlier submission");
            return;
        }
        // NV12: luma rows, then interleaved chroma from `uv_row` (or right after luma).
        let luma = s.height.next_multiple_of(32);
        let chroma_start = s.uv_row.max(luma);
        let len = s
            .pitch
            .saturating_mul(chroma_start + s.height.div_ceil(2).next_multiple_of(32));
        // The decoded picture: luma rows, then half as many chroma rows.
        let shape = Shape::rows(s.width, s.pitch, s.height + s.height / 2);
        for &a in &self.mfx_dest {
            fp.add(
                SurfaceRole::VideoDestination,
                self.space,
                a,
                len,
                shape,
                true,
            );
        }
        // Row stores hold a few cache lines per macroblock column: the media driver sizes the
        // largest at 4 lines per macroblock; twice that is the bound taken here.
        let mbs = s.width.div_ceil(16);
        let row_store = mbs * 8 * 64;
        for &a in &self.mfx_row_store {
            fp.add(
                SurfaceRole::VideoRowStore,
                self.space,
                a,
                row_store,
                Shape::linear(mbs * 4 * 64),
                true,
            );
        }
        if let Some(b) = self.mfx_bitstream {
            fp.add(
                SurfaceRole::Bitstream,
                self.space,
                b,
                4096,
                Shape::linear(4096),
                false,
            );
        }
        if let Some(name) = self.mfx_unmodelled {
            fp.widen(format!("{name} names buffers that are not modelled"));
        }
        if self.mfx_other_writes {
            fp.widen("MFX stream-out or status buffers are not sized");
        }
    }
}

/// What [`IndirectState::observe`] records from a state command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Obs {
    StateBaseAddress,
    BindingTablePool,
    BindingTable(Stage),
    /// 3DSTATE_VS, 3DSTATE_DS or 3DSTATE_GS.
    Shader(Stage),
    Hull,
    Pixel,
    Depth,
    Stencil,
    HierDepth,
    StreamOut,
    SoBuffer,
    /// Media pipe state: scratch (reached only through kernels' scratch messages), CURBE and
    /// gateway state write nothing.
    MediaWritesNothing,
    InterfaceDescriptors,
    MfxSurface,
    MfxPipeBuffers,
    MfxBspBuffers,
    MfxIndirectObjects,
}

/// The state commands [`IndirectState::observe`] records, and what it records of each.
const OBSERVED: &[(&str, Obs)] = &[
    ("STATE_BASE_ADDRESS", Obs::StateBaseAddress),
    ("3DSTATE_BINDING_TABLE_POOL_ALLOC", Obs::BindingTablePool),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_VS",
        Obs::BindingTable(Stage::Vs),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_HS",
        Obs::BindingTable(Stage::Hs),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_DS",
        Obs::BindingTable(Stage::Ds),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_GS",
        Obs::BindingTable(Stage::Gs),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_PS",
        Obs::BindingTable(Stage::Ps),
    ),
    ("3DSTATE_VS", Obs::Shader(Stage::Vs)),
    ("3DSTATE_HS", Obs::Hull),
    ("3DSTATE_DS", Obs::Shader(Stage::Ds)),
    ("3DSTATE_GS", Obs::Shader(Stage::Gs)),
    ("3DSTATE_PS", Obs::Pixel),
    ("3DSTATE_DEPTH_BUFFER", Obs::Depth),
    ("3DSTATE_STENCIL_BUFFER", Obs::Stencil),
    ("3DSTATE_HIER_DEPTH_BUFFER", Obs::HierDepth),
    ("3DSTATE_STREAMOUT", Obs::StreamOut),
    ("3DSTATE_SO_BUFFER", Obs::SoBuffer),
    ("MEDIA_VFE_STATE", Obs::MediaWritesNothing),
    ("MEDIA_CURBE_LOAD", Obs::MediaWritesNothing),
    ("MEDIA_GATEWAY_STATE", Obs::MediaWritesNothing),
    ("MEDIA_STATE_FLUSH", Obs::MediaWritesNothing),
    ("MEDIA_POOL_STATE", Obs::MediaWritesNothing),
    ("MEDIA_INTERFACE_DESCRIPTOR_LOAD", Obs::InterfaceDescriptors),
    ("MFX_SURFACE_STATE", Obs::MfxSurface),
    ("MFX_PIPE_BUF_ADDR_STATE", Obs::MfxPipeBuffers),
    ("MFX_BSP_BUF_BASE_ADDR_STATE", Obs::MfxBspBuffers),
    ("MFX_IND_OBJ_BASE_ADDR_STATE", Obs::MfxIndirectObjects),
];

/// The kinds of work command a footprint is derived for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// 3DPRIMITIVE.
    Draw,
    /// 3DSTATE_WM_HZ_OP.
    DepthOp,
    /// GPGPU_WALKER and the MEDIA_OBJECT family.
    Dispatch,
    /// MFD_*_BSD_OBJECT.
    Decode,
    /// Work whose write targets are not modelled.
    Unmodelled,
}

/// What a command is to the indirect state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// State [`IndirectState::observe`] records.
    Named(Obs),
    /// A work command (it has a footprint).
    Work(Work),
    /// Anything else.
    Plain,
    /// A [`Role::Plain`] row that changes nothing here and writes no memory ([`inert`]).
    Inert,
}

fn role_of_name(name: &str) -> Role {
    if let Some(work) = work_of_name(name) {
        Role::Work(work)
    } else if let Some((_, obs)) = OBSERVED.iter().find(|(n, _)| *n == name) {
        Role::Named(*obs)
    } else {
        Role::Plain
    }
}

/// The role of a row: that of its name, and [`Role::Inert`] for a plain row that is [`inert`].
fn role_of_row(desc: &crate::table::CommandDesc) -> Role {
    match role_of_name(desc.name) {
        Role::Plain if inert(desc) => Role::Inert,
        r => r,
    }
}

/// The role of a table row, computed once per row (commands are stepped by the million).
fn role(desc: &'static crate::table::CommandDesc) -> Role {
    static ROLES: std::sync::OnceLock<Vec<Role>> = std::sync::OnceLock::new();
    let all = crate::table::all_commands();
    let roles = ROLES.get_or_init(|| all.iter().map(role_of_row).collect());
    let index = (desc as *const crate::table::CommandDesc as usize)
        .wrapping_sub(all.as_ptr() as usize)
        / std::mem::size_of::<crate::table::CommandDesc>().max(1);
    match (all.get(index), roles.get(index)) {
        (Some(row), Some(r)) if std::ptr::eq(row, desc) => *r,
        // A row from elsewhere (never, with the crate's tables): decide by name.
        _ => role_of_row(desc),
    }
}

/// Video state commands that name no buffer the decoder writes.
const MFX_STATE_WITHOUT_BUFFERS: &[&str] = &[
    "MFX_WAIT",
    "MFX_PIPE_MODE_SELECT",
    "MFX_STATE_POINTER",
    "MFX_QM_STATE",
    "MFX_FQM_STATE",
    "MFX_AVC_IMG_STATE",
    "MFX_AVC_QM_STATE",
    "MFX_AVC_SLICE_STATE",
    "MFX_AVC_REF_IDX_STATE",
    "MFX_AVC_WEIGHTOFFSET_STATE",
    "MFD_AVC_PICID_STATE",
    "MFD_AVC_DPB_STATE",
    "MFD_AVC_SLICEADDR",
    "MFX_MPEG2_PIC_STATE",
    "MFX_MPEG2_QM_STATE",
    "MFX_JPEG_PIC_STATE",
    "MFX_JPEG_HUFF_TABLE_STATE",
];

/// Whether a [`Role::Plain`] row changes nothing here and writes no memory: no written address
/// field, no unbounded writes, and not video state (which [`IndirectState::observe_plain`]
/// records). Its step is `(Nothing, None)` whatever its dwords.
#[inline]
fn inert(desc: &crate::table::CommandDesc) -> bool {
    use crate::table::Class;
    let f = desc.flags;
    !matches!(desc.class, Class::Mfx | Class::Vebox)
        && !desc.addrs.iter().any(|a| a.access.writes())
        && !f.has(Flags::UNBOUNDED_WRITES)
        && !f.has(Flags::OPAQUE)
}

/// The kind of work a command makes the GPU do through indirect state; `None` for a command that
/// is not work.
fn work_of_name(name: &str) -> Option<Work> {
    Some(match name {
        "3DPRIMITIVE" => Work::Draw,
        "3DSTATE_WM_HZ_OP" => Work::DepthOp,
        "GPGPU_WALKER"
        | "MEDIA_OBJECT"
        | "MEDIA_OBJECT_WALKER"
        | "MEDIA_OBJECT_PRT"
        | "MEDIA_OBJECT_GRPID" => Work::Dispatch,
        _ if name.starts_with("MFD_") && name.ends_with("_BSD_OBJECT") => Work::Decode,
        "MFD_IT_OBJECT"
        | "MFX_DBK_OBJECT"
        | "MFX_PAK_INSERT_OBJECT"
        | "MFX_STITCH_OBJECT"
        | "HCP_BSD_OBJECT"
        | "HCP_PAK_OBJECT"
        | "HCP_PAK_INSERT_OBJECT"
        | "HCP_VP9_PAK_OBJECT"
        | "HUC_START"
        | "HUC_STREAM_OBJECT"
        | "VDENC_WALKER_STATE"
        | "SFC_FRAME_START"
        | "VEB_DI_IECP"
        | "MFX_VP8_PAK_OBJECT" => Work::Unmodelled,
        _ if name.starts_with("MFC_") && name.ends_with("_PAK_OBJECT") => Work::Unmodelled,
        _ => return None,
    })
}

/// Rows a surface of `height` rows occupies per slice: whole tiles of `tile_rows`, doubled for a
/// mip chain, or the array pitch when larger.
fn tiled_rows(height: u64, tile_rows: u64, mips: u64, qpitch: u64, array: bool) -> u64 {
    let mut rows = height.next_multiple_of(tile_rows);
    if mips > 0 {
        rows *= 2;
    }
    if array {
        rows = rows.max(qpitch.saturating_mul(4).next_multiple_of(64));
    }
    rows
}

enum Extent {
    Null,
    Bytes {
        start: u64,
        len: u64,
        shape: Shape,
        aux: Option<(u64, u64)>,
    },
    Unsized(String),
}

/// The bytes a RENDER_SURFACE_STATE covers (an upper bound).
fn surface_extent(gen: Gen, ss: &[u32; 16]) -> Extent {
    const SURFTYPE_BUFFER: u64 = 4;
    const SURFTYPE_STRBUF: u64 = 5;
    const SURFTYPE_NULL: u64 = 7;
    const FORMAT_RAW: u64 = 0x1ff;
    let ty = bits(ss[0], 29, 3);
    let start = addr64(ss[8], ss[9], 0);
    let pitch = bits(ss[3], 0, 18) + 1;
    let width = bits(ss[2], 0, 14) + 1;
    let height = bits(ss[2], 16, 14) + 1;
    let (len, shape) = match ty {
        SURFTYPE_NULL => return Extent::Null,
        6 => return Extent::Unsized("reserved surface type 6".into()),
        SURFTYPE_BUFFER | SURFTYPE_STRBUF => {
            // Buffers: entries - 1 split over width 6:0, height 20:7, depth 30:21.
            let entries =
                (bits(ss[3], 21, 11) << 21 | bits(ss[2], 16, 14) << 7 | bits(ss[2], 0, 7)) + 1;
            let format_bits = if gen == Gen::Gen8 { 9 } else { 10 };
            let format = bits(ss[0], 18, format_bits);
            let stride = if format == FORMAT_RAW { 1 } else { 16 };
            let len = entries.saturating_mul(stride.max(pitch));
            (len, Shape::linear(len))
        }
        _ => {
            let depth = bits(ss[3], 21, 11) + 1;
            let mips = bits(ss[5], 0, 4);
            let qpitch = bits(ss[1], 0, 15);
            let array = bit(ss[0], 28) || ty == 2 || depth > 1;
            let mut slices = depth;
            if ty == 3 {
                slices = slices.saturating_mul(6);
            }
            let samples = 1u64 << bits(ss[4], 3, 3).min(4);
            // Tile heights: linear 1, X 8, W 64, Y 32 (Yf/Ys up to 256 as tiled resources).
            let tile_rows = match bits(ss[0], 12, 2) {
                0 => 1,
                2 => 8,
                _ if bits(ss[5], 18, 2) != 0 => 256,
                _ => 64,
            };
            let rows = tiled_rows(height, tile_rows, mips, qpitch, array);
            // X/Y offsets move the origin by up to 28 rows and 508 pixels of 16 bytes.
            let offset = if bits(ss[5], 21, 3) != 0 || bits(ss[5], 25, 7) != 0 {
                28 * pitch + 508 * 16
            } else {
                0
            };
            let len = pitch
                .saturating_mul(rows)
                .saturating_mul(slices)
                .saturating_mul(samples)
                .saturating_add(offset);
            // 32-bit pixels, the reference GPU's colour format.
            (len, Shape::rows(width * 4, pitch, height))
        }
    };
    // CCS, MCS and HiZ auxiliary surfaces are no larger than the surface they describe.
    let aux = (bits(ss[6], 0, 3) != 0)
        .then(|| addr64(ss[10], ss[11], 12))
        .filter(|a| *a != 0)
        .map(|a| (a, len));
    Extent::Bytes {
        start,
        len,
        shape,
        aux,
    }
}

/// An address field inside a RENDER_SURFACE_STATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateAddress {
    /// Field name.
    pub field: &'static str,
    /// Dword index of the field's low half in the surface state.
    pub dword: usize,
    /// Bits of the 64-bit value in dwords `dword` and `dword + 1` that hold the address.
    pub mask: u64,
    /// The address.
    pub addr: u64,
    /// Bytes the GPU may touch from it; `None` when the state does not size it.
    pub len: Option<u64>,
}

/// The address fields a RENDER_SURFACE_STATE uses: the surface base, the auxiliary surface (when
/// an aux mode is set) and, on GEN11, the clear-colour address (when enabled). A null surface uses
/// none. In a privileged (GGTT) context these are GGTT addresses to audit and remap.
#[must_use]
pub fn surface_state_addresses(gen: Gen, ss: &[u32; 16]) -> Vec<StateAddress> {
    const ADDR48: u64 = 0x0000_ffff_ffff_ffff;
    let pair = |i: usize| u64::from(ss[i]) | (u64::from(ss[i + 1]) << 32);
    let (len, aux) = match surface_extent(gen, ss) {
        Extent::Null => return Vec::new(),
        Extent::Unsized(_) => (None, None),
        Extent::Bytes { len, aux, .. } => (Some(len), aux),
    };
    let mut v = vec![StateAddress {
        field: "surface base",
        dword: 8,
        mask: ADDR48,
        addr: pair(8) & ADDR48,
        len,
    }];
    if let Some((addr, l)) = aux {
        v.push(StateAddress {
            field: "aux surface base",
            dword: 10,
            mask: ADDR48 & !0xfff,
            addr,
            len: Some(l),
        });
    }
    let clear = pair(12) & ADDR48 & !0x3f;
    if gen == Gen::Gen11 && bit(ss[10], 10) && clear != 0 {
        v.push(StateAddress {
            field: "clear value",
            dword: 12,
            mask: ADDR48 & !0x3f,
            addr: clear,
            len: Some(64),
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{all_commands, by_name, Engine};

    #[test]
    fn every_row_has_the_role_its_name_gives() {
        for d in all_commands() {
            assert_eq!(role(d), role_of_row(d), "{}", d.name);
            let plain = matches!(role(d), Role::Plain | Role::Inert);
            assert_eq!(plain, role_of_name(d.name) == Role::Plain, "{}", d.name);
            assert_eq!(role(d) == Role::Inert, plain && inert(d), "{}", d.name);
        }
    }

    /// The short path of `step` gives what the general one would, for every row it takes.
    #[test]
    fn the_short_path_agrees_with_the_general_one_on_every_inert_row() {
        let mut checked = 0;
        for desc in all_commands() {
            if role(desc) != Role::Inert {
                continue;
            }
            let found = Gen::ALL.into_iter().find_map(|g| {
                crate::table::Engine::ALL
                    .into_iter()
                    .find(|e| by_name(g, *e, desc.name).is_some_and(|d| std::ptr::eq(d, desc)))
                    .map(|e| (g, e))
            });
            let Some((gen, engine)) = found else {
                continue;
            };
            // The shortest length the row accepts; every dword after DW0 all ones, so that
            // written addresses and enable bits would show.
            let Some(v) = (1..=70).find_map(|n| {
                let mut v = vec![u32::MAX; n];
                v[0] = desc.header(n as u32);
                crate::decode_one(gen, engine, &v, 0)
                    .is_ok_and(|c| c.len() == n)
                    .then_some(v)
            }) else {
                continue;
            };
            let d = crate::decode_one(gen, engine, &v, 0).unwrap();
            for space in [AddressSpace::Ggtt, AddressSpace::Ppgtt] {
                let ctx = BatchContext::first_level(space);
                let mut st = IndirectState::new(gen, space);
                let before = st.recorded_state();
                let general = st.step_other(&d, Role::Plain, &ctx, &crate::PageMemory::new());
                assert_eq!(general, (WriteSet::Nothing, None), "{}", desc.name);
                assert_eq!(
                    st.recorded_state(),
                    before,
                    "{} changed the state",
                    desc.name
                );
            }
            checked += 1;
        }
        assert!(checked > 50, "only {checked} inert rows checked");
    }

    #[test]
    fn every_observed_command_exists_and_is_recorded_as_state() {
        for (name, _) in OBSERVED {
            let found = [Gen::Gen8, Gen::Gen9, Gen::Gen11]
                .into_iter()
                .find_map(|g| {
                    [Engine::Render, Engine::Video]
                        .into_iter()
                        .find_map(|e| by_name(g, e, name).map(|d| (g, e, d)))
                });
            let (gen, engine, desc) = found.unwrap_or_else(|| panic!("{name} is in no table"));
            // The shortest length the row accepts, all fields zero.
            let len = (2..=70)
                .find(|&n| {
                    let mut v = vec![0u32; n];
                    v[0] = desc.header(n as u32);
                    crate::decode_one(gen, engine, &v, 0).is_ok_and(|c| c.len() == n)
                })
                .unwrap_or_else(|| panic!("{name}: no length decodes"));
            let mut v = vec![0u32; len];
            v[0] = desc.header(len as u32);
            let d = crate::decode_one(gen, engine, &v, 0).unwrap();
            let mut st = IndirectState::new(gen, AddressSpace::Ppgtt);
            let ctx = BatchContext::first_level(AddressSpace::Ppgtt);
            let (set, fp) = st.step(&d, &ctx, &crate::PageMemory::new());
            assert_eq!((set, fp), (WriteSet::Nothing, None), "{name}");
        }
    }
}
