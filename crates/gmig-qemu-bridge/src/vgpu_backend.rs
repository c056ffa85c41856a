//! The reference vGPU as a vfio-user device: [`gmig_vgpu::pci`]'s PCI function (config space,
//! BAR0 registers and GGTT, BAR2 aperture, MSI) over the client's DMA-mapped RAM, migrated through
//! [`VmDevice`] — the same VFIO v2 device a VMM drives in process.
//!
//! The vGPU comes to life on the first DMA map with a descriptor (its guest memory *is* the
//! client's RAM: every section mapped with a descriptor, at its IOVA as guest-physical address,
//! followed as the client maps and unmaps) and then stays: a client that disconnects leaves it
//! running with its state, and the next client finds it. A resumed migration stream replaces it
//! (pages are written into the client's RAM). Maps without a descriptor (QEMU's ROMs) are taken
//! but never used: a GPU access there is unbacked.

use std::fs::File;

use gmig_cmdparser::{Gen, VgpuSlices};
use gmig_core::migration::{MigrationConfig, Policy, SaveSettings, VmDevice};
use gmig_core::stream::StreamLimits;
use gmig_vfio_migration::{DeviceState, MigrationHandle};
use gmig_vgpu::checkpoint::RestoreOptions;
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
use gmig_vgpu::pci::{self, PciConfig};
use gmig_vgpu::workload::{Profile, WorkloadConfig};
use vm_memory::GuestMemoryMmap;

use crate::display_region::{DisplayRegion, DRM_PLANE_TYPE_PRIMARY};
use crate::irqs::Irqs;
use crate::proto::GfxPlane;
use crate::server::{Errno, UserDevice};

/// Region indices (`linux/vfio.h`, PCI).
const BAR0: u32 = 0;
const BAR2: u32 = 2;
const CONFIG: u32 = 7;
/// `VFIO_REGION_INFO_FLAG_READ | WRITE`.
const RW: u32 = 3;

/// What a served vGPU is.
#[derive(Debug, Clone)]
pub struct VgpuSpec {
    /// Generation.
    pub gen: Gen,
    /// vGPU type.
    pub ty: VgpuType,
    /// Where the vGPU's slices sit on this host.
    pub slices: VgpuSlices,
    /// Host aperture size (BAR2).
    pub aperture: u64,
    /// Optionally, the guest-driver model to boot on the client's RAM (for demonstrations
    /// without a real guest driver).
    pub profile: Option<(Profile, u64)>,
    /// How the GPU keeps pace with the guest. `None`: everything queued runs at each BAR0 write
    /// (the guest-driver model waits by itself). `Some(n)`: one queued workload runs every `n`
    /// region accesses, so a real guest that polls a register sees its work complete a little
    /// later, as on hardware, and the same accesses give the same progress in and out of process.
    /// A guest that drives the vGPU by interrupts ([`gmig_vgpu::Vgpu::interrupt_driven`]: i915)
    /// sleeps until one comes instead of polling, so its work runs at the BAR0 write that
    /// submits it, whatever the pace.
    pub gpu_pace: Option<u32>,
    /// The VMM moves guest RAM itself (KVM VMM, QEMU): the migration stream carries the vGPU's
    /// state only, and the pages it writes are reported through DMA logging.
    pub ram_by_vmm: bool,
    /// Whether a restored vGPU remaps graphics addresses onto this host's slices (`false` only
    /// for negative controls, which show that without it the guest faults or differs).
    pub remap: bool,
    /// What of the dispatched work the stop lets finish on the source
    /// (`SaveSettings::max_drain`); the rest is preempted at a command boundary, travels in the
    /// vGPU's state and resumes on the destination.
    pub max_drain: gmig_core::migration::Drain,
    /// With a guest-driver model: commands of each frame the GPU runs as the model submits it
    /// (`VgpuVm::with_gpu_ahead`), so that a stop finds a workload part-way and carries it.
    pub gpu_ahead: u64,
    /// A virtual monitor on the vGPU's port D (the type's resolution); off only for negative
    /// controls (the guest then finds no connected port).
    pub monitor: bool,
}

