//! The parallel page hasher: recording what is sent, and diffing memory against a snapshot.
//!
//! Work is split into contiguous chunks of the tracked frame space with about equal numbers of
//! pages to hash (a few chunks per thread, so rayon's work stealing evens out slow chunks, and each
//! chunk walks memory sequentially while prefetching a page a little ahead). Each chunk writes its own
//! disjoint slice of the output (hashes or dirty-bitmap words), so there is no locking and no
//! per-page allocation.

use rayon::prelude::*;

use crate::addr::{Gfn, PageDigest, PAGE_SIZE};
use crate::bitmap::{BitmapError, DirtyBitmap};
use crate::kernel::{self, Kernel};
use crate::memory::{GuestPages, MemoryError};
use crate::snapshot::{HashSnapshot, SnapshotError};

/// Errors of hashing operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HashError {
    /// The worker pool could not be started.
    #[error("cannot start {threads} hashing threads: {reason}")]
    ThreadPool {
        /// Threads requested.
        threads: usize,
        /// rayon's reason.
        reason: String,
    },
    /// The requested kernel does not run on this CPU.
    #[error("hashing kernel {kernel} is not supported by this CPU")]
    UnsupportedKernel {
        /// Kernel name.
        kernel: &'static str,
    },
    /// A send buffer or digest slice does not match the batch.
    #[error("batch of {pages} pages needs {expected} bytes of buffer, got {got}")]
    BufferSize {
        /// Pages in the batch.
        pages: usize,
        /// Bytes needed.
        expected: usize,
        /// Bytes supplied.
        got: usize,
    },
    /// Guest memory does not back a page.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A snapshot operation failed.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A bitmap operation failed.
    #[error(transparent)]
    Bitmap(#[from] BitmapError),
}

/// Module result type.
pub type Result<T> = std::result::Result<T, HashError>;

/// The buffers a re-hash works in ([`Hasher::diff_into`]): the pages to visit and the dirty
/// bitmap, each one bit (or word) per page of the snapshot's span.
#[derive(Debug, Clone)]
pub struct DiffScratch {
    work: Vec<u64>,
    out: DirtyBitmap,
}

impl DiffScratch {
    fn new(snap: &HashSnapshot, touch: bool) -> Result<DiffScratch> {
        let tracked = snap.tracked();
        let mut s = DiffScratch {
            work: vec![0; tracked.words().len()],
            out: DirtyBitmap::new(tracked.base(), tracked.span_pages())?,
        };
        if touch {
            // Zeroed allocations may be untouched pages: write one word per page so that each
            // is really there now (through black_box, so the store is not elided).
            let step = crate::PAGE_SIZE / 8;
            for w in s.work.iter_mut().step_by(step) {
                *std::hint::black_box(w) = 0;
            }
            for w in s.out.words_mut().iter_mut().step_by(step) {
                *std::hint::black_box(w) = 0;
            }
        }
        Ok(s)
    }

    /// Buffers for re-hashing against `snap`, allocated and backed with memory now (before the
    /// downtime that uses them).
    ///
    /// # Errors
    /// The snapshot's span does not fit in memory.
    pub fn prepared(snap: &HashSnapshot) -> Result<DiffScratch> {
        DiffScratch::new(snap, true)
    }

    /// The pages the last [`Hasher::diff_into`] found dirty.
    pub fn dirty(&self) -> &DirtyBitmap {
        &self.out
    }
}

/// Chunks per thread: enough for work stealing to balance, few enough to keep chunks sequential.
const TASKS_PER_THREAD: usize = 4;
/// Smallest chunk worth a task (1 MiB of pages). A diff of at most this many pages is one task,
/// which [`Hasher::diff_into`] runs on the calling thread.
pub const MIN_TASK_PAGES: u64 = 256;
/// Default prefetch distance in pages (see [`HasherOptions::prefetch_pages`]) for this CPU.
///
/// Measured (docs/performance-history.md): on Intel Xeon cores, prefetching the next page raises hashing
/// from 0.52–0.65 to 0.85–0.98 of read bandwidth, because the hardware streamer restarts at each
/// 4 KiB page; on AMD Zen 4 the hardware prefetchers already cover page crossings and the software
/// prefetch costs 20–45%. So: 0 on AMD, 1 elsewhere.
pub fn default_prefetch_pages() -> usize {
    if cpu_vendor_is_amd() {
        0
    } else {
        1
    }
}

