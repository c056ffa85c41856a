//! The reference vGPU and its guest driver as a [`MigratableVm`], and the destination factory that
//! restores it onto other slices.
//!
//! **Stepping.** One step is what the guest does per frame: wait for the previous frame (the vGPU
//! runs whatever is still queued, the driver checks the status pages), then build and submit the
//! next frame without waiting for it. So at every step boundary the last frame's workloads are in
//! flight: a stop drains at most N of them and carries the rest across, and the destination runs
//! them first, in the same order as an unmigrated run would.
//!
//! **The guest's side.** The guest driver model is guest software (its state lives in guest RAM and
//! vCPU state, which the VMM migrates, not the vGPU). The stream carries the vGPU and guest memory;
//! the driver object itself is handed over with [`VgpuVm::take_driver`] /
//! [`VgpuVm::attach_driver`] where both ends share a process (`gmig demo`, tests).
//!
//! **Device-state sections.** The checkpoint ([`crate::checkpoint::VgpuState`]) is split over the
//! six typed sections (postcard each): config and slices, registers, GGTT, PPGTT roots, engines
//! (execlist and context state, statistics, faults), queued workloads.

use std::collections::BTreeSet;
use std::time::Instant;

use gmig_cmdparser::{Gen, SliceMove, VgpuSlices};
use serde::de::DeserializeOwned;
use vm_memory::GuestMemoryMmap;

use crate::checkpoint::{RestoreOptions, VgpuState};
use crate::gm::{Gfn, VgpuType, MIB, PAGE_SIZE};
use crate::gtt::{new_guest_ram, ram_size, Ggtt, GgttState, Space};
use crate::mmio::lrc;
use crate::vgpu::{Vgpu, VgpuConfig};
use crate::work::WriteLog;
use crate::workload::{GuestDriver, Profile, WorkloadConfig};
use gmig_core::migration::{
    decode_state, encode_state, Candidates, Drain, DrainWrites, MigratableVm, RestoreTimes,
    VmError, VmFactory,
};
use gmig_core::stream::{Compatibility, GpuGeneration, StateKind, StreamHeader, VgpuTypeId};

fn vm_err(what: &str, e: impl std::fmt::Display) -> VmError {
    VmError(format!("{what}: {e}"))
}

/// GPU commands one [`MigratableVm::run_device_piece`] runs at most: one, so that a stop waits
/// for the command running (a GPU preempts at a command boundary), not for a frame's work.
pub const DEVICE_PIECE_COMMANDS: u64 = 1;

/// The wire name of a GPU generation.
pub fn generation_of(gen: Gen) -> GpuGeneration {
    match gen {
        Gen::Gen8 => GpuGeneration::Gen8,
        Gen::Gen9 => GpuGeneration::Gen9,
        Gen::Gen11 => GpuGeneration::Gen11,
    }
}

/// The wire name of a vGPU type.
pub fn type_id(ty: VgpuType) -> VgpuTypeId {
    VgpuTypeId {
        aperture_mib: (ty.aperture_size() / MIB) as u32,
        hidden_mib: (ty.hidden_size() / MIB) as u32,
    }
}

/// Parse `"64+384"`-style vGPU type names (aperture+hidden MiB) or the GVT-g names.
pub fn parse_vgpu_type(s: &str) -> Option<VgpuType> {
    VgpuType::ALL.into_iter().find(|t| {
        let id = type_id(*t);
        s == t.name() || s == format!("{}+{}", id.aperture_mib, id.hidden_mib)
    })
}

/// A reference vGPU on guest RAM, with (on the side that runs it) the guest driver.
#[derive(Debug)]
pub struct VgpuVm {
    vgpu: Vgpu,
    driver: Option<GuestDriver>,
    tracking: Option<(WriteLog, BTreeSet<Gfn>)>,
    ram_by_vmm: bool,
    gpu_ahead: u64,
}

