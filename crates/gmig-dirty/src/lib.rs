//! # gmig-dirty
//!
//! Software dirty-page tracking for memory a GPU writes behind KVM's back.
//!
//! **Owns:** xxh3 hashing of 4 KiB guest pages read through `vm-memory`, in parallel on `rayon`;
//! "hash what was sent" copy-then-hash; compact per-frame hash snapshots and their diffs into dirty
//! bitmaps (optionally restricted to a candidate set); merging with KVM dirty-log bitmaps; a
//! sampling pre-filter; zero-page detection.
//!
//! **Must not know about:** GPUs, command buffers, VFIO or migration streams: it sees guest frames
//! and bytes only.
//!
//! ## Pieces
//! - [`DirtyBitmap`]: a set of guest frames over a span, one bit per 4 KiB page in KVM's
//!   `KVM_GET_DIRTY_LOG` layout (`u64` words); merge, intersect, iterate set frames or runs.
//! - [`GuestPages`]: which host address backs each guest frame of a `vm-memory` guest memory.
//! - [`HashSnapshot`]: the hash of the bytes last sent for each tracked frame (8 bytes per page).
//! - [`Hasher`]: a rayon pool of a chosen size running the widest xxh3 kernel the CPU has
//!   ([`Kernel`]); copies pages for sending while recording their hashes, and diffs memory against a
//!   snapshot, optionally restricted to candidates and streaming dirty frames to a sender.
//!
//! ## The migration flow
//! ```
//! use gmig_dirty::{DirtyBitmap, Gfn, GuestPages, HashSnapshot, Hasher, PageKind, PAGE_SIZE};
//! use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 * PAGE_SIZE)])?;
//! mem.write_obj(0x1234_u64, GuestAddress(0x3000))?;
//! let pages = GuestPages::new(&mem)?;
//! let hasher = Hasher::new(0)?; // one thread per core
//!
//! // Track the GTT-backed frames (here: all of them).
//! let mut snap = HashSnapshot::new(pages.frames()?)?;
//!
//! // Pre-copy, guest running: copy a batch into the send buffer; the snapshot records the hash
//! // of exactly the copied bytes. Zero pages can go on the wire as a marker.
//! let batch: Vec<Gfn> = snap.tracked().iter().collect();
//! let mut buf = vec![0u8; batch.len() * PAGE_SIZE];
//! let digests = hasher.copy_for_send(&pages, &mut snap, &batch, &mut buf)?;
//! assert_eq!(digests[3].kind, PageKind::Data);
//! assert_eq!(digests[4].kind, PageKind::Zero);
//!
//! // The GPU writes a page; the CPU dirties another (KVM's dirty log reports it).
//! mem.write_obj(7_u8, GuestAddress(0x5000))?;
//! let kvm_log = vec![1u64 << 9]; // KVM_GET_DIRTY_LOG words for a 64-page memslot at frame 0
//!
//! // Downtime: re-hash in parallel and diff; merge the CPU-dirty pages; send the union.
//! let mut dirty = hasher.diff(&pages, &snap, None)?;
//! dirty.merge_kvm_log(Gfn(0), 64, &kvm_log)?;
//! assert_eq!(dirty.iter().collect::<Vec<_>>(), vec![Gfn(5), Gfn(9)]);
//! # Ok(()) }
//! ```
//!
//! To overlap sending with hashing, [`Hasher::diff_with`] hands dirty frames to a callback in
//! batches as workers find them. See `docs/dirty-pages.md` for the design and
//! `docs/performance.md` for measured throughput.
#![warn(missing_docs)]

mod addr;
pub mod bitmap;
pub mod kernel;

pub use addr::{Gfn, PageDigest, PageHash, PageKind, PAGE_SHIFT, PAGE_SIZE};
pub use bitmap::DirtyBitmap;
pub use kernel::Kernel;
pub mod hasher;
pub mod memory;
pub mod snapshot;

pub use hasher::{DiffScratch, HashError, Hasher, HasherOptions};
pub use memory::GuestPages;
pub use snapshot::HashSnapshot;

/// The `vm-memory` version this crate's API speaks, re-exported so callers name the same types.
pub use vm_memory;
