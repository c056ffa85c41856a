//! Stream encode and decode throughput: a 16 MiB guest (a quarter of its pages non-zero) written
//! as page batches plus device state, then read back by the pull reader and the push decoder.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gmig_core::stream::{
    load, Gfn, GpuGeneration, PageBatch, StateKind, StreamDecoder, StreamHeader, StreamLimits,
    StreamWriter, VgpuTypeId, MAX_PAGES_PER_BATCH, PAGE_SIZE,
};

const PAGES: u64 = 4096;

fn pages() -> Vec<[u8; PAGE_SIZE]> {
    (0..PAGES)
        .map(|i| {
            let mut p = [0u8; PAGE_SIZE];
            if i % 4 == 0 {
                for (j, b) in p.iter_mut().enumerate() {
                    *b = (i as usize ^ j) as u8;
                }
            }
            p
        })
        .collect()
}

fn encode(pages: &[[u8; PAGE_SIZE]]) -> Vec<u8> {
    let header = StreamHeader::new(
        GpuGeneration::Gen9,
        VgpuTypeId {
            aperture_mib: 64,
            hidden_mib: 384,
        },
        0,
        1 << 30,
        PAGES,
    );
    let mut w = StreamWriter::new(Vec::with_capacity(8 << 20), &header).expect("header");
    let mut batch = PageBatch::with_capacity(MAX_PAGES_PER_BATCH as usize);
    for (i, p) in pages.iter().enumerate() {
        if !batch.push(Gfn(i as u64), p) {
            w.write_pages(&batch).expect("batch");
            batch.clear();
            batch.push(Gfn(i as u64), p);
        }
    }
    w.write_pages(&batch).expect("batch");
    for kind in StateKind::ALL {
        w.write_state(kind, &[kind as u8; 4096]).expect("state");
    }
    w.finish().expect("end").0
}

fn bench(c: &mut Criterion) {
    let pages = pages();
    let bytes = encode(&pages);
    let mut g = c.benchmark_group("stream");
    g.throughput(Throughput::Bytes(PAGES * PAGE_SIZE as u64));
    g.bench_function("encode_16MiB_guest", |b| b.iter(|| encode(&pages)));
    g.bench_function("decode_pull_16MiB_guest", |b| {
        b.iter(|| load(&bytes[..], StreamLimits::default(), None).expect("load"));
    });
    g.bench_function("decode_push_64KiB_chunks", |b| {
        b.iter(|| {
            let mut d = StreamDecoder::new(StreamLimits::default(), None);
            let mut n = 0u64;
            for chunk in bytes.chunks(64 * 1024) {
                d.feed(chunk).expect("feed");
                while let Some(_s) = d.next_section().expect("section") {
                    n += 1;
                }
            }
            n
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