#[cfg(target_arch = "x86_64")]
fn cpu_vendor_is_amd() -> bool {
    // CPUID leaf 0 returns the vendor string in EBX, EDX, ECX.
    // `__cpuid` is a safe fn on current toolchains and was `unsafe` on older ones.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 CPU and leaf 0 has no side effects.
    let r = unsafe { std::arch::x86_64::__cpuid(0) };
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..].copy_from_slice(&r.ecx.to_le_bytes());
    &v == b"AuthenticAMD"
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_vendor_is_amd() -> bool {
    false
}

/// Largest prefetch distance in pages.
pub const MAX_PREFETCH_PAGES: usize = 8;
/// Dirty pages handed to a diff sink at a time.
pub const SINK_BATCH: usize = 64;

/// How a [`Hasher`] is set up; `Default` is all cores, the widest kernel, and the prefetch
/// distance [`default_prefetch_pages`] picks for this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HasherOptions {
    /// Worker threads (0: one per available core).
    pub threads: usize,
    /// Kernel (`None`: [`Kernel::detect`]).
    pub kernel: Option<Kernel>,
    /// While hashing a page, prefetch the cache lines of the page this many pages further on in
    /// the walk (0: no software prefetch; at most [`MAX_PREFETCH_PAGES`]).
    pub prefetch_pages: usize,
}

impl Default for HasherOptions {
    fn default() -> Self {
        HasherOptions {
            threads: 0,
            kernel: None,
            prefetch_pages: default_prefetch_pages(),
        }
    }
}

/// Hashes guest pages on a private rayon pool of a fixed size with the widest kernel the CPU runs.
#[derive(Debug)]
pub struct Hasher {
    pool: rayon::ThreadPool,
    threads: usize,
    kernel: Kernel,
    prefetch_pages: usize,
}

impl Hasher {
    /// A hasher with `threads` workers (0: one per available core) and the detected kernel.
    pub fn new(threads: usize) -> Result<Self> {
        Self::with_options(HasherOptions {
            threads,
            ..HasherOptions::default()
        })
    }

    /// A hasher with `threads` workers (0: one per core) and a given kernel (for comparisons).
    pub fn with_kernel(threads: usize, kernel: Kernel) -> Result<Self> {
        Self::with_options(HasherOptions {
            threads,
            kernel: Some(kernel),
            ..HasherOptions::default()
        })
    }

    /// A hasher set up by `options`.
    pub fn with_options(options: HasherOptions) -> Result<Self> {
        let HasherOptions {
            threads,
            kernel,
            prefetch_pages,
        } = options;
        let prefetch_pages = prefetch_pages.min(MAX_PREFETCH_PAGES);
        let kernel = kernel.unwrap_or_else(Kernel::detect);
        if !kernel.is_supported() {
            return Err(HashError::UnsupportedKernel {
                kernel: kernel.name(),
            });
        }
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        } else {
            threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("gmig-hash-{i}"))
            .build()
            .map_err(|e| HashError::ThreadPool {
                threads,
                reason: e.to_string(),
            })?;
        Ok(Hasher {
            pool,
            threads,
            kernel,
            prefetch_pages,
        })
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The kernel in use.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// How many pages ahead the walk prefetches (0: none).
    pub fn prefetch_pages(&self) -> usize {
        self.prefetch_pages
    }

    /// Split `work` (bitmap words) into contiguous word ranges with about equal set bits.
    fn plan(&self, work: &[u64]) -> Vec<(usize, usize)> {
        let total: u64 = work.iter().map(|w| u64::from(w.count_ones())).sum();
        if total == 0 {
            return Vec::new();
        }
        let max_tasks = (self.threads * TASKS_PER_THREAD) as u64;
        let tasks = total.div_ceil(MIN_TASK_PAGES).clamp(1, max_tasks);
        let per = total.div_ceil(tasks);
        let mut out = Vec::with_capacity(tasks as usize);
        let (mut start, mut acc) = (0usize, 0u64);
        for (i, w) in work.iter().enumerate() {
            acc += u64::from(w.count_ones());
            if acc >= per {
                out.push((start, i + 1));
                start = i + 1;
                acc = 0;
            }
        }
        if start < work.len() && acc > 0 {
            out.push((start, work.len()));
        }
        out
    }

