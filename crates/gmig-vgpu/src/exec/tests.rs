//! Unit tests of the reference engine, run through a vGPU.

use gmig_cmdparser::build::{self, Rect};
use gmig_cmdparser::{BatchContext, GgttOffset};
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::gm::PAGE_SIZE;
use crate::mmio::{self, EngineId};
use crate::vgpu::Vgpu;
use crate::work::Workload;

/// A vGPU whose hidden slice's first `pages` pages map guest RAM from 1 MiB up.
fn setup(pages: u64) -> (Vgpu, u64) {
    let mut v = crate::vgpu::lone_test_vgpu(1, 8 << 20);
    let base = v.host_slices().hidden.base.0;
    for p in 0..pages {
        let e = mmio::GTT_MMIO_BASE + ((base / PAGE_SIZE + p) * 8) as u32;
        v.mmio_write64(e, ((1 << 20) + p * PAGE_SIZE) | 1).unwrap();
    }
    (v, base)
}

fn run(v: &mut Vgpu, engine: EngineId, cmds: Vec<Vec<u32>>) {
    let w = Workload {
        seq: 0,
        engine,
        desc: 1 << 32,
        lrca: GgttOffset(0),
        ring_tail: 0,
        pml4: None,
        commands: cmds
            .into_iter()
            .map(|dwords| ShadowCommand {
                ctx: BatchContext::RING,
                space: Space::Ggtt,
                guest_addr: 0,
                dwords,
            })
            .collect(),
    };
    v.execute(&w);
}

/// A 32 bpp XY_FAST_COPY_BLT (the encoding IGT and i915 use: depth 3 = 32 bpp).
fn fast_copy(dst: u64, dst_pitch: i16, r: Rect, src: u64, src_pitch: i16) -> Vec<u32> {
    gmig_cmdparser::build::xy_fast_copy_blt(dst, dst_pitch, r, src, src_pitch, 0, 0, 4)
}

fn gpa_of(base: u64, gpu: u64) -> GuestAddress {
    GuestAddress((1 << 20) + (gpu - base))
}

/// `len` bytes of guest memory at GPU address `gpu` (mapped by [`setup`] from `base`).
fn read_at(v: &Vgpu, base: u64, gpu: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    v.guest_memory()
        .read_slice(&mut out, gpa_of(base, gpu))
        .unwrap();
    out
}

/// Writes `img` at GPU address `a`, runs the blits `to_tiled` then `from_tiled` on the blitter
/// and checks that they fault nowhere and leave `img` again at `c`.
fn tiled_round_trip(
    v: &mut Vgpu,
    base: u64,
    img: &[u8],
    (a, c): (u64, u64),
    to_tiled: Vec<u32>,
    from_tiled: Vec<u32>,
) {
    v.guest_memory().write_slice(img, gpa_of(base, a)).unwrap();
    run(v, EngineId::Blitter, vec![to_tiled, from_tiled]);
    assert!(v.faults().is_empty(), "{:?}", v.faults());
    assert_eq!(read_at(v, base, c, img.len()), img);
}

#[test]
fn copies_through_an_x_tiled_surface_and_back() {
    let (mut v, base) = setup(64);
    let (a, b, c) = (base, base + 16 * PAGE_SIZE, base + 40 * PAGE_SIZE);
    // A: 200x16 pixels, pitch 800, a gradient.
    let img: Vec<u8> = (0..800 * 16).map(|i| (i * 31 % 253) as u8).collect();
    let rect = Rect {
        x1: 0,
        y1: 0,
        x2: 200,
        y2: 16,
    };
    // A -> B (X-tiled, pitch 1024 bytes = 256 dwords), B -> C (linear).
    let mut to_tiled = build::xy_src_copy_blt(b, 256, rect, a, 800, 0, 0, 4);
    to_tiled[0] |= 1 << 11;
    let mut from_tiled = build::xy_src_copy_blt(c, 800, rect, b, 256, 0, 0, 4);
    from_tiled[0] |= 1 << 15;
    tiled_round_trip(&mut v, base, &img, (a, c), to_tiled, from_tiled);
    // Pixel (150, 9) lives in tile 3 (second tile row, second column), row 1, byte 88.
    let px = read_at(&v, base, b + 3 * 4096 + 512 + 88, 4);
    assert_eq!(px, &img[9 * 800 + 600..9 * 800 + 604]);
}

#[test]
fn fast_copies_through_a_y_tiled_surface_and_back() {
    let (mut v, base) = setup(64);
    let (a, b, c) = (base, base + 16 * PAGE_SIZE, base + 40 * PAGE_SIZE);
    // A: 64x40 pixels linear (pitch 256); B: Y-tiled, pitch 256 bytes = 2 tiles per row.
    let img: Vec<u8> = (0..256 * 40).map(|i| (i * 13 % 251) as u8).collect();
    let rect = Rect {
        x1: 0,
        y1: 0,
        x2: 64,
        y2: 40,
    };
    let mut to_tiled = fast_copy(b, 64, rect, a, 256);
    to_tiled[0] |= 2 << 13;
    let mut from_tiled = fast_copy(c, 256, rect, b, 64);
    from_tiled[0] |= 2 << 20;
    tiled_round_trip(&mut v, base, &img, (a, c), to_tiled, from_tiled);
    // Pixel (37, 33): byte 148 of row 33 -> tile 3 (second row, second column), column 1,
    // row 1, byte 4.
    let px = read_at(&v, base, b + 3 * 4096 + 512 + 16 + 4, 4);
    assert_eq!(px, &img[33 * 256 + 148..33 * 256 + 152]);
    assert!(v.stats().skipped.is_empty());
}

