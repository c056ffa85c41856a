//! The migration stream format: round trips, and every way a stream can be refused.

use std::io::{self, Read};

use gmig_core::stream::{
    load, Compatibility, Control, FrameRange, Gfn, GpuGeneration, PageBatch, PageData, Section,
    StateKind, StreamError, StreamHeader, StreamLimits, StreamReader, StreamWriter, VgpuTypeId,
    FORMAT_MINOR, HEADER_LEN, KIND_END, KIND_PAGES, KIND_SYNC, KIND_WRITABLE_FRAMES,
    MAX_FRAME_RANGES_PER_SECTION, MAX_PAGES_PER_BATCH, PAGE_SIZE, SECTION_HEADER_LEN,
};
use proptest::prelude::*;

const TYPE_SMALL: VgpuTypeId = VgpuTypeId {
    aperture_mib: 64,
    hidden_mib: 384,
};

fn header() -> StreamHeader {
    StreamHeader::new(
        GpuGeneration::Gen9,
        TYPE_SMALL,
        0x0800_0000,
        0x1_0000_0000,
        1024,
    )
}

fn compat() -> Compatibility {
    Compatibility {
        generation: GpuGeneration::Gen9,
        vgpu_type: TYPE_SMALL,
    }
}

fn page(fill: u8) -> [u8; PAGE_SIZE] {
    let mut p = [fill; PAGE_SIZE];
    p[17] = fill.wrapping_add(1);
    p
}

/// A small but complete stream: two page batches (full and zero pages), all six state sections.
fn recorded() -> Vec<u8> {
    let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
    let mut b = PageBatch::new();
    assert!(b.push(Gfn(3), &page(0xaa)));
    assert!(b.push(Gfn(4), &[0; PAGE_SIZE]));
    assert!(b.push(Gfn(1023), &page(0x55)));
    w.write_pages(&b).unwrap();
    let mut b2 = PageBatch::new();
    b2.push(Gfn(0), &[0; PAGE_SIZE]);
    b2.push(Gfn(3), &page(0x11));
    w.write_pages(&b2).unwrap();
    for (i, kind) in StateKind::ALL.into_iter().enumerate() {
        let payload: Vec<u8> = (0..(i * 7 + 3)).map(|x| (x * 31 + i) as u8).collect();
        w.write_state(kind, &payload).unwrap();
    }
    let (bytes, summary) = w.finish().unwrap();
    assert_eq!(summary.pages, 5);
    assert_eq!(summary.zero_pages, 2);
    assert_eq!(summary.sections, 8);
    assert_eq!(summary.bytes, bytes.len() as u64);
    bytes
}

#[test]
fn round_trip_preserves_every_page_and_section() {
    let bytes = recorded();
    let loaded = load(&bytes[..], StreamLimits::default(), Some(&compat())).unwrap();
    assert_eq!(loaded.header, header());
    assert_eq!(loaded.summary.pages, 5);
    assert_eq!(loaded.summary.bytes, bytes.len() as u64);
    let pages: Vec<(Gfn, Option<u8>)> = loaded
        .batches
        .iter()
        .flat_map(PageBatch::iter)
        .map(|(g, d)| match d {
            PageData::Zero => (g, None),
            PageData::Full(p) => {
                assert_eq!(p[17], p[0].wrapping_add(1));
                (g, Some(p[0]))
            }
        })
        .collect();
    assert_eq!(
        pages,
        vec![
            (Gfn(3), Some(0xaa)),
            (Gfn(4), None),
            (Gfn(1023), Some(0x55)),
            (Gfn(0), None),
            (Gfn(3), Some(0x11)),
        ]
    );
    let kinds: Vec<StateKind> = loaded.states.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, StateKind::ALL.to_vec());
    assert_eq!(loaded.states[2].1.len(), 2 * 7 + 3);
}

