//! Unit tests of the AUB reader, writer and capture.

use super::writer::header;
use crate::{Budget, Engine, Gen, GgttOffset, SliceMove};

use super::*;
use proptest::prelude::*;

fn sample(gen: Gen) -> AubCapture {
    let mut b = CaptureBuilder::new(gen, "gmig test");
    b.write_ggtt_dwords(GgttOffset(0x10_0000), &[0x0500_0000])
        .unwrap();
    b.write_ppgtt_dwords(0x7000_1000, &[0x1000_0000, 0x0500_0000])
        .unwrap();
    let ring = [0x1880_0101, 0x7000_1000, 0, 0];
    b.submit(
        Engine::Blitter,
        &RingSpec {
            ring: GgttOffset(0x20_0000),
            ring_size: 4096,
            commands: &ring,
            context: GgttOffset(0x30_0000),
        },
    )
    .unwrap();
    b.finish()
}

#[test]
fn round_trip_every_generation() {
    for gen in [Gen::Gen8, Gen::Gen9, Gen::Gen11] {
        let c = sample(gen);
        let bytes = c.to_bytes().unwrap();
        let back = AubCapture::parse(&bytes).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.to_bytes().unwrap(), bytes);
    }
}

#[test]
fn submission_reads_ring_from_context_image() {
    let c = sample(Gen::Gen9);
    let back = AubCapture::parse(&c.to_bytes().unwrap()).unwrap();
    let s = back.submissions[0];
    assert_eq!(s.engine, Engine::Blitter);
    assert_eq!(s.lrca, GgttOffset(0x30_0000));
    assert_eq!(
        s.ring,
        RingState {
            start: GgttOffset(0x20_0000),
            size: 4096,
            head: 0,
            tail: 16
        }
    );
    let ring = back.memory.read_ggtt_dwords(s.ring.start, 4).unwrap();
    assert_eq!(ring, vec![0x1880_0101, 0x7000_1000, 0, 0]);
    let mut batch = [0u8; 8];
    back.memory
        .read_ppgtt(s.pml4, 0x7000_1000, &mut batch)
        .unwrap();
    assert_eq!(dwords_of(&batch), vec![0x1000_0000, 0x0500_0000]);
}

