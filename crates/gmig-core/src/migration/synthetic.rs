//! A small, deterministic VM for testing the engine on its own: a guest that submits
//! GGTT-addressed fill commands through a ring, a "GPU" that executes them against guest memory,
//! a bounded queue, write sets (some commands opaque, to exercise widening), and GGTT remapping
//! on restore. It is a test device in the sense of `gmig-vfio-migration`'s blob device: real
//! behaviour, small enough to reason about, with a negative control (restore without remapping).
//!
//! Guest memory layout: frames `0..RING_PAGES` hold the ring (written by the guest CPU), the rest
//! is graphics memory mapped 1:1 from the aperture slice (GGTT offset `aperture_base + i * 4096`
//! is frame `RING_PAGES + i`).

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::vm::{
    decode_state, encode_state, Candidates, DrainWrites, MigratableVm, RestoreTimes, VmError,
    VmFactory,
};

use crate::stream::{
    Compatibility, Gfn, GpuGeneration, StateKind, StreamHeader, VgpuTypeId, PAGE_SIZE,
};

/// Frames of the command ring.
pub const RING_PAGES: u64 = 8;
/// Commands kept in flight in steady state (the queue a quiesce carries across).
pub const QUEUE_DEPTH: usize = 3;
/// The synthetic VM's vGPU type.
pub const SYNTHETIC_TYPE: VgpuTypeId = VgpuTypeId {
    aperture_mib: 64,
    hidden_mib: 384,
};

/// Parameters of a synthetic VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyntheticConfig {
    /// Guest frames in all (ring included).
    pub pages: u64,
    /// Workload seed.
    pub seed: u64,
    /// Most pages one command writes.
    pub max_cmd_pages: u32,
    /// Every n-th command is opaque (its write set unknown); 0: none.
    pub opaque_every: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Cmd {
    seqno: u64,
    /// Host GGTT offset of the first page written (already translated by the vGPU).
    ggtt: u64,
    pages: u32,
    value: u8,
    opaque: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Engine {
    submitted: u64,
    executed: u64,
    accepting: bool,
}

/// The synthetic VM.
#[derive(Debug)]
pub struct SyntheticVm {
    cfg: SyntheticConfig,
    mem: GuestMemoryMmap,
    /// Where the guest believes its aperture is (read once from the info page; never changes).
    guest_aperture: u64,
    /// Where the vGPU's aperture slice is on this host.
    host_aperture: u64,
    host_hidden: u64,
    /// A register holding a GGTT address (think: a display plane surface), host view.
    surface: u64,
    queue: VecDeque<Cmd>,
    engine: Engine,
    tracking: Option<(BTreeSet<Gfn>, bool)>,
}

fn new_memory(pages: u64) -> Result<GuestMemoryMmap, VmError> {
    let bytes = pages
        .checked_mul(PAGE_SIZE as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| VmError(format!("{pages} pages do not fit")))?;
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes)])
        .map_err(|e| VmError(format!("guest memory: {e}")))
}

fn mix(seed: u64, n: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&[seed.to_le_bytes(), n.to_le_bytes()].concat())
}

impl SyntheticVm {
    /// A fresh VM whose aperture slice sits at `aperture_base` and hidden slice at `hidden_base`.
    pub fn new(
        cfg: SyntheticConfig,
        aperture_base: u64,
        hidden_base: u64,
    ) -> Result<Self, VmError> {
        if cfg.pages <= RING_PAGES + 1 || cfg.max_cmd_pages == 0 {
            return Err(VmError("synthetic VM too small".into()));
        }
        Ok(Self {
            cfg,
            mem: new_memory(cfg.pages)?,
            guest_aperture: aperture_base,
            host_aperture: aperture_base,
            host_hidden: hidden_base,
            surface: aperture_base,
            queue: VecDeque::new(),
            engine: Engine {
                submitted: 0,
                executed: 0,
                accepting: true,
            },
            tracking: None,
        })
    }

    fn gfx_pages(&self) -> u64 {
        self.cfg.pages - RING_PAGES
    }

    fn record(&mut self, gfn: Gfn, opaque: bool) {
        if let Some((set, unknown)) = self.tracking.as_mut() {
            if opaque {
                *unknown = true;
            } else {
                set.insert(gfn);
            }
        }
    }