impl VgpuVm {
    /// Boot a guest: a vGPU of type `ty` in `slices` on `ram_bytes` of guest RAM, and the guest
    /// driver for `profile`.
    pub fn boot(
        ty: VgpuType,
        slices: VgpuSlices,
        ram_bytes: u64,
        profile: Profile,
        wcfg: WorkloadConfig,
        seed: u64,
    ) -> Result<Self, VmError> {
        let ram = usize::try_from(ram_bytes).map_err(|e| vm_err("guest RAM size", e))?;
        let mem = new_guest_ram(ram).map_err(|e| vm_err("guest RAM", e))?;
        let mut vgpu =
            Vgpu::new(VgpuConfig::new(ty, 1), slices, mem).map_err(|e| vm_err("vGPU", e))?;
        let driver = GuestDriver::boot(&mut vgpu, profile, wcfg, seed)
            .map_err(|e| vm_err("guest driver", e))?;
        Ok(Self {
            vgpu,
            driver: Some(driver),
            tracking: None,
            ram_by_vmm: false,
            gpu_ahead: 0,
        })
    }

    /// A vGPU of type `ty` in `slices` on existing guest memory `mem` (the VMM's RAM, shared with
    /// the guest), with no guest-driver model: the guest that drives it is real (or attached later
    /// with [`VgpuVm::attach_driver`]).
    pub fn on_memory(
        ty: VgpuType,
        slices: VgpuSlices,
        mem: GuestMemoryMmap,
    ) -> Result<Self, VmError> {
        let vgpu = Vgpu::new(VgpuConfig::new(ty, 1), slices, mem).map_err(|e| vm_err("vGPU", e))?;
        Ok(Self {
            vgpu,
            driver: None,
            tracking: None,
            ram_by_vmm: false,
            gpu_ahead: 0,
        })
    }

    /// Whether the VMM moves guest RAM itself (a KVM VMM with its own RAM pre-copy, QEMU): then
    /// the device stream carries the vGPU's state only, as a VFIO device's does, and the pages the
    /// vGPU writes reach the VMM through DMA logging. Off by default: the stream carries guest
    /// RAM (what a VMM that does not migrate RAM itself needs).
    #[must_use]
    pub fn with_ram_by_vmm(mut self, on: bool) -> Self {
        self.ram_by_vmm = on;
        self
    }

    /// Lets the engines run `commands` commands of each frame as soon as the guest submits it
    /// (a GPU working while the guest goes on), so that a stop between steps finds a workload
    /// part-way and preempts it there. 0 (the default): the frame waits for the next step.
    #[must_use]
    pub fn with_gpu_ahead(mut self, commands: u64) -> Self {
        self.gpu_ahead = commands;
        self
    }

    /// Boot the guest-driver model for `profile` on this vGPU (its objects go into guest memory,
    /// its GGTT entries through the vGPU's registers), as [`VgpuVm::boot`] does.
    pub fn boot_driver(
        &mut self,
        profile: Profile,
        wcfg: WorkloadConfig,
        seed: u64,
    ) -> Result<(), VmError> {
        let driver = GuestDriver::boot(&mut self.vgpu, profile, wcfg, seed)
            .map_err(|e| vm_err("guest driver", e))?;
        self.driver = Some(driver);
        Ok(())
    }

    /// The vGPU, mutably (a VMM forwards the guest's MMIO accesses to it).
    pub fn vgpu_mut(&mut self) -> &mut Vgpu {
        &mut self.vgpu
    }

    /// The vGPU.
    pub fn vgpu(&self) -> &Vgpu {
        &self.vgpu
    }

    /// Take the guest driver (to hand it to the destination with the rest of the guest).
    pub fn take_driver(&mut self) -> Option<GuestDriver> {
        self.driver.take()
    }

    /// Attach the guest driver (on the destination, after the migration).
    pub fn attach_driver(&mut self, driver: GuestDriver) {
        self.driver = Some(driver);
    }

    /// Let the guest wait for its last frame: the vGPU runs everything queued.
    pub fn finish(&mut self) -> Result<(), VmError> {
        let d = self
            .driver
            .as_mut()
            .ok_or(VmError("no guest driver attached".into()))?;
        d.wait(&mut self.vgpu).map_err(|e| vm_err("wait", e))?;
        Ok(())
    }

    /// Run the workloads still queued (on a destination with no guest driver attached: the
    /// carried queue). Returns how many ran.
    pub fn run_queued(&mut self) -> usize {
        self.vgpu.run_until_idle()
    }

    /// Run `n` steps.
    pub fn run_steps(&mut self, n: u64) -> Result<(), VmError> {
        for _ in 0..n {
            self.step()?;
        }
        Ok(())
    }

