//! Indirect state in the layout Mesa's iris driver uses: a binder buffer of binding tables, a
//! separate surface-state heap, a dynamic-state heap and an instruction heap, each at its own base
//! address in the PPGTT (on GEN11 the binder is the binding-table pool), a PPGTT batch with the 3D
//! pipeline's state and an indirect draw, and a compute dispatch. Every surface resolves, with the
//! ranges the state describes, and nothing falls back to the GTT reach.

use gmig_cmdparser::isa::encode;
use gmig_cmdparser::{
    build, by_name, AddressSpace, BatchContext, Decoder, Engine, Footprint, Gen, IndirectState,
    PageMemory, Stage, SurfaceRole, WriteSet,
};
use proptest::prelude::*;

const BINDER: u64 = 0x1_0000_0000;
const SURFACES: u64 = 0x1_0010_0000;
const DYNAMIC: u64 = 0x1_0020_0000;
const KERNELS: u64 = 0x1_0030_0000;
const RT: u64 = 0x2_0000_0000;
const TEXTURE: u64 = 0x2_0010_0000;
const DEPTH: u64 = 0x2_0020_0000;
const SSBO: u64 = 0x2_0030_0000;
const P: AddressSpace = AddressSpace::Ppgtt;

fn put(mem: &mut PageMemory, addr: u64, dwords: &[u32]) {
    mem.put_dwords(P, addr, dwords).unwrap();
}

fn cmd(gen: Gen, name: &str, len: usize) -> Vec<u32> {
    let mut v = vec![0u32; len];
    v[0] = by_name(gen, Engine::Render, name)
        .unwrap()
        .header(len as u32);
    v
}

fn set_addr(v: &mut [u32], dw: usize, addr: u64, flags: u32) {
    v[dw] = addr as u32 | flags;
    v[dw + 1] = (addr >> 32) as u32;
}

/// The heaps, surfaces and kernels, as iris would leave them in memory.
fn heaps(gen: Gen) -> PageMemory {
    let mut mem = PageMemory::new();
    // Surface states: 0 = render target 64x64 linear, pitch 256; 1 = texture 32x32; 2 = a RAW
    // buffer of 64 KiB (an SSBO).
    let mut rt = [0u32; 16];
    rt[0] = (1 << 29) | (0xc0 << 18);
    rt[2] = (63 << 16) | 63;
    rt[3] = 255;
    set_addr(&mut rt, 8, RT, 0);
    let mut tex = rt;
    tex[2] = (31 << 16) | 31;
    tex[3] = 127;
    set_addr(&mut tex, 8, TEXTURE, 0);
    let mut buf = [0u32; 16];
    let n = (64 << 10) - 1u32;
    buf[0] = (4 << 29) | (0x1ff << 18);
    buf[2] = (((n >> 7) & 0x3fff) << 16) | (n & 0x7f);
    set_addr(&mut buf, 8, SSBO, 0);
    put(&mut mem, SURFACES, &rt);
    put(&mut mem, SURFACES + 64, &tex);
    put(&mut mem, SURFACES + 128, &buf);
    // Binding tables in the binder: entries relative to the surface-state base, which is the
    // binder before GEN11 and the surface heap on GEN11 (where the binder is the pool).
    let rel = |slot: u64| {
        if gen == Gen::Gen11 {
            (64 * slot) as u32
        } else {
            (SURFACES + 64 * slot - BINDER) as u32
        }
    };
    put(&mut mem, BINDER + 0x40, &[rel(0), rel(1)]);
    put(&mut mem, BINDER + 0x80, &[rel(2)]);
    // Kernels: a vertex shader (URB only), a pixel shader (sample 1, write RT 0), a compute
    // kernel (untyped write to 0).
    let vs = encode::kernel(&[encode::mov(), encode::send(6, 0, true)]);
    let ps = encode::kernel(&[
        encode::sample(1),
        encode::mov(),
        encode::render_target_write(0, true),
    ]);
    let cs = encode::kernel(&[encode::nop(), encode::untyped_write(0, true)]);
    put(&mut mem, KERNELS, &vs);
    put(&mut mem, KERNELS + 0x100, &ps);
    put(&mut mem, KERNELS + 0x200, &cs);
    // Interface descriptor 0 in the dynamic heap: the compute kernel, binding table 0x80.
    let mut id = [0u32; 8];
    id[0] = 0x200;
    id[4] = 0x80;
    put(&mut mem, DYNAMIC, &id);
    mem
}

