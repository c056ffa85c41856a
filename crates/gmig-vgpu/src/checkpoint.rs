//! Checkpoint and restore of the whole vGPU device state (not guest RAM, which the migration
//! engine sends page by page), with GGTT remapping onto other slices.
//!
//! # Envelope
//! ```text
//! 0   8  magic "GMIGVGPU"
//! 8   2  format version (little endian), currently 3 (2: per-engine running execlist
//!        instead of a CSB write pointer, which is its register's; 3: a display section)
//! 10  2  reserved, 0
//! 12  4  body length in bytes
//! 16  4  CRC-32 of the body
//! 20  …  body: postcard encoding of [`VgpuState`], then (version 3) of its
//!        [`DisplayState`]
//! ```
//! Version 2 bodies (no display section) still load: the vGPU had no display model then, so
//! its guest never saw a monitor, and the restored vGPU has none.
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

use crate::display::state::DisplayState;
use crate::gm::{GgttOffset, SliceMove, VgpuSlices};
use crate::gtt::{Ggtt, GgttLog, GgttState, GuestRam};
use crate::mmio;
use crate::vgpu::{Vgpu, VgpuConfig};
use crate::work::{EngineState, ExecStats, GpuFault, Workload, WriteLog};

/// Envelope magic.
pub const STATE_MAGIC: [u8; 8] = *b"GMIGVGPU";
/// Current format version.
pub const STATE_VERSION: u16 = 3;
/// The oldest format version this build reads.
pub const OLDEST_STATE_VERSION: u16 = 2;
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
    #[error(
        "checkpoint version {0} is not supported (this build reads {OLDEST_STATE_VERSION} to {STATE_VERSION})"
    )]
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
    /// A queued command does not pass the audit on this host (a tampered or corrupt stream).
    #[error("queued work fails the audit: {0}")]
    Audit(String),
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
    /// The display (its own section of the body).
    #[serde(skip)]
    pub display: DisplayState,
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
        let mut body = postcard::to_stdvec(self).unwrap_or_default();
        body.extend(postcard::to_stdvec(&self.display).unwrap_or_default());
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
        if !(OLDEST_STATE_VERSION..=STATE_VERSION).contains(&version) {
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
        let decode = |e: postcard::Error| CheckpointError::Decode(e.to_string());
        let (mut state, rest): (VgpuState, _) = postcard::take_from_bytes(body).map_err(decode)?;
        if version >= 3 {
            let (display, rest) = postcard::take_from_bytes(rest).map_err(decode)?;
            if !rest.is_empty() {
                return Err(CheckpointError::Decode(format!(
                    "{} bytes after the display section",
                    rest.len()
                )));
            }
            state.display = display;
        }
        Ok(state)
    }
}

impl Vgpu {
    /// Captures the device state. Pause first ([`Vgpu::pause`]) so nothing changes meanwhile;
    /// queued workloads are part of the state.
    pub fn save(&self) -> VgpuState {
        self.save_with(self.ggtt.save())
    }

    /// Starts logging GGTT writes and returns the whole table as it is now: a migration sends it
    /// while the guest still runs, and at the stop only [`Vgpu::save_since_ggtt_log`]'s changes.
    pub fn start_ggtt_log(&mut self) -> GgttState {
        self.ggtt_log = Some(GgttLog::new(&self.ggtt));
        self.ggtt.save()
    }

    /// Stops logging GGTT writes.
    pub fn stop_ggtt_log(&mut self) {
        self.ggtt_log = None;
    }

    /// [`Vgpu::save`] whose `ggtt` holds only the entries written since
    /// [`Vgpu::start_ggtt_log`] (cleared ones as 0): O(entries written), not O(GTT size).
    /// `None` when no log runs.
    pub fn save_since_ggtt_log(&self) -> Option<VgpuState> {
        let log = self.ggtt_log.as_ref()?;
        Some(self.save_with(self.ggtt.changes(log)))
    }