/// The checksums are computed once per payload and combined; what lands on the wire must still
/// be the plain CRC-32s the format defines, checked here with an independent computation.
#[test]
fn every_checksum_the_writer_stores_is_a_plain_crc32_of_its_bytes() {
    let bytes = recorded();
    let mut at = HEADER_LEN;
    let mut sections = 0;
    loop {
        let head = &bytes[at..at + SECTION_HEADER_LEN];
        let kind = u16::from_le_bytes([head[0], head[1]]);
        let len = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        let stored = u32::from_le_bytes(head[12..16].try_into().unwrap());
        let payload = &bytes[at + SECTION_HEADER_LEN..at + SECTION_HEADER_LEN + len];
        let mut h = crc32fast::Hasher::new();
        h.update(&head[..12]);
        h.update(payload);
        assert_eq!(stored, h.finalize(), "section {sections} (kind {kind})");
        sections += 1;
        if kind == KIND_END {
            let stream_crc = u32::from_le_bytes(payload[16..20].try_into().unwrap());
            assert_eq!(
                stream_crc,
                crc32fast::hash(&bytes[..at]),
                "END's stream checksum"
            );
            assert_eq!(at + SECTION_HEADER_LEN + len, bytes.len());
            break;
        }
        at += SECTION_HEADER_LEN + len;
    }
    assert_eq!(sections, 9);
}

#[test]
fn a_page_filled_in_place_is_encoded_as_a_pushed_one() {
    let mut pushed = PageBatch::new();
    let mut filled = PageBatch::new();
    for (gfn, p) in [(7u64, page(0x42)), (8, [0; PAGE_SIZE]), (9, page(0))] {
        assert!(pushed.push(Gfn(gfn), &p));
        let r: Result<bool, ()> = filled.push_from(Gfn(gfn), |dst| {
            dst.copy_from_slice(&p);
            Ok(())
        });
        assert_eq!(r, Ok(true));
    }
    assert_eq!(filled, pushed);
    assert_eq!(filled.zero_pages(), 1);

    // A fill that fails leaves the batch as it was.
    let before = filled.clone();
    let r = filled.push_from(Gfn(10), |dst| {
        dst[0] = 1;
        Err("unreadable")
    });
    assert_eq!(r, Err("unreadable"));
    assert_eq!(filled, before);

    // A full batch takes nothing and does not call the fill.
    let mut full = PageBatch::new();
    while full.push(Gfn(1), &[0; PAGE_SIZE]) {}
    let r: Result<bool, ()> = full.push_from(Gfn(2), |_| panic!("filled a full batch"));
    assert_eq!(r, Ok(false));
}

#[test]
fn zero_pages_travel_as_markers() {
    let mut b = PageBatch::new();
    b.push(Gfn(1), &[0; PAGE_SIZE]);
    assert_eq!(b.payload_len(), 8 + 16);
    b.push(Gfn(2), &page(1));
    assert_eq!(b.payload_len(), 8 + 16 + 16 + PAGE_SIZE);
    assert_eq!(b.zero_pages(), 1);
}

#[test]
fn batch_refuses_more_than_its_maximum() {
    let mut b = PageBatch::new();
    for i in 0..MAX_PAGES_PER_BATCH {
        assert!(b.push(Gfn(u64::from(i)), &[0; PAGE_SIZE]));
    }
    assert!(b.is_full());
    assert!(!b.push(Gfn(0), &[0; PAGE_SIZE]));
    b.clear();
    assert!(b.is_empty());
    assert_eq!(b.iter().count(), 0);
}

#[test]
fn bad_magic_is_refused() {
    let mut bytes = recorded();
    bytes[0] = b'X';
    let err = load(&bytes[..], StreamLimits::default(), None).unwrap_err();
    assert!(
        matches!(err, StreamError::BadMagic { found } if found[0] == b'X'),
        "{err}"
    );
}

#[test]
fn bad_header_crc_is_refused() {
    let mut bytes = recorded();
    bytes[30] ^= 0x40; // inside the hidden base
    let err = load(&bytes[..], StreamLimits::default(), None).unwrap_err();
    assert!(matches!(err, StreamError::HeaderChecksum { .. }), "{err}");
}

