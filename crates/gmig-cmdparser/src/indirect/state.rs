//! [`IndirectState`]: the state recorded so far in a submission, and stepping commands through it.

use std::cell::RefCell;
use std::sync::Arc;

use super::fields::dw;
use super::footprint::{Footprint, SurfaceStateAt};
use super::roles::{role, Obs, Role, Work, SURFACE_OBS, SURFACE_OBS_FIRST};
use crate::addr::AddressSpace;
use crate::decode::{BatchContext, Decoded};
use crate::isa::{scan_kernel, KernelScan, MAX_KERNEL_BYTES};
use crate::memory::GpuMemory;
use crate::table::{Class, Gen};
use crate::writeset::{Reach, WriteSet};

/// A heap base from STATE_BASE_ADDRESS (or the binding-table pool), with its size when bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Base {
    pub(super) addr: u64,
    pub(super) size: Option<u64>,
}

impl Base {
    /// `base + off .. + len`, if inside the heap's bound (when it has one).
    pub(super) fn at(&self, off: u64, len: u64) -> Option<u64> {
        let end = off.checked_add(len)?;
        if self.size.is_some_and(|s| end > s) {
            return None;
        }
        self.addr.checked_add(off)
    }
}

/// A shader stage's state (3DSTATE_VS/HS/DS/GS/PS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct StageState {
    pub(super) enabled: bool,
    /// Kernel start pointers (instruction-base relative); the PS has three.
    pub(super) ksp: [Option<u64>; 3],
}

/// 3DSTATE_DEPTH_BUFFER, as far as sizing needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DepthState {
    pub(super) addr: u64,
    pub(super) pitch: u64,
    pub(super) width: u64,
    pub(super) height: u64,
    pub(super) rows: u64,
    pub(super) slices: u64,
    pub(super) null: bool,
    pub(super) depth_write: bool,
    pub(super) stencil_write: bool,
    pub(super) hiz: bool,
}

/// MFX_SURFACE_STATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MfxSurface {
    pub(super) width: u64,
    pub(super) height: u64,
    pub(super) pitch: u64,
    pub(super) uv_row: u64,
}

/// Per-submission 3D, GPGPU and video state.
#[derive(Clone, Debug)]
pub struct IndirectState {
    pub(super) gen: Gen,
    /// The context's own space (its PPGTT, or the GGTT without one): what bounds the reach.
    pub(super) context: AddressSpace,
    /// The space the recorded state addresses: that of the buffer that set it.
    pub(super) space: AddressSpace,
    pub(super) general: Option<Base>,
    pub(super) surface: Option<u64>,
    pub(super) dynamic: Option<Base>,
    pub(super) instruction: Option<Base>,
    pub(super) bindless: Option<Base>,
    /// `Some(None)`: the pool was explicitly disabled.
    pub(super) bt_pool: Option<Option<Base>>,
    pub(super) bt: [Option<u64>; 5],
    pub(super) stages: [Option<StageState>; 5],
    pub(super) depth: Option<DepthState>,
    pub(super) stencil: Option<Option<(u64, u64)>>,
    pub(super) hiz: Option<Option<(u64, u64)>>,
    /// 3DSTATE_STREAMOUT's SO Function Enable.
    pub(super) streamout: Option<bool>,
    pub(super) so: [Option<(u64, u64, Option<u64>)>; 4],
    pub(super) idd: Option<(u64, u64)>,
    pub(super) mfx_surface: Option<MfxSurface>,
    pub(super) mfx_dest: Vec<u64>,
    pub(super) mfx_row_store: Vec<u64>,
    pub(super) mfx_other_writes: bool,
    pub(super) mfx_bitstream: Option<u64>,
    /// An MFX state command naming buffers this module does not size.
    pub(super) mfx_unmodelled: Option<&'static str>,
    /// Kernels scanned in this submission: (address, bytes the scan may have read, scan). A
    /// command that may write over one drops it (any unbounded write drops them all).
    pub(super) kernels: RefCell<Vec<(u64, u64, Arc<KernelScan>)>>,
}

/// Most kernel scans kept per submission.
const MAX_CACHED_KERNELS: usize = 64;

/// The interface descriptor a dispatch runs (its offset field).
pub(super) fn dispatch_index(d: &Decoded<'_>) -> u64 {
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
    pub(super) fn recorded_state(&self) -> String {
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
            // Nothing to record (`roles::records_nothing`): `observe` would change nothing (a
            // plain row outside the video classes is only classified there, and media pipe
            // state that writes nothing only acknowledged).
            Role::Inert | Role::Named(Obs::MediaWritesNothing) => None,
            Role::Plain if !matches!(d.desc.class, Class::Mfx | Class::Vebox) => None,
            role => {
                self.observe(d, role);
                None
            }
        }
    }

    /// [`IndirectState::advance`] for what the surface states of privileged work depend on only:
    /// `code` is the row's [`surface_code`](super::surface_code) (not
    /// [`SURFACE_UNKNOWN`](super::SURFACE_UNKNOWN)), read from the opcode index, so no role is
    /// looked up. Records the state a [`SurfaceKey`] holds and returns a draw's or a dispatch's
    /// kind; other state (depth, stencil, stream output, video) is not recorded, so only
    /// [`IndirectState::surface_key`] and [`IndirectState::surface_states`] may be asked of a
    /// state stepped this way. The state's space is not checked either: callers step only
    /// commands of privileged buffers, and the state was made for the GGTT.
    #[inline]
    pub(crate) fn advance_surfaces(&mut self, d: &Decoded<'_>, code: u8) -> Option<Work> {
        // One arm per code, each recording its (constant) kind of state: one jump, no second
        // match on the kind.
        macro_rules! record {
            ($($i:literal)*) => {
                match code {
                    super::SURFACE_DRAW => return Some(Work::Draw),
                    super::SURFACE_DISPATCH => return Some(Work::Dispatch),
                    $(c if c == SURFACE_OBS_FIRST + $i => {
                        self.observe_named(d, SURFACE_OBS[$i]);
                    })*
                    _ => {}
                }
            };
        }
        record!(0 1 2 3 4 5 6 7 8 9 10 11 12);
        None
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

    /// Whether `key` is the [`IndirectState::surface_key`] of work `work` (command `d`) now,
    /// compared field by field where the key would be built (no copy of the state).
    #[inline]
    pub(crate) fn has_surface_key(&self, d: &Decoded<'_>, work: Work, key: &SurfaceKey) -> bool {
        key.space == self.space
            && key.instruction == self.instruction
            && key.surface == self.surface
            && key.bt_pool == self.bt_pool
            && match (work, &key.of) {
                (Work::Draw, SurfaceWork::Draw { bt, stages }) => {
                    *bt == self.bt && *stages == self.stages
                }
                (
                    Work::Dispatch,
                    SurfaceWork::Dispatch {
                        idd,
                        dynamic,
                        index,
                    },
                ) => *idd == self.idd && *dynamic == self.dynamic && *index == dispatch_index(d),
                _ => false,
            }
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
    pub(super) fn step_other(
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
    pub(super) fn kernel_scan(
        &self,
        kernel: u64,
        limit: Option<u64>,
        mem: &dyn GpuMemory,
    ) -> Arc<KernelScan> {
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
}