    /// Copy the pages `gfns` into `buf` (page `i` at `buf[i * 4096..]`), in parallel, and record in
    /// `snap` the hash of exactly the bytes copied. This is *the* way to record hashes for pages sent
    /// while the guest runs: a write that lands during or after the copy makes memory differ from the
    /// recorded hash, so [`Hasher::diff`] reports the page. Returns one digest per page; a
    /// [`PageKind::Zero`](crate::PageKind::Zero) page can be sent as a marker instead of its bytes.
    pub fn copy_for_send(
        &self,
        mem: &GuestPages<'_>,
        snap: &mut HashSnapshot,
        gfns: &[Gfn],
        buf: &mut [u8],
    ) -> Result<Vec<PageDigest>> {
        let expected = gfns.len().saturating_mul(PAGE_SIZE);
        if buf.len() != expected {
            return Err(HashError::BufferSize {
                pages: gfns.len(),
                expected,
                got: buf.len(),
            });
        }
        // Every frame must be tracked before anything is copied, so a failure changes nothing.
        for &g in gfns {
            snap.index_of(g)
                .ok_or(SnapshotError::NotTracked { gfn: g.0 })?;
        }
        let mut digests = vec![PageDigest::EMPTY; gfns.len()];
        let mut samples = vec![0u32; if snap.has_samples() { gfns.len() } else { 0 }];
        let kernel = self.kernel;
        let prefetch = self.prefetch_pages > 0;
        let want_samples = snap.has_samples();
        self.pool.install(|| {
            buf.par_chunks_mut(PAGE_SIZE)
                .zip(digests.par_iter_mut())
                .enumerate()
                .with_min_len(16)
                .try_for_each(|(i, (dst, d))| -> Result<()> {
                    let src = mem.host(gfns[i])?;
                    let next = match gfns.get(i + 1) {
                        Some(&g) if prefetch => mem.host(g).unwrap_or(src),
                        _ => src,
                    };
                    // SAFETY: `src` is a mapped guest page (resolved by `mem`, alive for its
                    // borrow); `dst` is a distinct PAGE_SIZE chunk of `buf`; the kernel is
                    // supported (checked at construction).
                    *d = unsafe { kernel.copy_hash_raw(src, dst.as_mut_ptr(), next) };
                    Ok(())
                })
        })?;
        if want_samples {
            for (s, page) in samples.iter_mut().zip(buf.chunks_exact(PAGE_SIZE)) {
                // SAFETY: `page` is PAGE_SIZE bytes of our own buffer.
                *s = unsafe { kernel::sample_raw(page.as_ptr()) };
            }
        }
        for (i, (&g, d)) in gfns.iter().zip(&digests).enumerate() {
            snap.record(g, *d, samples.get(i).copied().unwrap_or(0))?;
        }
        Ok(digests)
    }

    /// Single-page form of [`Hasher::copy_for_send`] on the calling thread.
    pub fn copy_page_for_send(
        &self,
        mem: &GuestPages<'_>,
        snap: &mut HashSnapshot,
        gfn: Gfn,
        dst: &mut [u8; PAGE_SIZE],
    ) -> Result<PageDigest> {
        snap.index_of(gfn)
            .ok_or(SnapshotError::NotTracked { gfn: gfn.0 })?;
        let src = mem.host(gfn)?;
        // SAFETY: `src` is a mapped guest page; `dst` is our own PAGE_SIZE buffer; the kernel is
        // supported.
        let d = unsafe { self.kernel.copy_hash_raw(src, dst.as_mut_ptr(), src) };
        let sample = kernel::sample_page(dst);
        snap.record(gfn, d, sample)?;
        Ok(d)
    }