    /// Frames the guest has submitted.
    pub fn frames(&self) -> u64 {
        self.driver.as_ref().map_or(0, GuestDriver::frame)
    }

    /// Pages holding the context state the vGPU writes back (ring head) when a workload
    /// completes. These writes are the device's own, not a command's, so they are added to the
    /// candidate set explicitly.
    fn context_state_pages(&self) -> Vec<Gfn> {
        let view = self.vgpu.guest_gpu_view(None);
        self.vgpu
            .ctx_heads
            .keys()
            .filter_map(|lrca| {
                let addr = lrca.checked_add(lrc::STATE_OFFSET + 4 * lrc::RING_HEAD as u64)?;
                view.translate(Space::Ggtt, addr).ok().map(Gfn::containing)
            })
            .collect()
    }
}

impl MigratableVm for VgpuVm {
    fn stream_header(&self) -> StreamHeader {
        let cfg = self.vgpu.config();
        let host = self.vgpu.host_slices();
        StreamHeader::new(
            generation_of(cfg.gen),
            type_id(cfg.ty),
            host.aperture.base.0,
            host.hidden.base.0,
            ram_size(self.vgpu.guest_memory()) / PAGE_SIZE,
        )
    }

    fn memory(&self) -> &GuestMemoryMmap {
        self.vgpu.guest_memory()
    }

    fn migratable_pages(&self) -> Vec<Gfn> {
        if self.ram_by_vmm {
            return Vec::new();
        }
        // All of guest RAM: the GTT-backed pages plus the rest the VMM migrates anyway (mostly
        // zero pages, which travel as markers).
        (0..ram_size(self.vgpu.guest_memory()) / PAGE_SIZE)
            .map(Gfn)
            .collect()
    }

    fn migratable_pages_fixed(&self) -> bool {
        // All of guest RAM, whose size never changes.
        true
    }

    fn step(&mut self) -> Result<(), VmError> {
        let d = self
            .driver
            .as_mut()
            .ok_or(VmError("no guest driver attached".into()))?;
        d.wait(&mut self.vgpu).map_err(|e| vm_err("wait", e))?;
        if self.vgpu.is_accepting() {
            d.submit_frame(&mut self.vgpu)
                .map_err(|e| vm_err("submit", e))?;
            self.vgpu.advance(self.gpu_ahead);
        }
        Ok(())
    }

    fn run_device_piece(&mut self) -> Result<bool, VmError> {
        // The GPU works through the submitted frames a command at a time (as `step`'s wait would
        // all at once, in the same order); a stop between two pieces finds a workload part-way
        // and preempts it there. Nothing runs while the vGPU is paused.
        if !self.vgpu.is_accepting() || self.vgpu.queue.is_empty() {
            return Ok(false);
        }
        let ran = self.vgpu.advance(DEVICE_PIECE_COMMANDS);
        Ok(ran > 0 && !self.vgpu.queue.is_empty())
    }

    fn start_write_tracking(&mut self) {
        // Forget what happened before: pages are hashed from now on.
        let _ = self.vgpu.take_write_log();
        if let Some(d) = self.driver.as_mut() {
            let _ = d.take_cpu_dirty();
        }
        self.tracking = Some((WriteLog::default(), BTreeSet::new()));
    }

    fn stop_write_tracking(&mut self) {
        self.tracking = None;
        self.vgpu.stop_ggtt_log();
    }

    fn write_candidates(&mut self) -> Candidates {
        let log = self.vgpu.take_write_log();
        let cpu = self
            .driver
            .as_mut()
            .map(GuestDriver::take_cpu_dirty)
            .unwrap_or_default();
        let ctx = self.context_state_pages();
        if self.ram_by_vmm {
            return Candidates::Pages(Vec::new());
        }
        let Some((acc, acc_cpu)) = self.tracking.as_mut() else {
            return Candidates::Unknown;
        };
        acc.merge(log);
        acc_cpu.extend(cpu);
        if acc.unknown || self.driver.is_none() {
            return Candidates::Unknown;
        }
        let mut pages: BTreeSet<Gfn> = acc.candidate.clone();
        pages.extend(acc_cpu.iter().copied());
        pages.extend(ctx);
        Candidates::Pages(pages.into_iter().collect())
    }

