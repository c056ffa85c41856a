//! Indirect state in the layout Mesa's iris driver uses: a binder buffer of binding tables, a
//! separate surface-state heap, a dynamic-state heap and an instruction heap, each at its own base
//! address in the PPGTT (on GEN11 the binder is the binding-table pool), a PPGTT batch with the 3D
//! pipeline's state and an indirect draw, and a compute dispatch. Every surface resolves, with the
//! ranges the state describes, and nothing falls back to the GTT reach.

use gmig_cmdparser::aub::fixture::iris::{self, IrisLayout};
use gmig_cmdparser::isa::encode;
use gmig_cmdparser::{
    build, AddressSpace, BatchContext, Decoder, Engine, Footprint, Gen, IndirectState, PageMemory,
    Stage, SurfaceRole, WriteSet,
};
use proptest::prelude::*;

const L: IrisLayout = IrisLayout::PPGTT;
const RT: u64 = L.rt;
const TEXTURE: u64 = L.texture;
const DEPTH: u64 = L.depth;
const SSBO: u64 = L.ssbo;
const KERNELS: u64 = L.kernels;
const P: AddressSpace = AddressSpace::Ppgtt;

fn put(mem: &mut PageMemory, addr: u64, dwords: &[u32]) {
    mem.put_dwords(P, addr, dwords).unwrap();
}

/// The heaps, surfaces and kernels, as iris would leave them in memory.
fn heaps(gen: Gen) -> PageMemory {
    let mut mem = PageMemory::new();
    for (addr, dwords) in iris::heaps(gen, &L) {
        put(&mut mem, addr, &dwords);
    }
    mem
}

fn base_addresses(gen: Gen) -> Vec<u32> {
    iris::base_addresses(gen, &L)
}

fn draw_batch(gen: Gen) -> Vec<u32> {
    iris::draw_batch(gen, &L)
}

fn dispatch_batch(gen: Gen) -> Vec<u32> {
    iris::dispatch_batch(gen, &L)
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
        for base in [L.binder, L.surfaces, L.dynamic, L.kernels] {
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