    /// Hash every tracked page *in place* and record the hashes, in parallel.
    ///
    /// Use this only for pages whose current bytes the destination already holds by other means
    /// (or for benchmarks): a page sent by a separate copy after this call could change in between
    /// and the change would be lost. Pages being sent go through [`Hasher::copy_for_send`].
    pub fn record_in_place(&self, mem: &GuestPages<'_>, snap: &mut HashSnapshot) -> Result<()> {
        self.rehash_in_place(mem, snap, None)
    }

    /// Re-hash every tracked page in place, record the new hashes, and return the pages whose
    /// hash changed (or that were never recorded) since the last recording: a rolling diff.
    ///
    /// This is for *reporting* writes, not for sending pages: a caller that hands the result on
    /// (a DMA dirty-log report) before anyone reads the pages loses nothing — a write that lands
    /// after a page was hashed makes it differ at the next call, and one that lands before is in
    /// the bytes read after the report. Sampling, if the snapshot has it, is refreshed too.
    pub fn diff_update(
        &self,
        mem: &GuestPages<'_>,
        snap: &mut HashSnapshot,
    ) -> Result<DirtyBitmap> {
        let tracked = snap.tracked();
        let mut out = DirtyBitmap::new(tracked.base(), tracked.span_pages())?;
        self.rehash_in_place(mem, snap, Some(&mut out))?;
        Ok(out)
    }

    /// Hash every tracked page in place into the snapshot; with `dirty`, also set there the pages
    /// whose new hash differs from the recorded one (or that were not recorded).
    fn rehash_in_place(
        &self,
        mem: &GuestPages<'_>,
        snap: &mut HashSnapshot,
        mut dirty: Option<&mut DirtyBitmap>,
    ) -> Result<()> {
        let kernel = self.kernel;
        let recorded = snap.recorded().clone();
        let (tracked, ranks, hashes, samples) = snap.parts_mut();
        let plan = self.plan(tracked.words());
        let base = tracked.base().0;
        let mut out_words = dirty.as_mut().map(|d| d.words_mut());
        // Carve the dense outputs (and the dirty words) into one disjoint slice per task.
        let mut tasks = Vec::with_capacity(plan.len());
        let (mut rest_h, mut rest_s) = (hashes, samples);
        let mut rest_d: Option<&mut [u64]> = out_words.as_deref_mut();
        let (mut consumed, mut consumed_w) = (0usize, 0usize);
        for &(w0, w1) in &plan {
            let (lo, hi) = (ranks[w0] as usize, ranks[w1] as usize);
            let (_, tail) = std::mem::take(&mut rest_h).split_at_mut(lo - consumed);
            let (mine_h, tail) = tail.split_at_mut(hi - lo);
            rest_h = tail;
            let mine_s = carve(&mut rest_s, lo - consumed, hi - lo);
            let mine_d = carve(&mut rest_d, w0 - consumed_w, w1 - w0);
            consumed = hi;
            consumed_w = w1;
            tasks.push((w0, w1, lo, mine_h, mine_s, mine_d));
        }
        let recorded = &recorded;
        self.pool.install(|| {
            tasks.into_par_iter().try_for_each(
                |(w0, w1, lo, out_h, mut out_s, mut out_d)| -> Result<()> {
                    for_each_page(
                        self.walk(tracked, ranks, mem),
                        |w| tracked.words()[w],
                        w0,
                        w1,
                        |gfn, idx, p, next| {
                            // SAFETY: `p` is a mapped guest page; the kernel is supported.
                            let d = unsafe { kernel.hash_raw(p, next) };
                            if let Some(words) = out_d.as_deref_mut() {
                                let bit = gfn.0 - base;
                                let (w, b) = ((bit / 64) as usize, bit % 64);
                                let was = recorded.words()[w] >> b & 1 == 1;
                                if !was || out_h[idx - lo] != d.hash.0 {
                                    words[w - w0] |= 1 << b;
                                }
                            }
                            out_h[idx - lo] = d.hash.0;
                            if let Some(s) = out_s.as_deref_mut() {
                                // SAFETY: as above.
                                s[idx - lo] = unsafe { kernel::sample_raw(p) };
                            }
                            Ok(())
                        },
                    )
                },
            )
        })?;
        drop(out_words);
        snap.mark_all_recorded();
        Ok(())
    }