fn rewrite_header(bytes: &mut [u8], edit: impl FnOnce(&mut [u8])) {
    edit(&mut bytes[..HEADER_LEN]);
    let crc = crc32fast::hash(&bytes[..HEADER_LEN - 4]);
    bytes[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn newer_minor_and_other_major_versions_are_refused() {
    let mut newer = recorded();
    rewrite_header(&mut newer, |h| h[10] = FORMAT_MINOR as u8 + 1);
    let err = load(&newer[..], StreamLimits::default(), None).unwrap_err();
    assert_eq!(
        err,
        StreamError::UnsupportedVersion {
            major: 1,
            minor: FORMAT_MINOR + 1
        }
    );
    assert!(
        err.to_string().contains(&format!("1.{}", FORMAT_MINOR + 1)),
        "{err}"
    );

    // A format-1.0 stream (before SYNC and the GGTT update) is still read.
    let mut older = recorded();
    rewrite_header(&mut older, |h| h[10] = 0);
    assert_eq!(
        load(&older[..], StreamLimits::default(), None)
            .unwrap()
            .header
            .format_minor,
        0
    );

    let mut major = recorded();
    rewrite_header(&mut major, |h| {
        h[8] = 2;
        h[10] = 0;
    });
    let err = load(&major[..], StreamLimits::default(), None).unwrap_err();
    assert_eq!(err, StreamError::UnsupportedVersion { major: 2, minor: 0 });
}

#[test]
fn incompatible_generation_and_type_are_refused_clearly() {
    let bytes = recorded();
    let gen11 = Compatibility {
        generation: GpuGeneration::Gen11,
        ..compat()
    };
    let err = load(&bytes[..], StreamLimits::default(), Some(&gen11)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "incompatible GPU generation: stream is GEN9, this destination is GEN11"
    );

    let big = Compatibility {
        vgpu_type: VgpuTypeId {
            aperture_mib: 128,
            hidden_mib: 512,
        },
        ..compat()
    };
    let err = load(&bytes[..], StreamLimits::default(), Some(&big)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "incompatible vGPU type: stream is 64+384 MiB, this destination expects 128+512 MiB"
    );

    let mut unknown_gen = recorded();
    rewrite_header(&mut unknown_gen, |h| h[12] = 10);
    let err = load(&unknown_gen[..], StreamLimits::default(), None).unwrap_err();
    assert_eq!(err, StreamError::UnknownGeneration { value: 10 });
}

#[test]
fn guest_size_beyond_the_limit_is_refused() {
    let bytes = recorded();
    let limits = StreamLimits {
        max_guest_pages: 1000,
        ..StreamLimits::default()
    };
    let err = load(&bytes[..], limits, None).unwrap_err();
    assert!(
        matches!(
            err,
            StreamError::BadHeaderField {
                field: "guest_pages",
                value: 1024,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn every_truncation_is_refused() {
    let bytes = recorded();
    for cut in 0..bytes.len() {
        let err = load(&bytes[..cut], StreamLimits::default(), None)
            .expect_err("a truncated stream must not load");
        assert!(
            matches!(err, StreamError::Truncated { .. }),
            "cut {cut}: {err}"
        );
    }
}

struct FailingReader<'a> {
    data: &'a [u8],
    fail_at: usize,
    pos: usize,
}

impl Read for FailingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.fail_at {
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "link down"));
        }
        let n = buf
            .len()
            .min(self.fail_at - self.pos)
            .min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn failing_reader_gives_an_io_error_with_its_offset() {
    let bytes = recorded();
    for fail_at in [
        0,
        10,
        HEADER_LEN,
        HEADER_LEN + 5,
        HEADER_LEN + 100,
        bytes.len() - 1,
    ] {
        let r = FailingReader {
            data: &bytes,
            fail_at,
            pos: 0,
        };
        let err = load(r, StreamLimits::default(), None).unwrap_err();
        assert_eq!(
            err,
            StreamError::Io {
                offset: fail_at as u64,
                kind: io::ErrorKind::ConnectionReset
            }
        );
    }
}

fn raw_section(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&kind.to_le_bytes());
    s.extend_from_slice(&1u16.to_le_bytes());
    s.extend_from_slice(&0u32.to_le_bytes());
    s.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&s);
    h.update(payload);
    s.extend_from_slice(&h.finalize().to_le_bytes());
    s.extend_from_slice(payload);
    s
}

fn stream_with(section: &[u8]) -> Vec<u8> {
    let mut bytes = header().to_bytes().to_vec();
    bytes.extend_from_slice(section);
    bytes
}

fn first_error(bytes: &[u8], limits: StreamLimits) -> StreamError {
    let mut r = StreamReader::open(bytes, limits, None).unwrap();
    loop {
        match r.next_section() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("stream ended without error"),
            Err(e) => {
                assert_eq!(
                    r.next_section(),
                    Ok(None),
                    "reader must stay empty after an error"
                );
                return e;
            }
        }
    }
}

