//! xxh3-64 of exactly one 4 KiB page, with optional fused copy, zero detection and prefetch.
//!
//! `xxhash-rust` selects its SIMD width with `cfg(target_feature)` when *it* is compiled, so a
//! default x86-64 build always runs its SSE2 path, and wrapping a call in
//! `#[target_feature(enable = "avx2")]` does not change that (the `cfg`s were resolved long before).
//! For the one input length that matters here (4096 bytes, default secret, seed 0) this module
//! carries its own AVX2 and AVX-512 instantiations of the xxh3 long-input loop, chosen at run time,
//! and checks them bit for bit against `xxhash_rust::xxh3::xxh3_64` in tests. The portable kernel is
//! `xxhash-rust` itself.
//!
//! For a 4096-byte input xxh3 consumes 64 stripes of 64 bytes: three blocks of 16 stripes (each
//! followed by a scramble), 15 stripes of the last block, and the final stripe with the secret at
//! offset 121. Every stripe is loaded once; the fused variant stores the loaded vector to the send
//! buffer and feeds the same register to the hash, so the hash is exactly that of the bytes written.

use xxhash_rust::const_xxh3::const_custom_default_secret;

use crate::addr::{PageDigest, PageHash, PageKind, PAGE_SIZE};

const SECRET: [u8; 192] = const_custom_default_secret(0);

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

const INIT_ACC: [u64; 8] = [
    PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
];

/// Which implementation hashes pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `xxhash-rust` as compiled (SSE2 on a default x86-64 build); copies with `memcpy` first.
    Portable,
    /// Own AVX2 instantiation of the xxh3 stripe loop (x86-64 with AVX2 only).
    Avx2,
    /// Own AVX-512F instantiation of the xxh3 stripe loop (x86-64 with AVX-512F only).
    Avx512,
}

