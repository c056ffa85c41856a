//! A deterministic, blind mutator for the `replay` runner: stacked byte-level mutations of corpus
//! inputs (bit flips, interesting values, truncations, erased, duplicated and spliced ranges,
//! random bytes), the kinds libFuzzer's default mutators make, without its coverage feedback.

/// A xorshift64 generator (never seeded with 0).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value; 0 is mapped to a fixed odd constant).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    u64::MAX,
];

/// Writes `out`, a mutation of `corpus[i]` for a random `i`: one to four stacked mutations, each
/// one of nine kinds (one a splice with another corpus input). `corpus` must not be empty.
pub fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&corpus[rng.below(corpus.len())]);
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(9) {
            0 => {
                // Flip one to four bits.
                for _ in 0..1 + rng.below(4) {
                    if len > 0 {
                        let at = rng.below(len);
                        out[at] ^= 1 << rng.below(8);
                    }
                }
            }
            1 => {
                // A random byte.
                if len > 0 {
                    let at = rng.below(len);
                    out[at] = rng.next_u64() as u8;
                }
            }
            2 => {
                // An interesting 1, 2, 4 or 8-byte little-endian value.
                let width = 1 << rng.below(4);
                if len >= width {
                    let at = rng.below(len - width + 1);
                    let mut v = INTERESTING[rng.below(INTERESTING.len())];
                    if rng.below(4) == 0 {
                        v = v.wrapping_add(rng.below(16) as u64).wrapping_sub(8);
                    }
                    out[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
                }
            }
            3 => out.truncate(rng.below(len + 1)),
            4 => {
                // Erase a range (short, mostly).
                if len > 0 {
                    let a = rng.below(len);
                    let cap = if rng.below(4) == 0 { len } else { 64 };
                    let n = 1 + rng.below((len - a).min(cap));
                    out.drain(a..a + n);
                }
            }
            5 => {
                // Duplicate a range at another place.
                if len > 0 {
                    let a = rng.below(len);
                    let b = (a + 1 + rng.below(256)).min(len);
                    let piece = out[a..b].to_vec();
                    let at = rng.below(len + 1);
                    out.splice(at..at, piece);
                }
            }
            6 => {
                // Insert random bytes.
                let at = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                out.splice(at..at, bytes);
            }
            7 => {
                // Copy a range over another place.
                if len > 1 {
                    let a = rng.below(len);
                    let n = 1 + rng.below((len - a).min(64));
                    let to = rng.below(len - n + 1);
                    out.copy_within(a..a + n, to);
                }
            }
            _ => {
                // Splice: this input's head, another's tail (or a piece of it).
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                let to = if rng.below(2) == 0 {
                    other.len()
                } else {
                    (from + rng.below(512)).min(other.len())
                };
                out.truncate(cut);
                out.extend_from_slice(&other[from..to]);
            }
        }
    }
}
