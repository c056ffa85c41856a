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
    b.write_ggtt_dwords(GgttOffset(BATCH), &batch).unwrap();
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