    /// Re-hash tracked pages and return those that changed since they were recorded, as a bitmap
    /// over the snapshot's tracked span. With `candidates`, only tracked pages also set there are
    /// re-hashed (the caller vouches the others are clean); pages never recorded are dirty either way.
    /// With sampling on in the snapshot, a page whose sample differs is dirty without a full hash;
    /// an equal sample always falls through to the full hash.
    pub fn diff(
        &self,
        mem: &GuestPages<'_>,
        snap: &HashSnapshot,
        candidates: Option<&DirtyBitmap>,
    ) -> Result<DirtyBitmap> {
        self.diff_with(mem, snap, candidates, &|_| {})
    }

    /// [`Hasher::diff`] that also hands dirty frames to `sink` as they are found, in batches of up
    /// to [`SINK_BATCH`], from the worker threads, so sending overlaps hashing. Frames arrive in
    /// ascending order within a batch; batches from different workers interleave.
    pub fn diff_with(
        &self,
        mem: &GuestPages<'_>,
        snap: &HashSnapshot,
        candidates: Option<&DirtyBitmap>,
        sink: &(dyn Fn(&[Gfn]) + Sync),
    ) -> Result<DirtyBitmap> {
        let mut scratch = DiffScratch::new(snap, false)?;
        self.diff_into(mem, snap, candidates, sink, &mut scratch)?;
        Ok(scratch.out)
    }

    /// [`Hasher::diff_with`] into buffers made beforehand ([`DiffScratch::prepared`]): what a
    /// re-hash in downtime uses, so that it allocates and first-touches no memory there (on a
    /// thread of its own that would come from a fresh malloc arena, page by page). The dirty
    /// pages end up in [`DiffScratch::dirty`].
    ///
    /// # Errors
    /// `scratch` was made for a snapshot of another span (`Bitmap`), or as [`Hasher::diff_with`].
    pub fn diff_into(
        &self,
        mem: &GuestPages<'_>,
        snap: &HashSnapshot,
        candidates: Option<&DirtyBitmap>,
        sink: &(dyn Fn(&[Gfn]) + Sync),
        scratch: &mut DiffScratch,
    ) -> Result<()> {
        let tracked = snap.tracked();
        let recorded = snap.recorded();
        let ranks = snap.ranks();
        let hashes = snap.hashes();
        let samples = snap.samples();
        let kernel = self.kernel;
        if scratch.out.base() != tracked.base()
            || scratch.out.span_pages() != tracked.span_pages()
            || scratch.work.len() != tracked.words().len()
        {
            return Err(HashError::Bitmap(BitmapError::WrongWordCount {
                pages: tracked.span_pages(),
                expected: tracked.words().len(),
                got: scratch.work.len(),
            }));
        }
        // Pages to visit: tracked ∧ (unrecorded ∨ candidate).
        for (k, w) in scratch.work.iter_mut().enumerate() {
            let cand = candidates.map_or(u64::MAX, |c| tracked.foreign_word(c, k));
            *w = tracked.words()[k] & (!recorded.words()[k] | cand);
        }
        let work = &scratch.work;
        let out = &mut scratch.out;
        out.clear_all();
        let plan = self.plan(work);
        let mut tasks = Vec::with_capacity(plan.len());
        {
            let mut rest: &mut [u64] = &mut out.words_mut();
            let mut consumed = 0;
            for &(w0, w1) in &plan {
                let (_, t) = std::mem::take(&mut rest).split_at_mut(w0 - consumed);
                let (mine, t) = t.split_at_mut(w1 - w0);
                rest = t;
                consumed = w1;
                tasks.push((w0, w1, mine));
            }
            let base = tracked.base().0;
            let run = |(w0, w1, mine): (usize, usize, &mut [u64])| -> Result<()> {
                let mut batch = [Gfn(0); SINK_BATCH];
                let mut n = 0usize;
                for_each_page(
                    self.walk(tracked, ranks, mem),
                    |w| work[w],
                    w0,
                    w1,
                    |gfn, idx, p, next| {
                        let bit = gfn.0 - base;
                        let unrecorded =
                            recorded.words()[(bit / 64) as usize] >> (bit % 64) & 1 == 0;
                        let sample_differs = || {
                            samples.is_some_and(|s| {
                                // SAFETY: `p` is a mapped guest page.
                                let now = unsafe { kernel::sample_raw(p) };
                                s[idx] != now
                            })
                        };
                        // SAFETY: `p` is a mapped guest page; the kernel is supported.
                        let hash_differs =
                            || unsafe { kernel.hash_raw(p, next) }.hash.0 != hashes[idx];
                        let dirty = unrecorded || sample_differs() || hash_differs();
                        if dirty {
                            let local = bit as usize / 64 - w0;
                            mine[local] |= 1 << (bit % 64);
                            batch[n] = gfn;
                            n += 1;
                            if n == SINK_BATCH {
                                sink(&batch);
                                n = 0;
                            }
                        }
                        Ok(())
                    },
                )?;
                if n > 0 {
                    sink(&batch[..n]);
                }
                Ok(())
            };
            if tasks.len() <= 1 {
                // One task (at most MIN_TASK_PAGES pages): on the calling thread, so a small
                // re-hash in downtime waits for no pool worker to wake up (on a busy host a
                // wake-up can take milliseconds).
                tasks.into_iter().try_for_each(run)?;
            } else {
                self.pool
                    .install(|| tasks.into_par_iter().try_for_each(run))?;
            }
        }
        Ok(())
    }

