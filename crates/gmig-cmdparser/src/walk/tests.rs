//! Tests of the in-page walk loop and of the privileged surface states a walk resolves.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::privileged::PrivilegedSurfaces;
use super::walker::Walker;
use super::*;
use crate::addr::{AddressSpace, GgttOffset};
use crate::aub::fixture::iris::{self, IrisLayout};
use crate::build;
use crate::decode::BatchLevel;
use crate::indirect::IndirectState;
use crate::isa::encode;
use crate::memory::{GpuMemory, PageMemory};
use crate::table::{Engine, Gen};

const GGTT: AddressSpace = AddressSpace::Ggtt;
const A: IrisLayout = IrisLayout::packed(0x1000_0000);
const B: IrisLayout = IrisLayout::packed(0x2000_0000);
/// A's heaps with B's kernels, whose pixel shader writes another binding-table entry.
const MIXED: IrisLayout = IrisLayout {
    kernels: B.kernels,
    ..A
};
const BATCH: u64 = 0x0100_0000;
const RING: u64 = 0x0000_1000;

fn state(gen: Gen, name: &str, len: u32) -> Vec<u32> {
    build::state_off(gen, name, len).unwrap()
}

/// One piece of a random privileged batch.
fn piece(gen: Gen, which: u8, arg: u8) -> Vec<u32> {
    let l = if arg & 1 == 0 { &A } else { &B };
    match which % 10 {
        0 => iris::base_addresses(gen, l),
        9 => iris::base_addresses(gen, &MIXED),
        1 => {
            let mut v = state(gen, "3DSTATE_BINDING_TABLE_POINTERS_PS", 2);
            v[1] = [0x40, 0x80, 0xc0][usize::from(arg % 3)];
            v
        }
        2 => {
            let mut v = state(gen, "3DSTATE_PS", 12);
            v[1] = [0x100, 0x200][usize::from(arg % 2)];
            v[6] = u32::from(!arg.is_multiple_of(3));
            v
        }
        3 => {
            let mut v = state(gen, "3DSTATE_VS", 9);
            v[7] = u32::from(arg % 2);
            v
        }
        4 => build::primitive_3d(3),
        5 => {
            let mut v = state(gen, "MEDIA_INTERFACE_DESCRIPTOR_LOAD", 4);
            v[2] = [32, 64][usize::from(arg % 2)];
            v
        }
        6 => {
            let mut v = state(gen, "GPGPU_WALKER", 15);
            v[1] = u32::from(arg % 2);
            v[7] = 4;
            v
        }
        7 => iris::draw_batch(gen, l),
        _ => iris::dispatch_batch(gen, l),
    }
}

/// Both layouts' heaps, plus a binding table 0xc0 naming a fourth surface state and an
/// interface descriptor 1 using that table; B's pixel shader writes binding-table entry 3.
fn memory(gen: Gen, batch: &[u32]) -> PageMemory {
    let mut mem = PageMemory::new();
    for l in [&A, &B] {
        for (at, d) in iris::heaps(gen, l) {
            mem.put_dwords(GGTT, at, &d).unwrap();
        }
        mem.put_dwords(GGTT, l.surfaces + 192, &iris::raw_buffer(l.ssbo, 4096))
            .unwrap();
        let rel = if gen == Gen::Gen11 {
            192
        } else {
            (l.surfaces + 192 - l.binder) as u32
        };
        mem.put_dwords(GGTT, l.binder + 0xc0, &[rel]).unwrap();
        let mut id = [0u32; 8];
        id[0] = 0x200;
        id[4] = 0xc0;
        mem.put_dwords(GGTT, l.dynamic + 32, &id).unwrap();
    }
    let ps = encode::kernel(&[encode::untyped_write(3, true)]);
    mem.put_dwords(GGTT, B.kernels + 0x100, &ps).unwrap();
    mem.put_dwords(GGTT, BATCH, batch).unwrap();
    let ring = [
        build::mi_batch_buffer_start(GGTT, BATCH, false),
        build::mi_noop(),
    ]
    .concat();
    mem.put_dwords(GGTT, RING, &ring).unwrap();
    mem
}

