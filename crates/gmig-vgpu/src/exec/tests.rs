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
        preempted: None,
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

/// Every shader stage off but a SIMD8 pixel shader at `ksp`; stream output, stencil and HiZ off.
fn stages_with_pixel_shader(ksp: u32) -> Vec<Vec<u32>> {
    let off =
        |name: &str, len: u32| build::state_off(gmig_cmdparser::Gen::Gen9, name, len).unwrap();
    let mut ps = off("3DSTATE_PS", 12);
    ps[1] = ksp;
    ps[6] = 1;
    vec![
        off("3DSTATE_VS", 9),
        off("3DSTATE_HS", 9),
        off("3DSTATE_DS", 11),
        off("3DSTATE_GS", 10),
        off("3DSTATE_STREAMOUT", 5),
        off("3DSTATE_STENCIL_BUFFER", 5),
        off("3DSTATE_HIER_DEPTH_BUFFER", 5),
        ps,
    ]
}

/// A heap page (binding table at 0 → surface state at 64 → a 32x16 render target, pitch 128; a
/// pixel shader at 1024 writing render target 0), the draw's state commands and the draw.
fn draw_setup(v: &Vgpu, base: u64, full_state: bool) -> (u64, u64, Vec<Vec<u32>>) {
    use gmig_cmdparser::isa::encode;
    let heap = base;
    let rt = base + PAGE_SIZE;
    let depth = base + 9 * PAGE_SIZE;
    let mut ss = [0u32; 16];
    ss[0] = 1 << 29;
    ss[2] = (15 << 16) | 31;
    ss[3] = 127;
    ss[8] = rt as u32;
    let mut bytes = 64u32.to_le_bytes().to_vec();
    bytes.resize(64, 0);
    bytes.extend(ss.iter().flat_map(|d| d.to_le_bytes()));
    bytes.resize(1024, 0);
    let ps = encode::kernel(&[encode::mov(), encode::render_target_write(0, true)]);
    bytes.extend(ps.iter().flat_map(|d| d.to_le_bytes()));
    v.guest_memory()
        .write_slice(&bytes, gpa_of(base, heap))
        .unwrap();
    let mut db = vec![0u32; 8];
    db[0] = 0x7805_0006;
    db[1] = (1 << 29) | (1 << 28) | 127;
    db[2] = depth as u32;
    db[4] = (15 << 18) | (31 << 4);
    let mut cmds = vec![build::state_base_address_3d(heap, heap, heap)];
    if full_state {
        cmds.extend(stages_with_pixel_shader(1024));
    }
    cmds.extend([
        vec![0x782a_0000, 0],
        db,
        vec![0x7804_0001, 0x3f80_0000, 1],
        build::primitive_3d(3),
    ]);
    (rt, depth, cmds)
}

#[test]
fn a_draw_writes_what_its_state_names_and_the_write_set_covers_it() {
    let (mut v, base) = setup(32);
    let (rt, depth, cmds) = draw_setup(&v, base, true);
    run(&mut v, EngineId::Render, cmds);
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
    assert!(!log.unknown);
    assert_eq!(log.reach_workloads, 0, "the state bounds the draw");
    assert!(log.actual.is_subset(&log.candidate));
    // The render target's and depth buffer's pages (and nothing like the whole GGTT).
    assert!(log.candidate.len() < 16, "{:?}", log.candidate);
}