fn base_addresses(gen: Gen) -> Vec<u32> {
    let len = match gen {
        Gen::Gen8 => 16,
        Gen::Gen9 => 19,
        Gen::Gen11 => 22,
    };
    let mut v = cmd(gen, "STATE_BASE_ADDRESS", len);
    set_addr(&mut v, 1, 0, 1);
    let surface = if gen == Gen::Gen11 { SURFACES } else { BINDER };
    set_addr(&mut v, 4, surface, 1);
    set_addr(&mut v, 6, DYNAMIC, 1);
    set_addr(&mut v, 10, KERNELS, 1);
    v[12] = (0xfffff << 12) | 1;
    v[13] = (1 << 12) | 1;
    v[15] = (1 << 12) | 1;
    if gen == Gen::Gen11 {
        let mut pool = cmd(gen, "3DSTATE_BINDING_TABLE_POOL_ALLOC", 4);
        set_addr(&mut pool, 1, BINDER, 1 << 11);
        pool[3] = 1 << 12;
        v.extend(pool);
    }
    v
}

fn draw_batch(gen: Gen) -> Vec<u32> {
    let mut b = base_addresses(gen);
    let mut vs = cmd(gen, "3DSTATE_VS", 9);
    vs[7] = 1;
    b.extend(vs);
    b.extend(cmd(gen, "3DSTATE_HS", 9));
    b.extend(cmd(
        gen,
        "3DSTATE_DS",
        if gen == Gen::Gen8 { 9 } else { 11 },
    ));
    b.extend(cmd(gen, "3DSTATE_GS", 10));
    b.extend(cmd(gen, "3DSTATE_STREAMOUT", 5));
    let mut ps = cmd(gen, "3DSTATE_PS", 12);
    ps[1] = 0x100;
    ps[6] = 1;
    b.extend(ps);
    let mut bt = cmd(gen, "3DSTATE_BINDING_TABLE_POINTERS_PS", 2);
    bt[1] = 0x40;
    b.extend(bt);
    let mut db = cmd(gen, "3DSTATE_DEPTH_BUFFER", 8);
    db[1] = (1 << 29) | (1 << 28) | 255;
    set_addr(&mut db, 2, DEPTH, 0);
    db[4] = (63 << 18) | (63 << 4);
    b.extend(db);
    b.extend(cmd(gen, "3DSTATE_STENCIL_BUFFER", 5));
    b.extend(cmd(gen, "3DSTATE_HIER_DEPTH_BUFFER", 5));
    // An indirect draw: the vertex count comes from registers MI_LOAD_REGISTER_MEM loaded.
    let mut draw = build::primitive_3d(3);
    draw[0] |= 1 << 10;
    b.extend(draw);
    b
}

fn dispatch_batch(gen: Gen) -> Vec<u32> {
    let mut b = base_addresses(gen);
    b.extend(cmd(gen, "MEDIA_VFE_STATE", 9));
    let mut idl = cmd(gen, "MEDIA_INTERFACE_DESCRIPTOR_LOAD", 4);
    idl[2] = 32;
    b.extend(idl);
    let mut w = cmd(gen, "GPGPU_WALKER", 15);
    w[7] = 4;
    b.extend(w);
    b
}

/// Steps a PPGTT batch through the indirect state; the footprints of its work commands.
fn run(gen: Gen, batch: &[u32], mem: &PageMemory) -> Vec<(WriteSet, Footprint)> {
    let mut st = IndirectState::new(gen, P);
    let ctx = BatchContext::first_level(P);
    let mut out = Vec::new();
    for d in Decoder::new(gen, Engine::Render, batch) {
        let d = d.unwrap();
        let (ws, fp) = st.step(&d, &ctx, mem);
        match fp {
            Some(fp) => out.push((ws, fp)),
            None => assert_eq!(ws, WriteSet::Nothing, "{} writes nothing", d.desc.name),
        }
    }
    out
}