impl Kernel {
    /// The widest kernel this CPU runs.
    pub fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Kernel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    }

    /// Whether this CPU can run the kernel.
    pub fn is_supported(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Short name (`"portable"`, `"avx2"`, `"avx512"`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
        }
    }

    /// Hash the page at `src`; `prefetch` is the next page the caller will hash (its lines are
    /// prefetched while this page is hashed; pass `src` again when there is none).
    ///
    /// # Safety
    /// `src` must be valid for reads of [`PAGE_SIZE`] bytes. `prefetch` is only prefetched, never
    /// dereferenced, so any value is allowed. `self.is_supported()` must be true.
    #[inline]
    pub(crate) unsafe fn hash_raw(self, src: *const u8, prefetch: *const u8) -> PageDigest {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: forwarded caller contract; the feature was checked by `is_supported`.
            Kernel::Avx512 => unsafe {
                if prefetch == src {
                    x86::page_avx512::<false, false>(src, std::ptr::null_mut(), prefetch)
                } else {
                    x86::page_avx512::<false, true>(src, std::ptr::null_mut(), prefetch)
                }
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Kernel::Avx2 => unsafe {
                if prefetch == src {
                    x86::page_avx2::<false, false>(src, std::ptr::null_mut(), prefetch)
                } else {
                    x86::page_avx2::<false, true>(src, std::ptr::null_mut(), prefetch)
                }
            },
            _ => {
                // SAFETY: caller guarantees PAGE_SIZE readable bytes. Guest memory may change
                // under us; the hash is then of some torn view, which is why senders use the
                // copying variant.
                let page = unsafe { std::slice::from_raw_parts(src, PAGE_SIZE) };
                portable_digest(page)
            }
        }
    }

    /// Copy the page at `src` to `dst` and return the digest of exactly the bytes written to `dst`.
    ///
    /// # Safety
    /// `src` valid for reads and `dst` valid for writes of [`PAGE_SIZE`] bytes, not overlapping.
    /// `self.is_supported()` must be true.
    #[inline]
    pub(crate) unsafe fn copy_hash_raw(
        self,
        src: *const u8,
        dst: *mut u8,
        prefetch: *const u8,
    ) -> PageDigest {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: forwarded caller contract; the feature was checked by `is_supported`.
            Kernel::Avx512 => unsafe {
                if prefetch == src {
                    x86::page_avx512::<true, false>(src, dst, prefetch)
                } else {
                    x86::page_avx512::<true, true>(src, dst, prefetch)
                }
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Kernel::Avx2 => unsafe {
                if prefetch == src {
                    x86::page_avx2::<true, false>(src, dst, prefetch)
                } else {
                    x86::page_avx2::<true, true>(src, dst, prefetch)
                }
            },
            _ => {
                // SAFETY: caller guarantees both ranges and that they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, PAGE_SIZE) };
                // SAFETY: `dst` now holds PAGE_SIZE initialised bytes that only we reference.
                let copy = unsafe { std::slice::from_raw_parts(dst, PAGE_SIZE) };
                portable_digest(copy)
            }
        }
    }

    /// Digest of a page held in a normal buffer.
    pub fn hash_page(self, page: &[u8; PAGE_SIZE]) -> PageDigest {
        let k = if self.is_supported() {
            self
        } else {
            Kernel::Portable
        };
        // SAFETY: `page` is PAGE_SIZE readable bytes; `k` is supported.
        unsafe { k.hash_raw(page.as_ptr(), page.as_ptr()) }
    }

    /// Digest of `page`, prefetching the lines of `next` (the page the caller hashes next) meanwhile.
    pub fn hash_page_prefetching(
        self,
        page: &[u8; PAGE_SIZE],
        next: &[u8; PAGE_SIZE],
    ) -> PageDigest {
        let k = if self.is_supported() {
            self
        } else {
            Kernel::Portable
        };
        // SAFETY: `page` is PAGE_SIZE readable bytes; `next` is only prefetched; `k` is supported.
        unsafe { k.hash_raw(page.as_ptr(), next.as_ptr()) }
    }

    /// Copy `src` into `dst` and return the digest of the copy.
    pub fn copy_hash_page(self, src: &[u8; PAGE_SIZE], dst: &mut [u8; PAGE_SIZE]) -> PageDigest {
        let k = if self.is_supported() {
            self
        } else {
            Kernel::Portable
        };
        // SAFETY: distinct borrows cannot overlap; both are PAGE_SIZE long; `k` is supported.
        unsafe { k.copy_hash_raw(src.as_ptr(), dst.as_mut_ptr(), src.as_ptr()) }
    }
}

fn portable_digest(page: &[u8]) -> PageDigest {
    let hash = PageHash(xxhash_rust::xxh3::xxh3_64(page));
    // Only a page whose hash equals the zero-page hash can be zero; confirm on the (cached) bytes.
    let kind = if hash == PageHash::ZERO_PAGE && is_zero(page) {
        PageKind::Zero
    } else {
        PageKind::Data
    };
    PageDigest { hash, kind }
}

/// Whether every byte of `bytes` is zero: an OR-fold over 64-byte blocks with no early exit, so it
/// compiles to wide vector loads. (A byte-wise `all(|b| b == 0)` ran several times slower and, on
/// mostly-zero guests, dominated a full re-hash: most pages there hash to the zero page's hash.)
#[inline]
fn is_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(64);
    let mut acc = [0u64; 8];
    for block in &mut blocks {
        for (a, word) in acc.iter_mut().zip(block.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            *a |= u64::from_ne_bytes(w);
        }
    }
    acc.iter().fold(0, |x, &a| x | a) == 0 && blocks.remainder().iter().all(|&b| b == 0)
}

fn mul128_fold64(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

fn read_secret_u64(off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&SECRET[off..off + 8]);
    u64::from_le_bytes(b)
}