impl VgpuSpec {
    /// A GEN9 vGPU of type `ty` placed in host slot `slot` (0: first fit; `n`: after `n` other
    /// vGPUs of the same type) on the default host, for a real guest: the GPU keeps pace with the
    /// guest's accesses, the VMM moves guest RAM (`ram_by_vmm`), remapping on, and the stop runs
    /// nothing (`Drain::CARRY`: the work in flight travels and the destination resumes it).
    pub fn for_guest(ty: VgpuType, slot: u32, ram_by_vmm: bool) -> Result<VgpuSpec, String> {
        let host = gmig_vgpu::gm::HostConfig::default();
        let slices = gmig_vgpu::gm::slot_slices(host, ty, slot)
            .map_err(|e| format!("placing the vGPU in slot {slot}: {e}"))?;
        Ok(VgpuSpec {
            gen: Gen::Gen9,
            ty,
            slices,
            aperture: host.aperture_size,
            profile: None,
            gpu_pace: Some(GUEST_GPU_PACE),
            ram_by_vmm,
            remap: true,
            max_drain: gmig_core::migration::Drain::CARRY,
            gpu_ahead: 0,
            monitor: true,
        })
    }
}

/// The reference vGPU behind a vfio-user server.
pub struct VgpuBackend {
    spec: VgpuSpec,
    config: PciConfig,
    handle: Option<MigrationHandle<VmDevice<VgpuFactory>>>,
    irqs: Irqs,
    irqs_seen: u64,
    ticks: u64,
    steps: u64,
    accesses: u64,
    /// Guest memory that changed during a migration, followed once the device is RUNNING.
    pending_memory: Option<GuestMemoryMmap>,
    /// Where the guest's screen is written, if anywhere.
    screen: Option<crate::screen::Screen>,
    /// The screen for the client's display (GFX_PLANE), with a monitor.
    display: Option<DisplayRegion>,
}

/// The [`VgpuSpec::gpu_pace`] for a real guest: one workload every this many region accesses.
pub const GUEST_GPU_PACE: u32 = 4;

/// With a guest-driver model, one workload step (a frame) every this many messages.
pub const MESSAGES_PER_STEP: u64 = 4;

impl std::fmt::Debug for VgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VgpuBackend")
            .field("spec", &self.spec)
            .field("attached", &self.handle.is_some())
            .finish_non_exhaustive()
    }
}

fn settings(max_drain: gmig_core::migration::Drain) -> SaveSettings {
    SaveSettings {
        max_drain,
        ..SaveSettings::from(&MigrationConfig::new(Policy::OneShotNarrow))
    }
}

impl VgpuBackend {
    /// A backend that will serve `spec` once the client maps its RAM.
    pub fn new(spec: VgpuSpec) -> Self {
        VgpuBackend {
            config: PciConfig::new(spec.gen, spec.aperture),
            handle: None,
            irqs: Irqs::default(),
            irqs_seen: 0,
            ticks: 0,
            steps: 0,
            accesses: 0,
            pending_memory: None,
            screen: None,
            display: spec.monitor.then(|| display_region(spec.ty)).flatten(),
            spec,
        }
    }

    /// Writes the guest's screen (pipe A's primary plane) to `path` as PNG while a pipe scans
    /// out, whenever it changed ([`crate::screen`]).
    pub fn with_screen(mut self, path: std::path::PathBuf) -> Self {
        self.screen = Some(crate::screen::Screen::new(path));
        self
    }

    /// The vGPU, when one is attached.
    pub fn vm(&self) -> Option<&VgpuVm> {
        self.handle.as_ref().and_then(|h| h.device().vm())
    }

    /// The vGPU, mutably.
    pub fn vm_mut(&mut self) -> Option<&mut VgpuVm> {
        self.handle.as_mut().and_then(|h| h.device_mut().vm_mut())
    }

    /// Workload steps the guest-driver model has taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// A new vGPU on `mem` (with the guest-driver model booted, if the spec has one).
    fn fresh_vm(&self, mem: &GuestMemoryMmap) -> Option<VgpuVm> {
        let s = &self.spec;
        let mut vm = match VgpuVm::on_memory(s.ty, s.slices, mem.clone()) {
            Ok(vm) => vm.with_ram_by_vmm(s.ram_by_vmm).with_gpu_ahead(s.gpu_ahead),
            Err(e) => {
                tracing::warn!(%e, "no vGPU on the mapped memory");
                return None;
            }
        };
        if !s.monitor {
            vm.vgpu_mut().set_monitor(None);
        }
        if let Some((profile, seed)) = s.profile {
            if let Err(e) = vm.boot_driver(profile, WorkloadConfig::small(), seed) {
                tracing::warn!(%e, "guest-driver model did not boot");
            }
        }
        Some(vm)
    }

