//! Host evacuation, behind `gmig bench evacuate`: N whole KVM guests (`gmig-vmm`), each driving
//! its own vGPU in its own slot of the source host, migrated at once to N destinations over one
//! shared link, then run to their end and checked against their unmigrated runs.
//!
//! **The guests.** VM `i` runs the guest GPU driver with seed `seed + i` (so that two VMs'
//! results differ and a stream delivered to the wrong destination could not pass), its vGPU in
//! slot `i` of the source host and slot `(i + 1) mod` [`MAX_VMS`] of its destination (another
//! place in graphics memory, so remapping has work). The default host (`HostConfig::default`: a
//! 4 GiB GGTT, 64 MiB of each part kept by the host) places 7 vGPUs of the smallest type, 64+384
//! MiB, so an evacuation moves at most [`MAX_VMS`]. One set of unmigrated runs ([`Baselines`])
//! serves every evacuation of a command.
//!
//! **The migration.** Each VM migrates on a thread of its own with the VMM's defaults
//! ([`gmig_vmm::migrate::Options`]: iterative RAM pre-copy until a round is small, the vGPU's
//! stream beside it), all of them released at once. Their connections share one link: a paced
//! link hands out its rate in 64 KiB pieces, first come first served ([`SharedLink`]); an
//! unlimited one is loopback TCP. Each destination runs its guest on to the end as soon as it has
//! it, as a destination host would, while the others are still migrating.
//!
//! **Pinning.** With a [`Pinning`], every source-side thread (the guests before the migration,
//! their migrations and copiers) runs on the source's cores and every destination thread on the
//! destination's; the unmigrated runs, before the evacuations, on the source's.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gmig_vgpu::gm::VgpuType;
use gmig_vmm::loopback::{linked_vgpu, RUN_TO_END};
use gmig_vmm::migrate::{migrate_in_with, migrate_out, Options, Report};
use gmig_vmm::switchover::Progress;
use gmig_vmm::{GuestConfig, Machine, Stop, VmOptions};
use serde::Serialize;

use super::pin::{CpuList, Pinning};

/// The most VMs one evacuation moves: the 64+384 MiB vGPUs a 4 GiB GGTT holds.
pub const MAX_VMS: usize = 7;

/// The vGPU type of every evacuated VM.
pub const EVACUATION_TYPE: VgpuType = VgpuType::V5_8;

/// Bytes one writer may send before the link is offered to the others.
const PIECE: usize = 64 * 1024;

/// One link shared by several connections, paced to a rate: each write reserves the link for its
/// bytes after every reservation made before it, and waits for its turn.
#[derive(Debug)]
pub struct SharedLink {
    bytes_per_sec: f64,
    next_free: Mutex<Option<Instant>>,
}

impl SharedLink {
    /// A link of `gbps` Gbit/s.
    ///
    /// # Errors
    /// `gbps` is not a positive number.
    pub fn new(gbps: f64) -> anyhow::Result<Arc<Self>> {
        if !(gbps.is_finite() && gbps > 0.0) {
            bail!("link speed {gbps} Gbit/s");
        }
        Ok(Arc::new(Self {
            bytes_per_sec: gbps * 1e9 / 8.0,
            next_free: Mutex::new(None),
        }))
    }

    /// Reserves the link for `n` bytes; returns when they may start.
    fn reserve(&self, n: usize) -> Instant {
        let now = Instant::now();
        let mut next = self
            .next_free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = next.map_or(now, |t| t.max(now));
        *next = Some(start + Duration::from_secs_f64(n as f64 / self.bytes_per_sec));
        start
    }
}

/// A connection whose writes go over a [`SharedLink`] (or straight through without one).
pub struct OnLink<S> {
    inner: S,
    link: Option<Arc<SharedLink>>,
}

impl<S: Read> Read for OnLink<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<S: Write> Write for OnLink<S> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let Some(link) = &self.link else {
            return self.inner.write(data);
        };
        let n = data.len().min(PIECE);
        if n == 0 {
            return Ok(0);
        }
        let start = link.reserve(n);
        if let Some(wait) = start.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        self.inner.write_all(&data[..n])?;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// One evacuation.