#[test]
fn color_fill_and_fast_copy() {
    let (mut v, base) = setup(16);
    let (a, b) = (base, base + 8 * PAGE_SIZE);
    let fill = build::xy_color_blt(
        a,
        256,
        4,
        Rect {
            x1: 4,
            y1: 2,
            x2: 8,
            y2: 3,
        },
        0x1122_3344,
    );
    let copy = fast_copy(
        b,
        256,
        Rect {
            x1: 0,
            y1: 0,
            x2: 64,
            y2: 4,
        },
        a,
        256,
    );
    run(&mut v, EngineId::Blitter, vec![fill, copy]);
    let mut row = vec![0u8; 256];
    v.guest_memory()
        .read_slice(&mut row, gpa_of(base, b + 2 * 256))
        .unwrap();
    assert_eq!(&row[..16], &[0u8; 16]);
    assert_eq!(&row[16..32], &[0x44, 0x33, 0x22, 0x11].repeat(4)[..]);
    assert_eq!(&row[32..], &vec![0u8; 224][..]);
    assert_eq!(v.stats().executed, 2);
}

#[test]
fn post_sync_writes_and_interrupts() {
    let (mut v, base) = setup(4);
    run(
        &mut v,
        EngineId::Render,
        vec![
            build::mi_store_data_imm(gmig_cmdparser::AddressSpace::Ggtt, base + 8, &[0xabcd]),
            build::pipe_control(Some((
                gmig_cmdparser::AddressSpace::Ggtt,
                base + 16,
                0x1_0000_0002,
            ))),
            build::mi_flush_dw(Some((gmig_cmdparser::AddressSpace::Ggtt, base + 32, 7))),
            build::mi_load_register_imm(&[(0x2600, 99)]),
            build::mi_user_interrupt(),
        ],
    );
    let mut m = [0u8; 40];
    v.guest_memory()
        .read_slice(&mut m, gpa_of(base, base))
        .unwrap();
    assert_eq!(u32::from_le_bytes(m[8..12].try_into().unwrap()), 0xabcd);
    assert_eq!(
        u64::from_le_bytes(m[16..24].try_into().unwrap()),
        0x1_0000_0002
    );
    assert_eq!(u64::from_le_bytes(m[32..40].try_into().unwrap()), 7);
    assert_eq!(v.mmio_read32(0x2600).unwrap(), 99);
    assert_eq!(v.mmio_read32(mmio::GT_IIR0).unwrap() & 1, 1);
    let log = v.take_write_log();
    assert!(!log.unknown);
    assert!(log.actual.is_subset(&log.candidate));
}

#[test]
fn a_draw_rewrites_render_target_and_depth() {
    let (mut v, base) = setup(32);
    let heap = base;
    let rt = base + PAGE_SIZE;
    let depth = base + 9 * PAGE_SIZE;
    // Binding table entry 0 -> SURFACE_STATE at 64: 32x16, pitch 128.
    let mut ss = [0u32; 16];
    ss[2] = (15 << 16) | 31;
    ss[3] = 127;
    ss[8] = rt as u32;
    let mut bytes = 64u32.to_le_bytes().to_vec();
    bytes.resize(64, 0);
    bytes.extend(ss.iter().flat_map(|d| d.to_le_bytes()));
    v.guest_memory()
        .write_slice(&bytes, gpa_of(base, heap))
        .unwrap();
    let mut db = vec![0u32; 8];
    db[0] = 0x7805_0006;
    db[1] = 127;
    db[2] = depth as u32;
    db[4] = (15 << 18) | (31 << 4);
    run(
        &mut v,
        EngineId::Render,
        vec![
            build::state_base_address(heap, heap),
            vec![0x782a_0000, 0],
            db,
            vec![0x7804_0001, 0x3f80_0000, 1],
            build::primitive_3d(3),
        ],
    );
    assert!(v.faults().is_empty(), "{:?}", v.faults());
    let mut px = [0u8; 4];
    v.guest_memory()
        .read_slice(&mut px, gpa_of(base, rt + 15 * 128 + 124))
        .unwrap();
    assert_ne!(px, [0; 4], "last pixel of the render target written");
    v.guest_memory()
        .read_slice(&mut px, gpa_of(base, depth + 15 * 128 + 124))
        .unwrap();
    assert_ne!(px, [0; 4], "last depth value written");
    let log = v.take_write_log();
    assert!(log.unknown, "a draw's write set is unknown to the parser");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
    #[test]
    fn any_command_soup_executes_without_panicking(
        cmds in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u32>(), 1..24), 1..16),
        engine in 0usize..4,
    ) {
        let (mut v, _) = setup(8);
        run(&mut v, EngineId::ALL[engine], cmds);
        proptest::prop_assert_eq!(v.stats().workloads + v.stats().refused, 1);
    }
}
