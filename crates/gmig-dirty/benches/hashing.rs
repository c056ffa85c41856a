//! Page hashing against plain reads of the same buffer, in one run.
//!
//! Buffer: `GMIG_BENCH_MIB` MiB (default 448, larger than the last-level cache) of non-zero
//! pseudo-random bytes. Groups:
//! - `single_thread`: plain read (with and without prefetch), a bare `xxhash_rust::xxh3::xxh3_64`
//!   loop over the pages, a bare loop of this crate's kernel, and the framework (`Hasher` with one
//!   thread: `record_in_place`, `diff`). The framework's per-page overhead is framework_record
//!   against kernel_bare_loop_prefetch (same kernel, same next-page prefetch), and
//!   framework_record_no_prefetch against kernel_bare_loop (neither prefetches).
//! - `all_threads`: plain read vs framework hashing on every core.
//! - `send_copy`: copying batches of 256 pages into a send buffer with `memcpy` vs
//!   `Hasher::copy_for_send` (copy fused with hashing the copy), one thread.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gmig_dirty::{Gfn, GuestPages, HashSnapshot, Hasher, HasherOptions, Kernel, PAGE_SIZE};

fn buffer() -> Vec<u8> {
    let mib: usize = std::env::var("GMIG_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(448);
    let mut buf = vec![0u8; mib << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for w in buf.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&(x | 1).to_le_bytes());
    }
    buf
}

fn benches(c: &mut Criterion) {
    let buf = buffer();
    let pages = GuestPages::from_slice(Gfn(0), &buf).unwrap();
    let frames = pages.frames().unwrap();
    let npages = buf.len() / PAGE_SIZE;
    let bytes = buf.len() as u64;
    let kernel = Kernel::detect();
    eprintln!("kernel: {}", kernel.name());

    // Explicit prefetch settings (the default depends on the CPU vendor), so each framework
    // variant has a bare-loop twin with the same prefetching.
    let one = Hasher::with_options(HasherOptions {
        threads: 1,
        prefetch_pages: 1,
        ..HasherOptions::default()
    })
    .unwrap();
    let one_nopf = Hasher::with_options(HasherOptions {
        threads: 1,
        prefetch_pages: 0,
        ..HasherOptions::default()
    })
    .unwrap();
    let mut snap = HashSnapshot::new(frames.clone()).unwrap();
    one.record_in_place(&pages, &mut snap).unwrap();
    let mut out = vec![0u64; npages];

    let mut g = c.benchmark_group("single_thread");
    g.throughput(Throughput::Bytes(bytes))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    g.bench_function("read_prefetch", |b| {
        b.iter(|| black_box(one.read_probe(&pages, &frames, true).unwrap()));
    });
    g.bench_function("read_plain", |b| {
        b.iter(|| black_box(one.read_probe(&pages, &frames, false).unwrap()));
    });
    g.bench_function("xxh3_bare_loop", |b| {
        b.iter(|| {
            for (o, p) in out.iter_mut().zip(buf.chunks_exact(PAGE_SIZE)) {
                *o = xxhash_rust::xxh3::xxh3_64(p);
            }
            black_box(&out);
        });
    });
    g.bench_function("kernel_bare_loop", |b| {
        b.iter(|| {
            for (o, p) in out.iter_mut().zip(buf.chunks_exact(PAGE_SIZE)) {
                let page: &[u8; PAGE_SIZE] = p.try_into().unwrap();
                *o = kernel.hash_page(page).hash.0;
            }
            black_box(&out);
        });
    });
    g.bench_function("kernel_bare_loop_prefetch", |b| {
        b.iter(|| {
            let mut it = buf.chunks_exact(PAGE_SIZE).peekable();
            let mut o = out.iter_mut();
            while let (Some(p), Some(slot)) = (it.next(), o.next()) {
                let page: &[u8; PAGE_SIZE] = p.try_into().unwrap();
                let next: &[u8; PAGE_SIZE] = (*it.peek().unwrap_or(&p)).try_into().unwrap();
                *slot = kernel.hash_page_prefetching(page, next).hash.0;
            }
            black_box(&out);
        });
    });
    g.bench_function("framework_record", |b| {
        b.iter(|| one.record_in_place(&pages, &mut snap).unwrap());
    });
    g.bench_function("framework_record_no_prefetch", |b| {
        b.iter(|| one_nopf.record_in_place(&pages, &mut snap).unwrap());
    });
    g.bench_function("framework_diff", |b| {
        b.iter(|| black_box(one.diff(&pages, &snap, None).unwrap()));
    });
    g.finish();

    let all = Hasher::new(0).unwrap();
    let mut g = c.benchmark_group("all_threads");
    g.throughput(Throughput::Bytes(bytes))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    g.bench_function("read_prefetch", |b| {
        b.iter(|| black_box(all.read_probe(&pages, &frames, true).unwrap()));
    });
    g.bench_function("read_plain", |b| {
        b.iter(|| black_box(all.read_probe(&pages, &frames, false).unwrap()));
    });
    g.bench_function("framework_record", |b| {
        b.iter(|| all.record_in_place(&pages, &mut snap).unwrap());
    });
    g.bench_function("framework_diff", |b| {
        b.iter(|| black_box(all.diff(&pages, &snap, None).unwrap()));
    });
    g.finish();

    const BATCH: usize = 256;
    let gfns: Vec<Gfn> = frames.iter().collect();
    let mut send = vec![0u8; BATCH * PAGE_SIZE];
    let mut g = c.benchmark_group("send_copy");
    g.throughput(Throughput::Bytes(bytes))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            for chunk in buf.chunks(BATCH * PAGE_SIZE) {
                send[..chunk.len()].copy_from_slice(chunk);
                black_box(&send);
            }
        });
    });
    g.bench_function("copy_for_send", |b| {
        b.iter(|| {
            for batch in gfns.chunks(BATCH) {
                let n = batch.len() * PAGE_SIZE;
                black_box(
                    one.copy_for_send(&pages, &mut snap, batch, &mut send[..n])
                        .unwrap(),
                );
            }
        });
    });
    g.finish();
}

criterion_group!(hashing, benches);
criterion_main!(hashing);
