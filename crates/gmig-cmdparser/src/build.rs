//! Builders for the commands the reference vGPU executes (GEN8+ encodings), for tests, fixtures
//! and workloads. Each returns the command's dwords, DW0 first.

use crate::addr::AddressSpace;

/// MI_NOOP.
pub fn mi_noop() -> Vec<u32> {
    vec![0]
}

/// MI_USER_INTERRUPT.
pub fn mi_user_interrupt() -> Vec<u32> {
    vec![0x02 << 23]
}

/// MI_BATCH_BUFFER_END.
pub fn mi_batch_buffer_end() -> Vec<u32> {
    vec![0x0a << 23]
}

/// MI_BATCH_BUFFER_START to `addr` through `space`; `second_level` sets DW0 bit 22.
pub fn mi_batch_buffer_start(space: AddressSpace, addr: u64, second_level: bool) -> Vec<u32> {
    let mut dw0 = (0x31 << 23) | 1;
    if space == AddressSpace::Ppgtt {
        dw0 |= 1 << 8;
    }
    if second_level {
        dw0 |= 1 << 22;
    }
    vec![dw0, (addr as u32) & !3, ((addr >> 32) as u32) & 0xffff]
}

/// MI_STORE_DATA_IMM of `data` (1 or more dwords) at `addr`; GGTT when `space` is GGTT.
pub fn mi_store_data_imm(space: AddressSpace, addr: u64, data: &[u32]) -> Vec<u32> {
    let len = 3 + data.len().max(1) as u32;
    let mut dw0 = (0x20 << 23) | (len - 2);
    if space == AddressSpace::Ggtt {
        dw0 |= 1 << 22;
    }
    if data.len() == 2 {
        dw0 |= 1 << 21;
    }
    let mut v = vec![dw0, (addr as u32) & !3, ((addr >> 32) as u32) & 0xffff];
    if data.is_empty() {
        v.push(0);
    } else {
        v.extend_from_slice(data);
    }
    v
}

/// MI_LOAD_REGISTER_IMM of (register, value) pairs.
pub fn mi_load_register_imm(pairs: &[(u32, u32)]) -> Vec<u32> {
    let len = 1 + 2 * pairs.len().max(1) as u32;
    let mut v = vec![(0x22 << 23) | (len - 2)];
    if pairs.is_empty() {
        v.extend([0x2600, 0]);
    }
    for &(r, x) in pairs {
        v.push(r & 0x007f_fffc);
        v.push(x);
    }
    v
}

/// MI_STORE_REGISTER_MEM of register `reg` to `addr`.
pub fn mi_store_register_mem(space: AddressSpace, reg: u32, addr: u64) -> Vec<u32> {
    let mut dw0 = (0x24 << 23) | 2;
    if space == AddressSpace::Ggtt {
        dw0 |= 1 << 22;
    }
    vec![
        dw0,
        reg & 0x007f_fffc,
        (addr as u32) & !3,
        (addr >> 32) as u32,
    ]
}

/// MI_FLUSH_DW with a post-sync write of `imm` at `addr` (or no post-sync when `post` is None).
pub fn mi_flush_dw(post: Option<(AddressSpace, u64, u64)>) -> Vec<u32> {
    match post {
        None => vec![(0x26 << 23) | 3, 0, 0, 0, 0],
        Some((space, addr, imm)) => {
            let dw0 = (0x26 << 23) | (1 << 14) | 3;
            let mut dw1 = (addr as u32) & !7;
            if space == AddressSpace::Ggtt {
                dw1 |= 1 << 2;
            }
            vec![
                dw0,
                dw1,
                ((addr >> 32) as u32) & 0xffff,
                imm as u32,
                (imm >> 32) as u32,
            ]
        }
    }
}

/// PIPE_CONTROL with a post-sync immediate write of `imm` at `addr` (or none).
pub fn pipe_control(post: Option<(AddressSpace, u64, u64)>) -> Vec<u32> {
    let dw0 = 0x7a00_0000 | 4;
    match post {
        None => vec![dw0, 1 << 20, 0, 0, 0, 0],
        Some((space, addr, imm)) => {
            let mut dw1 = (1 << 14) | (1 << 20);
            if space == AddressSpace::Ggtt {
                dw1 |= 1 << 24;
            }
            vec![
                dw0,
                dw1,
                (addr as u32) & !3,
                ((addr >> 32) as u32) & 0xffff,
                imm as u32,
                (imm >> 32) as u32,
            ]
        }
    }
}

/// A blit rectangle: `(x1, y1)` inclusive to `(x2, y2)` exclusive, in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    /// Left.
    pub x1: u16,
    /// Top.
    pub y1: u16,
    /// Right (exclusive).
    pub x2: u16,
    /// Bottom (exclusive).
    pub y2: u16,
}

fn br13(pitch: i16, cpp: u32, rop: u32) -> u32 {
    let depth = match cpp {
        1 => 0,
        2 => 1,
        _ => 3,
    };
    (depth << 24) | (rop << 16) | u32::from(pitch as u16)
}

