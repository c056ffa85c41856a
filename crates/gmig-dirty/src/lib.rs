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
#![warn(missing_docs)]