    fn quiesce(&mut self, drain: Drain) -> Result<usize, VmError> {
        Ok(self.vgpu.pause(drain).executed)
    }

    fn drain_writes(&self, max_drain: usize) -> Option<DrainWrites> {
        // The workloads a drain would run, their write sets taken through the host view as the
        // engine will run them, plus what completing each writes (its context's ring head, its
        // engine's status page). A workload with an unknown write set (a draw: shaders may write
        // anywhere the context reaches) is counted as the largest footprint any workload has had
        // on this vGPU, all of it pages not yet due to be sent — an estimate, as MIG_DATA_SIZE
        // is, and the cautious one. (Assuming a context rewrites the pages its last workload
        // wrote was tried and under-estimated video decode, which rotates its surfaces.) With no
        // history there is no estimate.
        let gen = self.vgpu.config().gen;
        let seen = self.vgpu.stats().max_workload_pages;
        let mut out = DrainWrites::default();
        for w in self.vgpu.queue.iter().take(max_drain) {
            let view = self.vgpu.host_view(w.pml4);
            let mut log = WriteLog::default();
            let before = out.pages.len();
            let mut sets = crate::shadow::WriteSets::new(gen, &view, &mut out.pages);
            for cmd in &w.commands {
                crate::shadow::log_write_set(gen, w.engine, cmd, &view, &mut log, &mut sets);
            }
            // Writes bounded only by the context's reach are estimated like unknown ones.
            if log.unknown || sets.has_reach() {
                if seen == 0 {
                    return None;
                }
                let known = (out.pages.len() - before) as u64;
                out.more = out.more.saturating_add(seen.saturating_sub(known));
            }
            let head = w
                .lrca
                .0
                .checked_add(lrc::STATE_OFFSET + 4 * lrc::RING_HEAD as u64);
            let hws = self
                .vgpu
                .sregs
                .get(&(w.engine.mmio_base_for(gen) + crate::mmio::ring::HWS_PGA))
                .filter(|h| **h != 0)
                .map(|h| u64::from(h & 0xffff_f000));
            for addr in [head, hws].into_iter().flatten() {
                if let Ok(gpa) = view.translate(Space::Ggtt, addr) {
                    out.pages.push(Gfn::containing(gpa));
                }
            }
        }
        if out.more > 0 {
            // The GPU writes only through its GTTs: whatever a shader writes is a mapped frame.
            out.within = Some(self.vgpu.gtt_backed_pages());
        }
        out.pages.sort_unstable();
        out.pages.dedup();
        Some(out)
    }

    fn device_writable_pages(&self) -> Option<Vec<Gfn>> {
        // The GPU writes guest memory only through its GTTs.
        Some(self.vgpu.gtt_backed_pages())
    }

    fn unquiesce(&mut self) -> Result<(), VmError> {
        self.vgpu.resume();
        Ok(())
    }

    fn save_state(&self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        sections(&self.vgpu.save(), StateKind::Ggtt)
    }

    fn precopy_state(&mut self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        // The GGTT is O(GTT size) (655,360 entries at 512+2048) and changes little: it goes while
        // the guest runs, and the stop sends only the entries written since.
        let ggtt = self.vgpu.start_ggtt_log();
        Ok(vec![(StateKind::Ggtt, encode_state(&ggtt)?)])
    }

    fn save_state_delta(&self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        match self.vgpu.save_since_ggtt_log() {
            Some(s) => sections(&s, StateKind::GgttUpdate),
            None => self.save_state(),
        }
    }
}

/// The device-state sections of `s`, its GGTT part as a section of kind `ggtt` (the whole table,
/// or the entries written since pre-copy sent it).
fn sections(s: &VgpuState, ggtt: StateKind) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
    Ok(vec![
        (
            StateKind::DeviceConfig,
            encode_state(&(s.cfg, s.guest_view, s.host, s.remap, s.next_seq))?,
        ),
        (StateKind::Registers, encode_state(&(&s.vregs, &s.sregs))?),
        (ggtt, encode_state(&s.ggtt)?),
        (StateKind::Ppgtt, encode_state(&s.ppgtt_roots)?),
        (
            StateKind::Engines,
            encode_state(&(&s.engines, &s.ctx_heads, &s.stats, &s.faults, s.accepting))?,
        ),
        (StateKind::Workloads, encode_state(&s.queue)?),
        (StateKind::Display, encode_state(&s.display)?),
    ])
}

