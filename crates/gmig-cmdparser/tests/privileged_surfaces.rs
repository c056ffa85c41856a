//! A privileged (GGTT) batch's surface states hold GGTT addresses no command field shows: the
//! walk audits them against the vGPU's slices and the remap rebases them in memory, for any
//! placement of the surface, and migrating back restores the capture.

use gmig_cmdparser::aub::fixture::iris::{self, IrisLayout};
use gmig_cmdparser::aub::fixture::{DST_APERTURE, DST_HIDDEN, SRC_APERTURE, SRC_HIDDEN};
use gmig_cmdparser::aub::{cmd, AubCapture, CaptureBuilder, RingSpec};
use gmig_cmdparser::{
    audit_walk, AuditError, Budget, Engine, Gen, GgttOffset, Slice, SliceMove, VgpuSlices,
    WalkError,
};
use proptest::prelude::*;

fn slices(
    a: gmig_cmdparser::aub::fixture::SliceSpec,
    h: gmig_cmdparser::aub::fixture::SliceSpec,
) -> VgpuSlices {
    VgpuSlices {
        aperture: Slice::new(GgttOffset(a.base), a.size).unwrap(),
        hidden: Slice::new(GgttOffset(h.base), h.size).unwrap(),
    }
}

fn mv() -> SliceMove {
    SliceMove::new(
        slices(SRC_APERTURE, SRC_HIDDEN),
        slices(DST_APERTURE, DST_HIDDEN),
    )
    .unwrap()
}

const L: IrisLayout = IrisLayout::packed(SRC_HIDDEN.base + 0x100_0000);
const BATCH: u64 = SRC_APERTURE.base + 0x1_0000;

/// A privileged draw and dispatch over the iris heaps in the hidden slice; the render target's
/// surface state points at `rt`, the storage buffer's at `ssbo`.
fn capture(gen: Gen, rt: u64, ssbo: u64) -> AubCapture {
    let mut b = CaptureBuilder::new(gen, "privileged surfaces");
    for (at, dwords) in iris::heaps(gen, &L) {
        b.write_ggtt_dwords(GgttOffset(at), &dwords).unwrap();
    }
    b.write_ggtt_dwords(GgttOffset(L.surfaces), &iris::surface_2d(rt, 64, 64, 256))
        .unwrap();
    b.write_ggtt_dwords(
        GgttOffset(L.surfaces + 128),
        &iris::raw_buffer(ssbo, 64 << 10),
    )
    .unwrap();
    let batch = [
        iris::draw_batch(gen, &L),
        iris::dispatch_batch(gen, &L),
        vec![cmd::MI_BATCH_BUFFER_END],
    ]
    .concat();
    submit_batch(b, &batch)
}

/// Writes `batch` at [`BATCH`], starts it from a ring in the aperture and finishes the capture.
fn submit_batch(mut b: CaptureBuilder, batch: &[u32]) -> AubCapture {
    b.write_ggtt_dwords(GgttOffset(BATCH), batch).unwrap();
    let ring = [
        cmd::bb_start(BATCH, false, false).to_vec(),
        vec![cmd::MI_NOOP],
    ]
    .concat();
    b.submit(
        Engine::Render,
        &RingSpec {
            ring: GgttOffset(SRC_APERTURE.base),
            ring_size: 4096,
            commands: &ring,
            context: GgttOffset(SRC_APERTURE.base + 0x1000),
        },
    )
    .unwrap();
    b.finish()
}

fn audit(c: &AubCapture, s: &VgpuSlices) -> Result<u64, WalkError> {
    let sub = &c.submissions[0];
    audit_walk(
        c.gen.unwrap(),
        sub.engine,
        &sub.memory(&c.memory),
        sub.ring_span(),
        Budget::default(),
        s,
    )
    .map(|r| r.ggtt_uses)
}

fn surface_base(c: &AubCapture, state: u64) -> u64 {
    let d = c
        .memory
        .read_ggtt_dwords(GgttOffset(state + 32), 2)
        .unwrap();
    u64::from(d[0]) | (u64::from(d[1]) << 32)
}