    /// Puts the vGPU on `mem` (created there the first time), its state kept, and rebuilds its
    /// migration handle so that a resumed stream lands in `mem` too.
    fn follow_memory(&mut self, mem: &GuestMemoryMmap) {
        self.pending_memory = None;
        let vm = match self.handle.take().map(|h| h.into_device().into_vm()) {
            Some(Some(mut vm)) => {
                rehome(&mut vm, mem);
                Some(vm)
            }
            None | Some(None) => self.fresh_vm(mem),
        };
        let Some(vm) = vm else {
            return;
        };
        self.irqs_seen = vm.vgpu().interrupts_raised();
        let s = &self.spec;
        let mut factory = VgpuFactory::new(s.gen, s.ty, s.slices, 0).on_memory(mem.clone());
        factory.ram_by_vmm = s.ram_by_vmm;
        factory.opts.remap = s.remap;
        match VmDevice::new(
            Some(vm),
            factory,
            StreamLimits::default(),
            settings(s.max_drain),
        )
        .and_then(|d| {
            MigrationHandle::new(d)
                .map_err(|e| gmig_vfio_migration::DeviceError::Failed(e.to_string()))
        }) {
            Ok(h) => self.handle = Some(h),
            Err(e) => tracing::warn!(%e, "vGPU device"),
        }
    }

    /// One region access by the guest: with a pace, every `n`th runs one queued workload.
    fn access(&mut self) {
        let Some(n) = self.spec.gpu_pace else {
            return;
        };
        self.accesses += 1;
        if self.accesses.is_multiple_of(u64::from(n.max(1))) {
            self.run_gpu(Some(1));
        }
    }

    /// Runs the work the guest queued (at most `max` workloads) and signals MSI (or INTx, while
    /// MSI is not armed) when it raised an interrupt.
    fn run_gpu(&mut self, max: Option<usize>) {
        let Some(vm) = self.vm_mut() else {
            return;
        };
        if vm.vgpu().is_accepting() {
            match max {
                Some(m) => {
                    vm.vgpu_mut().run(m);
                }
                None => {
                    vm.run_queued();
                }
            }
        }
        self.signal_irqs();
    }

    /// Signals MSI (or INTx, while MSI is not armed) when the vGPU raised an interrupt since the
    /// last signal.
    fn signal_irqs(&mut self) {
        let Some(vm) = self.vm() else {
            return;
        };
        let raised = vm.vgpu().interrupts_raised();
        if raised != self.irqs_seen {
            self.irqs_seen = raised;
            let intx = self.config.command() & pci::CMD_INTX_DISABLE == 0;
            self.irqs.raise(intx);
        }
    }

    /// Whether the device runs (not stopped by a migration).
    fn running(&self) -> bool {
        self.handle
            .as_ref()
            .is_none_or(|h| matches!(h.state(), DeviceState::Running | DeviceState::PreCopy))
    }

    /// Advances the vGPU's display clock to now while a pipe scans out (vblanks, flips, their
    /// interrupts); nothing while the device is stopped, so a saved state stays as saved.
    fn display_tick(&mut self) {
        if !self.running() {
            return;
        }
        let Some(vm) = self.vm_mut() else {
            return;
        };
        if !vm.vgpu().display_active() && vm.vgpu().next_vblank().is_none() {
            return;
        }
        vm.vgpu_mut()
            .display_tick(gmig_vgpu::regs::clock::ticks_now());
        if let (Some(screen), Some(vm)) = (
            self.screen.as_mut(),
            self.handle.as_ref().and_then(|h| h.device().vm()),
        ) {
            screen.look(vm.vgpu());
        }
        self.signal_irqs();
    }
}

/// A config-space access of `len` bytes at `offset` as the naturally aligned 4-, 2- and 1-byte
/// accesses a PCI function answers (QEMU reads the whole space at once; vfio-pci splits such
/// reads the same way): `(offset, range in the caller's buffer)`.
fn config_accesses(offset: u64, len: usize) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> {
    let mut done = 0;
    std::iter::from_fn(move || {
        let left = len - done;
        let at = offset + done as u64;
        let n = [4, 2, 1]
            .into_iter()
            .find(|&n| left >= n && at.is_multiple_of(n as u64))?;
        done += n;
        Some((at, done - n..done))
    })
}

/// The display region for a vGPU of type `ty` (its resolution); `None`, logged, when the
/// memfd cannot be made (the vGPU then has no display for the client).
fn display_region(ty: VgpuType) -> Option<DisplayRegion> {
    let r = ty.resolution();
    DisplayRegion::new(u32::from(r.width), u32::from(r.height))
        .map_err(|e| tracing::warn!(%e, "no display region"))
        .ok()
}

