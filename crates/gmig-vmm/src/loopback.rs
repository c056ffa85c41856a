//! A whole-VM migration with both VMMs in this process (over loopback TCP), checked against an
//! unmigrated run of the same guest: what `gmig demo` runs when `/dev/kvm` is there.

use std::net::{TcpListener, TcpStream};

use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vgpu::gm::VgpuType;
use serde::Serialize;

use crate::guest::GuestConfig;
use crate::kvm::VmOptions;
use crate::machine::Machine;
use crate::migrate::{migrate_in_with, migrate_out_at, Incoming, Options, Report};
use crate::switchover::{Progress, Work};
use crate::{Error, GpuLink, Linked, Result, Stop};

/// Exits enough for any guest this crate builds to finish.
pub const RUN_TO_END: u64 = 1 << 40;

/// The in-process reference vGPU of type `ty` in host slot `slot`, for a real guest.
pub fn linked_vgpu(ty: VgpuType, slot: u32) -> Result<Box<dyn GpuLink>> {
    let spec = VgpuSpec::for_guest(ty, slot, true).map_err(Error::Device)?;
    Ok(Box::new(Linked(VgpuBackend::new(spec))))
}

/// What [`loopback`] found.
#[derive(Debug, Clone, Serialize)]
pub struct LoopbackReport {
    /// The source's report.
    pub migration: Report,
    /// The destination's.
    pub incoming: Incoming,
    /// Frames the guest had completed when the migration started.
    pub at_frame: u64,
    /// Frames it had completed at the switch-over (pre-copy rounds run until then).
    pub switch_frame: u64,
    /// The guest's final serial line with its checksum.
    pub checksum_line: String,
    /// The migrated guest's serial output, guest RAM (telemetry page aside) and exits equal the
    /// unmigrated run's.
    pub identical: bool,
    /// The largest TSC gap the guest saw in its wait loop on the destination, µs (with KVM
    /// emulating MMIO in software, ordinary exits can exceed the downtime).
    pub guest_max_gap_us: f64,
    /// The same in the unmigrated run of the same guest: the baseline the migrated run's gap is
    /// judged against.
    pub unmigrated_max_gap_us: f64,
    /// MSIs the vGPU signalled on the destination (counted; the guest polls).
    pub msis: u64,
    /// What the destination did after the switch-over: frames the guest completed and GPU
    /// workloads the vGPU ran there (both > 0, or [`loopback`] fails).
    pub destination: Work,
    /// `destination.frames`, flat for JSON readers.
    pub destination_frames: u64,
    /// `destination.workloads`, flat for JSON readers.
    pub destination_workloads: u64,
    /// Of the source's guest RAM, KiB the kernel mapped with huge pages when the migration
    /// started ([`crate::Vm::ram_huge_kib`]).
    pub ram_huge_kib: u64,
}

/// Runs `cfg` unmigrated on `ram` bytes, then again migrating it (once it has completed
/// `at_frame` frames) to a destination whose vGPU sits elsewhere in graphics memory, and
/// compares the two. Pre-copy rounds run while the guest renders, and the switch-over comes
/// when the guest completes [`switch_frame`]`(cfg, at_frame)`, halfway through what is left, so
/// the destination always has work to do. A migration whose switch-over leaves the destination nothing to do (the
/// guest finished during pre-copy, or the destination completed no frame or ran no GPU workload)
/// is an error: it would prove nothing about the destination.
pub fn loopback(
    cfg: &GuestConfig,
    ram: u64,
    at_frame: u64,
    opts: &Options,
) -> Result<LoopbackReport> {
    loopback_with(cfg, ram, at_frame, opts, &VmOptions::default())
}

/// As [`loopback`], every VM (the unmigrated one, the source, the destination) made as `vm`
/// asks.
pub fn loopback_with(
    cfg: &GuestConfig,
    ram: u64,
    at_frame: u64,
    opts: &Options,
    vm: &VmOptions,
) -> Result<LoopbackReport> {
    let ty = VgpuType::V5_8;
    let mut base = Machine::boot_with(ram, cfg, linked_vgpu(ty, 0)?, vm)?;
    if base.run(RUN_TO_END)? != Stop::Halted {
        return Err(Error::Guest("the unmigrated guest did not finish".into()));
    }
    let mut src = Machine::boot_with(ram, cfg, linked_vgpu(ty, 0)?, vm)?;
    src.run_until(RUN_TO_END, |m| m.frames_done() >= at_frame)?;
    if src.halted() {
        return Err(Error::Guest(format!(
            "the guest finished before frame {at_frame}"
        )));
    }
    let ram_huge_kib = src.vm().ram_huge_kib();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let dest_vm = *vm;
    let dest = std::thread::spawn(move || -> Result<(Machine, Incoming)> {
        let (mut conn, _) = listener.accept()?;
        conn.set_nodelay(true)?;
        migrate_in_with(&mut conn, linked_vgpu(ty, 1)?, &dest_vm)
    });
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let switch = switch_frame(cfg, at_frame);
    let out = migrate_out_at(&mut src, cfg, &mut conn, opts, &mut |m: &Machine| {
        m.frames_done() >= switch
    });
    drop(conn);
    let incoming = dest
        .join()
        .map_err(|_| Error::Guest("the destination thread panicked".into()))?;
    let migration = out?;
    let (mut m, incoming) = incoming?;
    if migration.at_stop.halted {
        return Err(Error::Guest(format!(
            "the guest finished all {} frames during pre-copy: the destination would do no work \
             (fewer pre-copy rounds or more frames)",
            migration.at_stop.frames
        )));
    }
    if m.run(RUN_TO_END)? != Stop::Halted {
        return Err(Error::Guest("the migrated guest did not finish".into()));
    }
    let destination = Progress::of(&m).work_since(&incoming.at_restore);
    let destination_workloads = destination.workloads.unwrap_or(0);
    if destination.frames == 0 || destination_workloads == 0 {
        return Err(Error::Guest(format!(
            "the destination completed {} frames and {destination_workloads} GPU workloads after \
             the switch-over: nothing proven",
            destination.frames
        )));
    }
    let identical = m.serial_results() == base.serial_results() && m.ram_equals(&base)?;
    let gap_us = |m: &Machine| -> Result<f64> {
        let khz = f64::from(m.vm().tsc_khz().max(1));
        Ok(m.telemetry()?.max_gap_tsc as f64 * 1000.0 / khz)
    };
    Ok(LoopbackReport {
        migration,
        incoming,
        at_frame,
        switch_frame: migration.at_stop.frames,
        checksum_line: m
            .serial_results()
            .lines()
            .rfind(|l| l.starts_with("checksum"))
            .unwrap_or_default()
            .to_string(),
        identical,
        guest_max_gap_us: gap_us(&m)?,
        unmigrated_max_gap_us: gap_us(&base)?,
        msis: m.msis(),
        destination,
        destination_frames: destination.frames,
        destination_workloads,
        ram_huge_kib,
    })
}

/// The frame at whose completion [`loopback`] switches over: halfway from `at_frame` to the
/// guest's last frame (rounded up), so both sides render part of what is left.
pub fn switch_frame(cfg: &GuestConfig, at_frame: u64) -> u64 {
    let frames = u64::from(cfg.frames);
    at_frame + frames.saturating_sub(at_frame).div_ceil(2)
}
