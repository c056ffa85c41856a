//! Checkpoint and restore of the whole vGPU device state (not guest RAM, which the migration
//! engine sends page by page), with GGTT remapping onto other slices.
//!
//! # Envelope
//! ```text
//! 0   8  magic "GMIGVGPU"
//! 8   2  format version (little endian), currently 1
//! 10  2  reserved, 0
//! 12  4  body length in bytes
//! 16  4  CRC-32 of the body
//! 20  …  body: postcard encoding of [`VgpuState`]
//! ```
//! A load refuses a bad magic, a newer version, a body over [`MAX_STATE_BYTES`], a bad CRC, or a
//! body that does not decode or does not fit the vGPU type.
//!
//! # Remapping on restore
//! The state holds the *host-side* addresses the hardware would use: shadow registers (status
//! pages, plane surfaces, cursors, fences), the rebased LRCA of each queued workload and the GGTT
//! addresses inside its shadowed ring and batch commands. Restoring onto slices elsewhere rebases all
//! of them through gmig-cmdparser (`remap_in_place` for commands, `SliceMove::rebase` for single
//! addresses), all or nothing. The guest's own view (its registers, its GGTT entries at its old
//! offsets, its context images and ring contents in guest RAM) is left exactly as it was: after the
//! restore the guest keeps using its old addresses and the vGPU keeps remapping what it submits.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::gm::{GgttOffset, SliceMove, VgpuSlices};
use crate::gtt::{Ggtt, GgttState, GuestRam};
use crate::mmio;
use crate::vgpu::{EngineState, ExecStats, GpuFault, Vgpu, VgpuConfig, Workload, WriteLog};

/// Envelope magic.
pub const STATE_MAGIC: [u8; 8] = *b"GMIGVGPU";
/// Current format version.
pub const STATE_VERSION: u16 = 1;
/// Largest body a load accepts (a denial-of-service guard).
pub const MAX_STATE_BYTES: usize = 64 << 20;
const HEADER_LEN: usize = 20;

/// Errors of checkpoint and restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Fewer bytes than the header or the body length says.
    #[error("checkpoint truncated: {got} bytes, need {need}")]
    Truncated {
        /// Bytes given.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Wrong magic.
    #[error("not a gmig vGPU checkpoint (magic {0:02x?})")]
    BadMagic([u8; 8]),
    /// A version this build cannot read.
    #[error("checkpoint version {0} is not supported (this build reads {STATE_VERSION})")]
    UnsupportedVersion(u16),
    /// Body larger than [`MAX_STATE_BYTES`].
    #[error("checkpoint body of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// CRC mismatch.
    #[error("checkpoint CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc {
        /// CRC in the header.
        stored: u32,
        /// CRC of the body.
        computed: u32,
    },
    /// The body does not decode.
    #[error("checkpoint body does not decode: {0}")]
    Decode(String),
    /// The state does not fit the target (type, slice sizes, table sizes).
    #[error("checkpoint does not fit the target: {0}")]
    Mismatch(&'static str),
    /// An address in the state could not be remapped onto the new slices.
    #[error("remapping failed: {0}")]
    Remap(String),
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, CheckpointError>;

/// The serialized device state (everything but guest RAM).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VgpuState {
    /// Configuration.
    pub cfg: VgpuConfig,
    /// The slices the guest was told about.
    pub guest_view: VgpuSlices,
    /// The slices the vGPU occupied on the saving host.
    pub host: VgpuSlices,
    /// Whether the vGPU remaps (false only in negative-control tests).
    pub remap: bool,
    /// Guest-visible registers.
    pub vregs: Vec<(u32, u32)>,
    /// Host-side shadows of address registers.
    pub sregs: Vec<(u32, u32)>,
    /// GGTT entries.
    pub ggtt: GgttState,
    /// Execlist state per engine.
    pub engines: Vec<EngineState>,
    /// Queued, unfinished workloads (shadowed, host addresses).
    pub queue: Vec<Workload>,
    /// Whether submissions were accepted.
    pub accepting: bool,
    /// Faults reported so far.
    pub faults: Vec<GpuFault>,
    /// Counters.
    pub stats: ExecStats,
    /// PPGTT roots seen (guest-physical).
    pub ppgtt_roots: Vec<u64>,
    /// Next submission sequence number.
    pub next_seq: u64,
    /// Submitted-up-to ring offsets per context.
    pub ctx_heads: Vec<(u64, u32)>,
}

/// How to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreOptions {
    /// Rebase every host-side GGTT address onto the new slices and keep remapping new
    /// submissions. Turning it off is only for negative-control tests: the vGPU then runs with
    /// stale addresses.
    pub remap: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions { remap: true }
    }
}

