//! Property tests: arbitrary bytes never panic and always terminate (decoder, walker); remap
//! output passes the destination audit; remapping there and back is the identity; a failed remap
//! changes nothing.

use gmig_cmdparser::build::{self, Rect};
use gmig_cmdparser::{
    all_commands, audit, audit_walk, remap_in_place, remap_walk, walk, AddressSpace, BatchContext,
    Budget, Decoder, Engine, Gen, GgttOffset, PageMemory, RingSpan, Slice, SliceMove, VgpuSlices,
    WriteSet,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const GGTT: AddressSpace = AddressSpace::Ggtt;
const PPGTT: AddressSpace = AddressSpace::Ppgtt;

fn gen_strategy() -> impl Strategy<Value = Gen> {
    prop_oneof![Just(Gen::Gen8), Just(Gen::Gen9), Just(Gen::Gen11)]
}

fn engine_strategy() -> impl Strategy<Value = Engine> {
    prop_oneof![
        Just(Engine::Render),
        Just(Engine::Blitter),
        Just(Engine::Video),
        Just(Engine::VideoEnhance)
    ]
}

/// Dwords biased towards real command headers so that decoding goes deep.
fn dword() -> impl Strategy<Value = u32> {
    let n = all_commands().len();
    prop_oneof![
        3 => any::<u32>(),
        3 => (0..n, 0u32..12).prop_map(|(i, l)| all_commands()[i].header(l)),
        1 => Just(0u32),
    ]
}

fn ctx_strategy() -> impl Strategy<Value = BatchContext> {
    prop_oneof![
        Just(BatchContext::RING),
        Just(BatchContext::first_level(GGTT)),
        Just(BatchContext::first_level(PPGTT)),
    ]
}

fn slices_strategy() -> impl Strategy<Value = VgpuSlices> {
    (0u64..64, 0u64..64).prop_map(|(a, h)| VgpuSlices {
        aperture: Slice::new(GgttOffset(a * 64 * MIB), 64 * MIB).unwrap(),
        hidden: Slice::new(GgttOffset((4 << 30) + h * 384 * MIB), 384 * MIB).unwrap(),
    })
}

fn move_strategy() -> impl Strategy<Value = SliceMove> {
    (slices_strategy(), slices_strategy()).prop_map(|(a, b)| SliceMove::new(a, b).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn decoder_is_total_and_terminates(
        gen in gen_strategy(),
        engine in engine_strategy(),
        ctx in ctx_strategy(),
        slices in slices_strategy(),
        buf in prop::collection::vec(dword(), 0..200),
    ) {
        let mut dec = Decoder::new(gen, engine, &buf);
        let mut steps = 0usize;
        let mut covered = 0usize;
        loop {
            steps += 1;
            prop_assert!(steps <= buf.len() + 1, "decoder did not terminate");
            match dec.next() {
                Ok(Some(cmd)) => {
                    prop_assert_eq!(cmd.offset, covered);
                    covered += cmd.len();
                    prop_assert!(covered <= buf.len());
                    for u in cmd.addresses(&ctx) {
                        prop_assert!(u.dword < cmd.len());
                        prop_assert!(u.len >= 1 || u.bounded);
                    }
                    let _ = audit(&cmd, &ctx, &slices);
                    if let WriteSet::Ranges(r) = cmd.write_set(&ctx) {
                        prop_assert!(r.iter().all(|r| r.len > 0));
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    prop_assert_eq!(e.offset(), covered);
                    prop_assert_eq!(dec.next(), Ok(None));
                    break;
                }
            }
        }
    }

    #[test]
    fn remap_of_arbitrary_buffers_is_all_or_nothing_and_round_trips(
        gen in gen_strategy(),
        engine in engine_strategy(),
        ctx in ctx_strategy(),
        mv in move_strategy(),
        buf in prop::collection::vec(dword(), 0..120),
    ) {
        let mut out = buf.clone();
        match remap_in_place(gen, engine, &mut out, &ctx, &mv) {
            Err(_) => prop_assert_eq!(&out, &buf),
            Ok(_) => {
                for cmd in Decoder::new(gen, engine, &out) {
                    prop_assert_eq!(audit(&cmd.unwrap(), &ctx, &mv.to), Ok(()));
                }
                remap_in_place(gen, engine, &mut out, &ctx, &mv.inverse()).unwrap();
                prop_assert_eq!(&out, &buf);
            }
        }
    }
}

/// A GGTT address inside one of `s`'s slices, `align`-aligned, leaving `room` bytes after it.
fn in_slice(s: &VgpuSlices, hidden: bool, frac: u32, align: u64, room: u64) -> u64 {
    let sl = if hidden { s.hidden } else { s.aperture };
    let span = sl.size - room;
    let off = (span / u64::from(u32::MAX)).max(1) * u64::from(frac) % span;
    sl.base.0 + off / align * align
}

#[derive(Clone, Debug)]
enum Cmd {
    Sdi(bool, u32, bool, bool),
    SdiPpgtt(u64),
    Pipe(bool, u32, bool),
    Flush(bool, u32),
    Sba(bool, u32, bool, u32),
    Lri(u32),
    BbStart(bool, u32),
    Color(bool, u32, u16, u16),
    Copy(bool, u32, bool, u32, u16, u16),
    Fast(bool, u32, bool, u32),
    Noop,
}

fn cmd_strategy() -> impl Strategy<Value = Cmd> {
    let h = any::<bool>;
    let f = any::<u32>;
    prop_oneof![
        (h(), f(), h(), h()).prop_map(|(a, b, c, d)| Cmd::Sdi(a, b, c, d)),
        (0u64..1 << 46).prop_map(|a| Cmd::SdiPpgtt(a * 4)),
        (h(), f(), h()).prop_map(|(a, b, c)| Cmd::Pipe(a, b, c)),
        (h(), f()).prop_map(|(a, b)| Cmd::Flush(a, b)),
        (h(), f(), h(), f()).prop_map(|(a, b, c, d)| Cmd::Sba(a, b, c, d)),
        (0u32..16).prop_map(Cmd::Lri),
        (h(), f()).prop_map(|(a, b)| Cmd::BbStart(a, b)),
        (h(), f(), 1u16..256, 1u16..64).prop_map(|(a, b, c, d)| Cmd::Color(a, b, c, d)),
        (h(), f(), h(), f(), 1u16..256, 1u16..64)
            .prop_map(|(a, b, c, d, e, g)| Cmd::Copy(a, b, c, d, e, g)),
        (h(), f(), h(), f()).prop_map(|(a, b, c, d)| Cmd::Fast(a, b, c, d)),
        Just(Cmd::Noop),
    ]
}

fn encode(c: &Cmd, s: &VgpuSlices, engine: Engine, gen: Gen) -> Vec<u32> {
    let rect = |w: u16, h: u16| Rect {
        x1: 1,
        y1: 2,
        x2: 1 + w,
        y2: 2 + h,
    };
    match (engine, c) {
        (_, Cmd::Sdi(h, f, q, ring_ppgtt)) => {
            let a = in_slice(s, *h, *f, 8, 16);
            if *ring_ppgtt {
                build::mi_store_data_imm(PPGTT, a, &[1])
            } else if *q {
                build::mi_store_data_imm(GGTT, a, &[1, 2])
            } else {
                build::mi_store_data_imm(GGTT, a, &[3])
            }
        }
        (_, Cmd::SdiPpgtt(a)) => build::mi_store_data_imm(PPGTT, *a, &[9]),
        (Engine::Render, Cmd::Pipe(h, f, some)) => {
            build::pipe_control(some.then(|| (GGTT, in_slice(s, *h, *f, 8, 16), 7)))
        }
        (_, Cmd::Flush(h, f)) => build::mi_flush_dw(Some((GGTT, in_slice(s, *h, *f, 8, 16), 1))),
        (Engine::Render, Cmd::Sba(h1, f1, h2, f2)) if gen != Gen::Gen8 => {
            build::state_base_address(
                in_slice(s, *h1, *f1, 4096, 4096),
                in_slice(s, *h2, *f2, 4096, 64 * 1024),
            )
        }
        (_, Cmd::Lri(i)) => {
            let gpr = gmig_cmdparser::regs::engine_bases(gen, engine)[0] + 0x600;
            build::mi_load_register_imm(&[(gpr + 4 * i, *i), (gpr + 0x40, 1)])
        }
        (_, Cmd::BbStart(h, f)) => {
            build::mi_batch_buffer_start(GGTT, in_slice(s, *h, *f, 4, 64), false)
        }
        (Engine::Blitter, Cmd::Color(h, f, w, ht)) => {
            build::xy_color_blt(in_slice(s, *h, *f, 64, 2 * MIB), 4096, 4, rect(*w, *ht), 5)
        }
        (Engine::Blitter, Cmd::Copy(h, f, h2, f2, w, ht)) => build::xy_src_copy_blt(
            in_slice(s, *h, *f, 64, 2 * MIB),
            4096,
            rect(*w, *ht),
            in_slice(s, *h2, *f2, 64, 2 * MIB),
            2048,
            3,
            4,
            2,
        ),
        (Engine::Blitter, Cmd::Fast(h, f, h2, f2)) if gen != Gen::Gen8 => build::xy_fast_copy_blt(
            in_slice(s, *h, *f, 64, 2 * MIB),
            1024,
            rect(16, 16),
            in_slice(s, *h2, *f2, 64, 2 * MIB),
            1024,
            0,
            0,
            8,
        ),
        _ => build::mi_noop(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn remap_of_valid_buffers_passes_destination_audit_and_round_trips(
        gen in gen_strategy(),
        engine in engine_strategy(),
        mv in move_strategy(),
        cmds in prop::collection::vec(cmd_strategy(), 0..40),
    ) {
        let mut buf = Vec::new();
        for c in &cmds {
            buf.extend(encode(c, &mv.from, engine, gen));
        }
        let ctx = BatchContext::RING;
        for cmd in Decoder::new(gen, engine, &buf) {
            prop_assert_eq!(audit(&cmd.unwrap(), &ctx, &mv.from), Ok(()));
        }
        let mut out = buf.clone();
        let st = remap_in_place(gen, engine, &mut out, &ctx, &mv).unwrap();
        prop_assert_eq!(st.commands as usize, Decoder::new(gen, engine, &buf).count());
        let must = cmds
            .iter()
            .filter(|c| matches!(c, Cmd::Sdi(_, _, _, false) | Cmd::Flush(..) | Cmd::BbStart(..)))
            .count();
        prop_assert!(st.ggtt_rewritten as usize >= must);
        for cmd in Decoder::new(gen, engine, &out) {
            prop_assert_eq!(audit(&cmd.unwrap(), &ctx, &mv.to), Ok(()));
        }
        let both_move = mv.from.aperture.base != mv.to.aperture.base
            && mv.from.hidden.base != mv.to.hidden.base;
        if both_move && st.ggtt_rewritten > 0 {
            prop_assert_ne!(&out, &buf);
        }
        remap_in_place(gen, engine, &mut out, &ctx, &mv.inverse()).unwrap();
        prop_assert_eq!(&out, &buf);
    }
}

/// Memory with a ring and two batch pages (in both spaces) filled from `ring`, `b1`, `b2`; some
/// dwords are turned into batch starts aimed at those pages so that walks nest and loop.
fn world(ring: &[u32], b1: &[u32], b2: &[u32], jumps: &[(usize, u8)]) -> (PageMemory, RingSpan) {
    let mut m = PageMemory::new();
    let targets = [0x0400_1000u64, 0x0400_2000, 0x0400_2800];
    let mut bufs = [ring.to_vec(), b1.to_vec(), b2.to_vec()];
    for &(at, k) in jumps {
        let which = usize::from(k) % 3;
        let b = &mut bufs[usize::from(k / 3) % 3];
        let space = if k & 1 == 0 { GGTT } else { PPGTT };
        let cmd = build::mi_batch_buffer_start(space, targets[which], k & 2 != 0);
        if at + 3 <= b.len() {
            b[at..at + 3].copy_from_slice(&cmd);
        }
    }
    for space in [GGTT, PPGTT] {
        m.map(space, 0x0400_0000, 0x3000).unwrap();
        m.put_dwords(space, 0x0400_1000, &bufs[1]).unwrap();
        m.put_dwords(space, 0x0400_2000, &bufs[2]).unwrap();
    }
    m.put_dwords(GGTT, 0x0400_0000, &bufs[0]).unwrap();
    let tail = ((bufs[0].len() * 4) as u64) % 0x1000;
    (
        m,
        RingSpan {
            start: GgttOffset(0x0400_0000),
            size: 0x1000,
            head: 0,
            tail,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn walker_is_total_and_bounded(
        gen in gen_strategy(),
        engine in engine_strategy(),
        ring in prop::collection::vec(dword(), 1..120),
        b1 in prop::collection::vec(dword(), 1..200),
        b2 in prop::collection::vec(dword(), 1..200),
        jumps in prop::collection::vec((0usize..150, any::<u8>()), 0..6),
        mv in move_strategy(),
    ) {
        let (m, span) = world(&ring, &b1, &b2, &jumps);
        let budget = Budget { max_commands: 3000, max_batch_bytes: 1 << 20, max_batches: 64 };
        let mut n = 0u64;
        let r = walk(gen, engine, &m, span, budget, &mut |_| {
            n += 1;
            Ok(())
        });
        prop_assert!(n <= budget.max_commands);
        if let Ok(sum) = r {
            prop_assert_eq!(sum.commands, n);
        }
        let s = VgpuSlices {
            aperture: Slice::new(GgttOffset(0x0400_0000), 64 * MIB).unwrap(),
            hidden: Slice::new(GgttOffset(0x4000_0000), 384 * MIB).unwrap(),
        };
        let _ = audit_walk(gen, engine, &m, span, budget, &s);
        let mv = SliceMove::new(s, mv.to).unwrap();
        let mut m2 = m.clone();
        match remap_walk(gen, engine, &mut m2, span, budget, &mv) {
            Err(_) => prop_assert_eq!(&m2, &m),
            Ok(st) => prop_assert!(st.commands <= budget.max_commands),
        }
    }
}