    /// The guest submits one command (CPU writes its descriptor into the ring; the vGPU
    /// translates its guest GGTT address to the host's).
    fn submit(&mut self) -> Result<(), VmError> {
        let seqno = self.engine.submitted;
        let r = mix(self.cfg.seed, seqno);
        let pages = 1 + (r % u64::from(self.cfg.max_cmd_pages)) as u32;
        let span = self.gfx_pages().saturating_sub(u64::from(pages)).max(1);
        // Desktop-like locality: most commands hit a small hot window.
        let first = if r >> 60 < 12 {
            (r >> 8) % span.min(64)
        } else {
            (r >> 8) % span
        };
        let guest_ggtt = self.guest_aperture + first * PAGE_SIZE as u64;
        let opaque =
            self.cfg.opaque_every > 0 && seqno % self.cfg.opaque_every == self.cfg.opaque_every - 1;
        let value = (r >> 32) as u8;
        // The ring slot holds the descriptor in guest terms.
        let slot = Gfn(seqno % RING_PAGES);
        let mut desc = [0u8; 32];
        desc[..8].copy_from_slice(&seqno.to_le_bytes());
        desc[8..16].copy_from_slice(&guest_ggtt.to_le_bytes());
        desc[16..20].copy_from_slice(&pages.to_le_bytes());
        desc[20] = value;
        desc[21] = u8::from(opaque);
        let at = (seqno / RING_PAGES % (PAGE_SIZE as u64 / 32)) * 32;
        self.mem
            .write_slice(&desc, GuestAddress(slot.0 * PAGE_SIZE as u64 + at))
            .map_err(|e| VmError(format!("ring write: {e}")))?;
        self.record(slot, false);
        let host = guest_ggtt
            .checked_add(self.host_aperture)
            .and_then(|x| x.checked_sub(self.guest_aperture))
            .ok_or_else(|| VmError("GGTT translation overflow".into()))?;
        self.queue.push_back(Cmd {
            seqno,
            ggtt: host,
            pages,
            value,
            opaque,
        });
        self.engine.submitted += 1;
        Ok(())
    }

    /// The GPU executes the oldest queued command.
    fn execute_one(&mut self) -> Result<bool, VmError> {
        let Some(cmd) = self.queue.pop_front() else {
            return Ok(false);
        };
        let off = cmd
            .ggtt
            .checked_sub(self.host_aperture)
            .ok_or_else(|| VmError(format!("GGTT 0x{:x} below the aperture slice", cmd.ggtt)))?;
        let first = off / PAGE_SIZE as u64;
        if first + u64::from(cmd.pages) > self.gfx_pages() {
            return Err(VmError(format!(
                "GGTT 0x{:x} outside the aperture slice",
                cmd.ggtt
            )));
        }
        let mut page = [0u8; PAGE_SIZE];
        for i in 0..u64::from(cmd.pages) {
            let gfn = Gfn(RING_PAGES + first + i);
            for (j, b) in page.iter_mut().enumerate() {
                *b = cmd.value ^ (j as u8) ^ (cmd.seqno as u8) ^ (i as u8);
            }
            self.mem
                .write_slice(&page, GuestAddress(gfn.0 * PAGE_SIZE as u64))
                .map_err(|e| VmError(format!("GPU write: {e}")))?;
            self.record(gfn, cmd.opaque);
        }
        self.surface = cmd.ggtt;
        self.engine.executed += 1;
        Ok(true)
    }

    /// Run until the queue is empty (used to compare final states).
    pub fn finish(&mut self) -> Result<(), VmError> {
        while self.execute_one()? {}
        Ok(())
    }

    /// Commands submitted so far.
    pub fn submitted(&self) -> u64 {
        self.engine.submitted
    }

    /// Commands queued but not executed.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether the vGPU accepts submissions.
    pub fn accepting(&self) -> bool {
        self.engine.accepting
    }

    /// A digest of everything the guest can see: memory, and registers in guest terms.
    pub fn guest_digest(&self) -> Result<u64, VmError> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut page = [0u8; PAGE_SIZE];
        for g in 0..self.cfg.pages {
            self.mem
                .read_slice(&mut page, GuestAddress(g * PAGE_SIZE as u64))
                .map_err(|e| VmError(e.to_string()))?;
            h.update(&page);
        }
        // Wrapping: a vGPU restored without remapping (the negative control) may hold a surface
        // below its own slice; the digest must still be computable (and then differs).
        let surface_guest = self
            .surface
            .wrapping_sub(self.host_aperture)
            .wrapping_add(self.guest_aperture);
        h.update(&surface_guest.to_le_bytes());
        h.update(&self.engine.submitted.to_le_bytes());
        h.update(&self.engine.executed.to_le_bytes());
        Ok(h.digest())
    }
}

impl MigratableVm for SyntheticVm {
    fn stream_header(&self) -> StreamHeader {
        StreamHeader::new(
            GpuGeneration::Gen9,
            SYNTHETIC_TYPE,
            self.host_aperture,
            self.host_hidden,
            self.cfg.pages,
        )
    }

    fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    fn migratable_pages(&self) -> Vec<Gfn> {
        (0..self.cfg.pages).map(Gfn).collect()
    }

    fn step(&mut self) -> Result<(), VmError> {
        if self.engine.accepting {
            self.submit()?;
        }
        while self.queue.len() > QUEUE_DEPTH {
            self.execute_one()?;
        }
        Ok(())
    }

    fn start_write_tracking(&mut self) {
        self.tracking = Some((BTreeSet::new(), false));
    }

    fn stop_write_tracking(&mut self) {
        self.tracking = None;
    }

    fn write_candidates(&mut self) -> Candidates {
        match &self.tracking {
            None | Some((_, true)) => Candidates::Unknown,
            Some((set, false)) => Candidates::Pages(set.iter().copied().collect()),
        }
    }