/// A random batch: valid commands, batch ends, chains and second-level calls to the other
/// batch, and raw dwords (unknown opcodes, zero lengths, commands cut by the batch's end).
fn random_batch(gen: Gen, parts: &[(u8, u32)], other: u64) -> Vec<u32> {
    let mut v = Vec::new();
    for &(k, x) in parts {
        v.extend(match k % 8 {
            0 => build::mi_noop(),
            1 => build::pipe_control(Some((GGTT, 0x0400_0000 + u64::from(x % 64) * 8, 1))),
            2 => build::mi_load_register_imm(&[(0x2600, x)]),
            3 => state(gen, "3DSTATE_VS", 9),
            4 => build::mi_batch_buffer_end(),
            5 => build::mi_batch_buffer_start(GGTT, other, x % 2 == 0),
            6 => build::primitive_3d(x % 7),
            _ => vec![x],
        });
    }
    v
}

/// Every command a walk visits, as (space, address, offset, length, level), and how it ends.
type Visits = (
    Vec<(AddressSpace, u64, usize, usize, BatchLevel)>,
    Result<WalkSummary>,
);

fn walk_recorded(mem: &PageMemory, ring: RingSpan, budget: Budget, in_page: bool) -> Visits {
    let mut seen = Vec::new();
    let mut visit = |w: &WalkedCommand<'_>| -> Result<()> {
        seen.push((w.space, w.addr, w.cmd.offset, w.cmd.len(), w.ctx.level));
        Ok(())
    };
    let mut w = Walker::new(Gen::Gen9, Engine::Render, mem, budget, &mut visit);
    w.in_page = in_page;
    let r = w.ring(ring).map(|()| w.sum);
    (seen, r)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// The in-page loop visits exactly what the general path visits, in the same order, and
    /// ends the same way (the same summary, or the same error), on valid and broken batches,
    /// batches that cross pages, and small budgets.
    #[test]
    fn the_in_page_loop_walks_as_the_general_path_does(
        first in proptest::collection::vec((any::<u8>(), any::<u32>()), 0..200),
        second in proptest::collection::vec((any::<u8>(), any::<u32>()), 0..50),
        first_at in 0u64..1024,
        max_commands in prop_oneof![Just(1u64 << 20), 1u64..300],
        max_batch_bytes in prop_oneof![Just(64u64 << 20), 4u64..8192],
    ) {
        let gen = Gen::Gen9;
        let (a, b) = (BATCH + first_at * 4, BATCH + 0x10_0000 + 0xff0);
        let mut mem = PageMemory::new();
        mem.put_dwords(GGTT, a, &random_batch(gen, &first, b)).unwrap();
        mem.put_dwords(GGTT, b, &random_batch(gen, &second, a)).unwrap();
        let ring = [build::mi_batch_buffer_start(GGTT, a, false), build::mi_noop()].concat();
        mem.put_dwords(GGTT, RING, &ring).unwrap();
        let span = RingSpan { start: GgttOffset(RING), size: 4096, head: 0, tail: 16 };
        let budget = Budget { max_commands, max_batch_bytes, max_batches: 64 };
        let fast = walk_recorded(&mem, span, budget, true);
        let general = walk_recorded(&mem, span, budget, false);
        prop_assert_eq!(fast, general);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The walk's surface states (resolved once per surface key) are exactly those the
    /// general `IndirectState::step` finds for every privileged work command, whatever the
    /// order in which state and work come.
    #[test]
    fn surface_keys_lose_no_surface_state(
        gen in prop_oneof![Just(Gen::Gen8), Just(Gen::Gen9), Just(Gen::Gen11)],
        pieces in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..40),
    ) {
        let mut batch: Vec<u32> = pieces.iter().flat_map(|&(w, a)| piece(gen, w, a)).collect();
        batch.extend(build::mi_batch_buffer_end());
        let mem = memory(gen, &batch);
        let ring = RingSpan { start: GgttOffset(RING), size: 4096, head: 0, tail: 16 };
        let dyn_mem: &dyn GpuMemory = &mem;
        let mut keyed = PrivilegedSurfaces::new(gen);
        let mut general = IndirectState::new(gen, AddressSpace::Ggtt);
        let (mut found, mut expected) = (BTreeSet::new(), BTreeSet::new());
        walk(gen, Engine::Render, &mem, ring, Budget::default(), &mut |w| {
            for (at, _, _) in keyed.step(gen, w, dyn_mem)? {
                found.insert(at);
            }
            if w.ctx.privileged {
                if let (_, Some(fp)) = general.step(&w.cmd, &w.ctx, dyn_mem) {
                    expected.extend(
                        fp.surface_states.iter().filter(|s| s.space == GGTT).map(|s| s.addr),
                    );
                }
            }
            Ok(())
        })
        .unwrap();
        prop_assert_eq!(found, expected);
    }
}