#[derive(Debug, Clone, Copy)]
pub struct EvacuationCase {
    /// VMs moved at once (1 to [`MAX_VMS`]).
    pub vms: usize,
    /// The shared link in Gbit/s (`None`: unlimited, loopback TCP).
    pub link_gbps: Option<f64>,
    /// The guest program; VM `i` runs it with seed `guest.seed + i`.
    pub guest: GuestConfig,
    /// Guest RAM of each VM, bytes.
    pub ram_bytes: u64,
    /// The migrations start once every guest has completed this many frames.
    pub at_frame: u64,
    /// How each VM migrates (`link_gbps` is ignored: the shared link paces).
    pub opts: Options,
    /// How each VM is made.
    pub vm: VmOptions,
    /// Source and destination threads on disjoint cores.
    pub pinning: Option<Pinning>,
}

/// What one VM of an evacuation did.
#[derive(Debug, Clone, Serialize)]
pub struct EvacuatedVm {
    /// Its index, 0 to N−1.
    pub index: usize,
    /// Its guest's seed.
    pub seed: u64,
    /// Its vGPU's slot on the source host and on its destination.
    pub slots: [u32; 2],
    /// The source's report (downtime and its phases, rounds, pages, bytes).
    pub migration: Report,
    /// When its migration started and ended (the destination running it), ms after the
    /// evacuation started.
    pub started_ms: f64,
    /// See `started_ms`.
    pub ended_ms: f64,
    /// The largest gap its guest saw in its wait loop over its whole run (TSC), ms.
    pub guest_max_gap_ms: f64,
    /// The same in its unmigrated run.
    pub unmigrated_max_gap_ms: f64,
    /// Frames its guest had completed at the stop, and completed on the destination after it.
    pub frames_at_stop: u64,
    /// See `frames_at_stop`.
    pub destination_frames: u64,
    /// Its guest had finished all its frames when pre-copy ended (the destination then had
    /// nothing left to run: its check proves less; give the guests more frames).
    pub finished_in_precopy: bool,
    /// Its destination finished exactly as its unmigrated run (serial output and RAM).
    pub identical: bool,
}

/// What an evacuation measured.
#[derive(Debug, Clone, Serialize)]
pub struct Evacuation {
    /// VMs moved.
    pub vms: usize,
    /// The shared link, Gbit/s (`null`: unlimited).
    pub link_gbps: Option<f64>,
    /// Guest RAM of each VM, MiB.
    pub ram_mib: u64,
    /// Each VM.
    pub each: Vec<EvacuatedVm>,
    /// First migration started → last VM running on its destination, ms.
    pub total_ms: f64,
    /// Bytes the sources wrote on the link, all VMs.
    pub link_bytes: u64,
    /// `link_bytes` over `total_ms`, Gbit/s.
    pub link_used_gbps: f64,
    /// `link_used_gbps` over the link's rate (`null` when unlimited).
    pub link_share: Option<f64>,
    /// `link_bytes` at the link's rate, ms (`null` when unlimited): what the link alone costs.
    pub link_bound_ms: Option<f64>,
    /// Every VM identical to its unmigrated run.
    pub identical: bool,
}

fn on_cpus(cpus: Option<CpuList>) -> anyhow::Result<()> {
    if let Some(c) = cpus {
        c.pin_current_thread()
            .map_err(|e| anyhow!("pinning to CPUs {c}: {e}"))?;
    }
    Ok(())
}

fn guest_of(case: &EvacuationCase, i: usize) -> GuestConfig {
    GuestConfig {
        seed: case.guest.seed.wrapping_add(i as u64),
        ..case.guest
    }
}

fn gap_ms(m: &Machine) -> anyhow::Result<f64> {
    let khz = f64::from(m.vm().tsc_khz().max(1));
    Ok(m.telemetry()?.max_gap_tsc as f64 / khz)
}

/// The unmigrated runs the evacuated VMs are checked against: VM `i`'s does not depend on how
/// many VMs move or over which link, so one set serves every evacuation of a command.
#[derive(Default)]
pub struct Baselines {
    machines: Vec<Machine>,
    /// What they ran: the guest program (VM 0's seed), guest RAM and VM options.
    made_for: Option<(GuestConfig, u64, VmOptions)>,
}