    fn save_with(&self, ggtt: GgttState) -> VgpuState {
        VgpuState {
            cfg: self.cfg,
            guest_view: self.guest_view,
            host: self.host,
            remap: self.remap,
            vregs: self.vregs.iter().map(|(k, v)| (*k, *v)).collect(),
            sregs: self.sregs.iter().map(|(k, v)| (*k, *v)).collect(),
            ggtt,
            engines: self.engines.to_vec(),
            queue: self.queue.iter().cloned().collect(),
            accepting: self.accepting,
            faults: self.faults.clone(),
            stats: self.stats.clone(),
            ppgtt_roots: self.ppgtt_roots.iter().copied().collect(),
            next_seq: self.next_seq,
            ctx_heads: self.ctx_heads.iter().map(|(k, v)| (*k, *v)).collect(),
            display: self.display.clone(),
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
        Vgpu::restore_onto(state, mem, dest, opts, None)
    }

    /// [`Vgpu::restore`] into a GGTT table prepared beforehand ([`Ggtt::prefaulted`] for `dest`,
    /// still empty), so that restoring costs O(present entries), not O(GTT size).
    pub fn restore_onto(
        state: &VgpuState,
        mem: GuestRam,
        dest: VgpuSlices,
        opts: RestoreOptions,
        ggtt: Option<Ggtt>,
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
        let ggtt = Ggtt::load_onto(ggtt.unwrap_or_else(|| Ggtt::new(&dest)), &state.ggtt)
            .ok_or(CheckpointError::Mismatch("GGTT table size"))?;
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
            ggtt_log: None,
            engines,
            queue: VecDeque::new(),
            accepting: state.accepting,
            faults: state.faults.clone(),
            stats: state.stats.clone(),
            ppgtt_roots: state.ppgtt_roots.iter().copied().collect::<BTreeSet<u64>>(),
            next_seq: state.next_seq,
            write_log: WriteLog::default(),
            ctx_heads: state.ctx_heads.iter().copied().collect(),
            irqs_raised: 0,
            unmodelled: Default::default(),
            live: None,
            display: state.display.clone(),
        };
        // Shadow registers: rebase host addresses onto the new slices.
        for &(reg, value) in &state.sregs {
            let v = match mmio::address_register(state.cfg.gen, state.cfg.fence_num, reg) {
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
        for (i, w) in state.queue.iter().enumerate() {
            // Only the workload at the head can have been stopped part-way, and only where its
            // own command list puts a command boundary.
            if let Some(p) = &w.preempted {
                if i != 0 || !w.is_consistent(p) {
                    return Err(CheckpointError::Mismatch(
                        "a queued workload's preemption point is not a command boundary of the workload at the head",
                    ));
                }
            }
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
            if remap {
                // Whatever the stream says, nothing runs here that this host's audit refuses.
                if !dest.contains(
                    w.lrca.0,
                    crate::mmio::lrc::CONTEXT_PAGES * crate::gm::PAGE_SIZE,
                ) {
                    return Err(CheckpointError::Audit(format!(
                        "context image {:#x} outside the slices",
                        w.lrca.0
                    )));
                }
                for c in &w.commands {
                    crate::shadow::audit_command(state.cfg.gen, w.engine, c, &dest)
                        .map_err(|e| CheckpointError::Audit(format!("workload {}: {e}", w.seq)))?;
                }
            }
            vgpu.queue.push_back(w);
        }
        Ok(vgpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gm::{HostConfig, PartitionManager, VgpuType};
    use crate::gtt::copy_guest_ram;
    use crate::workload::{GuestDriver, Profile, WorkloadConfig};
    use proptest::prelude::*;

    fn busy_vgpu() -> Vgpu {
        let mut v = crate::vgpu::lone_test_vgpu(1, 16 << 20);
        let mut d =
            GuestDriver::boot(&mut v, Profile::Desktop, WorkloadConfig::small(), 3).unwrap();
        d.run_frames(&mut v, 1).unwrap();
        d.submit_frame(&mut v).unwrap();
        v.pause(crate::work::Drain::CARRY);
        v
    }

    #[test]
    fn envelope_round_trips() {
        let v = busy_vgpu();
        let state = v.save();
        assert!(!state.queue.is_empty());
        let bytes = state.to_bytes();
        assert_eq!(&bytes[..8], b"GMIGVGPU");
        assert_eq!(VgpuState::from_bytes(&bytes).unwrap(), state);
    }

    #[test]
    fn envelope_rejects_bad_input() {
        let bytes = busy_vgpu().save().to_bytes();
        let mut b = bytes.clone();
        b[0] ^= 1;
        assert!(matches!(
            VgpuState::from_bytes(&b),
            Err(CheckpointError::BadMagic(_))
        ));
        for v in [1, STATE_VERSION + 1] {
            let mut b = bytes.clone();
            b[8] = v as u8;
            assert_eq!(
                VgpuState::from_bytes(&b),
                Err(CheckpointError::UnsupportedVersion(v))
            );
        }
        let mut b = bytes.clone();
        let last = b.len() - 1;
        b[last] ^= 0x40;
        assert!(matches!(
            VgpuState::from_bytes(&b),
            Err(CheckpointError::BadCrc { .. })
        ));
        assert!(matches!(
            VgpuState::from_bytes(&bytes[..bytes.len() - 1]),
            Err(CheckpointError::Truncated { .. })
        ));
        assert!(matches!(
            VgpuState::from_bytes(&bytes[..4]),
            Err(CheckpointError::Truncated { .. })
        ));
        let mut b = bytes.clone();
        b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            VgpuState::from_bytes(&b),
            Err(CheckpointError::TooLarge(_))
        ));
        // A body that passes the CRC but does not decode.
        let mut b = bytes[..HEADER_LEN].to_vec();
        let body = [0xffu8; 9];
        b[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
        b[16..20].copy_from_slice(&crc32fast::hash(&body).to_le_bytes());
        b.extend_from_slice(&body);
        assert!(matches!(
            VgpuState::from_bytes(&b),
            Err(CheckpointError::Decode(_))
        ));
    }

    #[test]
    fn restore_refuses_the_wrong_type() {
        let v = busy_vgpu();
        let state = v.save();
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        let (_, other) = pm.place(VgpuType::V5_4).unwrap();
        let ram = copy_guest_ram(v.guest_memory()).unwrap();
        assert!(matches!(
            Vgpu::restore(&state, ram, other, RestoreOptions::default()),
            Err(CheckpointError::Mismatch(_))
        ));
    }

    #[test]
    fn restore_rebases_queued_commands_and_shadow_registers() {
        let v = busy_vgpu();
        let state = v.save();
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        pm.place(VgpuType::V5_2).unwrap();
        let (_, dest) = pm
            .place_avoiding(VgpuType::V5_8, Some(&v.host_slices()))
            .unwrap();
        let ram = copy_guest_ram(v.guest_memory()).unwrap();
        let w = Vgpu::restore(&state, ram, dest, RestoreOptions::default()).unwrap();
        let mv = SliceMove::new(v.host_slices(), dest).unwrap();
        let after = w.save();
        for (a, b) in state.queue.iter().zip(&after.queue) {
            assert_eq!(mv.rebase(a.lrca), Some(b.lrca));
            assert_ne!(a.commands, b.commands, "GGTT addresses in the shadow moved");
            // And back again gives the original.
            let mut back = b.clone();
            for c in &mut back.commands {
                crate::shadow::remap_command(state.cfg.gen, b.engine, c, &mv.inverse()).unwrap();
            }
            assert_eq!(back.commands, a.commands);
        }
        let plane = mmio::PLANE_SURF[0];
        let before = v.shadow_reg(plane).unwrap();
        assert_eq!(
            w.shadow_reg(plane).map(u64::from),
            mv.rebase(GgttOffset(u64::from(before))).map(|g| g.0)
        );
        assert_eq!(
            w.mmio_read32(plane).unwrap(),
            v.mmio_read32(plane).unwrap(),
            "guest view unchanged"
        );
    }

    #[test]
    fn restore_refuses_tampered_queued_work() {
        let v = busy_vgpu();
        let mut state = v.save();
        // Point a queued blit at memory outside the vGPU.
        let cmd = state.queue[0]
            .commands
            .iter_mut()
            .find(|c| c.dwords.len() >= 6 && c.dwords[0] >> 29 == 2)
            .unwrap();
        cmd.dwords[4] = 0x1000;
        cmd.dwords[5] = 0;
        let bytes = state.to_bytes();
        let state = VgpuState::from_bytes(&bytes).unwrap();
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        let (_, dest) = pm.place(VgpuType::V5_8).unwrap();
        let ram = copy_guest_ram(v.guest_memory()).unwrap();
        let err = Vgpu::restore(&state, ram, dest, RestoreOptions::default()).unwrap_err();
        assert!(
            matches!(err, CheckpointError::Remap(_) | CheckpointError::Audit(_)),
            "{err}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn corrupted_checkpoints_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
            let bytes = busy_vgpu().save().to_bytes();
            let mut b = bytes.clone();
            for (i, x) in flips {
                let n = b.len();
                b[i % n] ^= x;
            }
            b.truncate(cut % (bytes.len() + 1));
            let _ = VgpuState::from_bytes(&b);
        }
    }
}
