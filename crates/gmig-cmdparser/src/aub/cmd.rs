//! Encoders of GEN8–GEN11 commands as raw dwords, for building command sequences (fixtures, tests,
//! workloads). Every address is a 48-bit GPU address split over two dwords, low dword first.
//!
//! These encoders write what the hardware documentation (and Mesa's genxml) lays out; they do not
//! consult the decoder tables, so fixtures built with them test the decoder independently.

use crate::Gen;

/// `MI_NOOP`.
pub const MI_NOOP: u32 = 0;
/// `MI_BATCH_BUFFER_END`.
pub const MI_BATCH_BUFFER_END: u32 = 0x0500_0000;

fn lo(addr: u64) -> u32 {
    addr as u32
}

fn hi(addr: u64) -> u32 {
    ((addr >> 32) & 0xffff) as u32
}

/// `MI_BATCH_BUFFER_START`: `ppgtt` sets the address-space indicator (bit 8), `second_level` bit 22.
#[must_use]
pub fn bb_start(addr: u64, ppgtt: bool, second_level: bool) -> [u32; 3] {
    let mut dw0 = 0x1880_0001;
    if ppgtt {
        dw0 |= 1 << 8;
    }
    if second_level {
        dw0 |= 1 << 22;
    }
    [dw0, lo(addr), hi(addr)]
}

/// `MI_STORE_DATA_IMM` of one dword; `ggtt` sets "use global GTT" (bit 22).
#[must_use]
pub fn store_data_imm(addr: u64, ggtt: bool, value: u32) -> [u32; 4] {
    let dw0 = 0x1000_0002 | if ggtt { 1 << 22 } else { 0 };
    [dw0, lo(addr), hi(addr), value]
}

/// `MI_LOAD_REGISTER_IMM` of (register, value) pairs (at least one).
#[must_use]
pub fn load_register_imm(pairs: &[(u32, u32)]) -> Vec<u32> {
    let n = pairs.len().max(1) as u32;
    let mut v = vec![0x1100_0000 | (2 * n - 1)];
    for &(r, val) in pairs {
        v.push(r);
        v.push(val);
    }
    v
}

/// `MI_LOAD_REGISTER_MEM`: load `reg` from memory; `ggtt` sets bit 22.
#[must_use]
pub fn load_register_mem(reg: u32, addr: u64, ggtt: bool) -> [u32; 4] {
    let dw0 = 0x1480_0002 | if ggtt { 1 << 22 } else { 0 };
    [dw0, reg, lo(addr), hi(addr)]
}

/// `MI_STORE_REGISTER_MEM`: store `reg` to memory; `ggtt` sets bit 22.
#[must_use]
pub fn store_register_mem(reg: u32, addr: u64, ggtt: bool) -> [u32; 4] {
    let dw0 = 0x1200_0002 | if ggtt { 1 << 22 } else { 0 };
    [dw0, reg, lo(addr), hi(addr)]
}

/// `PIPE_CONTROL` with a post-sync "write immediate data" (op 1) to `addr`; `ggtt` sets DW1 bit 24.
#[must_use]
pub fn pipe_control_write(addr: u64, ggtt: bool, value: u64) -> [u32; 6] {
    let dw1 = (1 << 14) | (1 << 20) /* CS stall */ | if ggtt { 1 << 24 } else { 0 };
    [
        0x7a00_0004,
        dw1,
        lo(addr),
        hi(addr),
        value as u32,
        (value >> 32) as u32,
    ]
}

/// `MI_FLUSH_DW` with a post-sync "write immediate data" (op 1) to `addr`; `ggtt` sets DW1 bit 2.
#[must_use]
pub fn flush_dw_write(addr: u64, ggtt: bool, value: u64) -> [u32; 5] {
    let dw1 = (lo(addr) & !7) | if ggtt { 1 << 2 } else { 0 };
    [
        0x1300_4003,
        dw1,
        hi(addr),
        value as u32,
        (value >> 32) as u32,
    ]
}

