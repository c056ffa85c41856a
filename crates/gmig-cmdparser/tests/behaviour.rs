//! Behaviour of the decoder, audit, remap, write sets and walker on hand-built buffers.

use gmig_cmdparser::build::{self, Rect};
use gmig_cmdparser::{
    audit, audit_walk, by_name, remap_in_place, remap_walk, walk, AddressRange, AddressSpace,
    AuditError, BatchContext, BatchLevel, Budget, DecodeError, Decoder, Engine, Gen, GgttOffset,
    GpuMemory, PageMemory, RemapError, RingSpan, Slice, SliceMove, VgpuSlices, WalkError, WriteSet,
};

const GGTT: AddressSpace = AddressSpace::Ggtt;
const PPGTT: AddressSpace = AddressSpace::Ppgtt;
const MIB: u64 = 1 << 20;

fn slices(ap: u64, hi: u64) -> VgpuSlices {
    VgpuSlices {
        aperture: Slice::new(GgttOffset(ap), 64 * MIB).unwrap(),
        hidden: Slice::new(GgttOffset(hi), 384 * MIB).unwrap(),
    }
}

fn src() -> VgpuSlices {
    slices(0x0400_0000, 0x4000_0000)
}

fn dst() -> VgpuSlices {
    slices(0x1000_0000, 0x8000_0000)
}

fn mv() -> SliceMove {
    SliceMove::new(src(), dst()).unwrap()
}

fn concat(parts: &[Vec<u32>]) -> Vec<u32> {
    parts.iter().flatten().copied().collect()
}