#[test]
fn ggtt_write_goes_through_entries() {
    let mut w = AubWriter::new(Gen::Gen8, "x");
    w.memory_write(AubSpace::GgttEntry, 5 * 8, &(0x7000u64 | 1).to_le_bytes());
    w.memory_write(AubSpace::Ggtt, 5 * 4096 + 8, &[1, 2, 3, 4]);
    let c = AubCapture::parse(&w.finish()).unwrap();
    assert_eq!(c.gen, Some(Gen::Gen8));
    let mut out = [0u8; 4];
    c.memory.read_phys(0x7008, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
}

#[test]
fn unmapped_ggtt_write_is_refused_with_offset() {
    let mut w = AubWriter::new(Gen::Gen9, "x");
    let off = w.clone().finish().len();
    w.memory_write(AubSpace::Ggtt, 0x5000, &[1, 2, 3, 4]);
    let err = AubCapture::parse(&w.finish()).unwrap_err();
    assert_eq!(
        err,
        AubError::Memory {
            offset: off,
            fault: MemFault::GgttUnmapped { addr: 0x5000 }
        }
    );
}

#[test]
fn truncated_and_foreign_packets_are_refused() {
    let bytes = sample(Gen::Gen9).to_bytes().unwrap();
    let cut = bytes.len() - 4;
    assert!(matches!(
        AubCapture::parse(&bytes[..cut]),
        Err(AubError::Truncated { .. })
    ));
    assert!(matches!(
        AubCapture::parse(&bytes[..cut + 1]),
        Err(AubError::Truncated { .. })
    ));
    assert_eq!(
        AubCapture::parse(&[0, 0, 0, 0]),
        Err(AubError::NotAubPacket { offset: 0, dw0: 0 })
    );
    let legacy = (7u32 << 29 | 1 << 23 | 5 << 16).to_le_bytes();
    assert!(matches!(
        AubCapture::parse(&legacy),
        Err(AubError::LegacyPacket { offset: 0, .. })
    ));
}

#[test]
fn harmless_packets_are_skipped_and_discontiguous_writes_refused() {
    let base = AubWriter::new(Gen::Gen9, "x").finish();
    let packet = |sub: u32| {
        let mut b = base.clone();
        b.extend_from_slice(&header(sub, 3).to_le_bytes());
        b.extend_from_slice(&[0x41; 8]);
        b
    };
    let bytes = packet(subop::COMMENT);
    let mut r = AubReader::new(&bytes);
    assert!(matches!(r.next_event(), Ok(Some(AubEvent::Version { .. }))));
    assert_eq!(
        r.next_event(),
        Ok(Some(AubEvent::Skipped {
            offset: base.len(),
            dw0: header(subop::COMMENT, 3)
        }))
    );
    assert_eq!(r.next_event(), Ok(None));
    assert_eq!(
        AubCapture::parse(&packet(0x0b)),
        Err(AubError::UnsupportedPacket {
            offset: base.len(),
            dw0: header(0x0b, 3)
        })
    );
}

#[test]
fn page_limit_bounds_memory() {
    let mut w = AubWriter::new(Gen::Gen9, "x");
    for p in 0..10u64 {
        w.memory_write(AubSpace::Physical, p * 4096, &[1, 0, 0, 0]);
    }
    let bytes = w.finish();
    let limits = ReadLimits {
        max_pages: 4,
        ..ReadLimits::default()
    };
    let err = AubCapture::parse_with_limits(&bytes, limits).unwrap_err();
    assert!(matches!(
        err,
        AubError::Memory {
            fault: MemFault::PageLimit { limit: 4 },
            ..
        }
    ));
}

#[test]
fn gen11_elsq_and_gen8_elsp_both_submit() {
    for gen in [Gen::Gen8, Gen::Gen11] {
        let c = sample(gen);
        let bytes = c.to_bytes().unwrap();
        let mut r = AubReader::new(&bytes);
        let mut submits = 0;
        while let Some(ev) = r.next_event().unwrap() {
            if let AubEvent::Submit { submission, .. } = ev {
                assert_eq!(submission.engine, Engine::Blitter);
                submits += 1;
            }
        }
        assert_eq!(submits, 1);
        // The execlist-port writes do not show up as plain registers.
        assert!(!r
            .capture()
            .registers
            .keys()
            .any(|&k| k == 0x2_2230 || k == 0x2_2550));
    }
}

/// A capture laid out the way Mesa's `intel_dump_gpu` lays one out: GGTT entries for ring,
/// PPHWSP and context; PPGTT page tables and the batch written as physical memory; the ring
/// holding a non-privileged MI_BATCH_BUFFER_START; ELSP writes and a status poll.
#[test]
fn mesa_style_capture_decodes() {
    let mut w = AubWriter::new(Gen::Gen9, "PCI-ID=0x1912 glxgears");
    let pte = |phys: u64| (phys | 1).to_le_bytes();
    // GGTT: entry 0 (dummy), then ring (1 page), PPHWSP and context (2 pages) at GGTT 0x1000...
    w.memory_write(AubSpace::GgttEntry, 0, &pte(0x1_0000));
    let mut entries = Vec::new();
    for i in 0..3u64 {
        entries.extend_from_slice(&pte(0x2_0000 + i * 0x1000));
    }
    w.memory_write(AubSpace::GgttEntry, 8, &entries);
    for e in [0x2000u32, 0x1_2000, 0x2_2000] {
        w.register_write(e + reg::GFX_MODE, 0x8000_8000);
    }
    // PPGTT: PML4 at phys 0, tables at 0x5000.., batch page at 0x8000, for VA 0x1_0000_0000.
    let va = 0x1_0000_0000u64;
    w.memory_write(
        AubSpace::Physical,
        ((va >> 39) & 0x1ff) * 8,
        &(0x5000u64 | 3).to_le_bytes(),
    );
    w.memory_write(
        AubSpace::Physical,
        0x5000 + ((va >> 30) & 0x1ff) * 8,
        &(0x6000u64 | 3).to_le_bytes(),
    );
    w.memory_write(
        AubSpace::Physical,
        0x6000 + ((va >> 21) & 0x1ff) * 8,
        &(0x7000u64 | 3).to_le_bytes(),
    );
    w.memory_write(
        AubSpace::Physical,
        0x7000 + ((va >> 12) & 0x1ff) * 8,
        &(0x8000u64 | 3).to_le_bytes(),
    );
    let batch = bytes_of(&[0x1000_0002, 0x20_0000, 0, 7, cmd::MI_BATCH_BUFFER_END]);
    w.memory_write(AubSpace::Physical, 0x8000, &batch);
    // Ring, PPHWSP and context through the GGTT.
    let (ring, lrca) = (0x1000u64, 0x2000u64);
    w.memory_write(AubSpace::Ggtt, ring, &[0; 4096]);
    let mut ctx_img = vec![0u32; 1024 + 64];
    ctx_img[1024 + 9] = ring as u32;
    ctx_img[1024 + 11] = 1;
    w.memory_write(AubSpace::Ggtt, lrca, &bytes_of(&ctx_img));
    w.memory_write(
        AubSpace::Ggtt,
        ring,
        &bytes_of(&[0x1880_0101, va as u32, (va >> 32) as u32, 0]),
    );
    w.memory_write(AubSpace::Ggtt, lrca + 4096 + 20, &0u32.to_le_bytes());
    w.memory_write(AubSpace::Ggtt, lrca + 4096 + 28, &16u32.to_le_bytes());
    w.register_write(0x2000 + reg::HWS_PGA, 0x4000);
    w.submit(Gen::Gen9, Engine::Render, lrca | DESCRIPTOR_FLAGS);
    let bytes = w.finish();

    let c = AubCapture::parse(&bytes).unwrap();
    assert_eq!(c.gen, Some(Gen::Gen9));
    assert_eq!(c.app_name, "PCI-ID=0x1912 glxgears");
    assert_eq!(c.submissions.len(), 1);
    let s = c.submissions[0];
    assert_eq!(
        s.ring,
        RingState {
            start: GgttOffset(ring),
            size: 4096,
            head: 0,
            tail: 16
        }
    );
    assert_eq!(s.pml4, 0);
    let items = listing::list_capture(&bytes, None, listing::LISTING_BUDGET);
    let names: Vec<&str> = items
        .iter()
        .filter_map(|i| match i {
            listing::ListingItem::Command(c) => Some(c.name),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        [
            "MI_BATCH_BUFFER_START",
            "MI_STORE_DATA_IMM",
            "MI_BATCH_BUFFER_END",
            "MI_NOOP"
        ]
    );
    let text = listing::to_text(&items);
    assert!(
        text.contains("ppgtt 0x000100000000  batch1 +0x0000  MI_STORE_DATA_IMM"),
        "{text}"
    );
    // Our writer's canonical form of it reads back as the same capture.
    assert_eq!(AubCapture::parse(&c.to_bytes().unwrap()).unwrap(), c);
}

fn fixture_move() -> SliceMove {
    fixture::Manifest::parse(&fixture::specs()[0].manifest().to_text())
        .unwrap()
        .slice_move()
        .unwrap()
}

#[test]
fn migrate_there_and_back_restores_every_fixture_byte_for_byte() {
    let mv = fixture_move();
    let mut n = 0;
    for spec in fixture::specs() {
        if spec.expect != fixture::Expect::Remap {
            continue;
        }
        let bytes = spec.capture().unwrap();
        let c = AubCapture::parse(&bytes).unwrap();
        let moved = c.migrate(&mv, fixture::REPLAY_BUDGET).unwrap();
        assert_ne!(moved.to_bytes().unwrap(), bytes, "{}", spec.name);
        let back = moved
            .migrate(&mv.inverse(), fixture::REPLAY_BUDGET)
            .unwrap();
        assert_eq!(back.to_bytes().unwrap(), bytes, "{}", spec.name);
        n += 1;
    }
    assert!(n >= 10);
}

#[test]
fn migrate_moves_entries_rings_and_contexts_but_not_ppgtt() {
    let mv = fixture_move();
    let mut b = CaptureBuilder::new(Gen::Gen11, "m");
    b.write_ppgtt_dwords(0x7000_0000, &[cmd::MI_BATCH_BUFFER_END])
        .unwrap();
    let ring = cmd::bb_start(0x7000_0000, true, false);
    let spec = RingSpec {
        ring: GgttOffset(0x0400_0000),
        ring_size: 4096,
        commands: &ring,
        context: GgttOffset(0x4000_0000),
    };
    b.submit(Engine::Video, &spec).unwrap();
    let c = b.finish();
    let m = c.migrate(&mv, Budget::default()).unwrap();
    let (s0, s1) = (c.submissions[0], m.submissions[0]);
    assert_eq!(s1.lrca, GgttOffset(0x6000_0000));
    assert_eq!(s1.ring.start, GgttOffset(0x0800_0000));
    assert_eq!(
        s1.descriptor & !DESCRIPTOR_LRCA_MASK,
        s0.descriptor & !DESCRIPTOR_LRCA_MASK
    );
    assert_eq!(m.memory.ggtt_entry_count(), c.memory.ggtt_entry_count());
    assert_eq!(
        m.memory.ggtt_entry(0x0800_0000 / 4096),
        c.memory.ggtt_entry(0x0400_0000 / 4096)
    );
    assert_eq!(m.memory.ggtt_entry(0x0400_0000 / 4096), None);
    // The ring's BB_START names a PPGTT batch: same bytes before and after.
    assert_eq!(
        m.memory.read_ggtt_dwords(s1.ring.start, 3).unwrap(),
        c.memory.read_ggtt_dwords(s0.ring.start, 3).unwrap()
    );
    assert_eq!(s1.pml4, s0.pml4);
}

#[test]
fn migrate_refuses_what_it_cannot_rebase_and_changes_nothing() {
    let mv = fixture_move();
    let mut b = CaptureBuilder::new(Gen::Gen8, "m");
    let ring = [cmd::MI_NOOP, cmd::MI_NOOP];
    // A context outside both slices.
    let spec = RingSpec {
        ring: GgttOffset(0x0400_0000),
        ring_size: 4096,
        commands: &ring,
        context: GgttOffset(0x10_0000),
    };
    b.submit(Engine::Render, &spec).unwrap();
    let c = b.finish();
    let before = c.clone();
    assert_eq!(
        c.migrate(&mv, Budget::default()),
        Err(AubError::NotInSlice {
            what: "context",
            addr: 0x10_0000
        })
    );
    assert_eq!(c, before);
    // A batch writing outside the slices: the walk's remap refuses.
    let mut b = CaptureBuilder::new(Gen::Gen8, "m");
    b.write_ggtt_dwords(
        GgttOffset(0x0401_0000),
        &cmd::store_data_imm(0x2000_0000, true, 1),
    )
    .unwrap();
    let ring = cmd::bb_start(0x0401_0000, false, false);
    let spec = RingSpec {
        ring: GgttOffset(0x0400_0000),
        ring_size: 4096,
        commands: &ring,
        context: GgttOffset(0x0400_1000),
    };
    b.submit(Engine::Render, &spec).unwrap();
    let c = b.finish();
    assert!(matches!(
        c.migrate(&mv, Budget::default()),
        Err(AubError::Walk { submission: 0, .. })
    ));
}

#[derive(Clone, Debug)]
enum Op {
    Ggtt(u64, Vec<u32>),
    Ppgtt(u64, Vec<u32>),
    Reg(u32, u32),
    Submit(u8, u64, Vec<u32>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..0x400, prop::collection::vec(any::<u32>(), 0..300))
            .prop_map(|(p, d)| Op::Ggtt(p * 256, d)),
        (0u64..(1 << 24), prop::collection::vec(any::<u32>(), 0..300))
            .prop_map(|(p, d)| Op::Ppgtt(p * 4096 + 0x40, d)),
        (0u32..0x2_0000, any::<u32>()).prop_map(|(r, v)| Op::Reg(r * 4 + 0x4_0000, v)),
        (
            0u8..4,
            0u64..0x100,
            prop::collection::vec(any::<u32>(), 0..64)
        )
            .prop_map(|(e, c, d)| Op::Submit(e, c, d)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let mut r = AubReader::new(&bytes);
        let mut n = 0;
        while let Ok(Some(_)) = r.next_event() {
            n += 1;
            prop_assert!(n <= bytes.len());
        }
        prop_assert_eq!(r.next_event(), Ok(None));
    }

    #[test]
    fn packet_shaped_garbage_never_panics(
        packets in prop::collection::vec(
            (0u32..0x12, prop::collection::vec(any::<u32>(), 0..12), any::<bool>()), 0..24)
    ) {
        let mut bytes = Vec::new();
        for (sub, body, honest) in packets {
            let len = if honest { body.len() as u32 } else { body.first().copied().unwrap_or(0) & 0xffff };
            bytes.extend_from_slice(&((7u32 << 29) | (0x2e << 23) | (sub << 16) | len).to_le_bytes());
            for d in body {
                bytes.extend_from_slice(&d.to_le_bytes());
            }
        }
        let limits = ReadLimits { max_pages: 64, max_submissions: 8, max_registers: 8 };
        let _ = AubCapture::parse_with_limits(&bytes, limits);
    }

    #[test]
    fn mutated_captures_never_panic(
        which in 0usize..64,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let specs = fixture::specs();
        let spec = specs[which % specs.len()];
        let mut bytes = spec.capture().unwrap();
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x | 1;
        }
        let small = Budget { max_commands: 512, max_batch_bytes: 1 << 16, max_batches: 8 };
        let _ = listing::list_capture(&bytes, None, small);
        let limits = ReadLimits { max_pages: 256, max_submissions: 16, max_registers: 64 };
        if let Ok(c) = AubCapture::parse_with_limits(&bytes, limits) {
            let _ = c.migrate(&fixture_move(), small);
            let _ = c.to_bytes();
        }
    }

    #[test]
    fn migrate_round_trips_and_passes_destination_audit(
        gen_i in 0usize..3,
        cmds in prop::collection::vec((0u8..3, any::<bool>(), 0u64..0x10_0000), 1..16),
    ) {
        let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][gen_i];
        let mv = fixture_move();
        let mut batch = Vec::new();
        for (kind, hidden, off) in cmds {
            let slice = if hidden { mv.from.hidden } else { mv.from.aperture };
            let addr = slice.base.0 + 0x10_0000 + off * 8;
            match kind {
                0 => batch.extend(cmd::store_data_imm(addr, true, off as u32)),
                1 => batch.extend(cmd::xy_color_blt(addr, 64, 16, 4, 0)),
                _ => batch.extend(cmd::flush_dw_write(addr, true, off)),
            }
        }
        batch.push(cmd::MI_BATCH_BUFFER_END);
        let mut b = CaptureBuilder::new(gen, "prop");
        b.write_ggtt_dwords(GgttOffset(0x0401_0000), &batch).unwrap();
        let ring = cmd::bb_start(0x0401_0000, false, false);
        let spec = RingSpec { ring: GgttOffset(0x0400_0000), ring_size: 4096, commands: &ring, context: GgttOffset(0x0400_1000) };
        b.submit(Engine::Blitter, &spec).unwrap();
        let c = b.finish();
        let m = c.migrate(&mv, Budget::default()).unwrap();
        for s in &m.submissions {
            crate::audit_walk(gen, s.engine, &s.memory(&m.memory), s.ring_span(), Budget::default(), &mv.to).unwrap();
        }
        prop_assert_ne!(&m, &c);
        prop_assert_eq!(m.migrate(&mv.inverse(), Budget::default()).unwrap(), c);
    }

    #[test]
    fn write_read_round_trip(gen_i in 0usize..3, ops in prop::collection::vec(op(), 0..12)) {
        let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][gen_i];
        let mut b = CaptureBuilder::new(gen, "proptest");
        let mut used = std::collections::BTreeSet::new();
        for op in ops {
            match op {
                Op::Ggtt(a, d) => b.write_ggtt_dwords(GgttOffset(0x100_0000 + a), &d).unwrap(),
                Op::Ppgtt(a, d) => b.write_ppgtt_dwords(a, &d).unwrap(),
                Op::Reg(r, v) => b.set_register(r, v),
                Op::Submit(e, c, d) => {
                    if !used.insert(c) {
                        continue;
                    }
                    let engine = [Engine::Render, Engine::Blitter, Engine::Video, Engine::VideoEnhance][usize::from(e)];
                    let spec = RingSpec {
                        ring: GgttOffset(0x800_0000 + c * 0x3000),
                        ring_size: 4096,
                        commands: &d,
                        context: GgttOffset(0x800_0000 + c * 0x3000 + 0x1000),
                    };
                    b.submit(engine, &spec).unwrap();
                }
            }
        }
        let c = b.finish();
        let bytes = c.to_bytes().unwrap();
        let back = AubCapture::parse(&bytes).unwrap();
        prop_assert_eq!(&back, &c);
        prop_assert_eq!(back.to_bytes().unwrap(), bytes);
    }
}