impl VgpuState {
    /// Encodes the state into the versioned envelope.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain data into a Vec cannot fail.
        let body = postcard::to_stdvec(self).unwrap_or_default();
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&STATE_MAGIC);
        out.extend_from_slice(&STATE_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes an envelope.
    pub fn from_bytes(bytes: &[u8]) -> Result<VgpuState> {
        let header = bytes.get(..HEADER_LEN).ok_or(CheckpointError::Truncated {
            got: bytes.len(),
            need: HEADER_LEN,
        })?;
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&header[..8]);
        if magic != STATE_MAGIC {
            return Err(CheckpointError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([header[8], header[9]]);
        if version != STATE_VERSION {
            return Err(CheckpointError::UnsupportedVersion(version));
        }
        let len = u32::from_le_bytes([header[12], header[13], header[14], header[15]]) as usize;
        if len > MAX_STATE_BYTES {
            return Err(CheckpointError::TooLarge(len));
        }
        let stored = u32::from_le_bytes([header[16], header[17], header[18], header[19]]);
        let need = HEADER_LEN + len;
        let body = bytes
            .get(HEADER_LEN..need)
            .ok_or(CheckpointError::Truncated {
                got: bytes.len(),
                need,
            })?;
        let computed = crc32fast::hash(body);
        if computed != stored {
            return Err(CheckpointError::BadCrc { stored, computed });
        }
        postcard::from_bytes(body).map_err(|e| CheckpointError::Decode(e.to_string()))
    }
}

impl Vgpu {
    /// Captures the device state. Pause first ([`Vgpu::pause`]) so nothing changes meanwhile;
    /// queued workloads are part of the state.
    pub fn save(&self) -> VgpuState {
        VgpuState {
            cfg: self.cfg,
            guest_view: self.guest_view,
            host: self.host,
            remap: self.remap,
            vregs: self.vregs.iter().map(|(k, v)| (*k, *v)).collect(),
            sregs: self.sregs.iter().map(|(k, v)| (*k, *v)).collect(),
            ggtt: self.ggtt.save(),
            engines: self.engines.to_vec(),
            queue: self.queue.iter().cloned().collect(),
            accepting: self.accepting,
            faults: self.faults.clone(),
            stats: self.stats.clone(),
            ppgtt_roots: self.ppgtt_roots.iter().copied().collect(),
            next_seq: self.next_seq,
            ctx_heads: self.ctx_heads.iter().map(|(k, v)| (*k, *v)).collect(),
        }
    }

    /// Rebuilds a vGPU from `state` on guest RAM `mem` (already holding the guest's pages), living
    /// in `dest` slices on this host.
    pub fn restore(
        state: &VgpuState,
        mem: GuestRam,
        dest: VgpuSlices,
        opts: RestoreOptions,
    ) -> Result<Vgpu> {
        let ty = state.cfg.ty;
        for s in [&state.host, &state.guest_view, &dest] {
            if s.aperture.size != ty.aperture_size() || s.hidden.size != ty.hidden_size() {
                return Err(CheckpointError::Mismatch(
                    "slice sizes differ from the vGPU type",
                ));
            }
        }
        if state.engines.len() != 4 {
            return Err(CheckpointError::Mismatch("engine count"));
        }
        let ggtt =
            Ggtt::load(&dest, &state.ggtt).ok_or(CheckpointError::Mismatch("GGTT table size"))?;
        let mv =
            SliceMove::new(state.host, dest).map_err(|e| CheckpointError::Remap(e.to_string()))?;
        let remap = state.remap && opts.remap;
        let mut engines: [EngineState; 4] = Default::default();
        for (dst, src) in engines.iter_mut().zip(&state.engines) {
            *dst = src.clone();
        }
        let mut vgpu = Vgpu {
            cfg: state.cfg,
            guest_view: state.guest_view,
            host: dest,
            remap,
            mem,
            vregs: state.vregs.iter().copied().collect(),
            sregs: BTreeMap::new(),
            ggtt,
            engines,
            queue: VecDeque::new(),
            accepting: state.accepting,
            faults: state.faults.clone(),
            stats: state.stats.clone(),
            ppgtt_roots: state.ppgtt_roots.iter().copied().collect::<BTreeSet<u64>>(),
            next_seq: state.next_seq,
            write_log: WriteLog::default(),
            ctx_heads: state.ctx_heads.iter().copied().collect(),
        };
        // Shadow registers: rebase host addresses onto the new slices.
        for &(reg, value) in &state.sregs {
            let v = match mmio::address_register(state.cfg.fence_num, reg) {
                Some(mask) if remap && value != 0 => {
                    let addr = u64::from(value & mask);
                    let h = mv.rebase(GgttOffset(addr)).ok_or_else(|| {
                        CheckpointError::Remap(format!("register {reg:#x} = {value:#x}"))
                    })?;
                    (h.0 as u32 & mask) | (value & !mask)
                }
                _ => value,
            };
            vgpu.sregs.insert(reg, v);
        }
        // Queued workloads: rebase their context images and every GGTT address in their commands.
        for w in &state.queue {
            let mut w = w.clone();
            if remap {
                w.lrca = mv.rebase(w.lrca).ok_or_else(|| {
                    CheckpointError::Remap(format!("context image {:#x}", w.lrca.0))
                })?;
                for c in &mut w.commands {
                    crate::shadow::remap_command(state.cfg.gen, w.engine, c, &mv).map_err(|e| {
                        CheckpointError::Remap(format!(
                            "workload {} at {:#x}: {e}",
                            w.seq, c.guest_addr
                        ))
                    })?;
                }
            }
            vgpu.queue.push_back(w);
        }
        Ok(vgpu)
    }
}