/// `XY_SRC_COPY_BLT` of a `w`×`h` rectangle of 32-bit pixels from (0,0) of `src` to (0,0) of `dst`.
#[must_use]
pub fn xy_src_copy_blt(
    dst: u64,
    dst_pitch: u16,
    src: u64,
    src_pitch: u16,
    w: u16,
    h: u16,
) -> [u32; 10] {
    [
        0x54f0_0008,
        (3 << 24) | (0xcc << 16) | u32::from(dst_pitch),
        0,
        (u32::from(h) << 16) | u32::from(w),
        lo(dst),
        hi(dst),
        0,
        u32::from(src_pitch),
        lo(src),
        hi(src),
    ]
}

/// `XY_COLOR_BLT` filling a `w`×`h` rectangle of 32-bit pixels at (0,0) of `dst` with `color`.
#[must_use]
pub fn xy_color_blt(dst: u64, pitch: u16, w: u16, h: u16, color: u32) -> [u32; 7] {
    [
        0x5430_0005,
        (3 << 24) | (0xf0 << 16) | u32::from(pitch),
        0,
        (u32::from(h) << 16) | u32::from(w),
        lo(dst),
        hi(dst),
        color,
    ]
}

/// `STATE_BASE_ADDRESS` with every base address (general, surface, dynamic, indirect object,
/// instruction, and on GEN9+ bindless surface, on GEN11 bindless sampler) set to `base + n * 0x1_0000`
/// and its modify-enable bit set; sizes 64 KiB.
#[must_use]
pub fn state_base_address(gen: Gen, base: u64) -> Vec<u32> {
    let len = match gen {
        Gen::Gen8 => 16,
        Gen::Gen9 => 19,
        Gen::Gen11 => 22,
    };
    let mut v = vec![0u32; len];
    v[0] = 0x6101_0000 | (len as u32 - 2);
    let mut k = 0u64;
    let mut put = |v: &mut Vec<u32>, at: usize| {
        let a = (base + k * 0x1_0000) | 1;
        v[at] = lo(a);
        v[at + 1] = hi(a);
        k += 1;
    };
    for at in [1, 4, 6, 8, 10] {
        put(&mut v, at);
    }
    for size in &mut v[12..16] {
        *size = 0x10 << 12 | 1; // 16 pages, modify enable
    }
    if len >= 19 {
        put(&mut v, 16);
        v[18] = 0x10 << 12 | 1;
    }
    if len >= 22 {
        put(&mut v, 19);
        v[21] = 0x10 << 12 | 1;
    }
    v
}

/// `3DSTATE_VERTEX_BUFFERS` with one buffer (`index`) of `size` bytes at `addr`.
#[must_use]
pub fn vertex_buffers(index: u32, addr: u64, size: u32, pitch: u32) -> [u32; 5] {
    [
        0x7808_0003,
        (index << 26) | (1 << 14) | (pitch & 0xfff),
        lo(addr),
        hi(addr),
        size,
    ]
}

/// `3DSTATE_INDEX_BUFFER` of 32-bit indices, `size` bytes at `addr`.
#[must_use]
pub fn index_buffer(addr: u64, size: u32) -> [u32; 5] {
    [0x780a_0003, 2 << 8, lo(addr), hi(addr), size]
}

/// `3DPRIMITIVE` drawing `vertices` vertices of a triangle list.
#[must_use]
pub fn primitive(vertices: u32) -> [u32; 7] {
    [0x7b00_0005, 4, vertices, 0, 1, 0, 0]
}

/// `MI_UPDATE_GTT` writing one GGTT entry (a command a mediated parser must refuse).
#[must_use]
pub fn update_gtt(entry_offset: u32, pte: u64) -> [u32; 4] {
    [0x1180_0002, entry_offset, pte as u32, (pte >> 32) as u32]
}

/// `MI_SEMAPHORE_WAIT` polling the GGTT dword at `addr` until it equals `value`.
#[must_use]
pub fn semaphore_wait(addr: u64, value: u32) -> [u32; 4] {
    [0x0e00_8002 | (1 << 22), value, lo(addr), hi(addr)]
}