    fn quiesce(&mut self, drain: super::Drain) -> Result<usize, VmError> {
        // Synthetic commands are atomic: only the count bounds this drain.
        self.engine.accepting = false;
        let mut n = 0;
        while n < drain.workloads && self.execute_one()? {
            n += 1;
        }
        Ok(n)
    }

    fn drain_writes(&self, max_drain: usize) -> Option<DrainWrites> {
        // A command writes `pages` frames from its GGTT offset; an opaque one says nothing.
        let mut pages = Vec::new();
        for c in self.queue.iter().take(max_drain) {
            if c.opaque {
                return None;
            }
            let first = c.ggtt.checked_sub(self.host_aperture)? / PAGE_SIZE as u64;
            pages.extend((0..u64::from(c.pages)).map(|i| Gfn(RING_PAGES + first + i)));
        }
        Some(DrainWrites {
            pages,
            more: 0,
            within: None,
        })
    }

    fn unquiesce(&mut self) -> Result<(), VmError> {
        self.engine.accepting = true;
        Ok(())
    }

    fn save_state(&self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        let queue: Vec<Cmd> = self.queue.iter().copied().collect();
        Ok(vec![
            (StateKind::DeviceConfig, encode_state(&self.cfg)?),
            (
                StateKind::Registers,
                encode_state(&(self.surface, self.guest_aperture))?,
            ),
            (
                StateKind::Ggtt,
                encode_state(&(self.host_aperture, self.host_hidden))?,
            ),
            (StateKind::Ppgtt, Vec::new()),
            (StateKind::Engines, encode_state(&self.engine)?),
            (StateKind::Workloads, encode_state(&queue)?),
        ])
    }
}

fn dec<'a, T: Deserialize<'a>>(
    states: &'a [(StateKind, Vec<u8>)],
    kind: StateKind,
) -> Result<T, VmError> {
    decode_state(states, kind, "state")
}

/// Builds synthetic VMs on a destination whose slices sit at the given offsets.
#[derive(Debug, Clone)]
pub struct SyntheticFactory {
    /// Destination aperture slice offset.
    pub aperture_base: u64,
    /// Destination hidden slice offset.
    pub hidden_base: u64,
    /// Negative control: skip GGTT remapping (the migrated run must then differ).
    pub skip_remap: bool,
}

impl VmFactory for SyntheticFactory {
    type Vm = SyntheticVm;

    fn compatibility(&self) -> Compatibility {
        Compatibility {
            generation: GpuGeneration::Gen9,
            vgpu_type: SYNTHETIC_TYPE,
        }
    }

    fn create_memory(&mut self, header: &StreamHeader) -> Result<GuestMemoryMmap, VmError> {
        new_memory(header.guest_pages)
    }

    fn restore(
        &mut self,
        header: &StreamHeader,
        memory: GuestMemoryMmap,
        states: &[(StateKind, Vec<u8>)],
    ) -> Result<(SyntheticVm, RestoreTimes), VmError> {
        let t = Instant::now();
        let cfg: SyntheticConfig = dec(states, StateKind::DeviceConfig)?;
        if cfg.pages != header.guest_pages {
            return Err(VmError("config and header disagree on guest size".into()));
        }
        if cfg.pages <= RING_PAGES + 1 || cfg.max_cmd_pages == 0 {
            return Err(VmError("synthetic VM config out of range".into()));
        }
        let (surface, guest_aperture): (u64, u64) = dec(states, StateKind::Registers)?;
        let (src_aperture, _src_hidden): (u64, u64) = dec(states, StateKind::Ggtt)?;
        if src_aperture != header.src_aperture_base {
            return Err(VmError(
                "GGTT section and header disagree on the aperture".into(),
            ));
        }
        let engine: Engine = dec(states, StateKind::Engines)?;
        let queue: Vec<Cmd> = dec(states, StateKind::Workloads)?;
        let restore_ns = t.elapsed().as_nanos() as u64;

        let t = Instant::now();
        let (new_ap, surface, queue) = if self.skip_remap {
            (self.aperture_base, surface, queue)
        } else {
            let rebase = |a: u64| {
                a.checked_sub(src_aperture)
                    .and_then(|off| off.checked_add(self.aperture_base))
                    .ok_or_else(|| VmError(format!("GGTT 0x{a:x} outside the source aperture")))
            };
            let queue = queue
                .into_iter()
                .map(|c| {
                    Ok(Cmd {
                        ggtt: rebase(c.ggtt)?,
                        ..c
                    })
                })
                .collect::<Result<Vec<_>, VmError>>()?;
            (self.aperture_base, rebase(surface)?, queue)
        };
        let remap_ns = t.elapsed().as_nanos() as u64;
        let vm = SyntheticVm {
            cfg,
            mem: memory,
            guest_aperture,
            host_aperture: new_ap,
            host_hidden: self.hidden_base,
            surface,
            queue: queue.into(),
            engine,
            tracking: None,
        };
        Ok((
            vm,
            RestoreTimes {
                restore_ns,
                remap_ns,
            },
        ))
    }
}