fn names(gen: Gen, engine: Engine, buf: &[u32]) -> Vec<(usize, &'static str, usize)> {
    Decoder::new(gen, engine, buf)
        .map(|r| r.map(|d| (d.offset, d.desc.name, d.len())))
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn decodes_mixed_render_buffer() {
    let buf = concat(&[
        build::mi_noop(),
        build::mi_store_data_imm(GGTT, 0x0400_1000, &[7]),
        build::mi_load_register_imm(&[(0x2600, 1), (0x2604, 2)]),
        build::pipe_control(Some((GGTT, 0x0400_2000, 5))),
        build::primitive_3d(3),
        build::mi_user_interrupt(),
        build::mi_batch_buffer_end(),
    ]);
    assert_eq!(
        names(Gen::Gen9, Engine::Render, &buf),
        vec![
            (0, "MI_NOOP", 1),
            (1, "MI_STORE_DATA_IMM", 4),
            (5, "MI_LOAD_REGISTER_IMM", 5),
            (10, "PIPE_CONTROL", 6),
            (16, "3DPRIMITIVE", 7),
            (23, "MI_USER_INTERRUPT", 1),
            (24, "MI_BATCH_BUFFER_END", 1),
        ]
    );
}

#[test]
fn decode_errors_name_offset_and_stop_for_good() {
    // A 2D command is unknown on the render engine.
    let blit = build::xy_color_blt(0x0400_0000, 64, 4, rect(0, 0, 4, 4), 0);
    let buf = concat(&[build::mi_noop(), blit.clone()]);
    let mut d = Decoder::new(Gen::Gen9, Engine::Render, &buf);
    assert!(d.next().unwrap().is_some());
    assert_eq!(
        d.next(),
        Err(DecodeError::UnknownOpcode {
            offset: 1,
            dw0: blit[0]
        })
    );
    assert_eq!(d.next(), Ok(None), "empty for good after an error");
    // ... and fine on the blitter.
    assert_eq!(names(Gen::Gen9, Engine::Blitter, &buf).len(), 2);

    let sdi = build::mi_store_data_imm(GGTT, 0x1000, &[1, 2]);
    let cut = &sdi[..4];
    let e = Decoder::new(Gen::Gen8, Engine::Render, cut)
        .next()
        .unwrap_err();
    assert!(matches!(
        e,
        DecodeError::Truncated {
            offset: 0,
            len: 5,
            available: 4,
            ..
        }
    ));

    let mut srm = build::mi_store_register_mem(GGTT, 0x2600, 0x1000);
    srm[0] += 1; // length 5: SRM must be 4 dwords
    srm.push(0);
    let e = Decoder::new(Gen::Gen11, Engine::Video, &srm)
        .next()
        .unwrap_err();
    assert!(matches!(
        e,
        DecodeError::BadLength {
            offset: 0,
            len: 5,
            ..
        }
    ));
    assert_eq!(e.offset(), 0);
}

fn rect(x1: u16, y1: u16, x2: u16, y2: u16) -> Rect {
    Rect { x1, y1, x2, y2 }
}

#[test]
fn address_spaces_follow_selector_bits_and_privilege() {
    let ring = BatchContext::RING;
    let ppgtt_batch = BatchContext::first_level(PPGTT);
    let sdi_g = build::mi_store_data_imm(GGTT, 0x0400_1000, &[1]);
    let sdi_p = build::mi_store_data_imm(PPGTT, 0x7000_0000_1000, &[1]);
    let first = |b: &[u32], ctx: &BatchContext| {
        let d = Decoder::new(Gen::Gen9, Engine::Render, b)
            .next()
            .unwrap()
            .unwrap();
        d.addresses(ctx).collect::<Vec<_>>()
    };
    let u = first(&sdi_g, &ring);
    assert_eq!((u[0].space, u[0].addr, u[0].len), (GGTT, 0x0400_1000, 4));
    let u = first(&sdi_p, &ring);
    assert_eq!((u[0].space, u[0].addr), (PPGTT, 0x7000_0000_1000));
    // Blit addresses follow the buffer: GGTT in the ring, PPGTT in a PPGTT batch.
    let blit = build::xy_color_blt(0x0400_0000, 64, 4, rect(0, 0, 16, 2), 0);
    let d = Decoder::new(Gen::Gen8, Engine::Blitter, &blit)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(d.addresses(&ring).next().unwrap().space, GGTT);
    assert_eq!(d.addresses(&ppgtt_batch).next().unwrap().space, PPGTT);
    // PIPE_CONTROL without post-sync has no address.
    assert!(first(&build::pipe_control(None), &ring).is_empty());
    let u = first(&build::pipe_control(Some((PPGTT, 0x5000, 1))), &ring);
    assert_eq!((u[0].space, u[0].addr, u[0].len), (PPGTT, 0x5000, 8));
    let f = build::mi_flush_dw(Some((GGTT, 0x0400_0008, 1)));
    let d = Decoder::new(Gen::Gen9, Engine::Blitter, &f)
        .next()
        .unwrap()
        .unwrap();
    let u: Vec<_> = d.addresses(&ring).collect();
    assert_eq!((u[0].space, u[0].addr), (GGTT, 0x0400_0008));
    assert!(d.addresses(&ring).count() == 1);
    assert!(
        Decoder::new(Gen::Gen9, Engine::Blitter, &build::mi_flush_dw(None))
            .next()
            .unwrap()
            .unwrap()
            .addresses(&ring)
            .next()
            .is_none()
    );
}

fn audit_one(gen: Gen, engine: Engine, b: &[u32], ctx: &BatchContext) -> Result<(), AuditError> {
    let d = Decoder::new(gen, engine, b).next().unwrap().unwrap();
    audit(&d, ctx, &src())
}

#[test]
fn audit_refuses_forbidden_commands() {
    for name in [
        "MI_UPDATE_GTT",
        "MI_CLFLUSH",
        "MI_REPORT_PERF_COUNT",
        "MI_COPY_MEM_MEM",
    ] {
        let desc = by_name(Gen::Gen9, Engine::Render, name).unwrap();
        let len = desc.exact_len.map_or(4, usize::from);
        let mut b = vec![0u32; len];
        b[0] = desc.header(len as u32);
        let r = audit_one(Gen::Gen9, Engine::Render, &b, &BatchContext::RING);
        assert_eq!(r, Err(AuditError::Forbidden { offset: 0, name }), "{name}");
    }
}

/// Store-data-index writes (i915's flushes, IGT's spinners): an offset into a status page, not
/// a graphics address. Admitted with the offset checked against the page, as GVT-g does; the
/// global page only from privileged buffers; never an address use (not audited against the
/// slices, not remapped).
#[test]
fn store_data_index_is_an_offset_into_a_status_page() {
    let ring = BatchContext::RING;
    let user = BatchContext::batch(BatchLevel::First, AddressSpace::Ppgtt, ring);
    let one = |engine: Engine, b: &[u32], ctx: &BatchContext| {
        let d = Decoder::new(Gen::Gen9, engine, b).next().unwrap().unwrap();
        (
            d.status_index(),
            d.addresses(ctx).count(),
            audit(&d, ctx, &src()),
        )
    };
    let idx = |per_process: bool, offset: u64, len: u64| {
        Some(gmig_cmdparser::IndexUse {
            per_process,
            offset,
            len,
        })
    };
    // i915 6.1's render flush: PIPE_CONTROL, QW write, store data index, GGTT bit clear.
    let pc = |dw1: u32, at: u32| [0x7a00_0004, dw1, at, 0, 0, 0];
    let flush = (1 << 21) | (1 << 14) | (1 << 20);
    for ctx in [&ring, &user] {
        assert_eq!(
            one(Engine::Render, &pc(flush, 0xd0), ctx),
            (idx(true, 0xd0, 8), 0, Ok(()))
        );
        // With the GGTT bit too (an index, not GGTT 0xd0 outside the slices).
        let r = one(Engine::Render, &pc(flush | (1 << 24), 0xd0), ctx);
        assert_eq!(r, (idx(true, 0xd0, 8), 0, Ok(())));
        let r = one(Engine::Render, &pc(flush, 0xffc), ctx);
        assert!(matches!(
            r.2,
            Err(AuditError::IndexOutOfPage {
                index: 0xffc,
                len: 8,
                ..
            })
        ));
    }
    // Without the bit, the post-sync address is an address as before.
    let r = one(Engine::Render, &pc((1 << 14) | (1 << 24), 0xd0), &ring);
    assert_eq!((r.0, r.1), (None, 1));
    assert!(matches!(
        r.2,
        Err(AuditError::OutOfSlice { start: 0xd0, .. })
    ));
    // MI_FLUSH_DW with store data index (DW0 bit 21) and the GGTT bit: i915's blitter flush.
    let fdw = [0x1320_4002, 0xd0 | 4, 0, 0];
    assert_eq!(
        one(Engine::Blitter, &fdw, &user),
        (idx(true, 0xd0, 8), 0, Ok(()))
    );
    // MI_STORE_DATA_INDEX: per-process (DW0 bit 21) from anywhere; the global page only from
    // the ring or a privileged batch.
    let sdi = [0x10a0_0002, 0x40, 1, 2];
    assert_eq!(
        one(Engine::Render, &sdi, &user),
        (idx(true, 0x40, 8), 0, Ok(()))
    );
    let global = [0x1080_0001, 0x40, 1];
    assert_eq!(
        one(Engine::Render, &global, &ring),
        (idx(false, 0x40, 4), 0, Ok(()))
    );
    assert!(matches!(
        one(Engine::Render, &global, &user).2,
        Err(AuditError::GgttFromUnprivileged { .. })
    ));
    assert!(matches!(
        one(Engine::Render, &[0x1080_0001, 0x1000, 1], &ring).2,
        Err(AuditError::IndexOutOfPage { index: 0x1000, .. })
    ));
}

#[test]
fn audit_checks_ggtt_ranges_against_both_slices() {
    let ring = BatchContext::RING;
    let ok = |a: u64, data: &[u32]| {
        audit_one(
            Gen::Gen9,
            Engine::Render,
            &build::mi_store_data_imm(GGTT, a, data),
            &ring,
        )
    };
    assert!(ok(0x0400_0000, &[1]).is_ok());
    assert!(ok(0x0800_0000 - 4, &[1]).is_ok());
    assert!(matches!(
        ok(0x0800_0000 - 4, &[1, 2]),
        Err(AuditError::OutOfSlice { len: 8, .. })
    ));
    assert!(ok(0x4000_0000, &[1]).is_ok());
    assert!(ok(0x0300_0000, &[1]).is_err());
    // PPGTT addresses are not the audit's business.
    assert!(audit_one(
        Gen::Gen9,
        Engine::Render,
        &build::mi_store_data_imm(PPGTT, 0x0300_0000, &[1]),
        &ring
    )
    .is_ok());
    // A blit larger than 36 MiB is refused even inside the slice.
    let big = build::xy_color_blt(0x4000_0000, 16384, 4, rect(0, 0, 4096, 4000), 0);
    assert!(matches!(
        audit_one(Gen::Gen9, Engine::Blitter, &big, &ring),
        Err(AuditError::SurfaceTooLarge { .. })
    ));
    // A blit whose rectangle leaves the aperture is refused.
    let spill = build::xy_color_blt(0x0800_0000 - 4096, 4096, 4, rect(0, 0, 1024, 2), 0);
    assert!(matches!(
        audit_one(Gen::Gen9, Engine::Blitter, &spill, &ring),
        Err(AuditError::OutOfSlice { .. })
    ));
}

#[test]
fn audit_checks_registers_privilege_and_nesting() {
    let ring = BatchContext::RING;
    let lri = |r| build::mi_load_register_imm(&[(0x2600, 0), (r, 0)]);
    assert!(audit_one(Gen::Gen9, Engine::Render, &lri(0x2608), &ring).is_ok());
    assert_eq!(
        audit_one(Gen::Gen9, Engine::Render, &lri(0x2034), &ring),
        Err(AuditError::Register {
            offset: 0,
            name: "MI_LOAD_REGISTER_IMM",
            reg: 0x2034
        })
    );
    let srm = build::mi_store_register_mem(GGTT, 0x2358, 0x0400_0000);
    assert!(audit_one(Gen::Gen9, Engine::Render, &srm, &ring).is_ok());
    // Selecting the GGTT from a PPGTT batch is privileged.
    let unpriv = BatchContext::first_level(PPGTT);
    assert!(matches!(
        audit_one(Gen::Gen9, Engine::Render, &srm, &unpriv),
        Err(AuditError::GgttFromUnprivileged { .. })
    ));
    let bb2 = build::mi_batch_buffer_start(PPGTT, 0x1000, true);
    assert_eq!(
        audit_one(Gen::Gen9, Engine::Render, &bb2, &ring),
        Err(AuditError::SecondLevelFromRing { offset: 0 })
    );
    let second = BatchContext::batch(BatchLevel::Second, PPGTT, unpriv);
    assert_eq!(
        audit_one(
            Gen::Gen9,
            Engine::Render,
            &build::mi_batch_buffer_start(PPGTT, 0x1000, false),
            &second
        ),
        Err(AuditError::NestedBatchStart { offset: 0 })
    );
    // Video commands whose layout is not modelled: refused from privileged buffers only.
    let desc = by_name(Gen::Gen9, Engine::Video, "MFX_PIPE_BUF_ADDR_STATE").unwrap();
    let mut b = vec![0u32; 65];
    b[0] = desc.header(65);
    assert!(matches!(
        audit_one(Gen::Gen9, Engine::Video, &b, &ring),
        Err(AuditError::Unmodelled { .. })
    ));
    assert!(audit_one(Gen::Gen9, Engine::Video, &b, &unpriv).is_ok());
}

fn ring_mix() -> Vec<u32> {
    concat(&[
        build::mi_store_data_imm(GGTT, 0x0400_1000, &[7]),
        build::mi_store_data_imm(PPGTT, 0x0300_0000, &[8]),
        build::pipe_control(Some((GGTT, 0x4000_0010, 5))),
        build::state_base_address(0x0401_0000, 0x4002_0000),
        build::mi_batch_buffer_start(GGTT, 0x4010_0000, false),
        build::mi_user_interrupt(),
    ])
}

#[test]
fn remap_rebases_ggtt_only_and_round_trips() {
    let orig = ring_mix();
    let mut buf = orig.clone();
    let st = remap_in_place(
        Gen::Gen9,
        Engine::Render,
        &mut buf,
        &BatchContext::RING,
        &mv(),
    )
    .unwrap();
    assert_eq!(st.ggtt_rewritten, 5);
    assert_eq!(st.ppgtt_untouched, 1);
    // SDI GGTT moved by the aperture delta, PPGTT untouched.
    assert_eq!(buf[1], 0x1000_1000);
    assert_eq!(&buf[4..8], &orig[4..8]);
    // PIPE_CONTROL moved by the hidden delta; control bits kept.
    assert_eq!(buf[9], orig[9]);
    assert_eq!(buf[10], 0x8000_0010);
    // STATE_BASE_ADDRESS: surface state (aperture) and dynamic state (hidden), modify bits kept.
    assert_eq!(buf[14 + 4], 0x1001_0000 | 1);
    assert_eq!(buf[14 + 6], 0x8002_0000 | 1);
    // Batch start (hidden).
    assert_eq!(buf[34], 0x8010_0000);
    // The output passes the destination audit.
    for d in Decoder::new(Gen::Gen9, Engine::Render, &buf) {
        audit(&d.unwrap(), &BatchContext::RING, &dst()).unwrap();
    }
    remap_in_place(
        Gen::Gen9,
        Engine::Render,
        &mut buf,
        &BatchContext::RING,
        &mv().inverse(),
    )
    .unwrap();
    assert_eq!(buf, orig);
}

#[test]
fn remap_is_all_or_nothing() {
    let mut buf = concat(&[
        ring_mix(),
        build::mi_store_data_imm(GGTT, 0x0300_0000, &[1]),
    ]);
    let orig = buf.clone();
    let e = remap_in_place(
        Gen::Gen9,
        Engine::Render,
        &mut buf,
        &BatchContext::RING,
        &mv(),
    );
    assert!(matches!(
        e,
        Err(RemapError::Source(AuditError::OutOfSlice { .. }))
    ));
    assert_eq!(buf, orig);
    let mut buf = concat(&[ring_mix(), vec![0xdead_beef]]);
    let orig = buf.clone();
    assert!(matches!(
        remap_in_place(
            Gen::Gen9,
            Engine::Render,
            &mut buf,
            &BatchContext::RING,
            &mv()
        ),
        Err(RemapError::Decode(DecodeError::UnknownOpcode { .. }))
    ));
    assert_eq!(buf, orig);
}

fn write_set(gen: Gen, engine: Engine, b: &[u32], ctx: &BatchContext) -> WriteSet {
    Decoder::new(gen, engine, b)
        .next()
        .unwrap()
        .unwrap()
        .write_set(ctx)
}

#[test]
fn write_sets_bound_blits_and_stores() {
    let ring = BatchContext::RING;
    // 16x2 pixels of 4 bytes at pitch 256 from (4, 3): rows 3 and 4.
    let blit = build::xy_color_blt(0x0400_0000, 256, 4, rect(4, 3, 20, 5), 0);
    assert_eq!(
        write_set(Gen::Gen9, Engine::Blitter, &blit, &ring),
        WriteSet::Ranges(vec![AddressRange {
            space: GGTT,
            start: 0x0400_0000 + 3 * 256 + 16,
            len: 256 + 64,
        }])
    );
    let copy = build::xy_src_copy_blt(0x0400_0000, 128, rect(0, 0, 8, 4), 0x0500_0000, 64, 0, 0, 2);
    assert_eq!(
        write_set(Gen::Gen9, Engine::Blitter, &copy, &ring),
        WriteSet::Ranges(vec![AddressRange {
            space: GGTT,
            start: 0x0400_0000,
            len: 3 * 128 + 16,
        }])
    );
    let fast =
        build::xy_fast_copy_blt(0x0400_0000, 64, rect(1, 1, 2, 2), 0x0500_0000, 64, 0, 0, 16);
    assert_eq!(
        write_set(Gen::Gen9, Engine::Blitter, &fast, &ring),
        WriteSet::Ranges(vec![AddressRange {
            space: GGTT,
            start: 0x0400_0000 + 64 + 16,
            len: 16,
        }])
    );
    // 32 bpp (depth 3 as i915 encodes it), destination Y-tiled (DW0 bits 14:13 = 2), pitch 64
    // dwords: whole rows of 256-row tiles.
    let mut tiled = build::xy_fast_copy_blt(
        0x0400_0000,
        64,
        rect(0, 300, 8, 301),
        0x0500_0000,
        64,
        0,
        0,
        4,
    );
    assert_eq!(tiled[1] >> 24 & 7, 3);
    tiled[0] |= 2 << 13;
    assert_eq!(
        write_set(Gen::Gen11, Engine::Blitter, &tiled, &ring),
        WriteSet::Ranges(vec![AddressRange {
            space: GGTT,
            start: 0x0400_0000 + 256 * 256,
            len: 256 * 256,
        }])
    );
    let sdi = build::mi_store_data_imm(PPGTT, 0x9000, &[1, 2]);
    assert_eq!(
        write_set(Gen::Gen8, Engine::Video, &sdi, &ring),
        WriteSet::Ranges(vec![AddressRange {
            space: PPGTT,
            start: 0x9000,
            len: 8,
        }])
    );
    assert_eq!(
        write_set(Gen::Gen9, Engine::Render, &build::primitive_3d(3), &ring),
        WriteSet::Unknown
    );
    assert_eq!(
        write_set(
            Gen::Gen9,
            Engine::Render,
            &build::mi_load_register_imm(&[(0x2600, 1)]),
            &ring
        ),
        WriteSet::Nothing
    );
    assert_eq!(
        write_set(Gen::Gen9, Engine::Render, &build::pipe_control(None), &ring),
        WriteSet::Nothing
    );
}

/// A ring at 0x0400_0000 (4 pages) with head near its end so that commands wrap, starting a
/// first-level batch in the hidden slice that calls a second-level batch and chains to another.
fn world() -> (PageMemory, RingSpan) {
    let mut m = PageMemory::new();
    let ring_start = 0x0400_0000u64;
    let size = 0x4000u64;
    m.map(GGTT, ring_start, size).unwrap();
    let b1 = 0x4010_0000u64;
    let b2 = 0x4020_0000u64;
    let b3 = 0x4030_0000u64;
    let first = concat(&[
        build::mi_store_data_imm(GGTT, 0x4000_0100, &[1]),
        build::mi_batch_buffer_start(GGTT, b2, true),
        build::mi_store_data_imm(GGTT, 0x4000_0104, &[2]),
        build::mi_batch_buffer_start(GGTT, b3, false),
    ]);
    let second = concat(&[
        build::pipe_control(Some((GGTT, 0x0400_8000, 9))),
        build::mi_batch_buffer_end(),
    ]);
    let third = concat(&[
        build::mi_store_data_imm(PPGTT, 0x1234_0000, &[3]),
        build::mi_batch_buffer_end(),
    ]);
    m.put_dwords(GGTT, b1, &first).unwrap();
    m.put_dwords(GGTT, b2, &second).unwrap();
    m.put_dwords(GGTT, b3, &third).unwrap();
    let ring_cmds = concat(&[
        build::mi_store_data_imm(GGTT, 0x0400_9000, &[4, 5]),
        build::mi_batch_buffer_start(GGTT, b1, false),
        build::mi_user_interrupt(),
    ]);
    // Place the ring commands so that the first SDI straddles the wrap.
    let head = size - 8;
    for (i, d) in ring_cmds.iter().enumerate() {
        let off = (head + 4 * i as u64) % size;
        m.put_dwords(GGTT, ring_start + off, &[*d]).unwrap();
    }
    let tail = (head + 4 * ring_cmds.len() as u64) % size;
    (
        m,
        RingSpan {
            start: GgttOffset(ring_start),
            size,
            head,
            tail,
        },
    )
}

#[test]
fn walker_follows_wrap_batches_calls_and_chains() {
    let (m, ring) = world();
    let mut seen = Vec::new();
    let sum = walk(
        Gen::Gen9,
        Engine::Render,
        &m,
        ring,
        Budget::default(),
        &mut |w| {
            seen.push((w.cmd.desc.name, w.ctx.level, w.space, w.addr));
            Ok(())
        },
    )
    .unwrap();
    let names: Vec<_> = seen.iter().map(|s| (s.0, s.1)).collect();
    assert_eq!(
        names,
        vec![
            ("MI_STORE_DATA_IMM", BatchLevel::Ring),
            ("MI_BATCH_BUFFER_START", BatchLevel::Ring),
            ("MI_STORE_DATA_IMM", BatchLevel::First),
            ("MI_BATCH_BUFFER_START", BatchLevel::First),
            ("PIPE_CONTROL", BatchLevel::Second),
            ("MI_BATCH_BUFFER_END", BatchLevel::Second),
            ("MI_STORE_DATA_IMM", BatchLevel::First),
            ("MI_BATCH_BUFFER_START", BatchLevel::First),
            ("MI_STORE_DATA_IMM", BatchLevel::First),
            ("MI_BATCH_BUFFER_END", BatchLevel::First),
            ("MI_USER_INTERRUPT", BatchLevel::Ring),
        ]
    );
    assert_eq!(sum.commands, 11);
    assert_eq!(sum.batches, 3);
    assert_eq!(seen[0].3, 0x0400_0000 + 0x4000 - 8);
    assert_eq!(seen[1].3, 0x0400_0000 + 12);

    let rep = audit_walk(
        Gen::Gen9,
        Engine::Render,
        &m,
        ring,
        Budget::default(),
        &src(),
    )
    .unwrap();
    assert_eq!(rep.commands, 11);
    assert_eq!(rep.ppgtt_uses, 1);
}

#[test]
fn walker_budget_stops_self_chaining_batch() {
    let mut m = PageMemory::new();
    let b = 0x4010_0000u64;
    m.put_dwords(
        GGTT,
        b,
        &concat(&[
            build::mi_noop(),
            build::mi_batch_buffer_start(GGTT, b, false),
        ]),
    )
    .unwrap();
    m.put_dwords(
        GGTT,
        0x0400_0000,
        &build::mi_batch_buffer_start(GGTT, b, false),
    )
    .unwrap();
    m.map(GGTT, 0x0400_0000, 0x1000).unwrap();
    let ring = RingSpan {
        start: GgttOffset(0x0400_0000),
        size: 0x1000,
        head: 0,
        tail: 12,
    };
    let e = walk(
        Gen::Gen8,
        Engine::Render,
        &m,
        ring,
        Budget::default(),
        &mut |_| Ok(()),
    )
    .unwrap_err();
    assert!(matches!(e, WalkError::Budget { .. }), "{e}");
    // A BB_START inside a second-level batch is an error.
    let mut m2 = m.clone();
    m2.put_dwords(
        GGTT,
        b,
        &build::mi_batch_buffer_start(GGTT, 0x4020_0000, true),
    )
    .unwrap();
    m2.put_dwords(
        GGTT,
        0x4020_0000,
        &build::mi_batch_buffer_start(GGTT, b, false),
    )
    .unwrap();
    let e = walk(
        Gen::Gen8,
        Engine::Render,
        &m2,
        ring,
        Budget::default(),
        &mut |_| Ok(()),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            WalkError::Nesting {
                addr: 0x4020_0000,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn remap_walk_rewrites_memory_and_round_trips() {
    let (orig, ring) = world();
    let mut m = orig.clone();
    let st = remap_walk(
        Gen::Gen9,
        Engine::Render,
        &mut m,
        ring,
        Budget::default(),
        &mv(),
    )
    .unwrap();
    assert_eq!(st.commands, 11);
    assert_eq!(st.ppgtt_untouched, 1);
    let mut d = [0u32; 1];
    m.read_dwords(GGTT, 0x4010_0000 + 4, &mut d).unwrap();
    assert_eq!(d[0], 0x8000_0100);
    // The straddling SDI's address dword sits at the ring's start after the wrap.
    m.read_dwords(GGTT, 0x0400_0000, &mut d).unwrap();
    assert_eq!(d[0], 0);
    let mut a = [0u32; 1];
    m.read_dwords(GGTT, 0x0400_0000 + 0x4000 - 4, &mut a)
        .unwrap();
    assert_eq!(a[0], 0x1000_9000);
    assert_ne!(m, orig);
    // Walking back needs memory that resolves destination-layout addresses (the buffers now
    // hold them): map the rewritten pages at their rebased locations.
    let mut back = PageMemory::new();
    let moved = mv();
    for (space, addr, len) in [
        (GGTT, 0x0400_0000u64, 0x4000u64),
        (GGTT, 0x4010_0000, 0x1000),
        (GGTT, 0x4020_0000, 0x1000),
        (GGTT, 0x4030_0000, 0x1000),
    ] {
        let mut bytes = vec![0u8; len as usize];
        m.read(space, addr, &mut bytes).unwrap();
        let to = moved.rebase(GgttOffset(addr)).unwrap().0;
        back.map(space, to, len).unwrap();
        gmig_cmdparser::GpuMemoryMut::write(&mut back, space, to, &bytes).unwrap();
    }
    let ring_back = RingSpan {
        start: moved.rebase(ring.start).unwrap(),
        ..ring
    };
    remap_walk(
        Gen::Gen9,
        Engine::Render,
        &mut back,
        ring_back,
        Budget::default(),
        &moved.inverse(),
    )
    .unwrap();
    for (addr, len) in [
        (0x0400_0000u64, 0x4000usize),
        (0x4010_0000, 0x1000),
        (0x4020_0000, 0x1000),
        (0x4030_0000, 0x1000),
    ] {
        let mut a = vec![0u8; len];
        let mut b = vec![0u8; len];
        orig.read(GGTT, addr, &mut a).unwrap();
        back.read(GGTT, moved.rebase(GgttOffset(addr)).unwrap().0, &mut b)
            .unwrap();
        assert_eq!(a, b, "page at 0x{addr:x} restored");
    }
}

/// Found by `cargo fuzz` (decode_walk_remap, ~210k executions): a blit whose negative pitch puts
/// its rectangle below address 0 used to count as "size unknown" and pass the audit; after a
/// remap to a higher slice the same rectangle became representable and failed the destination
/// audit. A range that does not fit the address space is now invalid: refused, write set unknown.
#[test]
fn blit_range_below_zero_is_refused_not_unknown() {
    let blit = [
        0x5532_0005, // XY_MONO_SRC_COPY_BLT, 7 dwords
        0xf000_a955, // BR13: pitch -22187, 8 bpp
        0xff00_0005, // (5, 0xff00)
        0xffff_ffff, // (0xffff, 0xffff)
        0x0400_ff11, // dst
        0,
        0xde11_f055,
    ];
    let d = Decoder::new(Gen::Gen8, Engine::Blitter, &blit)
        .next()
        .unwrap()
        .unwrap();
    let u = d.addresses(&BatchContext::RING).next().unwrap();
    assert_eq!((u.bounded, u.len), (true, gmig_cmdparser::INVALID_LEN));
    assert!(matches!(
        audit(&d, &BatchContext::RING, &src()),
        Err(AuditError::SurfaceTooLarge { .. })
    ));
    assert_eq!(d.write_set(&BatchContext::RING), WriteSet::Unknown);
    let mut buf = blit.to_vec();
    assert!(remap_in_place(
        Gen::Gen8,
        Engine::Blitter,
        &mut buf,
        &BatchContext::RING,
        &mv()
    )
    .is_err());
    assert_eq!(buf, blit);
}

#[test]
fn walk_batch_calls_second_level_from_a_ppgtt_batch() {
    let mut m = PageMemory::new();
    let b1 = 0x7000_0ff0u64; // crosses a page boundary
    let b2 = 0x7100_0000u64;
    m.put_dwords(
        PPGTT,
        b1,
        &concat(&[
            build::mi_store_data_imm(PPGTT, 0x10, &[1]),
            build::mi_batch_buffer_start(PPGTT, b2, true),
            build::pipe_control(Some((PPGTT, 0x20, 2))),
            build::mi_batch_buffer_end(),
        ]),
    )
    .unwrap();
    m.put_dwords(
        PPGTT,
        b2,
        &concat(&[build::mi_noop(), build::mi_batch_buffer_end()]),
    )
    .unwrap();
    let mut seen = Vec::new();
    let sum = gmig_cmdparser::walk_batch(
        Gen::Gen11,
        Engine::Render,
        &m,
        PPGTT,
        b1,
        BatchContext::first_level(PPGTT),
        Budget::default(),
        &mut |w| {
            seen.push((w.cmd.desc.name, w.ctx.level, w.ctx.privileged, w.addr));
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(sum.commands, 6);
    assert_eq!(
        seen.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
        vec![
            ("MI_STORE_DATA_IMM", BatchLevel::First),
            ("MI_BATCH_BUFFER_START", BatchLevel::First),
            ("MI_NOOP", BatchLevel::Second),
            ("MI_BATCH_BUFFER_END", BatchLevel::Second),
            ("PIPE_CONTROL", BatchLevel::First),
            ("MI_BATCH_BUFFER_END", BatchLevel::First),
        ]
    );
    assert!(seen.iter().all(|s| !s.2), "PPGTT batches are unprivileged");
    assert_eq!(seen[4].3, b1 + 4 * (4 + 3));
}

#[test]
fn audit_walk_refuses_buffers_outside_the_slices() {
    let (m, ring) = world();
    // Slices that hold the ring but not the hidden-slice batches.
    let narrow = VgpuSlices {
        aperture: Slice::new(GgttOffset(0x0400_0000), 64 * MIB).unwrap(),
        hidden: Slice::new(GgttOffset(0x5000_0000), 64 * MIB).unwrap(),
    };
    let e = audit_walk(
        Gen::Gen9,
        Engine::Render,
        &m,
        ring,
        Budget::default(),
        &narrow,
    )
    .unwrap_err();
    assert!(matches!(e, WalkError::Audit { .. }), "{e}");
    // A ring outside the slices is refused before anything is read.
    let elsewhere = VgpuSlices {
        aperture: Slice::new(GgttOffset(0x0800_0000), 64 * MIB).unwrap(),
        hidden: Slice::new(GgttOffset(0x4000_0000), 384 * MIB).unwrap(),
    };
    let e = audit_walk(
        Gen::Gen9,
        Engine::Render,
        &m,
        ring,
        Budget::default(),
        &elsewhere,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            WalkError::Audit {
                addr: 0x0400_0000,
                ..
            }
        ),
        "{e}"
    );
}

/// Memory whose 4th write fails (and only that one).
struct OnceFailing {
    inner: PageMemory,
    writes: usize,
}

impl GpuMemory for OnceFailing {
    fn read(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), gmig_cmdparser::MemoryError> {
        self.inner.read(space, addr, out)
    }
}

impl gmig_cmdparser::GpuMemoryMut for OnceFailing {
    fn write(
        &mut self,
        space: AddressSpace,
        addr: u64,
        data: &[u8],
    ) -> Result<(), gmig_cmdparser::MemoryError> {
        self.writes += 1;
        if self.writes == 4 {
            return Err(gmig_cmdparser::MemoryError::Denied { space, addr });
        }
        self.inner.write(space, addr, data)
    }
}

#[test]
fn remap_walk_undoes_partial_writes() {
    let (orig, ring) = world();
    let mut m = OnceFailing {
        inner: orig.clone(),
        writes: 0,
    };
    let e = remap_walk(
        Gen::Gen9,
        Engine::Render,
        &mut m,
        ring,
        Budget::default(),
        &mv(),
    )
    .unwrap_err();
    assert!(matches!(e, WalkError::Memory(_)), "{e}");
    assert!(
        m.writes > 4,
        "the three writes before the failure were undone"
    );
    assert_eq!(m.inner, orig);
}

/// Memory that refuses every read touching `denied` (and otherwise reads `inner`).
struct Holey {
    inner: PageMemory,
    denied: std::ops::Range<u64>,
}

impl GpuMemory for Holey {
    fn read(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), gmig_cmdparser::MemoryError> {
        let end = addr + out.len() as u64;
        if addr < self.denied.end && self.denied.start < end {
            return Err(gmig_cmdparser::MemoryError::Denied { space, addr });
        }
        self.inner.read(space, addr, out)
    }
}

#[test]
fn a_batch_in_a_page_that_cannot_be_read_whole_is_read_piecemeal() {
    let batch = [
        build::mi_noop(),
        build::mi_noop(),
        build::mi_noop(),
        build::mi_batch_buffer_end(),
    ]
    .concat();
    let walk_at = |at: u64| {
        let mut inner = PageMemory::new();
        inner.put_dwords(GGTT, at, &batch).unwrap();
        // The page's second half cannot be read: the walker cannot cache the page.
        let mem = Holey {
            inner,
            denied: 0x1800..0x2000,
        };
        let mut names = Vec::new();
        let r = gmig_cmdparser::walk_batch(
            Gen::Gen9,
            Engine::Render,
            &mem,
            GGTT,
            at,
            BatchContext::first_level(GGTT),
            Budget::default(),
            &mut |w| {
                names.push(w.cmd.desc.name);
                Ok(())
            },
        );
        (r, names)
    };
    let (r, names) = walk_at(0x1000);
    assert_eq!(r.unwrap().commands, 4);
    assert_eq!(
        names,
        ["MI_NOOP", "MI_NOOP", "MI_NOOP", "MI_BATCH_BUFFER_END"]
    );
    // The end lies in the part that cannot be read: a memory error after the three no-ops.
    let (r, names) = walk_at(0x1800 - 12);
    assert!(matches!(r, Err(WalkError::Memory(_))), "{r:?}");
    assert_eq!(names, ["MI_NOOP", "MI_NOOP", "MI_NOOP"]);
}

/// A batch that chains to itself (IGT's spinner): a plain walk follows it until the budget
/// refuses it; `walk_looping` walks it once, counts the loop and goes on in the ring.
#[test]
fn walk_looping_walks_a_spinner_once_and_goes_on_in_the_ring() {
    use gmig_cmdparser::walk_looping;
    let mut m = PageMemory::new();
    for space in [GGTT, AddressSpace::Ppgtt] {
        m.map(space, 0x0400_0000, 0x3000).unwrap();
    }
    let batch = [0x0280_0000, 0x1880_0101, 0x0400_1000, 0];
    m.put_dwords(AddressSpace::Ppgtt, 0x0400_1000, &batch)
        .unwrap();
    let ring = [0x1880_0101, 0x0400_1000, 0, 0x0100_0000];
    m.put_dwords(GGTT, 0x0400_0000, &ring).unwrap();
    let span = RingSpan {
        start: GgttOffset(0x0400_0000),
        size: 0x1000,
        head: 0,
        tail: 16,
    };
    let budget = Budget {
        max_commands: 256,
        max_batch_bytes: 1 << 20,
        max_batches: 64,
    };
    let mut seen = Vec::new();
    let sum = walk_looping(Gen::Gen9, Engine::Render, &m, span, budget, &mut |w| {
        seen.push((w.ctx.level, w.cmd.desc.name));
        Ok(())
    })
    .unwrap();
    assert_eq!(sum.loops, 1);
    assert_eq!(
        seen,
        [
            (BatchLevel::Ring, "MI_BATCH_BUFFER_START"),
            (BatchLevel::First, "MI_ARB_CHECK"),
            (BatchLevel::First, "MI_BATCH_BUFFER_START"),
            (BatchLevel::Ring, "MI_USER_INTERRUPT"),
        ]
    );
    let r = walk(Gen::Gen9, Engine::Render, &m, span, budget, &mut |_| Ok(()));
    assert!(matches!(r, Err(WalkError::Budget { .. })), "{r:?}");
}

/// An X-tiled blit whose rows are wider than its pitch reaches into the tiles after each row of
/// tiles (the engine's addressing; found by the `vgpu_guest` fuzz target): the write set covers
/// them. 2048 pixels of 4 bytes at a 512-byte pitch: tiles 0..16, 64 KiB.
#[test]
fn a_tiled_blit_wider_than_its_pitch_names_every_tile_it_reaches() {
    let mut b = build::xy_color_blt(
        0x4000_0000,
        128,
        4,
        Rect {
            x1: 0,
            y1: 0,
            x2: 2048,
            y2: 8,
        },
        0x1234_5678,
    );
    b[0] |= 1 << 11;
    let d = Decoder::new(Gen::Gen9, Engine::Blitter, &b)
        .next()
        .unwrap()
        .unwrap();
    let u = d.addresses(&BatchContext::RING).next().unwrap();
    assert_eq!(u.start, 0x4000_0000);
    assert!(u.len >= 16 * 4096, "the write set names {:#x} bytes", u.len);
}