#[test]
fn oversized_section_is_refused_before_allocation() {
    let mut sec = raw_section(KIND_PAGES, &[]);
    sec[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = first_error(&stream_with(&sec), StreamLimits::default());
    assert!(
        matches!(err, StreamError::SectionTooLarge { len: u32::MAX, .. }),
        "{err}"
    );
}

#[test]
fn total_size_cap_stops_the_load() {
    let bytes = recorded();
    let limits = StreamLimits {
        max_stream_bytes: 4096,
        ..StreamLimits::default()
    };
    let err = load(&bytes[..], limits, None).unwrap_err();
    assert!(
        matches!(err, StreamError::StreamTooLarge { limit: 4096, .. }),
        "{err}"
    );
}

fn batch_payload(records: &[(u64, u32, usize)]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&(records.len() as u32).to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    for &(gfn, enc, data) in records {
        p.extend_from_slice(&gfn.to_le_bytes());
        p.extend_from_slice(&enc.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend(std::iter::repeat_n(7u8, data));
    }
    p
}

#[test]
fn malformed_page_batches_are_refused_even_with_valid_checksums() {
    let out_of_range = raw_section(KIND_PAGES, &batch_payload(&[(1024, 0, PAGE_SIZE)]));
    let err = first_error(&stream_with(&out_of_range), StreamLimits::default());
    assert!(
        matches!(
            err,
            StreamError::PageOutOfRange {
                gfn: 1024,
                pages: 1024,
                ..
            }
        ),
        "{err}"
    );

    let bad_enc = raw_section(KIND_PAGES, &batch_payload(&[(1, 9, 0)]));
    let err = first_error(&stream_with(&bad_enc), StreamLimits::default());
    assert!(
        matches!(err, StreamError::BadPageEncoding { encoding: 9, .. }),
        "{err}"
    );

    let short = raw_section(KIND_PAGES, &batch_payload(&[(1, 0, 100)]));
    let err = first_error(&stream_with(&short), StreamLimits::default());
    assert!(matches!(err, StreamError::BadPageBatch { .. }), "{err}");

    let trailing = raw_section(KIND_PAGES, &batch_payload(&[(1, 1, 3)]));
    let err = first_error(&stream_with(&trailing), StreamLimits::default());
    assert!(matches!(err, StreamError::BadPageBatch { .. }), "{err}");

    let empty = raw_section(KIND_PAGES, &batch_payload(&[]));
    let err = first_error(&stream_with(&empty), StreamLimits::default());
    assert!(
        matches!(
            err,
            StreamError::BadPageBatch {
                reason: "empty batch",
                ..
            }
        ),
        "{err}"
    );

    let unknown = raw_section(99, &[1, 2, 3]);
    let err = first_error(&stream_with(&unknown), StreamLimits::default());
    assert!(
        matches!(
            err,
            StreamError::UnknownSection {
                kind: 99,
                offset: 64
            }
        ),
        "{err}"
    );
}

#[test]
fn duplicate_state_and_missing_state_are_refused() {
    let mut s = raw_section(StateKind::Registers as u16, &[1]);
    s.extend(raw_section(StateKind::Registers as u16, &[2]));
    let err = first_error(&stream_with(&s), StreamLimits::default());
    assert!(
        matches!(err, StreamError::DuplicateSection { kind: 2, .. }),
        "{err}"
    );

    let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
    w.write_state(StateKind::DeviceConfig, &[1]).unwrap();
    assert!(matches!(
        w.write_state(StateKind::DeviceConfig, &[1]),
        Err(StreamError::DuplicateSection { .. })
    ));
    assert!(matches!(
        w.finish(),
        Err(StreamError::MissingSection { kind: 2, .. })
    ));
}

/// A format-1.1 stream as a source with pre-copy state writes it: the GGTT and a SYNC among the
/// pre-copy pages, the GGTT update with the rest of the state at the stop.
fn recorded_with_precopy_state() -> Vec<u8> {
    let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
    w.write_state(StateKind::Ggtt, &[1, 2, 3]).unwrap();
    let mut b = PageBatch::new();
    b.push(Gfn(7), &page(0x77));
    w.write_pages(&b).unwrap();
    w.write_sync(1).unwrap();
    for kind in StateKind::ALL {
        if kind == StateKind::Ggtt {
            w.write_state(StateKind::GgttUpdate, &[9]).unwrap();
        } else {
            w.write_state(kind, &[kind as u8]).unwrap();
        }
    }
    let (bytes, summary) = w.finish().unwrap();
    // GGTT, the batch, SYNC, five state sections and the update.
    assert_eq!(summary.sections, 9);
    bytes
}

#[test]
fn precopy_state_and_sync_round_trip() {
    let bytes = recorded_with_precopy_state();
    let loaded = load(&bytes[..], StreamLimits::default(), Some(&compat())).unwrap();
    let kinds: Vec<StateKind> = loaded.states.iter().map(|(k, _)| *k).collect();
    let mut want = StateKind::ALL.to_vec();
    want.push(StateKind::GgttUpdate);
    assert_eq!(kinds, want);
    let mut r = StreamReader::open(&bytes[..], StreamLimits::default(), None).unwrap();
    let mut order = Vec::new();
    while let Some(s) = r.next_section().unwrap() {
        order.push(match s {
            Section::State { kind, .. } => format!("{kind:?}"),
            Section::Pages(_) => "pages".into(),
            Section::Sync(seq) => format!("sync {seq}"),
            Section::WritableFrames(runs) => format!("writable {}", runs.len()),
            Section::End(_) => "end".into(),
        });
    }
    assert_eq!(order[..3], ["Ggtt", "pages", "sync 1"]);
    assert_eq!(order.last().map(String::as_str), Some("end"));
}

#[test]
fn an_update_before_its_section_is_refused_by_reader_and_writer() {
    let s = raw_section(StateKind::GgttUpdate as u16, &[1]);
    let err = first_error(&stream_with(&s), StreamLimits::default());
    assert!(
        matches!(
            err,
            StreamError::SectionOutOfOrder {
                kind: 9,
                needs: 3,
                ..
            }
        ),
        "{err}"
    );
    let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
    assert!(matches!(
        w.write_state(StateKind::GgttUpdate, &[1]),
        Err(StreamError::SectionOutOfOrder { .. })
    ));
    // Twice is refused like any other state section.
    let mut s = raw_section(StateKind::Ggtt as u16, &[1]);
    s.extend(raw_section(StateKind::GgttUpdate as u16, &[1]));
    s.extend(raw_section(StateKind::GgttUpdate as u16, &[2]));
    let err = first_error(&stream_with(&s), StreamLimits::default());
    assert!(
        matches!(err, StreamError::DuplicateSection { kind: 9, .. }),
        "{err}"
    );
}

#[test]
fn a_sync_section_of_another_length_is_refused() {
    for len in [0usize, 4, 9, 64] {
        let s = raw_section(KIND_SYNC, &vec![1u8; len]);
        let err = first_error(&stream_with(&s), StreamLimits::default());
        assert!(
            matches!(
                err,
                StreamError::BadSectionLength {
                    kind: 10,
                    expected: 8,
                    ..
                }
            ),
            "{len}: {err}"
        );
    }
    let s = raw_section(KIND_SYNC, &7u64.to_le_bytes());
    let bytes = stream_with(&s);
    let mut r = StreamReader::open(&bytes[..], StreamLimits::default(), None).unwrap();
    assert_eq!(r.next_section(), Ok(Some(Section::Sync(7))));
}

#[test]
fn a_dropped_section_is_caught_by_end() {
    let bytes = recorded();
    // Remove the second page batch entirely (its header says how long it is).
    let first_len = u32::from_le_bytes(bytes[HEADER_LEN + 8..HEADER_LEN + 12].try_into().unwrap());
    let second = HEADER_LEN + SECTION_HEADER_LEN + first_len as usize;
    let second_len = u32::from_le_bytes(bytes[second + 8..second + 12].try_into().unwrap());
    let mut cut = bytes[..second].to_vec();
    cut.extend_from_slice(&bytes[second + SECTION_HEADER_LEN + second_len as usize..]);
    let err = load(&cut[..], StreamLimits::default(), None).unwrap_err();
    assert!(
        matches!(
            err,
            StreamError::EndMismatch {
                what: "section count",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn reader_hands_out_sections_then_end_then_nothing() {
    let bytes = recorded();
    let mut r = StreamReader::open(&bytes[..], StreamLimits::default(), Some(&compat())).unwrap();
    let mut n = 0;
    loop {
        match r.next_section().unwrap() {
            Some(Section::End(s)) => {
                assert_eq!(s.sections, n);
                break;
            }
            Some(_) => n += 1,
            None => panic!("END missing"),
        }
    }
    assert_eq!(r.next_section(), Ok(None));
    assert_eq!(r.offset(), bytes.len() as u64);
}

#[test]
fn control_frames_round_trip_and_refuse_corruption() {
    let msgs = [
        Control::HeaderAccepted,
        Control::Rejected("vGPU type 128+512 MiB is not 64+384 MiB".into()),
        Control::Restored,
        Control::Commit,
        Control::Resumed {
            restore_ns: 12345,
            remap_ns: 678,
        },
        Control::Aborted("source timed out waiting for RESTORED".into()),
        Control::Synced(3),
    ];
    for m in &msgs {
        let mut buf = Vec::new();
        m.write_to(&mut buf).unwrap();
        assert_eq!(&Control::read_from(&mut &buf[..]).unwrap(), m);
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x01;
            assert!(
                Control::read_from(&mut &bad[..]).is_err(),
                "{m:?} flip at {i}"
            );
        }
        assert!(Control::read_from(&mut &buf[..buf.len() - 1]).is_err());
    }
    let long = "x".repeat(10_000);
    let mut buf = Vec::new();
    Control::Rejected(long).write_to(&mut buf).unwrap();
    match Control::read_from(&mut &buf[..]).unwrap() {
        Control::Rejected(m) => assert_eq!(m.len(), Control::MAX_PAYLOAD as usize),
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Flipping any bit pattern of any single byte of a recorded stream makes the load fail.
    #[test]
    fn any_corrupted_byte_is_rejected(pos in 0usize..100_000, mask in 1u8..=255) {
        let mut bytes = recorded();
        let pos = pos % bytes.len();
        bytes[pos] ^= mask;
        prop_assert!(load(&bytes[..], StreamLimits::default(), Some(&compat())).is_err());
    }

    /// Arbitrary bytes after a valid header never panic the reader and never load.
    #[test]
    fn garbage_sections_never_load(tail in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let bytes = stream_with(&tail);
        prop_assert!(load(&bytes[..], StreamLimits::default(), None).is_err());
    }

    /// Page batches round-trip: frames, order, contents and zero markers.
    #[test]
    fn page_batches_round_trip(pages in proptest::collection::vec((0u64..1024, any::<u8>(), any::<bool>()), 1..20)) {
        let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
        let mut b = PageBatch::new();
        for &(gfn, fill, zero) in &pages {
            let p = if zero { [0; PAGE_SIZE] } else { page(fill) };
            b.push(Gfn(gfn), &p);
        }
        w.write_pages(&b).unwrap();
        for kind in StateKind::ALL {
            w.write_state(kind, &[kind as u8]).unwrap();
        }
        let (bytes, _) = w.finish().unwrap();
        let loaded = load(&bytes[..], StreamLimits::default(), None).unwrap();
        let got: Vec<(Gfn, PageData<'_>)> = loaded.batches[0].iter().collect();
        let want: Vec<(Gfn, PageData<'_>)> = b.iter().collect();
        prop_assert_eq!(got, want);
    }
}

fn decode_in_chunks(bytes: &[u8], chunks: &[usize]) -> gmig_core::stream::Result<Vec<Section>> {
    use gmig_core::stream::StreamDecoder;
    let mut d = StreamDecoder::new(StreamLimits::default(), Some(compat()));
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = chunks[i % chunks.len()].max(1).min(bytes.len() - at);
        i += 1;
        d.feed(&bytes[at..at + n])?;
        at += n;
        while let Some(s) = d.next_section()? {
            out.push(s);
        }
    }
    if d.finished().is_none() {
        return Err(StreamError::Truncated {
            offset: at as u64,
            wanted: 1,
        });
    }
    Ok(out)
}

#[test]
fn push_decoder_refuses_bytes_after_end() {
    use gmig_core::stream::StreamDecoder;
    let bytes = recorded();
    let mut d = StreamDecoder::new(StreamLimits::default(), None);
    d.feed(&bytes).unwrap();
    while d.next_section().unwrap().is_some() {}
    assert!(d.finished().is_some());
    assert!(matches!(
        d.feed(&[0]),
        Err(StreamError::TrailingBytes { count: 1, .. })
    ));
    assert!(d.feed(&[]).is_err(), "a failed decoder stays failed");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The push decoder yields exactly what the pull reader yields, however the bytes are cut.
    #[test]
    fn push_decoder_matches_pull_reader(chunks in proptest::collection::vec(1usize..5000, 1..8)) {
        let bytes = recorded();
        let loaded = load(&bytes[..], StreamLimits::default(), None).unwrap();
        let sections = decode_in_chunks(&bytes, &chunks).unwrap();
        let batches: Vec<&PageBatch> = sections.iter().filter_map(|s| match s {
            Section::Pages(b) => Some(b),
            _ => None,
        }).collect();
        prop_assert_eq!(batches, loaded.batches.iter().collect::<Vec<_>>());
        prop_assert!(matches!(sections.last(), Some(Section::End(s)) if *s == loaded.summary));
    }

    /// The push decoder, too, rejects any corrupted byte.
    #[test]
    fn push_decoder_rejects_corruption(pos in 0usize..100_000, mask in 1u8..=255, chunk in 1usize..3000) {
        let mut bytes = recorded();
        let pos = pos % bytes.len();
        bytes[pos] ^= mask;
        prop_assert!(decode_in_chunks(&bytes, &[chunk]).is_err());
    }
}

fn hint_sections(bytes: &[u8]) -> Vec<Vec<FrameRange>> {
    let mut r = StreamReader::open(bytes, StreamLimits::default(), None).unwrap();
    let mut out = Vec::new();
    let mut ended = false;
    while let Some(s) = r.next_section().unwrap() {
        match s {
            Section::WritableFrames(runs) => out.push(runs),
            Section::End(_) => ended = true,
            _ => {}
        }
    }
    assert!(ended, "the reader went on to END");
    out
}

fn finish_with_states(mut w: StreamWriter<Vec<u8>>) -> Vec<u8> {
    for kind in StateKind::ALL {
        w.write_state(kind, &[kind as u8]).unwrap();
    }
    w.finish().unwrap().0
}

#[test]
fn a_writable_frames_hint_round_trips_as_sorted_runs() {
    let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
    let frames = [5, 3, 4, 10, 10, 1023, 12].map(Gfn);
    w.write_writable_frames(&frames).unwrap();
    w.write_writable_frames(&[]).unwrap(); // nothing
    let bytes = finish_with_states(w);
    let run = |start, count| FrameRange {
        start: Gfn(start),
        count,
    };
    assert_eq!(
        hint_sections(&bytes),
        vec![vec![run(3, 3), run(10, 1), run(12, 1), run(1023, 1)]]
    );
    // END counts the hint as a section; load() passes over it.
    let loaded = load(&bytes[..], StreamLimits::default(), None).unwrap();
    assert_eq!(loaded.summary.sections, 7);
    let frames: Vec<Gfn> = hint_sections(&bytes)[0]
        .iter()
        .flat_map(FrameRange::frames)
        .collect();
    assert_eq!(frames, [3, 4, 5, 10, 12, 1023].map(Gfn));
}

#[test]
fn a_long_hint_is_split_into_sections_of_at_most_the_maximum() {
    let mut h = header();
    h.guest_pages = 3 * MAX_FRAME_RANGES_PER_SECTION as u64;
    let mut w = StreamWriter::new(Vec::new(), &h).unwrap();
    // Every other frame: one run each, 1.5 sections' worth.
    let frames: Vec<Gfn> = (0..h.guest_pages).step_by(2).map(Gfn).collect();
    w.write_writable_frames(&frames).unwrap();
    let bytes = finish_with_states(w);
    let sections = hint_sections(&bytes);
    assert_eq!(
        sections.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![
            MAX_FRAME_RANGES_PER_SECTION,
            frames.len() - MAX_FRAME_RANGES_PER_SECTION
        ]
    );
    let back: Vec<Gfn> = sections
        .iter()
        .flatten()
        .flat_map(FrameRange::frames)
        .collect();
    assert_eq!(back, frames);
}

#[test]
fn a_writer_refuses_a_hint_past_guest_memory_and_an_old_format_gets_none() {
    let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
    let err = w.write_writable_frames(&[Gfn(2), Gfn(1024)]).unwrap_err();
    assert!(
        matches!(err, StreamError::PageOutOfRange { gfn: 1024, .. }),
        "{err}"
    );
    assert_eq!(w.bytes_written(), HEADER_LEN as u64, "nothing written");

    let mut old = header();
    old.format_minor = 1;
    let mut w = StreamWriter::new(Vec::new(), &old).unwrap();
    w.write_writable_frames(&[Gfn(2)]).unwrap();
    let bytes = finish_with_states(w);
    assert!(hint_sections(&bytes).is_empty());
}

fn hint_payload(ranges: &[(u64, u64)]) -> Vec<u8> {
    let mut p = Vec::new();
    for (s, c) in ranges {
        p.extend_from_slice(&s.to_le_bytes());
        p.extend_from_slice(&c.to_le_bytes());
    }
    p
}

#[test]
fn malformed_hints_are_refused_even_with_valid_checksums() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("not a multiple of 16", vec![0; 15]),
        ("empty range", hint_payload(&[(1, 0)])),
        ("past guest memory", hint_payload(&[(1000, 25)])),
        ("overflowing", hint_payload(&[(u64::MAX, 2)])),
        ("overlapping", hint_payload(&[(1, 4), (3, 1)])),
        ("adjacent", hint_payload(&[(1, 4), (5, 1)])),
        ("out of order", hint_payload(&[(10, 1), (2, 1)])),
        (
            "too many ranges",
            hint_payload(
                &(0..=MAX_FRAME_RANGES_PER_SECTION as u64)
                    .map(|i| (i * 2 % 1000, 1))
                    .collect::<Vec<_>>(),
            ),
        ),
    ];
    for (what, payload) in cases {
        let bytes = stream_with(&raw_section(KIND_WRITABLE_FRAMES, &payload));
        let err = first_error(&bytes, StreamLimits::default());
        assert!(
            matches!(err, StreamError::BadFrameHint { .. }),
            "{what}: {err}"
        );
    }
    // A well-formed one passes.
    let bytes = stream_with(&raw_section(
        KIND_WRITABLE_FRAMES,
        &hint_payload(&[(1, 4), (6, 1), (1023, 1)]),
    ));
    let mut r = StreamReader::open(&bytes[..], StreamLimits::default(), None).unwrap();
    assert!(matches!(
        r.next_section(),
        Ok(Some(Section::WritableFrames(v))) if v.len() == 3
    ));
}

#[test]
fn a_hint_in_a_format_1_1_stream_is_an_unknown_section() {
    let mut bytes = stream_with(&raw_section(KIND_WRITABLE_FRAMES, &hint_payload(&[(1, 4)])));
    rewrite_header(&mut bytes, |h| h[10] = 1);
    let err = first_error(&bytes, StreamLimits::default());
    assert_eq!(
        err,
        StreamError::UnknownSection {
            offset: HEADER_LEN as u64,
            kind: KIND_WRITABLE_FRAMES
        }
    );
}

/// The push decoder hands out a hint in any segmentation, as the pull reader does.
#[test]
fn the_push_decoder_hands_out_a_hint_too() {
    let mut w = StreamWriter::new(Vec::new(), &header()).unwrap();
    w.write_writable_frames(&[Gfn(7), Gfn(8), Gfn(100)])
        .unwrap();
    let bytes = finish_with_states(w);
    let sections = decode_in_chunks(&bytes, &[5, 17, 64]).unwrap();
    assert!(sections.iter().any(|s| matches!(
        s,
        Section::WritableFrames(v) if v.len() == 2 && v[0].count == 2
    )));
    assert!(matches!(sections.last(), Some(Section::End(_))));
}