/// Moves `vm`'s vGPU onto guest memory `mem`, its state kept: saved and restored in place (same
/// slices, so nothing is rebased). Only while no migration runs: a checkpoint leaves out the
/// pre-copy's GGTT and write logs. The interrupt count restarts (the caller resets what it saw).
fn rehome(vm: &mut VgpuVm, mem: &GuestMemoryMmap) {
    let v = vm.vgpu();
    let opts = RestoreOptions { remap: true };
    match gmig_vgpu::Vgpu::restore(&v.save(), mem.clone(), v.host_slices(), opts) {
        Ok(moved) => *vm.vgpu_mut() = moved,
        Err(e) => {
            tracing::error!(%e, "the vGPU cannot follow the new guest memory; it keeps the old");
        }
    }
}

impl UserDevice for VgpuBackend {
    type Mig = VmDevice<VgpuFactory>;

    fn device_info(&self) -> (u32, u32, u32) {
        // VFIO_DEVICE_FLAGS_PCI | RESET; 9 regions (BAR0-5, ROM, config, VGA) and, with a
        // monitor, the display region; 5 IRQ indices.
        let regions = if self.display.is_some() { 10 } else { 9 };
        (2 | 1, regions, 5)
    }

    fn region_info(&self, index: u32) -> Option<(u32, u64)> {
        match index {
            BAR0 | BAR2 => Some((RW, self.config.bar_size(index as usize)?)),
            CONFIG => Some((RW, pci::CONFIG_SIZE as u64)),
            // VFIO_REGION_INFO_FLAG_READ: the client maps it read-only.
            DisplayRegion::INDEX => self.display.as_ref().map(|d| (1, d.size())),
            _ => None,
        }
    }