fn dec<T: DeserializeOwned>(
    states: &[(StateKind, Vec<u8>)],
    kind: StateKind,
) -> Result<T, VmError> {
    decode_state(states, kind, "device-state")
}

/// Builds vGPUs on a destination host whose slices for the incoming vGPU are `slices`.
#[derive(Debug, Clone)]
pub struct VgpuFactory {
    /// GPU generation of this host.
    pub gen: Gen,
    /// vGPU type set up for the incoming guest.
    pub ty: VgpuType,
    /// Where this host placed the vGPU's slices.
    pub slices: VgpuSlices,
    /// Guest RAM of the incoming VM, in bytes (the stream must agree).
    pub ram_bytes: u64,
    /// Restore options (remapping off only for negative controls).
    pub opts: RestoreOptions,
    /// Guest memory the restored vGPU must use on this host: the VMM's own RAM (for example a
    /// vfio-user client's DMA-mapped RAM, or a KVM VMM's memfd-backed RAM), into which the stream's
    /// pages are written. `None`: private RAM of `ram_bytes` is allocated.
    pub memory: Option<GuestMemoryMmap>,
    /// Whether the restored vGPU leaves guest RAM to the VMM ([`VgpuVm::with_ram_by_vmm`]).
    pub ram_by_vmm: bool,
    /// The GGTT table of the incoming vGPU, built and written while the stream's pre-copy runs
    /// ([`Ggtt::prefaulted`]), so the restore in downtime does not pay for it.
    ggtt: Option<Ggtt>,
    /// Whether `ggtt` holds the stream's GGTT section already (loaded as it arrived, during
    /// pre-copy when the source sent it then): the restore applies only the GGTT update.
    ggtt_loaded: bool,
    /// The frames that GGTT maps, for the destination to back with memory during pre-copy.
    prefault: Vec<gmig_core::stream::Gfn>,
}

impl VgpuFactory {
    /// A destination for a `ty` vGPU of generation `gen` placed at `slices`, with `ram_bytes` of
    /// private guest RAM and remapping on.
    pub fn new(gen: Gen, ty: VgpuType, slices: VgpuSlices, ram_bytes: u64) -> Self {
        Self {
            gen,
            ty,
            slices,
            ram_bytes,
            opts: RestoreOptions { remap: true },
            memory: None,
            ram_by_vmm: false,
            ggtt: None,
            ggtt_loaded: false,
            prefault: Vec::new(),
        }
    }

