//! The 3D and GPGPU pipeline state of the guest-driver model, laid out as Mesa's iris driver lays
//! it out: a binder buffer of binding tables, a separate surface-state heap, a dynamic-state heap
//! (interface descriptors) and an instruction heap of real EU kernels, each at its own base
//! address; on GEN11 the binder is the binding-table pool. Every submission states the whole
//! pipeline (STATE_BASE_ADDRESS, every shader stage, depth/stencil/HiZ, stream output), as iris does
//! at the start of each batch.

use gmig_cmdparser::isa::{encode, sfid};
use gmig_cmdparser::Gen;

use super::{GuestDriver, Obj, Result};
use crate::gm::PAGE_SIZE;
use crate::mmio::EngineId;
use crate::vgpu::Vgpu;

/// Kernel offsets in the instruction heap.
const VS_KERNEL: u64 = 0;
const PS_KERNEL: u64 = 256;
const CS_KERNEL: u64 = 512;
/// Binding tables in the binder: 3D ones from 0, compute ones from here, 64 bytes each.
const COMPUTE_TABLES: u64 = 1024;
/// Compute output slices (one interface descriptor, binding table and buffer surface each).
pub(super) const COMPUTE_SLICES: u64 = 8;

/// RENDER_SURFACE_STATE of a linear 2D B8G8R8A8 surface.
pub(super) fn surface_2d(gpu: u64, w: u32, h: u32, pitch: u32) -> [u32; 16] {
    let mut ss = [0u32; 16];
    ss[0] = (1 << 29) | (0x0c0 << 18);
    ss[2] = ((h - 1) << 16) | (w - 1);
    ss[3] = pitch - 1;
    ss[8] = gpu as u32;
    ss[9] = (gpu >> 32) as u32;
    ss
}

/// RENDER_SURFACE_STATE of a RAW buffer of `bytes` bytes.
pub(super) fn surface_buffer(gpu: u64, bytes: u64) -> [u32; 16] {
    let n = (bytes.max(1) - 1) as u32;
    let mut ss = [0u32; 16];
    ss[0] = (4 << 29) | (0x1ff << 18);
    ss[2] = (((n >> 7) & 0x3fff) << 16) | (n & 0x7f);
    ss[3] = ((n >> 21) & 0x7ff) << 21;
    ss[8] = gpu as u32;
    ss[9] = (gpu >> 32) as u32;
    ss
}

impl GuestDriver {
    /// Allocates the heaps and writes the kernels and the compute interface descriptors.
    pub(super) fn setup_heaps(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        self.new_obj(vgpu, "binder", true, PAGE_SIZE)?;
        self.new_obj(vgpu, "surface_heap", true, PAGE_SIZE)?;
        let dynamic = self.new_obj(vgpu, "dynamic_heap", true, PAGE_SIZE)?;
        let kernels = self.new_obj(vgpu, "kernels", true, PAGE_SIZE)?;
        // A vertex shader that writes its URB entry, a pixel shader that samples binding-table
        // entry 1 and writes render target 0, a compute kernel that writes buffer 0.
        let vs = encode::kernel(&[encode::mov(), encode::send(sfid::URB, 0, true)]);
        let ps = encode::kernel(&[
            encode::sample(1),
            encode::mov(),
            encode::render_target_write(0, true),
        ]);
        let cs = encode::kernel(&[encode::mov(), encode::untyped_write(0, true)]);
        self.cpu_write_dwords(vgpu, kernels.gpa + VS_KERNEL, &vs)?;
        self.cpu_write_dwords(vgpu, kernels.gpa + PS_KERNEL, &ps)?;
        self.cpu_write_dwords(vgpu, kernels.gpa + CS_KERNEL, &cs)?;
        // INTERFACE_DESCRIPTOR_DATA k: the compute kernel with binding table k.
        for k in 0..COMPUTE_SLICES {
            let mut id = [0u32; 8];
            id[0] = CS_KERNEL as u32;
            id[4] = (COMPUTE_TABLES + 64 * k) as u32;
            self.cpu_write_dwords(vgpu, dynamic.gpa + 32 * k, &id)?;
        }
        Ok(())
    }

    /// Writes surface state `slot` (64 bytes each) of the surface-state heap.
    pub(super) fn write_surface(&mut self, vgpu: &Vgpu, slot: u64, ss: &[u32; 16]) -> Result<()> {
        let heap = self.objs["surface_heap"];
        self.cpu_write_dwords(vgpu, heap.gpa + 64 * slot, ss)
    }

