//! The fuzz harness shared by the libFuzzer target and the `replay` runner.
//!
//! Input layout: byte 0 selects generation, engine and context; bytes 1..3 the source and
//! destination slice positions; the rest is split into a ring and two batch pages of
//! little-endian dwords. The harness decodes, audits and remaps the ring buffer in place, walks,
//! audits and remaps the whole ring → batch graph in memory, and checks the remap guarantees:
//! a failed remap changes nothing; a successful one passes the destination audit and remapping
//! back restores the input.

pub mod mutate;

/// Keeps freed memory in glibc's heap instead of returning it to the kernel: the `vgpu_resume`
/// harness clones a vGPU (a GGTT table of about 900 KiB) for every input, and with glibc's
/// defaults each clone above the trimmed heap top came back as fresh, page-faulting memory (more
/// than half of an input's time). Under AddressSanitizer, whose allocator replaces glibc's, this
/// does nothing.
pub fn keep_heap() {
    // SAFETY: mallopt only changes allocator parameters; it is called before any other thread
    // exists (at the start of main, or in libFuzzer's init hook).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

use gmig_cmdparser::{
    audit, audit_walk, audit_widened, decode_one, redirect_null_uses, remap_in_place, remap_walk,
    walk, AddressSpace, BatchContext, Budget, CmdRegister, Decoder, Engine, Gen, GgttOffset,
    PageMemory, RingSpan, Slice, SliceMove, VgpuSlices, Widening, GTT_PAGE_SIZE,
};

/// A device's additions as a vGPU makes them (a few of its command-access rows, null state
/// pointers admitted), for the widened audit.
const CMD_REGISTERS: [CmdRegister; 3] = [
    CmdRegister {
        offset: 0x7014,
        engine: Engine::Render,
    },
    CmdRegister {
        offset: 0x229c,
        engine: Engine::Render,
    },
    CmdRegister {
        offset: 0x2_229c,
        engine: Engine::Blitter,
    },
];
const WIDENING: Widening<'static> = Widening {
    cmd_registers: &CMD_REGISTERS,
    null_state_pointers: true,
};

/// The widened audit's guarantees on one command: it admits whatever the audit admits; what it
/// admits keeps its store-data-index write inside its page; and the shadow copy (null pointers
/// redirected into the slices) passes with null pointers no longer admitted.
fn check_widened(
    gen: Gen,
    engine: Engine,
    cmd: &gmig_cmdparser::Decoded<'_>,
    ctx: &BatchContext,
    s: &VgpuSlices,
) {
    let widened = audit_widened(cmd, ctx, s, &WIDENING);
    if audit(cmd, ctx, s).is_ok() {
        assert_eq!(
            widened,
            Ok(()),
            "the widened audit refused what the audit admits"
        );
    }
    if widened.is_err() {
        return;
    }
    if let Some(u) = cmd.status_index() {
        assert!(
            u.offset + u.len <= GTT_PAGE_SIZE,
            "index past its page: {u:?}"
        );
    }
    let mut shadow = cmd.dwords.to_vec();
    redirect_null_uses(cmd, ctx, &mut shadow, s.aperture.base.0);
    let sd = decode_one(gen, engine, &shadow, 0).expect("the shadow decodes");
    let strict = Widening {
        null_state_pointers: false,
        ..WIDENING
    };
    assert_eq!(
        audit_widened(&sd, ctx, s, &strict),
        Ok(()),
        "shadow {shadow:x?}"
    );
}

const MIB: u64 = 1 << 20;

fn slices(ap: u8, hi: u8) -> VgpuSlices {
    VgpuSlices {
        aperture: Slice {
            base: GgttOffset(u64::from(ap % 64) * 64 * MIB),
            size: 64 * MIB,
        },
        hidden: Slice {
            base: GgttOffset((4 << 30) + u64::from(hi % 64) * 384 * MIB),
            size: 384 * MIB,
        },
    }
}

fn dwords(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs the harness on one input. Panics only when a guarantee is broken.
pub fn run(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let (params, body) = rest.split_at(rest.len().min(3));
    let p = |i: usize| params.get(i).copied().unwrap_or(0);
    let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][usize::from(sel % 3)];
    let engine = [
        Engine::Render,
        Engine::Blitter,
        Engine::Video,
        Engine::VideoEnhance,
    ][usize::from((sel / 3) % 4)];
    let ctx = [
        BatchContext::RING,
        BatchContext::first_level(AddressSpace::Ggtt),
        BatchContext::first_level(AddressSpace::Ppgtt),
    ][usize::from((sel / 12) % 3)];
    // The source aperture holds the ring and batches at 0x0400_0000.
    let from = slices(1, p(0));
    let to = slices(p(1), p(2));
    let Ok(mv) = SliceMove::new(from, to) else {
        return;
    };

    // 1. One buffer: decode, audit, remap in place.
    let buf = dwords(body);
    for cmd in Decoder::new(gen, engine, &buf).flatten() {
        check_widened(gen, engine, &cmd, &ctx, &from);
        let _ = cmd.write_set(&ctx);
    }
    let mut out = buf.clone();
    match remap_in_place(gen, engine, &mut out, &ctx, &mv) {
        Err(_) => assert_eq!(out, buf, "failed remap changed the buffer"),
        Ok(_) => {
            for cmd in Decoder::new(gen, engine, &out) {
                let cmd = cmd.expect("remapped buffer decodes");
                assert_eq!(audit(&cmd, &ctx, &to), Ok(()), "destination audit");
            }
            remap_in_place(gen, engine, &mut out, &ctx, &mv.inverse()).expect("remap back");
            assert_eq!(out, buf, "round trip");
        }
    }

    // 2. Ring and batches in memory: walk, audit, remap.
    let third = body.len() / 3 / 4 * 4;
    let (r, b) = body.split_at(third.min(body.len()));
    let (b1, b2) = b.split_at((b.len() / 2 / 4 * 4).min(b.len()));
    let (r, b1, b2) = (dwords(r), dwords(b1), dwords(b2));
    let mut m = PageMemory::new();
    for space in [AddressSpace::Ggtt, AddressSpace::Ppgtt] {
        let _ = m.map(space, 0x0400_0000, 0x4000);
        let _ = m.put_dwords(space, 0x0400_1000, b1.get(..0x400).unwrap_or(&b1));
        let _ = m.put_dwords(space, 0x0400_2000, b2.get(..0x800).unwrap_or(&b2));
    }
    let r = r.get(..0x3ff).unwrap_or(&r);
    let _ = m.put_dwords(AddressSpace::Ggtt, 0x0400_0000, r);
    let span = RingSpan {
        start: GgttOffset(0x0400_0000),
        size: 0x1000,
        head: 0,
        tail: (r.len() as u64 * 4) % 0x1000,
    };
    let budget = Budget {
        max_commands: 4096,
        max_batch_bytes: 1 << 20,
        max_batches: 64,
    };
    let mut n = 0u64;
    let _ = walk(gen, engine, &m, span, budget, &mut |_| {
        n += 1;
        Ok(())
    });
    assert!(n <= budget.max_commands, "budget overrun");
    let _ = audit_walk(gen, engine, &m, span, budget, &from);
    let mut m2 = m.clone();
    if remap_walk(gen, engine, &mut m2, span, budget, &mv).is_err() {
        assert!(m2 == m, "failed remap_walk changed memory");
    }
}