    /// How many times at most [`Hasher::diff_with`] calls its sink when it finds `dirty` pages:
    /// each work chunk hands its pages over in batches of up to [`SINK_BATCH`], so a caller that
    /// turns every call into one record (a page batch on the wire) can bound its framing bytes.
    pub fn diff_sink_calls_bound(&self, dirty: u64) -> u64 {
        let chunks = (self.threads * TASKS_PER_THREAD) as u64;
        dirty.min(dirty.div_ceil(SINK_BATCH as u64).saturating_add(chunks))
    }

    /// Count the pages set in `frames` whose bytes are all zero, in parallel with the same work
    /// split and kernel as hashing (a zero page is one whose digest is
    /// [`PageKind::Zero`](crate::PageKind::Zero), confirmed on its bytes). Used to size what a
    /// transfer that sends zero pages as markers will produce.
    pub fn count_zero(&self, mem: &GuestPages<'_>, frames: &DirtyBitmap) -> Result<u64> {
        let kernel = self.kernel;
        self.fold_pages(
            mem,
            frames,
            self.prefetch_pages,
            |p, next| {
                // SAFETY: `p` is a mapped guest page; the kernel is supported.
                u64::from(unsafe { kernel.hash_raw(p, next) }.is_zero())
            },
            |a, b| a + b,
        )
    }

    /// Read every page set in `frames` once with the widest loads available, using the same work
    /// split, threads and prefetching as hashing; returns an XOR fold of the data. This is the
    /// memory-bandwidth baseline benchmarks compare hashing against.
    /// `prefetch` chooses whether pages are prefetched at the hasher's distance (benchmarks take
    /// the faster of both).
    pub fn read_probe(
        &self,
        mem: &GuestPages<'_>,
        frames: &DirtyBitmap,
        prefetch: bool,
    ) -> Result<u64> {
        let kernel = self.kernel;
        self.fold_pages(
            mem,
            frames,
            if prefetch { self.prefetch_pages } else { 0 },
            // SAFETY: `p` is a mapped guest page.
            |p, next| unsafe { kernel::read_raw(kernel, p, next) },
            |a, b| a ^ b,
        )
    }