    /// Writes a binding table at `offset` in the binder naming surface-state `slots`. Entries are
    /// relative to the surface-state base: the binder itself before GEN11 (iris points the
    /// surface-state base at the binder), the surface heap on GEN11 (the binder is the pool).
    pub(super) fn write_binding_table(
        &mut self,
        vgpu: &Vgpu,
        offset: u64,
        slots: &[u64],
    ) -> Result<()> {
        let (binder, heap) = (self.objs["binder"], self.objs["surface_heap"]);
        let entries: Vec<u32> = slots
            .iter()
            .map(|s| {
                if self.gen == Gen::Gen11 {
                    (64 * s) as u32
                } else {
                    (heap.gpu + 64 * s - binder.gpu) as u32
                }
            })
            .collect();
        self.cpu_write_dwords(vgpu, binder.gpa + offset, &entries)
    }

    /// The compute binding table for output slice `k`.
    pub(super) fn compute_table(k: u64) -> u64 {
        COMPUTE_TABLES + 64 * k
    }

    fn heap(&self, name: &str) -> Obj {
        self.objs[name]
    }

    /// STATE_BASE_ADDRESS (and on GEN11 the binding-table pool) for the heaps.
    pub(super) fn base_addresses(&self) -> Result<Vec<u32>> {
        let e = EngineId::Render;
        let (binder, heap) = (self.heap("binder"), self.heap("surface_heap"));
        let (dynamic, kernels) = (self.heap("dynamic_heap"), self.heap("kernels"));
        let len = match self.gen {
            Gen::Gen8 => 16,
            Gen::Gen9 => 19,
            Gen::Gen11 => 22,
        };
        let mut v = vec![0u32; len];
        v[0] = self.header(e, "STATE_BASE_ADDRESS", len as u32)?;
        let mut set = |dw: usize, addr: u64| {
            v[dw] = (addr as u32 & !0xfff) | 1;
            v[dw + 1] = (addr >> 32) as u32 & 0xffff;
        };
        set(1, 0); // general state at 0, 4 GiB, as iris does
        let surface = if self.gen == Gen::Gen11 { heap } else { binder };
        set(4, surface.gpu);
        set(6, dynamic.gpu);
        set(8, 0);
        set(10, kernels.gpu);
        if len >= 19 {
            set(16, heap.gpu);
            v[18] = (1 << 12) | 1;
        }
        v[12] = (0xfffff << 12) | 1;
        v[13] = (1 << 12) | 1;
        v[14] = (0xfffff << 12) | 1;
        v[15] = (1 << 12) | 1;
        if self.gen == Gen::Gen11 {
            v.extend([
                self.header(e, "3DSTATE_BINDING_TABLE_POOL_ALLOC", 4)?,
                (binder.gpu as u32 & !0xfff) | (1 << 11),
                (binder.gpu >> 32) as u32,
                1 << 12,
            ]);
        }
        Ok(v)
    }

    /// Every shader stage (VS on, HS/DS/GS off, PS on at SIMD8), stream output off, and the
    /// binding tables of the VS and PS (`ps_table` in the binder).
    pub(super) fn shader_stages(&self, ps_table: u64) -> Result<Vec<u32>> {
        let e = EngineId::Render;
        let mut v = Vec::new();
        let mut cmd = |name: &'static str, len: usize, f: &dyn Fn(&mut [u32])| -> Result<()> {
            let mut c = vec![0u32; len];
            c[0] = self.header(e, name, len as u32)?;
            f(&mut c);
            v.extend(c);
            Ok(())
        };
        cmd("3DSTATE_VS", 9, &|c| {
            c[1] = VS_KERNEL as u32;
            c[7] = 1 | (1 << 2);
        })?;
        cmd("3DSTATE_HS", 9, &|_| {})?;
        let ds_len = if self.gen == Gen::Gen8 { 9 } else { 11 };
        cmd("3DSTATE_DS", ds_len, &|_| {})?;
        cmd("3DSTATE_GS", 10, &|_| {})?;
        cmd("3DSTATE_STREAMOUT", 5, &|_| {})?;
        cmd("3DSTATE_PS", 12, &|c| {
            c[1] = PS_KERNEL as u32;
            c[6] = 1;
        })?;
        cmd("3DSTATE_BINDING_TABLE_POINTERS_VS", 2, &|c| c[1] = 0)?;
        cmd("3DSTATE_BINDING_TABLE_POINTERS_PS", 2, &|c| {
            c[1] = ps_table as u32;
        })?;
        cmd("3DSTATE_STENCIL_BUFFER", 5, &|_| {})?;
        cmd("3DSTATE_HIER_DEPTH_BUFFER", 5, &|_| {})?;
        Ok(v)
    }

    /// The media pipe's VFE state and the compute interface descriptors.
    pub(super) fn compute_state(&self) -> Result<Vec<u32>> {
        let e = EngineId::Render;
        let mut v = vec![0u32; 9];
        v[0] = self.header(e, "MEDIA_VFE_STATE", 9)?;
        v.extend([
            self.header(e, "MEDIA_INTERFACE_DESCRIPTOR_LOAD", 4)?,
            0,
            (32 * COMPUTE_SLICES) as u32,
            0,
        ]);
        Ok(v)
    }
}