#[test]
fn a_surface_outside_the_slices_is_refused_naming_its_surface_state() {
    let c = capture(Gen::Gen9, 0x2000_0000, L.ssbo);
    match audit(&c, &mv().from) {
        Err(WalkError::Audit {
            err:
                AuditError::SurfaceStateOutOfSlice {
                    state,
                    field,
                    start,
                    ..
                },
            addr,
            ..
        }) => {
            // The draw, after STATE_BASE_ADDRESS and the pipeline's state, is refused.
            assert!(addr > BATCH, "{addr:#x}");
            assert_eq!(
                (state, field, start),
                (L.surfaces, "surface base", 0x2000_0000)
            );
        }
        other => panic!("expected a surface-state refusal, got {other:?}"),
    }
    assert!(
        c.migrate(&mv(), Budget::default()).is_err(),
        "nor is it remapped"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Anywhere the render target and the storage buffer lie: the audit passes exactly when both
    /// lie wholly inside one slice; then the remap moves each surface state's address by its
    /// slice's delta, the result passes the destination audit, and migrating back restores it.
    #[test]
    fn surface_states_audit_and_remap_like_command_fields(
        gen in prop_oneof![Just(Gen::Gen8), Just(Gen::Gen9), Just(Gen::Gen11)],
        rt_page in 0u64..(0x8000_0000 >> 12),
        ssbo_in_hidden in any::<bool>(),
        ssbo_page in 0u64..0x3ff0,
    ) {
        let rt = rt_page << 12;
        let ssbo = if ssbo_in_hidden {
            SRC_HIDDEN.base + (ssbo_page << 12)
        } else {
            SRC_APERTURE.base + ((ssbo_page << 12) % (SRC_APERTURE.size - (64 << 10)))
        };
        let m = mv();
        let c = capture(gen, rt, ssbo);
        let inside = m.from.contains(rt, 0x4000) && m.from.contains(ssbo, 64 << 10);
        prop_assert_eq!(audit(&c, &m.from).is_ok(), inside);
        let moved = c.migrate(&m, Budget::default());
        prop_assert_eq!(moved.is_ok(), inside);
        let Ok(moved) = moved else { return Ok(()) };
        let state = |a: u64| m.rebase(GgttOffset(a)).unwrap().0;
        prop_assert_eq!(surface_base(&moved, state(L.surfaces)), m.rebase_range(rt, 0x4000).unwrap());
        prop_assert_eq!(surface_base(&moved, state(L.surfaces + 128)), m.rebase_range(ssbo, 64 << 10).unwrap());
        // The texture moved too; the three surface states count as GGTT uses on both sides.
        prop_assert_eq!(surface_base(&moved, state(L.surfaces + 64)), m.rebase(GgttOffset(L.texture)).unwrap().0);
        let uses = audit(&c, &m.from).unwrap();
        prop_assert_eq!(audit(&moved, &m.to).unwrap(), uses);
        prop_assert_eq!(moved.migrate(&m.inverse(), Budget::default()).unwrap(), c);
    }
}

/// A privileged batch: the iris draw and dispatch, the draw again, then a draw that differs only
/// in its binding-table pointer (`bad_table`) or a dispatch that differs only in the interface
/// descriptor it runs (`!bad_table`); either reaches a surface state whose surface lies outside
/// the slices.
fn capture_with_second_work(gen: Gen, bad_table: bool) -> AubCapture {
    let mut b = CaptureBuilder::new(gen, "second work");
    for (at, dwords) in iris::heaps(gen, &L) {
        b.write_ggtt_dwords(GgttOffset(at), &dwords).unwrap();
    }
    // Surface state 3 names memory outside both slices; binding table 0xc0 holds it alone.
    b.write_ggtt_dwords(
        GgttOffset(L.surfaces + 192),
        &iris::surface_2d(0x2000_0000, 64, 64, 256),
    )
    .unwrap();
    let rel = if gen == Gen::Gen11 {
        192
    } else {
        (L.surfaces + 192 - L.binder) as u32
    };
    b.write_ggtt_dwords(GgttOffset(L.binder + 0xc0), &[rel])
        .unwrap();
    // Interface descriptor 1: the compute kernel with binding table 0xc0.
    let mut id = [0u32; 8];
    id[0] = 0x200;
    id[4] = 0xc0;
    b.write_ggtt_dwords(GgttOffset(L.dynamic + 32), &id)
        .unwrap();
    let row = |name: &str, len: u32| {
        let d = gmig_cmdparser::by_name(gen, Engine::Render, name).unwrap();
        let mut v = vec![0u32; len as usize];
        v[0] = d.header(len);
        v
    };
    let second = if bad_table {
        let mut bt = row("3DSTATE_BINDING_TABLE_POINTERS_PS", 2);
        bt[1] = 0xc0;
        let mut draw = gmig_cmdparser::build::primitive_3d(3);
        draw[0] |= 1 << 10;
        [bt, draw].concat()
    } else {
        // Two descriptors loaded; the dispatch of descriptor 0 resolves, that of 1 differs only
        // in its index.
        let mut idl = row("MEDIA_INTERFACE_DESCRIPTOR_LOAD", 4);
        idl[2] = 64;
        let walker = |index: u32| {
            let mut w = row("GPGPU_WALKER", 15);
            w[1] = index;
            w[7] = 4;
            w
        };
        [idl, walker(0), walker(1)].concat()
    };
    let batch = [
        iris::draw_batch(gen, &L),
        iris::dispatch_batch(gen, &L),
        // The same draw again: nothing new to audit.
        iris::draw_batch(gen, &L),
        second,
        vec![cmd::MI_BATCH_BUFFER_END],
    ]
    .concat();
    submit_batch(b, &batch)
}

/// The walk does not resolve the surfaces of work whose state it has already resolved; work whose
/// binding table or interface descriptor differs is resolved again and its surface states audited.
#[test]
fn work_with_other_state_than_earlier_work_is_audited_again() {
    for gen in [Gen::Gen8, Gen::Gen9, Gen::Gen11] {
        for bad_table in [true, false] {
            let c = capture_with_second_work(gen, bad_table);
            match audit(&c, &mv().from) {
                Err(WalkError::Audit {
                    err: AuditError::SurfaceStateOutOfSlice { state, start, .. },
                    ..
                }) => assert_eq!(
                    (state, start),
                    (L.surfaces + 192, 0x2000_0000),
                    "{gen} bad_table={bad_table}"
                ),
                other => panic!("{gen} bad_table={bad_table}: expected a refusal, got {other:?}"),
            }
        }
    }
}