#[test]
fn a_draw_on_inherited_state_is_bounded_by_the_gtt_reach() {
    let (mut v, base) = setup(32);
    let (_, depth, cmds) = draw_setup(&v, base, false);
    run(&mut v, EngineId::Render, cmds);
    let log = v.take_write_log();
    assert!(!log.unknown, "bounded, not unknown");
    assert_eq!(log.reach_workloads, 1);
    // The reach of a GGTT context: every frame the GGTT maps.
    let mapped: std::collections::BTreeSet<_> = v.gtt_backed_pages().into_iter().collect();
    assert!(mapped.is_subset(&log.candidate));
    assert!(log.actual.is_subset(&log.candidate));
    // Without a pixel shader in the state the model writes only the depth buffer.
    let mut px = [0u8; 4];
    v.guest_memory()
        .read_slice(&mut px, gpa_of(base, depth))
        .unwrap();
    assert_ne!(px, [0; 4]);
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

/// One random instruction of a pixel or compute kernel.
fn random_instruction(kind: u8, bti: u8, raw: u32) -> [u32; 4] {
    use gmig_cmdparser::isa::{encode, sfid};
    match kind % 8 {
        0 => encode::mov(),
        1 => encode::sample(bti),
        2 => encode::render_target_write(bti, false),
        3 => encode::untyped_write(bti, false),
        4 => encode::send(u32::from(bti) % 16, raw, false),
        5 => encode::send(sfid::DATA_CACHE, raw, false),
        6 => [0x22, 0, 0, 0], // IF: control flow
        _ => [
            raw,
            raw.rotate_left(7),
            raw.rotate_left(13),
            raw.rotate_left(21),
        ],
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]
    /// Random 3D and GPGPU state — binding tables, surface states (any type, size, pitch,
    /// tiling, base, some beyond what the GGTT maps), kernels of random SENDs, stages on or off —
    /// executed by the reference engine: every page it writes is in the candidate set, and a
    /// set that needs no reach stays inside the pages the GTT maps.
    #[test]
    fn random_pipeline_state_never_writes_outside_the_candidates(
        surfaces in proptest::collection::vec((0u32..8, 0u32..64, 0u32..64, 0u32..600, 0u64..80, 0u32..4, proptest::prelude::any::<u32>()), 1..6),
        table in proptest::collection::vec(0u32..8, 1..6),
        kernel in proptest::collection::vec((proptest::prelude::any::<u8>(), 0u8..8, proptest::prelude::any::<u32>()), 0..6),
        end in proptest::prelude::any::<bool>(),
        dispatch in proptest::prelude::any::<bool>(),
        full_state in proptest::prelude::any::<bool>(),
        depth_pages in 0u64..80,
    ) {
        use gmig_cmdparser::isa::encode;
        use gmig_cmdparser::Gen;
        let (mut v, base) = setup(64);
        let heap = base;
        // Binding table at 0 (and the compute one at 512), surface states from 64, the kernel
        // at 2048, one interface descriptor at 3072.
        let mut bytes = vec![0u8; 4096];
        for (i, slot) in table.iter().enumerate() {
            let e = 64 + 64 * slot;
            bytes[4 * i..4 * i + 4].copy_from_slice(&e.to_le_bytes());
            bytes[512 + 4 * i..512 + 4 * i + 4].copy_from_slice(&e.to_le_bytes());
        }
        for (i, (ty, w, h, pitch, page, tile, noise)) in surfaces.iter().enumerate() {
            let mut ss = [0u32; 16];
            ss[0] = (ty << 29) | (tile << 12) | (noise & 0x0fff_0000 & !(7 << 29));
            ss[2] = (h << 16) | w;
            ss[3] = pitch | (noise & 0x7 << 21);
            ss[5] = noise & 0xf;
            let at = base + page * PAGE_SIZE + u64::from(noise & 0xfc0);
            ss[8] = at as u32;
            let o = 64 + 64 * i;
            for (k, d) in ss.iter().enumerate() {
                bytes[o + 4 * k..o + 4 * k + 4].copy_from_slice(&d.to_le_bytes());
            }
        }
        let mut insts: Vec<[u32; 4]> = kernel
            .iter()
            .map(|(k, b, r)| random_instruction(*k, *b, *r))
            .collect();
        if end {
            insts.push(encode::render_target_write(0, true));
        }
        for (i, d) in encode::kernel(&insts).iter().enumerate() {
            bytes[2048 + 4 * i..2048 + 4 * i + 4].copy_from_slice(&d.to_le_bytes());
        }
        let mut id = [0u32; 8];
        id[0] = 2048;
        id[4] = 512;
        for (k, d) in id.iter().enumerate() {
            bytes[3072 + 4 * k..3072 + 4 * k + 4].copy_from_slice(&d.to_le_bytes());
        }
        v.guest_memory().write_slice(&bytes, gpa_of(base, heap)).unwrap();
        let off = |name: &str, len: u32| build::state_off(Gen::Gen9, name, len).unwrap();
        let mut cmds = vec![build::state_base_address_3d(heap, heap, heap)];
        if dispatch {
            let mut idl = off("MEDIA_INTERFACE_DESCRIPTOR_LOAD", 4);
            idl[2] = 32;
            idl[3] = 3072;
            let mut walker = off("GPGPU_WALKER", 15);
            walker[7] = 1;
            cmds.extend([off("MEDIA_VFE_STATE", 9), idl, walker]);
        } else {
            if full_state {
                cmds.extend(stages_with_pixel_shader(2048));
            }
            let mut db = off("3DSTATE_DEPTH_BUFFER", 8);
            db[1] = (1 << 29) | (1 << 28) | 255;
            db[2] = (base + depth_pages * PAGE_SIZE) as u32;
            db[4] = (7 << 18) | (63 << 4);
            cmds.extend([vec![0x782a_0000, 0], db, build::primitive_3d(3)]);
        }
        run(&mut v, EngineId::Render, cmds);
        let log = v.take_write_log();
        proptest::prop_assert!(!log.unknown);
        let missed: Vec<_> = log.actual.difference(&log.candidate).collect();
        proptest::prop_assert!(missed.is_empty(), "written outside the candidates: {:?}", missed);
        if log.reach_workloads == 0 {
            let mapped: std::collections::BTreeSet<_> = v.gtt_backed_pages().into_iter().collect();
            proptest::prop_assert!(log.candidate.is_subset(&mapped));
        }
    }
}
