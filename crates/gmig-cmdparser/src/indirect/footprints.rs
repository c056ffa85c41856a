//! A work command's [`Footprint`], from the recorded state: draws, depth/HiZ ops, dispatches and
//! video decodes.

use super::fields::addr64;
use super::footprint::{Footprint, Shape, Stage, SurfaceRole, SurfaceStateAt};
use super::roles::Work;
use super::state::{dispatch_index, Base, IndirectState};
use super::surfaces::{surface_extent, Extent, SURFACE_STATE_BYTES};
use crate::decode::Decoded;
use crate::isa::KernelScan;
use crate::memory::GpuMemory;

/// How many binding-table entries a kernel can name (240 and up are special indices).
const MAX_BINDING_TABLE_ENTRIES: u64 = 240;
/// Bytes per interface descriptor.
const INTERFACE_DESCRIPTOR_BYTES: u64 = 32;

impl IndirectState {
    /// The footprint of a work command of kind `work`.
    pub(super) fn footprint(&self, d: &Decoded<'_>, work: Work, mem: &dyn GpuMemory) -> Footprint {
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