/// One piece of a random batch for the remap walk's two paths: the privileged pieces above, the
/// raw pieces of `random_batch`, quiet rows (some with wrong lengths), register loads of any
/// register, and post-syncs inside and outside the slices.
fn remap_piece(gen: Gen, which: u8, arg: u8, x: u32, other: u64) -> Vec<u32> {
    match which % 6 {
        0 | 1 => piece(gen, which / 6, arg),
        2 => random_batch(gen, &[(arg, x)], other),
        3 => {
            let name = [
                "3DSTATE_SBE",
                "3DSTATE_RASTER",
                "3DSTATE_VF_TOPOLOGY",
                "MI_NOOP",
            ][usize::from(arg % 4)];
            let len = if name == "MI_NOOP" { 1 } else { 2 + x % 6 };
            let mut v = build::state_off(gen, name, len).unwrap_or_else(|| vec![x]);
            if arg & 0x80 != 0 {
                v.truncate(1); // cut: its length now runs into the next piece
            }
            v
        }
        // Mostly whitelisted registers (CS_GPR), now and then any.
        4 if x.is_multiple_of(8) => build::mi_load_register_imm(&[(x & 0x7f_fffc, x)]),
        4 => build::mi_load_register_imm(&[(0x2600 + ((x >> 3) & 0x7c), x)]),
        // Mostly inside the aperture slice, now and then past it.
        _ if x.is_multiple_of(16) => build::pipe_control(Some((GGTT, 0x0900_0000, 1))),
        _ => build::pipe_control(Some((GGTT, u64::from(x % 0x0800_0000) & !7, 1))),
    }
}

fn remap_slices(aperture: u64, hidden: u64) -> crate::addr::VgpuSlices {
    use crate::addr::{Slice, VgpuSlices};
    VgpuSlices {
        aperture: Slice::new(GgttOffset(aperture), 128 << 20).unwrap(),
        hidden: Slice::new(GgttOffset(hidden), 512 << 20).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// The remap walk's fast path (quiet commands counted, not visited; privileged commands
    /// stepped by their rows' surface codes, only what surface states depend on recorded, where
    /// the general path steps every command by its row's role; edits planned straight into the
    /// list; register verdicts and pages as the fast
    /// paths take them) leaves memory exactly as the general path does and ends the same way:
    /// the same statistics, or the same error, on valid and broken batches, with addresses
    /// inside and outside the slices and small budgets.
    #[test]
    fn the_fast_remap_walk_remaps_as_the_general_path_does(
        gen in prop_oneof![Just(Gen::Gen8), Just(Gen::Gen9), Just(Gen::Gen11)],
        pieces in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u32>()), 1..40),
        max_commands in prop_oneof![Just(1u64 << 20), 1u64..200],
    ) {
        let other = BATCH + 0x8000;
        let mut batch: Vec<u32> = pieces
            .iter()
            .flat_map(|&(w, a, x)| remap_piece(gen, w, a, x, other))
            .collect();
        batch.extend(build::mi_batch_buffer_end());
        let mut mem = memory(gen, &batch);
        mem.put_dwords(GGTT, other, &[build::mi_noop(), build::mi_batch_buffer_end()].concat())
            .unwrap();
        let mv = crate::addr::SliceMove::new(
            remap_slices(0, 0x1000_0000),
            remap_slices(0x0800_0000, 0x4000_0000),
        )
        .unwrap();
        let ring = RingSpan { start: GgttOffset(RING), size: 4096, head: 0, tail: 16 };
        let budget = Budget { max_commands, ..Budget::default() };
        let (mut fast_mem, mut general_mem) = (mem.clone(), mem);
        let fast =
            super::remap::remap_walk_with_path(gen, Engine::Render, &mut fast_mem, ring, budget, &mv, true);
        let general =
            super::remap::remap_walk_with_path(gen, Engine::Render, &mut general_mem, ring, budget, &mv, false);
        prop_assert_eq!(fast, general);
        prop_assert!(fast_mem == general_mem, "memory differs after the two walks");
    }
}