#[test]
fn an_iris_draw_resolves_every_surface() {
    for gen in [Gen::Gen8, Gen::Gen9, Gen::Gen11] {
        let mem = heaps(gen);
        let fps = run(gen, &draw_batch(gen), &mem);
        assert_eq!(fps.len(), 1, "{gen:?}");
        let (ws, fp) = &fps[0];
        assert!(fp.reach.is_empty(), "{gen:?}: {:?}", fp.reach);
        let find = |role: SurfaceRole| fp.surfaces.iter().find(|s| s.role == role).copied();
        let rt = find(SurfaceRole::Bound {
            stage: Stage::Ps,
            index: 0,
        })
        .expect("render target");
        assert_eq!(
            (rt.start, rt.len, rt.writes),
            (RT, 256 * 64, true),
            "{gen:?}"
        );
        let tex = find(SurfaceRole::Bound {
            stage: Stage::Ps,
            index: 1,
        })
        .expect("texture");
        assert_eq!((tex.start, tex.len, tex.writes), (TEXTURE, 128 * 32, false));
        let depth = find(SurfaceRole::Depth).expect("depth");
        assert_eq!((depth.start, depth.writes), (DEPTH, true));
        assert!(
            depth.len >= 256 * 64,
            "the depth buffer's rows, tile-aligned"
        );
        let ranges = ws.ranges();
        assert_eq!(ranges.len(), 2, "render target and depth: {ws:?}");
        assert!(matches!(ws, WriteSet::Ranges(_)));
    }
}

#[test]
fn an_iris_dispatch_writes_its_storage_buffer() {
    for gen in [Gen::Gen8, Gen::Gen9, Gen::Gen11] {
        let mem = heaps(gen);
        let fps = run(gen, &dispatch_batch(gen), &mem);
        let (ws, fp) = &fps[0];
        assert!(fp.reach.is_empty(), "{gen:?}: {:?}", fp.reach);
        assert_eq!(fp.surfaces.len(), 1);
        let s = fp.surfaces[0];
        assert_eq!(
            (s.role, s.start, s.len, s.writes),
            (
                SurfaceRole::Bound {
                    stage: Stage::Compute,
                    index: 0
                },
                SSBO,
                64 << 10,
                true
            )
        );
        assert_eq!(ws.ranges().len(), 1);
    }
}

#[test]
fn what_the_state_does_not_bound_falls_back_to_the_reach() {
    let gen = Gen::Gen9;
    let mut mem = heaps(gen);
    // A draw without its shader stages in this submission.
    let fps = run(
        gen,
        &[base_addresses(gen), build::primitive_3d(3)].concat(),
        &mem,
    );
    assert!(matches!(fps[0].0, WriteSet::WithinReach { .. }));
    // A kernel with control flow, one with an A64 write, one that is not mapped.
    for (kernel, why) in [
        (
            vec![[0x22, 0, 0, 0], encode::render_target_write(0, true)],
            "control flow",
        ),
        (vec![encode::send(12, (0x19 << 14) | 253, true)], "A64"),
    ] {
        put(&mut mem, KERNELS + 0x200, &encode::kernel(&kernel));
        let fps = run(gen, &dispatch_batch(gen), &mem);
        let fp = &fps[0].1;
        assert!(
            fp.reach.iter().any(|r| r.contains(why)),
            "{why}: {:?}",
            fp.reach
        );
    }
    let mut bad = dispatch_batch(gen);
    let n = bad.len();
    bad[n - 14] = 5; // interface descriptor 5 of one loaded
    let fps = run(gen, &bad, &heaps(gen));
    assert!(!fps[0].1.reach.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Any bytes in the heaps and any state dwords: stepping is total, surfaces stay bounded.
    #[test]
    fn any_state_and_heaps_are_total(
        heap in proptest::collection::vec(any::<u32>(), 0..1200),
        state in proptest::collection::vec(any::<u32>(), 0..40),
        gen in 0usize..3,
    ) {
        let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][gen];
        let mut mem = PageMemory::new();
        for base in [BINDER, SURFACES, DYNAMIC, KERNELS] {
            put(&mut mem, base, &heap);
        }
        let mut batch = base_addresses(gen);
        batch.extend(state.iter().map(|d| d & 0x1fff_ffff)); // keep the walker in 3D land
        for b in [draw_batch(gen), dispatch_batch(gen)] {
            let mut all = batch.clone();
            all.extend(b);
            let mut st = IndirectState::new(gen, P);
            let ctx = BatchContext::first_level(P);
            for d in Decoder::new(gen, Engine::Render, &all) {
                let Ok(d) = d else { break };
                let (_, fp) = st.step(&d, &ctx, &mem);
                if let Some(fp) = fp {
                    for s in &fp.surfaces {
                        prop_assert!(s.len <= gmig_cmdparser::MAX_SURFACE_BYTES);
                        prop_assert!(s.shape.span() <= s.len);
                    }
                }
            }
        }
    }
}