/// XY_COLOR_BLT filling `rect` of a linear surface at `dst` (pitch in bytes, `cpp` 1, 2 or 4).
pub fn xy_color_blt(dst: u64, pitch: i16, cpp: u32, rect: Rect, color: u32) -> Vec<u32> {
    let mut dw0 = (2 << 29) | (0x50 << 22) | 5;
    if cpp == 4 {
        dw0 |= 3 << 20; // write alpha and RGB
    }
    vec![
        dw0,
        br13(pitch, cpp, 0xf0),
        u32::from(rect.y1) << 16 | u32::from(rect.x1),
        u32::from(rect.y2) << 16 | u32::from(rect.x2),
        dst as u32,
        ((dst >> 32) as u32) & 0xffff,
        color,
    ]
}

/// XY_SRC_COPY_BLT copying `rect` (destination coordinates) from `(sx, sy)` of a linear source.
#[allow(clippy::too_many_arguments)]
pub fn xy_src_copy_blt(
    dst: u64,
    dst_pitch: i16,
    rect: Rect,
    src: u64,
    src_pitch: i16,
    sx: u16,
    sy: u16,
    cpp: u32,
) -> Vec<u32> {
    let mut dw0 = (2 << 29) | (0x53 << 22) | 8;
    if cpp == 4 {
        dw0 |= 3 << 20;
    }
    vec![
        dw0,
        br13(dst_pitch, cpp, 0xcc),
        u32::from(rect.y1) << 16 | u32::from(rect.x1),
        u32::from(rect.y2) << 16 | u32::from(rect.x2),
        dst as u32,
        ((dst >> 32) as u32) & 0xffff,
        u32::from(sy) << 16 | u32::from(sx),
        u32::from(src_pitch as u16),
        src as u32,
        ((src >> 32) as u32) & 0xffff,
    ]
}

/// XY_FAST_COPY_BLT (GEN9+) between linear surfaces; `cpp` 1, 2, 4, 8 or 16 (colour depth
/// encoded as i915 and IGT do: 0, 1, 3, 4, 5).
#[allow(clippy::too_many_arguments)]
pub fn xy_fast_copy_blt(
    dst: u64,
    dst_pitch: i16,
    rect: Rect,
    src: u64,
    src_pitch: i16,
    sx: u16,
    sy: u16,
    cpp: u32,
) -> Vec<u32> {
    let depth = match cpp {
        1 => 0,
        2 => 1,
        4 => 3,
        8 => 4,
        _ => 5,
    };
    vec![
        (2 << 29) | (0x42 << 22) | 8,
        (depth << 24) | u32::from(dst_pitch as u16),
        u32::from(rect.y1) << 16 | u32::from(rect.x1),
        u32::from(rect.y2) << 16 | u32::from(rect.x2),
        dst as u32,
        ((dst >> 32) as u32) & 0xffff,
        u32::from(sy) << 16 | u32::from(sx),
        u32::from(src_pitch as u16),
        src as u32,
        ((src >> 32) as u32) & 0xffff,
    ]
}

/// 3DPRIMITIVE (7 dwords; vertex count in DW2).
pub fn primitive_3d(vertex_count: u32) -> Vec<u32> {
    vec![0x7b00_0000 | 5, 0, vertex_count, 0, 1, 0, 0]
}

/// STATE_BASE_ADDRESS (GEN9 layout, 19 dwords) setting the surface-state, dynamic-state and
/// instruction bases, the last two bounded to 16 pages.
pub fn state_base_address_3d(surface_state: u64, dynamic_state: u64, instruction: u64) -> Vec<u32> {
    let mut v = state_base_address(surface_state, dynamic_state);
    v[10] = (instruction as u32 & !0xfff) | 1;
    v[11] = (instruction >> 32) as u32 & 0xffff;
    v[15] = (16 << 12) | 1;
    v
}

/// A GEN8–GEN11 3D state command `name` of `len` dwords (header only, fields zero: a disabled
/// stage, a disabled stencil buffer, no stream output).
pub fn state_off(gen: crate::Gen, name: &str, len: u32) -> Option<Vec<u32>> {
    let d = crate::by_name(gen, crate::Engine::Render, name)?;
    let mut v = vec![0u32; len as usize];
    v[0] = d.header(len);
    Some(v)
}

/// STATE_BASE_ADDRESS (GEN9 layout, 19 dwords) setting the surface-state and dynamic-state
/// bases (with their modify-enable bits) and leaving the others unmodified.
pub fn state_base_address(surface_state: u64, dynamic_state: u64) -> Vec<u32> {
    let mut v = vec![0u32; 19];
    v[0] = 0x6101_0000 | 17;
    v[4] = (surface_state as u32 & !0xfff) | 1;
    v[5] = (surface_state >> 32) as u32 & 0xffff;
    v[6] = (dynamic_state as u32 & !0xfff) | 1;
    v[7] = (dynamic_state >> 32) as u32 & 0xffff;
    v[13] = (16 << 12) | 1; // dynamic state size: 16 pages, modify enable
    v
}
