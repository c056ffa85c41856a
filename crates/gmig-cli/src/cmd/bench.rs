//! `gmig bench`.

use std::time::{Duration, Instant};

use anyhow::Context;
use gmig_dirty::hasher::default_prefetch_pages;
use gmig_dirty::vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use gmig_dirty::{GuestPages, HashSnapshot, Hasher, HasherOptions, Kernel, PAGE_SIZE};

use crate::cli::{BenchArgs, BenchWhat, HashKernelArg};
use crate::exit::Failure;

/// Run `gmig bench`.
pub fn run(args: &BenchArgs, json: bool) -> Result<(), Failure> {
    match &args.what {
        BenchWhat::Hash {
            size_mib,
            threads,
            reps,
            kernel,
            prefetch_pages,
        } => {
            let options = HasherOptions {
                threads: threads.unwrap_or(0),
                kernel: match kernel {
                    HashKernelArg::Auto => None,
                    HashKernelArg::Portable => Some(Kernel::Portable),
                    HashKernelArg::Avx2 => Some(Kernel::Avx2),
                    HashKernelArg::Avx512 => Some(Kernel::Avx512),
                },
                prefetch_pages: prefetch_pages.unwrap_or_else(default_prefetch_pages),
            };
            hash(*size_mib, options, *reps, json)
        }
        BenchWhat::Migrate(a) => super::bench_migrate::migrate(a, json),
        BenchWhat::Paper(a) => super::bench_paper::paper(a, json),
        BenchWhat::Vm(a) => super::bench_vm::vm(a, json),
        BenchWhat::Evacuate(a) => super::bench_evacuate::evacuate(a, json),
    }
}

/// Page hashing against plain memory reads of the same buffer, same threads and work split. The
/// read baseline is the faster of a pass prefetching at the hasher's distance and one without, so
/// the ratio is not flattered by a weak baseline.
fn hash(size_mib: usize, options: HasherOptions, reps: usize, json: bool) -> Result<(), Failure> {
    if size_mib == 0 || reps == 0 {
        return Err(anyhow::anyhow!("--size-mib and --reps must be at least 1").into());
    }
    let bytes = size_mib
        .checked_mul(1 << 20)
        .context("--size-mib is too large")?;
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes)])
        .with_context(|| format!("cannot allocate {size_mib} MiB of guest memory"))?;
    fill(&mem, bytes)?;
    let pages = GuestPages::new(&mem).context("guest memory view")?;
    let frames = pages.frames().context("frame set")?;
    let hasher = Hasher::with_options(options).context("hasher")?;
    let mut snap = HashSnapshot::new(frames.clone()).context("snapshot")?;

    // Warm up (page tables, thread pool), then alternate the passes and keep the best of each.
    let mut sink = hasher
        .read_probe(&pages, &frames, true)
        .context("read pass")?;
    hasher
        .record_in_place(&pages, &mut snap)
        .context("hash pass")?;
    let (mut read, mut hashing, mut diff) = (Duration::MAX, Duration::MAX, Duration::MAX);
    let (mut read_pf, mut read_nopf) = (Duration::MAX, Duration::MAX);
    for _ in 0..reps {
        for (prefetch, best) in [(true, &mut read_pf), (false, &mut read_nopf)] {
            let t = Instant::now();
            sink ^= hasher
                .read_probe(&pages, &frames, prefetch)
                .context("read pass")?;
            *best = (*best).min(t.elapsed());
        }
        read = read_pf.min(read_nopf);
        let t = Instant::now();
        hasher
            .record_in_place(&pages, &mut snap)
            .context("hash pass")?;
        hashing = hashing.min(t.elapsed());
        let t = Instant::now();
        let dirty = hasher.diff(&pages, &snap, None).context("diff pass")?;
        diff = diff.min(t.elapsed());
        if dirty.any() {
            return Err(anyhow::anyhow!("memory changed during the benchmark").into());
        }
    }
    std::hint::black_box(sink);
    let gbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    let (read_gbps, hash_gbps, diff_gbps) = (gbps(read), gbps(hashing), gbps(diff));
    let ratio = hash_gbps / read_gbps;
    if json {
        let obj = serde_json::json!({
            "hash_gbps": round2(hash_gbps),
            "read_gbps": round2(read_gbps),
            "threads": hasher.threads(),
            "ratio": (ratio * 1000.0).round() / 1000.0,
            "diff_gbps": round2(diff_gbps),
            "size_mib": size_mib,
            "kernel": hasher.kernel().name(),
            "reps": reps,
            "prefetch_pages": hasher.prefetch_pages(),
            "read_prefetch_gbps": round2(gbps(read_pf)),
            "read_plain_gbps": round2(gbps(read_nopf)),
        });
        println!("{obj}");
    } else {
        println!(
            "page hashing, {size_mib} MiB, {} threads, {} kernel (best of {reps})",
            hasher.threads(),
            hasher.kernel().name()
        );
        println!(
            "  plain read     {read_gbps:7.2} GB/s (with prefetch {:.2}, without {:.2})",
            gbps(read_pf),
            gbps(read_nopf)
        );
        println!("  hash (record)  {hash_gbps:7.2} GB/s");
        println!("  hash (diff)    {diff_gbps:7.2} GB/s");
        println!("  ratio hash/read {ratio:.3}");
    }
    Ok(())
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Fill guest memory with non-zero pseudo-random bytes so no page is a zero page.
fn fill(mem: &GuestMemoryMmap, bytes: usize) -> anyhow::Result<()> {
    let slice = mem
        .get_slice(GuestAddress(0), bytes)
        .context("guest memory slice")?;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; 1 << 20];
    let mut off = 0usize;
    while off < bytes {
        for w in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&(x | 1).to_le_bytes());
        }
        let n = chunk.len().min(bytes - off);
        slice
            .subslice(off, n)
            .context("guest memory subslice")?
            .copy_from(&chunk[..n]);
        off += n;
    }
    debug_assert_eq!(bytes % PAGE_SIZE, 0);
    Ok(())
}