    fn region_mmap(&self, index: u32) -> Option<crate::server::RegionMmap<'_>> {
        let d = self
            .display
            .as_ref()
            .filter(|_| index == DisplayRegion::INDEX)?;
        Some(crate::server::RegionMmap {
            file: d.file(),
            offset: 0,
            areas: Vec::new(),
        })
    }

    fn gfx_plane(&mut self, drm_plane_type: u32, probe: bool) -> Result<GfxPlane, Errno> {
        // QEMU's region-type display asks with plane type 0; the vGPU shows its primary plane.
        if !matches!(drm_plane_type, 0 | DRM_PLANE_TYPE_PRIMARY) {
            return Err(libc::EINVAL);
        }
        let vm = self.handle.as_ref().and_then(|h| h.device().vm());
        let display = self.display.as_mut().ok_or(libc::ENOTSUP)?;
        let mut plane = match vm {
            Some(vm) if !probe => display.fill(vm.vgpu()),
            _ => DisplayRegion::nothing(),
        };
        plane.drm_plane_type = DRM_PLANE_TYPE_PRIMARY;
        Ok(plane)
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        if index == DisplayRegion::INDEX {
            let d = self.display.as_ref().ok_or(libc::EINVAL)?;
            return d.read(offset, data).map_err(|_| libc::EIO);
        }
        self.access();
        match index {
            CONFIG => {
                for (at, range) in config_accesses(offset, data.len()) {
                    self.config.read(at, &mut data[range]);
                }
            }
            BAR0 | BAR2 => {
                if index == BAR0 && gmig_vgpu::display::reads_display_clock(offset, data.len()) {
                    // The display clock to now first: `PIPEDSL` and `PIPE_FRMCOUNT` read at the
                    // time of the read, not of the last message (i915 dates each vblank from
                    // the scan line it reads, and a clock lagging by the guest's time between
                    // two accesses put 114 µs of jitter on kms_flip's vblank timestamps). Only
                    // for the registers the clock changes: an i915 guest reads BAR0 all the
                    // time, and no other read needs the tick.
                    self.display_tick();
                }
                let vm = self.vm().ok_or(libc::EIO)?;
                if index == BAR0 {
                    pci::bar0_read(vm.vgpu(), offset, data);
                } else {
                    pci::aperture_read(vm.vgpu(), offset, data);
                }
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.access();
        match index {
            CONFIG => {
                for (at, range) in config_accesses(offset, data.len()) {
                    self.config.write(at, &data[range]);
                }
            }
            BAR0 => {
                let vm = self.vm_mut().ok_or(libc::EIO)?;
                pci::bar0_write(vm.vgpu_mut(), offset, data);
                let now = vm.vgpu().interrupt_driven() || self.spec.gpu_pace.is_none();
                if now {
                    self.run_gpu(None);
                }
            }
            BAR2 => {
                let vm = self.vm().ok_or(libc::EIO)?;
                pci::aperture_write(vm.vgpu(), offset, data);
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(())
    }

    fn irq_info(&self, index: u32) -> Option<(u32, u32)> {
        Irqs::info(index)
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        _start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<(), Errno> {
        self.irqs.set(index, flags, count, fds)
    }

    fn reset(&mut self) -> Result<(), Errno> {
        // A function-level reset: PCI state back to power-on, and the vGPU as GVT-g resets one
        // (QEMU resets the device when a VM starts: what a killed VM left half-written in ELSP
        // must not merge with the next guest's submissions, nor its GGTT entries and registers
        // outlive it): engines, GGTT, registers, PPGTTs. Guest memory stays. Not while a
        // migration holds the device, nor under a guest-driver model, whose frames are its own.
        self.config = PciConfig::new(self.spec.gen, self.spec.aperture);
        self.irqs = Irqs::default();
        let running = self
            .handle
            .as_ref()
            .is_none_or(|h| h.state() == DeviceState::Running);
        if running && self.spec.profile.is_none() {
            if let Some(vm) = self.vm_mut() {
                vm.vgpu_mut().device_reset();
            }
        }
        Ok(())
    }

    /// The vGPU is created on the first memory mapped and then follows every change: the guest
    /// memory it (and an incoming migration stream) uses is always everything the client mapped
    /// with a descriptor, IOVA = guest-physical address. With nothing mapped any more (the
    /// client unmapped it all, or left) it keeps what it had until the next map. During a
    /// migration the change waits for the device to be RUNNING again: the migration's bookkeeping
    /// (the frames it hashed, the GGTT it sent) holds for the memory it began with.
    fn dma_changed(&mut self, mem: Option<&GuestMemoryMmap>) {
        let Some(mem) = mem else {
            return;
        };
        match &self.handle {
            // QEMU's destination maps RAM while the device is RESUMING in every migration: an
            // expected event, not a warning.
            Some(h) if h.state() != DeviceState::Running => {
                tracing::debug!(
                    state = ?h.state(),
                    "guest memory changed during a migration: followed once it ends"
                );
                self.pending_memory = Some(mem.clone());
            }
            _ => self.follow_memory(mem),
        }
    }

    fn migration(&mut self) -> Option<&mut MigrationHandle<VmDevice<VgpuFactory>>> {
        self.handle.as_mut()
    }

    /// Queued work the engines stopped short of (a spinner's loop, a semaphore wait) goes on
    /// every millisecond without the guest, for a guest that waits for interrupts: a GPU runs on
    /// its own. Not while a migration holds the device stopped, nor for a polling guest or a
    /// guest-driver model, whose GPU keeps their pace.
    fn idle_after(&self) -> Option<std::time::Duration> {
        let running = self.running();
        let vm = self.vm()?;
        let v = vm.vgpu();
        // A pipe that scans out has its next vblank due: the device's turn then.
        if running && v.display_active() {
            let now = gmig_vgpu::regs::clock::ticks_now();
            let ticks = v.next_vblank().map_or(0, |t| t.saturating_sub(now));
            let us = ticks * 1_000_000 / gmig_vgpu::regs::clock::TIMESTAMP_HZ;
            return Some(std::time::Duration::from_micros(us.clamp(200, 1000)));
        }
        // Only for a guest that waits for interrupts (i915): the project's polling guests and
        // the tests that step the vGPU by messages keep their own pace, so what runs when stays
        // deterministic for them.
        (running
            && v.interrupt_driven()
            && self.spec.profile.is_none()
            && v.queued() > 0
            && v.is_accepting())
        .then_some(std::time::Duration::from_millis(1))
    }

    fn idle(&mut self) {
        self.display_tick();
        let v = self.vm().map(VgpuVm::vgpu);
        if v.is_some_and(|v| v.queued() > 0) {
            self.run_gpu(None);
        }
    }

    fn tick(&mut self) {
        let running = |h: &MigrationHandle<_>| h.state() == DeviceState::Running;
        if self.pending_memory.is_some() && self.handle.as_ref().is_none_or(running) {
            if let Some(mem) = self.pending_memory.take() {
                self.follow_memory(&mem);
            }
        }
        self.display_tick();
        self.ticks += 1;
        if self.spec.profile.is_none() || !self.ticks.is_multiple_of(MESSAGES_PER_STEP) {
            return;
        }
        let running = self.handle.as_ref().is_some_and(|h| {
            matches!(
                h.state(),
                gmig_vfio_migration::DeviceState::Running
                    | gmig_vfio_migration::DeviceState::PreCopy
            )
        });
        // A vGPU without the model (a destination) has nothing to step.
        if let (true, Some(vm)) = (running, self.vm_mut()) {
            if vm.run_steps(1).is_ok() {
                self.steps += 1;
            }
        }
    }
}