    /// Restore options (remapping off only for negative controls).
    #[must_use]
    pub fn with_options(mut self, opts: RestoreOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Restore onto `memory` (the VMM's guest RAM) instead of private RAM.
    #[must_use]
    pub fn on_memory(mut self, memory: GuestMemoryMmap) -> Self {
        self.ram_bytes = ram_size(&memory);
        self.memory = Some(memory);
        self
    }
}

impl VmFactory for VgpuFactory {
    type Vm = VgpuVm;

    fn compatibility(&self) -> Compatibility {
        Compatibility {
            generation: generation_of(self.gen),
            vgpu_type: type_id(self.ty),
        }
    }

    fn create_memory(&mut self, header: &StreamHeader) -> Result<GuestMemoryMmap, VmError> {
        let bytes = header.guest_pages.checked_mul(PAGE_SIZE);
        if bytes != Some(self.ram_bytes) {
            return Err(VmError(format!(
                "stream carries {} pages of guest RAM, this destination set up {} bytes",
                header.guest_pages, self.ram_bytes
            )));
        }
        // Outside downtime: the stream has only just started.
        self.ggtt = Some(Ggtt::prefaulted(&self.slices));
        self.ggtt_loaded = false;
        if let Some(mem) = &self.memory {
            return Ok(mem.clone());
        }
        let ram = usize::try_from(self.ram_bytes).map_err(|e| vm_err("guest RAM size", e))?;
        new_guest_ram(ram).map_err(|e| vm_err("guest RAM", e))
    }

    fn memory_is_zeroed(&self) -> bool {
        self.memory.is_none()
    }

    fn state_arrived(
        &mut self,
        _header: &StreamHeader,
        kind: StateKind,
        payload: &[u8],
    ) -> Result<(), VmError> {
        if kind != StateKind::Ggtt {
            return Ok(());
        }
        // O(present entries): done as the section arrives, during pre-copy when the source sends
        // the GGTT then, so the restore in downtime applies only the entries written since.
        let state: GgttState = postcard::from_bytes(payload)
            .map_err(|e| VmError(format!("device-state section Ggtt: {e}")))?;
        let table = self.ggtt.take().unwrap_or_else(|| Ggtt::new(&self.slices));
        let loaded = Ggtt::load_onto(table, &state).ok_or(VmError(format!(
            "device-state section Ggtt: {}+{} pages do not fit this vGPU's slices",
            state.aperture_pages, state.hidden_pages
        )))?;
        // What the GPU can write on this guest; pre-copy's pages go to these frames too, so backing
        // them now costs nothing extra there and keeps their first touch out of the downtime.
        self.prefault = loaded
            .mapped_frames()
            .map(|g| gmig_core::stream::Gfn(g.0))
            .collect();
        self.ggtt = Some(loaded);
        self.ggtt_loaded = true;
        Ok(())
    }

    fn take_prefault_frames(&mut self) -> Vec<gmig_core::stream::Gfn> {
        std::mem::take(&mut self.prefault)
    }

    fn restore(
        &mut self,
        header: &StreamHeader,
        memory: GuestMemoryMmap,
        states: &[(StateKind, Vec<u8>)],
    ) -> Result<(VgpuVm, RestoreTimes), VmError> {
        let t = Instant::now();
        let (cfg, guest_view, host, remap, next_seq): (
            VgpuConfig,
            VgpuSlices,
            VgpuSlices,
            bool,
            u64,
        ) = dec(states, StateKind::DeviceConfig)?;
        if cfg.ty != self.ty || cfg.gen != self.gen {
            return Err(VmError("device config disagrees with the header".into()));
        }
        if host.aperture.base.0 != header.src_aperture_base
            || host.hidden.base.0 != header.src_hidden_base
        {
            return Err(VmError(
                "device config and header disagree on the source slices".into(),
            ));
        }
        let (vregs, sregs) = dec(states, StateKind::Registers)?;
        let ggtt = if self.ggtt_loaded {
            // The table holds the GGTT section already; on top of it go the entries written since.
            if states.iter().any(|(k, _)| *k == StateKind::GgttUpdate) {
                dec(states, StateKind::GgttUpdate)?
            } else {
                GgttState {
                    aperture_pages: (self.slices.aperture.size / PAGE_SIZE) as u32,
                    hidden_pages: (self.slices.hidden.size / PAGE_SIZE) as u32,
                    aperture: Vec::new(),
                    hidden: Vec::new(),
                }
            }
        } else {
            dec(states, StateKind::Ggtt)?
        };
        let ppgtt_roots = dec(states, StateKind::Ppgtt)?;
        let (engines, ctx_heads, stats, faults, accepting) = dec(states, StateKind::Engines)?;
        let queue = dec(states, StateKind::Workloads)?;
        let display = if states.iter().any(|(k, _)| *k == StateKind::Display) {
            dec(states, StateKind::Display)?
        } else {
            crate::display::state::DisplayState::default()
        };
        let state = VgpuState {
            cfg,
            guest_view,
            host,
            remap,
            vregs,
            sregs,
            ggtt,
            engines,
            queue,
            accepting,
            faults,
            stats,
            ppgtt_roots,
            next_seq,
            ctx_heads,
            display,
        };
        // Slices must be a valid move (checked again inside restore, all or nothing).
        SliceMove::new(host, self.slices).map_err(|e| vm_err("slice move", e))?;
        let restore_ns = t.elapsed().as_nanos() as u64;
        let t = Instant::now();
        self.ggtt_loaded = false;
        let vgpu = Vgpu::restore_onto(&state, memory, self.slices, self.opts, self.ggtt.take())
            .map_err(|e| vm_err("restore", e))?;
        let remap_ns = t.elapsed().as_nanos() as u64;
        Ok((
            VgpuVm {
                vgpu,
                driver: None,
                tracking: None,
                ram_by_vmm: self.ram_by_vmm,
                gpu_ahead: 0,
            },
            RestoreTimes {
                restore_ns,
                remap_ns,
            },
        ))
    }
}