impl Baselines {
    /// Runs the unmigrated guests `case` needs and this set lacks (in parallel, on the source's
    /// cores).
    fn run_up_to(&mut self, case: &EvacuationCase) -> anyhow::Result<()> {
        let key = (case.guest, case.ram_bytes, case.vm);
        if self.made_for.is_some_and(|k| k != key) {
            bail!("baselines made for another guest, RAM size or VM options");
        }
        self.made_for = Some(key);
        let src_cpus = case.pinning.map(|p| p.source);
        let have = self.machines.len();
        let more: Vec<Machine> = thread::scope(|s| {
            let runs: Vec<_> = (have..case.vms)
                .map(|i| {
                    let g = guest_of(case, i);
                    s.spawn(move || -> anyhow::Result<Machine> {
                        on_cpus(src_cpus)?;
                        let link = linked_vgpu(EVACUATION_TYPE, i as u32)?;
                        let mut m = Machine::boot_with(case.ram_bytes, &g, link, &case.vm)?;
                        if m.run(RUN_TO_END)? != Stop::Halted {
                            bail!("VM {i}'s unmigrated run did not finish");
                        }
                        Ok(m)
                    })
                })
                .collect();
            runs.into_iter()
                .map(|t| {
                    t.join()
                        .map_err(|_| anyhow!("an unmigrated run panicked"))?
                })
                .collect::<anyhow::Result<Vec<Machine>>>()
        })?;
        self.machines.extend(more);
        Ok(())
    }
}