/// xxh3's final merge of the eight accumulators for a 4096-byte input.
fn merge_accs(acc: &[u64; 8]) -> u64 {
    const MERGE_START: usize = 11;
    let mut result = (PAGE_SIZE as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let s = MERGE_START + 16 * i;
        result = result.wrapping_add(mul128_fold64(
            acc[2 * i] ^ read_secret_u64(s),
            acc[2 * i + 1] ^ read_secret_u64(s + 8),
        ));
    }
    // avalanche
    result ^= result >> 37;
    result = result.wrapping_mul(0x1656_6791_9E37_79F9);
    result ^ (result >> 32)
}

/// Eight u64 words sampled across the page, folded to 32 bits. Different samples imply different
/// pages; equal samples imply nothing.
pub(crate) const SAMPLE_OFFSETS: [usize; 8] = [0, 584, 1168, 1752, 2336, 2920, 3504, 4088];

/// # Safety
/// `src` must be valid for reads of [`PAGE_SIZE`] bytes.
#[inline]
pub(crate) unsafe fn sample_raw(src: *const u8) -> u32 {
    let mut h: u64 = PRIME64_5;
    for off in SAMPLE_OFFSETS {
        // SAFETY: every offset + 8 <= PAGE_SIZE and the caller guarantees the page is readable.
        let w = unsafe { std::ptr::read_unaligned(src.add(off).cast::<u64>()) };
        h = (h ^ w).wrapping_mul(PRIME64_1).rotate_left(31);
    }
    (h ^ (h >> 32)) as u32
}

/// Sample of a page held in a normal buffer (see the sampling pre-filter).
pub fn sample_page(page: &[u8; PAGE_SIZE]) -> u32 {
    // SAFETY: `page` is PAGE_SIZE readable bytes.
    unsafe { sample_raw(page.as_ptr()) }
}