    /// `f(page, next page)` over every page set in `frames`, split and threaded as hashing is,
    /// folded with `combine` (associative and commutative, 0 its identity).
    fn fold_pages(
        &self,
        mem: &GuestPages<'_>,
        frames: &DirtyBitmap,
        prefetch: usize,
        f: impl Fn(*const u8, *const u8) -> u64 + Sync,
        combine: impl Fn(u64, u64) -> u64 + Sync,
    ) -> Result<u64> {
        let plan = self.plan(frames.words());
        let ranks = vec![0u32; frames.words().len() + 1];
        self.pool.install(|| {
            plan.into_par_iter()
                .map(|(w0, w1)| -> Result<u64> {
                    let mut acc = 0u64;
                    for_each_page(
                        Walk {
                            tracked: frames,
                            ranks: &ranks,
                            mem,
                            prefetch,
                        },
                        |w| frames.words()[w],
                        w0,
                        w1,
                        |_, _, p, next| {
                            acc = combine(acc, f(p, next));
                            Ok(())
                        },
                    )?;
                    Ok(acc)
                })
                .try_reduce(|| 0, |a, b| Ok(combine(a, b)))
        })
    }

    /// A [`Walk`] over `tracked` with this hasher's prefetch distance.
    fn walk<'a, 'm>(
        &self,
        tracked: &'a DirtyBitmap,
        ranks: &'a [u32],
        mem: &'a GuestPages<'m>,
    ) -> Walk<'a, 'm> {
        Walk {
            tracked,
            ranks,
            mem,
            prefetch: self.prefetch_pages,
        }
    }
}

/// What [`for_each_page`] walks: the tracked set, its ranks, the memory, the prefetch distance.
#[derive(Clone, Copy)]
struct Walk<'a, 'm> {
    tracked: &'a DirtyBitmap,
    ranks: &'a [u32],
    mem: &'a GuestPages<'m>,
    prefetch: usize,
}

/// Visit the pages of `tracked` set in `work(w)` for words `w0..w1`, ascending, calling
/// `f(gfn, dense index, host pointer, next page's host pointer)`. The dense index is only
/// meaningful when `ranks` are `tracked`'s ranks.
fn for_each_page<W, F>(walk: Walk<'_, '_>, work: W, w0: usize, w1: usize, mut f: F) -> Result<()>
where
    W: Fn(usize) -> u64,
    F: FnMut(Gfn, usize, *const u8, *const u8) -> Result<()>,
{
    let Walk {
        tracked,
        ranks,
        mem,
        prefetch,
    } = walk;
    let base = tracked.base().0;
    let tw = tracked.words();
    let mut cursor = mem.cursor();
    // A ring of the last `prefetch` pages seen: page i is hashed when page i + prefetch is found,
    // with that page's address to prefetch.
    let mut ring = [(Gfn(0), 0usize, std::ptr::null::<u8>()); MAX_PREFETCH_PAGES];
    let (mut head, mut len) = (0usize, 0usize);
    for w in w0..w1 {
        let t = tw[w];
        let mut m = work(w) & t;
        while m != 0 {
            let b = m.trailing_zeros();
            m &= m - 1;
            let gfn = Gfn(base + w as u64 * 64 + u64::from(b));
            let idx = ranks[w] as usize + (t & ((1u64 << b) - 1)).count_ones() as usize;
            let ptr = cursor.host(gfn)?;
            if prefetch == 0 {
                f(gfn, idx, ptr, ptr)?;
                continue;
            }
            if len == prefetch {
                let (g, i, p) = ring[head];
                f(g, i, p, ptr)?;
                head = (head + 1) % MAX_PREFETCH_PAGES;
                len -= 1;
            }
            ring[(head + len) % MAX_PREFETCH_PAGES] = (gfn, idx, ptr);
            len += 1;
        }
    }
    while len > 0 {
        let (g, i, p) = ring[head];
        f(g, i, p, p)?;
        head = (head + 1) % MAX_PREFETCH_PAGES;
        len -= 1;
    }
    Ok(())
}

/// Skips `skip` elements of the optional slice `rest`, takes the next `len` as one task's own
/// slice and leaves the remainder in `rest`; `None` stays `None`.
fn carve<'a, T>(rest: &mut Option<&'a mut [T]>, skip: usize, len: usize) -> Option<&'a mut [T]> {
    let (_, t) = rest.take()?.split_at_mut(skip);
    let (m, t) = t.split_at_mut(len);
    *rest = Some(t);
    Some(m)
}