/// Runs one evacuation: the unmigrated runs `bases` lacks first (in parallel), then the N
/// guests to `at_frame`, then their migrations all at once.
///
/// # Errors
/// A bad case (no VM, more than [`MAX_VMS`]), a guest that does not run, or a migration that
/// fails. A guest that finished during pre-copy is not an error: it is reported
/// ([`EvacuatedVm::finished_in_precopy`]).
pub fn evacuate(case: &EvacuationCase, bases: &mut Baselines) -> anyhow::Result<Evacuation> {
    let n = case.vms;
    if n == 0 || n > MAX_VMS {
        bail!(
            "{n} VMs: an evacuation moves 1 to {MAX_VMS} (a 4 GiB GGTT holds {MAX_VMS} vGPUs of \
             the smallest type, 64+384 MiB)"
        );
    }
    if case.at_frame >= u64::from(case.guest.frames) {
        bail!(
            "the migrations start at frame {} of the guests' {}",
            case.at_frame,
            case.guest.frames
        );
    }
    let link = case.link_gbps.map(SharedLink::new).transpose()?;
    let src_cpus = case.pinning.map(|p| p.source);
    let dst_cpus = case.pinning.map(|p| p.dest);
    let ram = case.ram_bytes;

    bases.run_up_to(case)?;
    let bases = &bases.machines[..n];

    // The destinations, listening.
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        let l = TcpListener::bind("127.0.0.1:0").context("a destination's listener")?;
        let addr = l.local_addr()?;
        listeners.push((l, addr));
    }
    let ready = Barrier::new(n);
    let t0 = Instant::now();
    let results: Vec<anyhow::Result<EvacuatedVm>> = thread::scope(|s| {
        let mut dests = Vec::with_capacity(n);
        for (i, ((l, _), base)) in listeners.iter().zip(bases).enumerate() {
            // A guest whose GPU results were lost may wait for ever: three times the unmigrated
            // run's exits is as long as it may take.
            let limit = base.exits.saturating_mul(3);
            dests.push(s.spawn(
                move || -> anyhow::Result<(Machine, gmig_vmm::migrate::Incoming, bool)> {
                    on_cpus(dst_cpus)?;
                    let (mut conn, _) = l.accept()?;
                    conn.set_nodelay(true)?;
                    let slot = ((i + 1) % MAX_VMS) as u32;
                    let (mut m, inc) =
                        migrate_in_with(&mut conn, linked_vgpu(EVACUATION_TYPE, slot)?, &case.vm)?;
                    // The destination runs its guest on at once, as its own host would.
                    let halted = m.run(limit)? == Stop::Halted;
                    Ok((m, inc, halted))
                },
            ));
        }
        let mut sources = Vec::with_capacity(n);
        for (i, (_, addr)) in listeners.iter().enumerate() {
            let (ready, link) = (&ready, link.clone());
            sources.push(s.spawn(move || -> anyhow::Result<(Report, f64, f64)> {
                on_cpus(src_cpus)?;
                let g = guest_of(case, i);
                let mut m =
                    Machine::boot_with(ram, &g, linked_vgpu(EVACUATION_TYPE, i as u32)?, &case.vm)?;
                m.run_until(RUN_TO_END, |m| m.frames_done() >= case.at_frame)?;
                if m.halted() {
                    bail!("VM {i} finished before frame {}", case.at_frame);
                }
                let conn = TcpStream::connect(addr)?;
                conn.set_nodelay(true)?;
                let mut conn = OnLink { inner: conn, link };
                let opts = Options {
                    link_gbps: None,
                    ..case.opts
                };
                ready.wait();
                let started = t0.elapsed().as_secs_f64() * 1e3;
                let rep = migrate_out(&mut m, &g, &mut conn, &opts)?;
                let ended = t0.elapsed().as_secs_f64() * 1e3;
                Ok((rep, started, ended))
            }));
        }
        let src: Vec<_> = sources
            .into_iter()
            .map(|t| t.join().map_err(|_| anyhow!("a source thread panicked"))?)
            .collect();
        let dst: Vec<_> = dests
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow!("a destination thread panicked"))?
            })
            .collect();
        src.into_iter()
            .zip(dst)
            .zip(bases)
            .enumerate()
            .map(|(i, ((src, dst), base))| {
                let (migration, started_ms, ended_ms) =
                    src.with_context(|| format!("VM {i}'s source"))?;
                let (m, inc, halted) = dst.with_context(|| format!("VM {i}'s destination"))?;
                let destination = Progress::of(&m).work_since(&inc.at_restore);
                Ok(EvacuatedVm {
                    index: i,
                    seed: guest_of(case, i).seed,
                    slots: [i as u32, ((i + 1) % MAX_VMS) as u32],
                    migration,
                    started_ms,
                    ended_ms,
                    guest_max_gap_ms: gap_ms(&m)?,
                    unmigrated_max_gap_ms: gap_ms(base)?,
                    frames_at_stop: migration.at_stop.frames,
                    destination_frames: destination.frames,
                    finished_in_precopy: migration.at_stop.halted,
                    identical: halted
                        && m.serial_results() == base.serial_results()
                        && m.ram_equals(base)?,
                })
            })
            .collect()
    });
    let each = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let first = each
        .iter()
        .map(|v| v.started_ms)
        .fold(f64::INFINITY, f64::min);
    let last = each.iter().map(|v| v.ended_ms).fold(0.0, f64::max);
    let total_ms = (last - first).max(0.0);
    let link_bytes: u64 = each.iter().map(|v| v.migration.wire_bytes).sum();
    let link_used_gbps = if total_ms > 0.0 {
        link_bytes as f64 * 8.0 / (total_ms * 1e6)
    } else {
        0.0
    };
    Ok(Evacuation {
        vms: n,
        link_gbps: case.link_gbps,
        ram_mib: ram >> 20,
        identical: each.iter().all(|v| v.identical),
        total_ms,
        link_bytes,
        link_used_gbps,
        link_share: case.link_gbps.map(|g| link_used_gbps / g),
        link_bound_ms: case.link_gbps.map(|g| link_bytes as f64 * 8.0 / (g * 1e6)),
        each,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writers sharing a link together go no faster than its rate: 4 MiB from two threads over
    /// 1 Gbit/s take at least 4 MiB less one piece at 125 MB/s. (A lower bound only: the pacer
    /// sleeps, so nothing makes it faster; a loaded machine only makes it slower.)
    #[test]
    fn writers_sharing_a_link_share_its_rate() {
        let link = SharedLink::new(1.0).unwrap();
        let t = Instant::now();
        thread::scope(|s| {
            for _ in 0..2 {
                let link = Some(Arc::clone(&link));
                s.spawn(move || {
                    let mut w = OnLink {
                        inner: std::io::sink(),
                        link,
                    };
                    w.write_all(&vec![7u8; 2 << 20]).unwrap();
                });
            }
        });
        let least = ((4 << 20) - PIECE) as f64 / 125e6;
        assert!(t.elapsed().as_secs_f64() >= least, "{:?}", t.elapsed());
        assert!(SharedLink::new(0.0).is_err());
        assert!(SharedLink::new(f64::NAN).is_err());
    }

    #[test]
    fn too_many_vms_are_refused_before_anything_runs() {
        let case = EvacuationCase {
            vms: MAX_VMS + 1,
            link_gbps: None,
            guest: GuestConfig::default(),
            ram_bytes: 16 << 20,
            at_frame: 2,
            opts: Options::default(),
            vm: VmOptions::default(),
            pinning: None,
        };
        let mut bases = Baselines::default();
        let e = evacuate(&case, &mut bases).unwrap_err().to_string();
        assert!(e.contains("1 to 7"), "{e}");
        let none = EvacuationCase { vms: 0, ..case };
        assert!(evacuate(&none, &mut bases).is_err());
        assert!(bases.machines.is_empty(), "nothing ran");
    }
}