/// Read-only pass over one page with the widest loads available, returning an XOR fold. This is
/// the "plain read" baseline benchmarks compare hashing against.
///
/// # Safety
/// `src` must be valid for reads of [`PAGE_SIZE`] bytes.
#[inline]
pub(crate) unsafe fn read_raw(kernel: Kernel, src: *const u8, prefetch: *const u8) -> u64 {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded contract; feature availability is implied by the kernel choice.
        Kernel::Avx512 => unsafe {
            if prefetch == src {
                x86::read_avx512::<false>(src, prefetch)
            } else {
                x86::read_avx512::<true>(src, prefetch)
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Kernel::Avx2 => unsafe {
            if prefetch == src {
                x86::read_avx2::<false>(src, prefetch)
            } else {
                x86::read_avx2::<true>(src, prefetch)
            }
        },
        _ => {
            let mut x = [0u64; 4];
            for i in (0..PAGE_SIZE).step_by(32) {
                for (j, v) in x.iter_mut().enumerate() {
                    // SAFETY: i + 8 * j + 8 <= PAGE_SIZE.
                    *v ^= unsafe { std::ptr::read_unaligned(src.add(i + 8 * j).cast::<u64>()) };
                }
            }
            x[0] ^ x[1] ^ x[2] ^ x[3]
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{merge_accs, INIT_ACC, PRIME32_1, SECRET};
    use crate::addr::{PageDigest, PageHash, PageKind, PAGE_SIZE};

    const SWAP: i32 = 0b01_00_11_10; // _MM_SHUFFLE(1, 0, 3, 2)

    /// Digest from the final accumulators; `bytes` are the hashed bytes (the copy, when copying),
    /// checked for all-zero only when the hash is the zero page's.
    ///
    /// # Safety
    /// `bytes` must be readable for PAGE_SIZE bytes.
    #[inline(always)]
    unsafe fn digest(acc: [u64; 8], bytes: *const u8) -> PageDigest {
        let hash = PageHash(merge_accs(&acc));
        let zero = hash == PageHash::ZERO_PAGE && {
            // SAFETY: forwarded caller contract.
            let page = unsafe { std::slice::from_raw_parts(bytes, PAGE_SIZE) };
            super::is_zero(page)
        };
        PageDigest {
            hash,
            kind: if zero { PageKind::Zero } else { PageKind::Data },
        }
    }

    /// # Safety
    /// AVX-512F available; `src` readable for 4096 bytes; `dst` writable for 4096 bytes when COPY.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn page_avx512<const COPY: bool, const PF: bool>(
        src: *const u8,
        dst: *mut u8,
        pf: *const u8,
    ) -> PageDigest {
        let key = SECRET.as_ptr();
        // SAFETY: every load/store below is at offset < 4096 - 63 of `src`/`dst`,
        // and at offset < 192 - 63 of the 192-byte SECRET; unaligned intrinsics are used.
        unsafe {
            let mut acc = _mm512_loadu_si512(INIT_ACC.as_ptr().cast());
            let prime = _mm512_set1_epi32(PRIME32_1 as i32);
            let stripe = |acc: __m512i, n: usize, koff: usize| -> __m512i {
                if PF {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(n * 64).cast());
                }
                let d = _mm512_loadu_si512(src.add(n * 64).cast());
                if COPY {
                    _mm512_storeu_si512(dst.add(n * 64).cast(), d);
                }
                let k = _mm512_loadu_si512(key.add(koff).cast());
                let dk = _mm512_xor_si512(d, k);
                let prod = _mm512_mul_epu32(dk, _mm512_srli_epi64::<32>(dk));
                let sw = _mm512_shuffle_epi32::<SWAP>(d);
                _mm512_add_epi64(acc, _mm512_add_epi64(prod, sw))
            };
            for b in 0..3 {
                for s in 0..16 {
                    acc = stripe(acc, b * 16 + s, s * 8);
                }
                // scramble
                let k = _mm512_loadu_si512(key.add(128).cast());
                let x = _mm512_xor_si512(acc, _mm512_srli_epi64::<47>(acc));
                let dk = _mm512_xor_si512(x, k);
                let lo = _mm512_mul_epu32(dk, prime);
                let hi = _mm512_mul_epu32(_mm512_srli_epi64::<32>(dk), prime);
                acc = _mm512_add_epi64(lo, _mm512_slli_epi64::<32>(hi));
            }
            for s in 0..15 {
                acc = stripe(acc, 48 + s, s * 8);
            }
            acc = stripe(acc, 63, 192 - 64 - 7);
            let mut out = [0u64; 8];
            _mm512_storeu_si512(out.as_mut_ptr().cast(), acc);
            digest(out, if COPY { dst.cast_const() } else { src })
        }
    }

    /// # Safety
    /// AVX2 available; `src` readable for 4096 bytes; `dst` writable for 4096 bytes when COPY.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn page_avx2<const COPY: bool, const PF: bool>(
        src: *const u8,
        dst: *mut u8,
        pf: *const u8,
    ) -> PageDigest {
        let key = SECRET.as_ptr();
        // SAFETY: every load/store below is at offset < 4096 - 31 of `src`/`dst`,
        // and at offset < 192 - 31 of the 192-byte SECRET; unaligned intrinsics are used.
        unsafe {
            let mut a0 = _mm256_loadu_si256(INIT_ACC.as_ptr().cast());
            let mut a1 = _mm256_loadu_si256(INIT_ACC.as_ptr().add(4).cast());
            let prime = _mm256_set1_epi32(PRIME32_1 as i32);
            let half = |acc: __m256i, off: usize, koff: usize| -> __m256i {
                let d = _mm256_loadu_si256(src.add(off).cast());
                if COPY {
                    _mm256_storeu_si256(dst.add(off).cast(), d);
                }
                let k = _mm256_loadu_si256(key.add(koff).cast());
                let dk = _mm256_xor_si256(d, k);
                let prod = _mm256_mul_epu32(dk, _mm256_srli_epi64::<32>(dk));
                let sw = _mm256_shuffle_epi32::<SWAP>(d);
                _mm256_add_epi64(acc, _mm256_add_epi64(prod, sw))
            };
            let scramble = |acc: __m256i, koff: usize| -> __m256i {
                let k = _mm256_loadu_si256(key.add(koff).cast());
                let x = _mm256_xor_si256(acc, _mm256_srli_epi64::<47>(acc));
                let dk = _mm256_xor_si256(x, k);
                let lo = _mm256_mul_epu32(dk, prime);
                let hi = _mm256_mul_epu32(_mm256_srli_epi64::<32>(dk), prime);
                _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi))
            };
            for b in 0..3 {
                for s in 0..16 {
                    let n = b * 16 + s;
                    if PF {
                        _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(n * 64).cast());
                    }
                    a0 = half(a0, n * 64, s * 8);
                    a1 = half(a1, n * 64 + 32, s * 8 + 32);
                }
                a0 = scramble(a0, 128);
                a1 = scramble(a1, 160);
            }
            for s in 0..15 {
                let n = 48 + s;
                if PF {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(n * 64).cast());
                }
                a0 = half(a0, n * 64, s * 8);
                a1 = half(a1, n * 64 + 32, s * 8 + 32);
            }
            if PF {
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(63 * 64).cast());
            }
            a0 = half(a0, 63 * 64, 121);
            a1 = half(a1, 63 * 64 + 32, 121 + 32);
            let mut out = [0u64; 8];
            _mm256_storeu_si256(out.as_mut_ptr().cast(), a0);
            _mm256_storeu_si256(out.as_mut_ptr().add(4).cast(), a1);
            digest(out, if COPY { dst.cast_const() } else { src })
        }
    }

    /// # Safety
    /// AVX-512F available; `src` readable for 4096 bytes.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn read_avx512<const PF: bool>(src: *const u8, pf: *const u8) -> u64 {
        // SAFETY: loads at offsets < 4096 - 63 of `src`; prefetches never fault.
        unsafe {
            // One 64-byte load per stripe in ascending order, like the hashing kernels: a baseline
            // whose loads the compiler reorders trains the hardware prefetchers worse.
            let mut x = _mm512_setzero_si512();
            for n in 0..64 {
                if PF {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(n * 64).cast());
                }
                let d = _mm512_loadu_si512(src.add(n * 64).cast());
                x = _mm512_add_epi64(x, d);
                std::arch::asm!("/* {0} */", in(zmm_reg) x, options(nomem, nostack, preserves_flags));
            }
            _mm512_reduce_add_epi64(x) as u64
        }
    }

    /// # Safety
    /// AVX2 available; `src` readable for 4096 bytes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn read_avx2<const PF: bool>(src: *const u8, pf: *const u8) -> u64 {
        // SAFETY: loads at offsets < 4096 - 31 of `src`; prefetches never fault.
        unsafe {
            // Ascending loads, one stripe (two 32-byte halves) at a time; see `read_avx512`.
            let (mut x0, mut x1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for n in 0..64 {
                if PF {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(n * 64).cast());
                }
                x0 = _mm256_add_epi64(x0, _mm256_loadu_si256(src.add(n * 64).cast()));
                x1 = _mm256_add_epi64(x1, _mm256_loadu_si256(src.add(n * 64 + 32).cast()));
                std::arch::asm!(
                    "/* {0} {1} */",
                    in(ymm_reg) x0,
                    in(ymm_reg) x1,
                    options(nomem, nostack, preserves_flags)
                );
            }
            let r = _mm256_add_epi64(x0, x1);
            let mut out = [0u64; 4];
            _mm256_storeu_si256(out.as_mut_ptr().cast(), r);
            out[0] ^ out[1] ^ out[2] ^ out[3]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels() -> Vec<Kernel> {
        [Kernel::Portable, Kernel::Avx2, Kernel::Avx512]
            .into_iter()
            .filter(|k| k.is_supported())
            .collect()
    }

    fn page_from(seed: u64) -> Box<[u8; PAGE_SIZE]> {
        let mut p = Box::new([0u8; PAGE_SIZE]);
        let mut x = seed.wrapping_mul(PRIME64_2) | 1;
        for b in p.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        p
    }

    #[test]
    fn zero_hash_constant_matches_runtime_xxh3() {
        assert_eq!(
            PageHash::ZERO_PAGE.0,
            xxhash_rust::xxh3::xxh3_64(&[0u8; PAGE_SIZE])
        );
    }

    #[test]
    fn every_kernel_matches_reference_xxh3() {
        let ks = kernels();
        eprintln!("kernels on this CPU: {ks:?}");
        for seed in 0..64 {
            let mut page = page_from(seed);
            // Also pages differing in a single byte at a stripe border.
            if seed % 2 == 1 {
                page[(seed as usize * 977) % PAGE_SIZE] ^= 0x80;
            }
            let want = xxhash_rust::xxh3::xxh3_64(&page[..]);
            for &k in &ks {
                let d = k.hash_page(&page);
                assert_eq!(d.hash.0, want, "{k:?} seed {seed}");
                assert_eq!(d.kind, PageKind::Data);
                let mut dst = Box::new([0u8; PAGE_SIZE]);
                let c = k.copy_hash_page(&page, &mut dst);
                assert_eq!(c, d, "{k:?} copy");
                assert_eq!(&dst[..], &page[..]);
            }
        }
    }

    #[test]
    fn zero_pages_are_marked_and_near_zero_pages_are_not() {
        for k in kernels() {
            let zero = Box::new([0u8; PAGE_SIZE]);
            let d = k.hash_page(&zero);
            assert_eq!(d.kind, PageKind::Zero, "{k:?}");
            assert_eq!(d.hash, PageHash::ZERO_PAGE);
            for pos in [0, 63, 64, 2047, 4032, 4095] {
                let mut p = Box::new([0u8; PAGE_SIZE]);
                p[pos] = 1;
                assert_eq!(k.hash_page(&p).kind, PageKind::Data, "{k:?} byte {pos}");
            }
        }
    }

    #[test]
    fn is_zero_sees_a_set_bit_anywhere() {
        let page = [0u8; PAGE_SIZE];
        assert!(is_zero(&page));
        for pos in 0..PAGE_SIZE {
            for bit in [0u8, 7] {
                let mut p = page;
                p[pos] = 1 << bit;
                assert!(!is_zero(&p), "byte {pos} bit {bit}");
            }
        }
        // Lengths that leave a remainder after the 64-byte blocks.
        let mut odd = [0u8; 100];
        assert!(is_zero(&odd));
        odd[99] = 0x80;
        assert!(!is_zero(&odd));
    }

    #[test]
    fn sample_sees_sampled_words_only() {
        let p = page_from(3);
        let s = sample_page(&p);
        let mut q = p.clone();
        q[SAMPLE_OFFSETS[5] + 3] ^= 1;
        assert_ne!(sample_page(&q), s);
        let mut r = p.clone();
        r[1] ^= 0; // unchanged
        r[100] ^= 1; // not sampled
        assert_eq!(sample_page(&r), s);
    }

    #[test]
    fn read_kernels_agree() {
        let p = page_from(9);
        let want = {
            // SAFETY: page is PAGE_SIZE bytes.
            unsafe { read_raw(Kernel::Portable, p.as_ptr(), p.as_ptr()) }
        };
        for k in kernels() {
            // SAFETY: page is PAGE_SIZE bytes; kernel supported.
            let got = unsafe { read_raw(k, p.as_ptr(), p.as_ptr()) };
            // The fold widths differ, so compare zero-ness, which all must agree on.
            assert_eq!(got == 0, want == 0);
        }
    }
}
