//! Whole-VM live migration between two VMM processes over a byte stream (TCP in practice).
//!
//! **Source.** DMA logging starts on the vGPU and KVM's dirty log is armed (cleared; with
//! manual protect, `KVM_CLEAR_DIRTY_LOG` over all of guest RAM: the `kvm` module's `dirty`
//! submodule has both modes); the vGPU enters PRE_COPY. Round 0 sends every non-zero page of
//! guest RAM (the destination's RAM starts zeroed), and each later round the pages KVM's log *or*
//! the vGPU's DMA log reports (the vGPU writes guest RAM behind KVM's back: only its log sees
//! those), until a round is small or the round budget is spent. A copier thread writes each round
//! while the vCPU runs on ([`Options::overlap`]; one round in flight at a time, the guest running
//! on while it is). Then the vCPU stays paused (the VMM does not enter it again; a round still in
//! flight is written first), the vGPU goes to STOP_COPY (a bounded drain may still write), both
//! logs are read one last time (KVM's, with manual protect, without a clear: only the pages
//! dirtied since the last round are set) and those pages go ([`Options::overlap_stop`] sends
//! KVM's while the vGPU stops), then the vGPU's stop-copy data, its PCI configuration space,
//! COM1, the vCPU, and DONE. The source commits only when the destination acknowledges; a cut
//! connection or a refusal puts the vGPU back to RUNNING and the source VM carries on with
//! nothing lost.
//!
//! **Stream.** After the 8-byte magic `GMIGVM01`, records of `tag u8, length u32 LE, crc32 u32 LE
//! (of the payload), payload`. The destination answers DONE with `ACK u8 0x06, resumed_at_ns u64`
//! or `NAK u8 0x15, length u32, message`. `docs/migration-stream.md` has the tables.

use std::io::{Read, Write};
use std::time::Instant;

use gmig_vfio_migration::{DeviceState, IovaRange};
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::gpu::GpuLink;
use crate::guest::GuestConfig;
use crate::kvm::{ram_layout, realtime_ns, DirtyLogMode, Rearm, Stop, VcpuState, VmOptions};
use crate::machine::{Machine, SerialSnapshot};
use crate::switchover::Progress;
use crate::{Error, Result};

mod collect;
mod copier;
mod wire;
use collect::{collect_dirty, stop_and_send};
use copier::{read_device, send_device, Copier, Pages, Round};
use wire::{read_record, Wire, PAGE};
pub use wire::{Tag, MAGIC, MAX_RECORD, PAGES_PER_RECORD};

/// Destination → source after DONE: the VM validated and is restored, stopped (then a u64 LE
/// realtime ns). This is RESTORED of the hand-over.
const ACK: u8 = 0x06;
/// Destination → source: refused (then a u32 LE length and the reason).
const NAK: u8 = 0x15;
/// Source → destination after ACK: the VM is yours, run it.
const COMMIT: u8 = b'C';
/// Source → destination: the migration is called off; the source runs the VM again.
const ABORT: u8 = 0x18;
/// Destination → source after COMMIT: the VM runs here (then a u64 LE realtime ns).
const RESUMED: u8 = b'R';

/// What the destination must set up before the first page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Guest RAM in bytes.
    pub ram_bytes: u64,
    /// The guest program's parameters (for reports; they are in guest RAM anyway).
    pub guest: GuestConfig,
}

/// How the source migrates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Pre-copy rounds after the first full pass, at most (0: stop right after the first pass,
    /// with no guest execution in between).
    pub max_rounds: u32,
    /// Guest exits between two rounds (the guest runs while pages are in flight).
    pub round_exits: u64,
    /// A round at or below this many dirty pages ends pre-copy.
    pub converge_pages: u64,
    /// Join the vGPU's DMA-logged pages to KVM's dirty log. `false` only for the negative
    /// control: the pages the vGPU wrote are then missed.
    pub gpu_dirty: bool,
    /// Emulated link speed in Gbit/s (`None`: as fast as the connection goes).
    pub link_gbps: Option<f64>,
    /// Pre-copy rounds are written by a copier thread while the vCPU runs on. `false` writes
    /// each round before the vCPU runs again (the guest is paused for every round): the
    /// negative control of the overlap, and the baseline for the guest's largest pause.
    pub overlap: bool,
    /// In the stop, send the pages KVM's log lists while the vGPU goes to STOP_COPY on another
    /// thread (then the pages the vGPU's log lists, again where both list them). On by default;
    /// `false` stops the vGPU first, then reads both logs (to measure what the overlap saves).
    pub overlap_stop: bool,
    /// Negative control of manual protect: pre-copy rounds read KVM's log and never clear it, so
    /// every page written since the migration started stays dirty and goes again in every round
    /// and in the stop. No effect with GET.
    #[doc(hidden)]
    pub x_skip_clear: bool,
    /// Negative control of manual protect: every read of KVM's log clears the whole log first,
    /// dropping the pages the guest wrote since the last read (the destination then differs).
    /// No effect with GET.
    #[doc(hidden)]
    pub x_drop_unread: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_rounds: 8,
            round_exits: 4000,
            converge_pages: 256,
            gpu_dirty: true,
            link_gbps: None,
            overlap: true,
            overlap_stop: true,
            x_skip_clear: false,
            x_drop_unread: false,
        }
    }
}

/// What a migration did and how long the VM was paused, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Guest RAM in bytes.
    pub ram_bytes: u64,
    /// Pre-copy rounds, the full first pass included.
    pub rounds: u32,
    /// Page records sent while the VM ran.
    pub precopy_pages: u64,
    /// Page records sent while it was paused (with [`Options::overlap_stop`], a page both logs
    /// list goes twice).
    pub final_pages: u64,
    /// Of those, pages only the vGPU's DMA log reported (KVM's log did not have them).
    pub final_gpu_only_pages: u64,
    /// vGPU migration bytes sent in pre-copy and in stop-copy.
    pub device_precopy_bytes: u64,
    /// See `device_precopy_bytes`.
    pub device_stop_bytes: u64,
    /// Bytes on the wire.
    pub wire_bytes: u64,
    /// Downtime phases, ms, one after the other: the last dirty-log reads and pages (with
    /// [`Options::overlap_stop`], KVM's beside the vGPU's stop, then the vGPU's),
    pub ram_ms: f64,
    /// the vGPU's stop (its bounded drain; with `overlap_stop`, what KVM's part did not hide)
    /// and stop-copy data,
    pub vgpu_ms: f64,
    /// the vCPU, COM1 and configuration space,
    pub vcpu_ms: f64,
    /// the flush and the destination's restore, up to its acknowledgement.
    pub transfer_ms: f64,
    /// Source vCPU paused → destination acknowledged (the source's view).
    pub downtime_ms: f64,
    /// Source vCPU paused → destination vCPU runnable, on one clock (the destination's view).
    pub dest_downtime_ms: f64,
    /// Whole migration, ms.
    pub total_ms: f64,
    /// Where the source's guest and vGPU were when its vCPU paused for good.
    pub at_stop: Progress,
    /// After the pause, waiting for the pre-copy round still being written, ms (part of the
    /// downtime).
    pub drain_ms: f64,
    /// Of `ram_ms`: reading KVM's and the vGPU's dirty logs (`kvm_log_ms` + `gpu_log_ms`).
    pub dirty_log_ms: f64,
    /// Of `dirty_log_ms`: reading KVM's log,
    pub kvm_log_ms: f64,
    /// and reading the vGPU's DMA log.
    pub gpu_log_ms: f64,
    /// The vGPU's STOP_COPY transition, ms (part of `vgpu_ms`; with
    /// [`Options::overlap_stop`] it runs beside KVM's log and pages, and only what they did not
    /// hide is in `vgpu_ms`).
    pub vgpu_stop_ms: f64,
    /// How KVM's dirty log was read (GET, or manual protect with `KVM_CLEAR_DIRTY_LOG`).
    pub dirty_log_mode: DirtyLogMode,
    /// Guest exits in the pre-copy stretches that began while a round was being written: the
    /// guest ran while its RAM was copied (0 without [`Options::overlap`]).
    pub exits_while_copying: u64,
}

fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(v).map_err(|e| Error::Stream(format!("encode: {e}")))
}

fn dec<'a, T: Deserialize<'a>>(what: &str, b: &'a [u8]) -> Result<T> {
    postcard::from_bytes(b).map_err(|e| Error::Stream(format!("{what}: {e}")))
}

/// How KVM's log is re-armed after a read: `stop` is the last read (nothing runs after it).
fn rearm(opts: &Options, stop: bool) -> Rearm {
    if opts.x_drop_unread {
        Rearm::DropUnread
    } else if stop || opts.x_skip_clear {
        Rearm::Keep
    } else {
        Rearm::Read
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Migrates `m` out over `conn`. On success the source is stopped for good (the destination
/// runs the VM); on any failure before the destination's acknowledgement the vGPU is put back
/// to RUNNING and `m` can keep running, with nothing lost.
///
/// From the first byte of COMMIT on, the source is in doubt until RESUMED arrives (or NAK: the
/// destination's vGPU could not run and it dropped its copy, so the VM is rolled back here as
/// before COMMIT): any other failure
/// there returns [`Error::InDoubt`] and leaves the VM stopped (vCPU never entered again, vGPU
/// still in STOP_COPY with its data read), with its whole state, for the caller to keep until the
/// doubt is resolved.
pub fn migrate_out<S: Read + Write + Send>(
    m: &mut Machine,
    guest: &GuestConfig,
    conn: &mut S,
    opts: &Options,
) -> Result<Report> {
    migrate(m, guest, conn, opts, None)
}

/// As [`migrate_out`], but the switch-over comes at a chosen point of the guest's run instead of
/// when pre-copy converges: pre-copy rounds go on (every `round_exits` exits, `max_rounds` and
/// `converge_pages` aside) until `point` holds, asked after every exit, and the vCPU pauses for
/// good at that exit. If `point` holds when the migration starts, the first pass is followed by
/// the stop at once. A guest that finishes before its point fails the migration (the source VM
/// is kept, halted): a switch-over after the guest's work would prove nothing. For tests and
/// benches that must stop, say, with GPU work queued or in the middle of a frame.
pub fn migrate_out_at<S: Read + Write + Send>(
    m: &mut Machine,
    guest: &GuestConfig,
    conn: &mut S,
    opts: &Options,
    point: &mut dyn FnMut(&Machine) -> bool,
) -> Result<Report> {
    migrate(m, guest, conn, opts, Some(point))
}

fn migrate<S: Read + Write + Send>(
    m: &mut Machine,
    guest: &GuestConfig,
    conn: &mut S,
    opts: &Options,
    point: Option<&mut dyn FnMut(&Machine) -> bool>,
) -> Result<Report> {
    let ram = m.vm().ram_bytes();
    let started = Instant::now();
    let mut committing = false;
    let r = send_all(m, guest, conn, opts, started, &mut committing, point);
    match r {
        Err(e) if committing => {
            return Err(match e {
                Error::InDoubt(_) => e,
                other => Error::InDoubt(format!("after COMMIT: {other}")),
            })
        }
        Err(_) => {
            // Tell a destination that may hold a restored copy to drop it, then roll back: the
            // vGPU runs again and stops logging; the vCPU was never harmed.
            let _ = conn.write_all(&[ABORT]).and_then(|()| conn.flush());
            let gpu = m.gpu().link();
            let _ = gpu.set_state(DeviceState::Running);
            let _ = gpu.dma_log_stop();
        }
        Ok(_) => {}
    }
    let mut rep = r?;
    rep.ram_bytes = ram;
    rep.total_ms = ms(started);
    Ok(rep)
}

fn send_all<S: Read + Write + Send>(
    m: &mut Machine,
    guest: &GuestConfig,
    conn: &mut S,
    opts: &Options,
    started: Instant,
    committing: &mut bool,
    mut point: Option<&mut dyn FnMut(&Machine) -> bool>,
) -> Result<Report> {
    let mut rep = Report::default();
    let ram = m.vm().ram_bytes();
    conn.write_all(MAGIC)?;
    let mut w = Wire {
        s: conn,
        bytes: MAGIC.len() as u64,
        rate: opts.link_gbps,
        start: started,
    };
    w.record(
        Tag::Hello,
        &enc(&Hello {
            ram_bytes: ram,
            guest: *guest,
        })?,
    )?;
    // Start both logs, then the first full pass.
    rep.dirty_log_mode = m.vm().dirty_log_mode();
    m.vm().dirty_log_start()?;
    let ranges: Vec<IovaRange> = ram_layout(ram)
        .into_iter()
        .map(|(iova, length)| IovaRange { iova, length })
        .collect();
    m.gpu().link().dma_log_start(&ranges)?;
    m.gpu().link().set_state(DeviceState::PreCopy)?;
    // The guest runs between rounds while the copier writes the last one (at most one in
    // flight; while it is busy the guest just runs on); a round at or below `converge_pages`, or
    // the round budget, ends pre-copy (after one more stretch of guest execution, as a VMM keeps
    // the vCPU running while its last round is in flight). With a chosen `point`, rounds go on
    // until it holds.
    let point_mode = point.is_some();
    let mut reached = |m: &Machine| point.as_deref_mut().is_some_and(|p| p(m));
    let mut at_point = reached(m);
    let mem = m.vm().memory().clone();
    let (mut w, paused, paused_at_ns) = std::thread::scope(|scope| {
        let mut copier = Copier::start(scope, w, mem);
        // After the logs started: a page written from here on is logged, whether or not the
        // extents list it.
        let extents = m.vm().ram_extents()?;
        let device = read_device(m.gpu().link())?;
        // A copier that stopped on a write error says which at `finish`, after the pause.
        let mut alive = copier
            .push(Round {
                pages: Pages::Extents(extents),
                device,
            })
            .is_ok();
        rep.rounds = 1;
        while alive && !at_point {
            if !opts.overlap {
                alive = copier.wait().is_ok();
            }
            let copying = copier.busy();
            let before = m.exits;
            let stop = m.run_until(opts.round_exits, |m| {
                at_point = reached(m);
                at_point
            })?;
            if copying {
                rep.exits_while_copying += m.exits - before;
            }
            // At the point the vCPU pauses at once: what the guest dirtied since the last round
            // goes in the downtime, as when a VMM stops its vCPU while a round is in flight.
            if stop == Stop::Halted || at_point || (!point_mode && rep.rounds > opts.max_rounds) {
                break;
            }
            match copier.idle() {
                Ok(true) => {}
                Ok(false) => continue,
                Err(()) => break,
            }
            let dirty = collect_dirty(m, opts.gpu_dirty, rearm(opts, false))?;
            let converged = !point_mode && dirty.len() as u64 <= opts.converge_pages;
            let device = read_device(m.gpu().link())?;
            alive = copier
                .push(Round {
                    pages: Pages::List(dirty),
                    device,
                })
                .is_ok();
            rep.rounds += 1;
            if converged {
                if !opts.overlap {
                    alive = copier.wait().is_ok();
                }
                if alive {
                    m.run(opts.round_exits)?;
                }
                break;
            }
        }
        if alive && point_mode && !at_point {
            return Err(Error::Guest(format!(
                "the guest finished ({} frames) before the chosen switch-over point",
                m.frames_done()
            )));
        }
        // Downtime: the vCPU is not entered again from here on. A round still in flight is
        // written first (its wait is `drain_ms`).
        let paused = Instant::now();
        let paused_at_ns = realtime_ns();
        rep.at_stop = Progress::of(m);
        let (w, sent, drain) = copier.finish()?;
        rep.precopy_pages += sent.pages;
        rep.device_precopy_bytes += sent.device_bytes;
        rep.drain_ms = drain.as_secs_f64() * 1e3;
        Ok::<_, Error>((w, paused, paused_at_ns))
    })?;

    // The vGPU's stop, the logs and their pages (KVM's beside the stop with `overlap_stop`).
    let fin = stop_and_send(
        m,
        &mut w,
        opts.gpu_dirty,
        rearm(opts, true),
        opts.overlap_stop,
    )?;
    let secs = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    rep.kvm_log_ms = secs(fin.kvm);
    rep.gpu_log_ms = secs(fin.gpu);
    rep.dirty_log_ms = rep.kvm_log_ms + rep.gpu_log_ms;
    rep.vgpu_stop_ms = secs(fin.vgpu_stop);
    rep.final_pages = fin.pages;
    rep.final_gpu_only_pages = fin.gpu_only;
    rep.ram_ms = secs(fin.ram);
    let t = Instant::now();
    rep.device_stop_bytes = send_device(&mut w, m.gpu().link())?;
    rep.vgpu_ms = secs(fin.stop_wait) + ms(t);
    let t = Instant::now();
    let config = m.gpu().save_config()?;
    w.record(Tag::Config, &config)?;
    w.record(Tag::Serial, &enc(&m.save_serial())?)?;
    let mut vcpu = m.vm().save_vcpu()?;
    vcpu.paused_at_ns = paused_at_ns;
    w.record(Tag::Vcpu, &enc(&vcpu)?)?;
    rep.vcpu_ms = ms(t);
    let t = Instant::now();
    w.record(Tag::Done, &paused_at_ns.to_le_bytes())?;
    rep.wire_bytes = w.bytes;
    w.s.flush()?;
    let mut answer = [0u8; 1];
    w.s.read_exact(&mut answer)?;
    match answer[0] {
        ACK => {
            let mut at = [0u8; 8];
            w.s.read_exact(&mut at)?;
            rep.transfer_ms = ms(t);
            // From the first byte of COMMIT the destination may run the VM: only RESUMED (it
            // runs) or NAK (it could not, and dropped its copy) tells.
            *committing = true;
            w.s.write_all(&[COMMIT])?;
            w.s.flush()?;
            let mut answer = [0u8; 1];
            w.s.read_exact(&mut answer)?;
            match answer[0] {
                RESUMED => {}
                NAK => {
                    // The destination could not run the VM (its vGPU failed as it was told to
                    // run) and dropped its copy: it says so for certain, so the VM is ours again.
                    let why = read_refusal(w.s)?;
                    *committing = false;
                    return Err(Error::Stream(format!(
                        "the destination could not run the VM after COMMIT and dropped it: {why}"
                    )));
                }
                other => {
                    return Err(Error::InDoubt(format!(
                        "the destination answered COMMIT with {other:#x}, not RESUMED"
                    )))
                }
            }
            rep.downtime_ms = ms(paused);
            let mut at = [0u8; 8];
            w.s.read_exact(&mut at)?;
            let resumed = u64::from_le_bytes(at);
            rep.dest_downtime_ms = resumed.saturating_sub(paused_at_ns) as f64 / 1e6;
            Ok(rep)
        }
        NAK => Err(Error::Stream(format!(
            "the destination refused the VM: {}",
            read_refusal(w.s)?
        ))),
        other => Err(Error::Stream(format!(
            "the destination answered {other:#x}, neither ACK nor NAK"
        ))),
    }
}

/// The reason after a NAK (u32 LE length, text; a longer one is cut to 64 KiB).
fn read_refusal<S: Read>(s: &mut S) -> Result<String> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    let mut msg = vec![0u8; len.min(64 << 10)];
    s.read_exact(&mut msg)?;
    Ok(String::from_utf8_lossy(&msg).into_owned())
}

/// What the destination saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Incoming {
    /// The guest's parameters, from the source.
    pub guest: Option<GuestConfig>,
    /// Page records received.
    pub pages: u64,
    /// vGPU migration bytes received.
    pub device_bytes: u64,
    /// DONE received → vCPU runnable (the destination's part of the downtime), ms.
    pub restore_ms: f64,
    /// Where the restored guest and vGPU were before the destination's vCPU first ran.
    pub at_restore: Progress,
}

/// Receives a VM over `conn` onto the vGPU behind `link`. Returns the VM, ready to run, once
/// the whole stream validated, the VM was restored (stopped), the source was told (ACK) and it
/// handed the VM over (COMMIT); the source is then told RESUMED. Any failure before the restore
/// is refused back to the source (which then keeps running) and returned; ABORT from the source
/// is returned as [`Error::Stream`]; a vGPU that fails as it is told to run after COMMIT is
/// refused back too (the source takes the VM back) and returned; anything else after the restore — the source vanishing,
/// silence past the connection's read timeout — is [`Error::InDoubt`] (the restored copy is
/// dropped with the machine; keep the received bytes, e.g. by teeing `conn`, to resume it later
/// with [`resume_in`]).
pub fn migrate_in<S: Read + Write>(
    conn: &mut S,
    link: Box<dyn GpuLink>,
) -> Result<(Machine, Incoming)> {
    migrate_in_with(conn, link, &VmOptions::default())
}

/// As [`migrate_in`], the destination's VM made as `vm` asks (its dirty-log mode and huge
/// pages are this side's own choice: they do not travel).
pub fn migrate_in_with<S: Read + Write>(
    conn: &mut S,
    link: Box<dyn GpuLink>,
    vm: &VmOptions,
) -> Result<(Machine, Incoming)> {
    receive_checked(conn, link, true, vm)
}

/// Resumes a VM from the bytes a migration carried (a journal of what a side sent or received,
/// up to and past DONE), as if the source had committed: the copy a side left in doubt.
pub fn resume_in<R: Read>(journal: &mut R, link: Box<dyn GpuLink>) -> Result<(Machine, Incoming)> {
    struct ReadOnly<'a, R>(&'a mut R);
    impl<R: Read> Read for ReadOnly<'_, R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }
    impl<R> Write for ReadOnly<'_, R> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    receive_checked(&mut ReadOnly(journal), link, false, &VmOptions::default())
}

fn receive_checked<S: Read + Write>(
    conn: &mut S,
    link: Box<dyn GpuLink>,
    handshake: bool,
    vm: &VmOptions,
) -> Result<(Machine, Incoming)> {
    let mut magic = [0u8; 8];
    conn.read_exact(&mut magic)?;
    if &magic != MAGIC {
        let e = Error::Stream("not a gmig VM migration stream (bad magic)".into());
        refuse(conn, &e);
        return Err(e);
    }
    match receive(conn, link, handshake, vm) {
        Ok(r) => Ok(r),
        Err(e) => {
            if !e.in_doubt() {
                refuse(conn, &e);
            }
            Err(e)
        }
    }
}

fn refuse<S: Write>(conn: &mut S, e: &Error) {
    let msg = e.to_string();
    let mut out = vec![NAK];
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg.as_bytes());
    // Best effort: the source may be gone already.
    let _ = conn.write_all(&out).and_then(|()| conn.flush());
}

fn receive<S: Read + Write>(
    conn: &mut S,
    link: Box<dyn GpuLink>,
    handshake: bool,
    vm: &VmOptions,
) -> Result<(Machine, Incoming)> {
    let (tag, p) = read_record(conn)?;
    if tag != Tag::Hello {
        return Err(Error::Stream(format!("expected Hello, got {tag:?}")));
    }
    let hello: Hello = dec("Hello", &p)?;
    let mut inc = Incoming {
        guest: Some(hello.guest),
        ..Incoming::default()
    };
    let mut m = Machine::incoming_with(hello.ram_bytes, link, vm)?;
    m.gpu().link().set_state(DeviceState::Resuming)?;
    let pages = m.vm().ram_end() / PAGE as u64;
    let (mut config, mut serial, mut vcpu) = (None, None, None);
    loop {
        let (tag, p) = read_record(conn)?;
        match tag {
            Tag::Pages => inc.pages += apply_pages(m.vm().memory(), pages, &p)?,
            Tag::Device => {
                inc.device_bytes += p.len() as u64;
                m.gpu().link().resume_write(&p)?;
            }
            Tag::Config => config = Some(p),
            Tag::Serial => serial = Some(dec::<SerialSnapshot>("Serial", &p)?),
            Tag::Vcpu => vcpu = Some(dec::<VcpuState>("Vcpu", &p)?),
            Tag::Done => break,
            Tag::Hello => return Err(Error::Stream("a second Hello".into())),
        }
    }
    let t = Instant::now();
    let (Some(config), Some(serial), Some(vcpu)) = (config, serial, vcpu) else {
        return Err(Error::Stream(
            "DONE before the configuration space, COM1 and vCPU".into(),
        ));
    };
    // RESUMING → STOP validates the whole vGPU stream and restores it; then the rest.
    m.gpu().link().set_state(DeviceState::Stop)?;
    m.gpu().restore_config(&config)?;
    m.restore_serial(&serial)?;
    m.vm().restore_vcpu(&vcpu)?;
    inc.at_restore = Progress::of(&m);
    inc.restore_ms = ms(t);
    if handshake {
        // A complete, stopped copy exists here now: from this point a failure is a doubt.
        let in_doubt = |e: std::io::Error| {
            Error::InDoubt(format!(
                "the VM is restored here but the source did not hand it over: {e}"
            ))
        };
        let mut ack = vec![ACK];
        ack.extend_from_slice(&realtime_ns().to_le_bytes());
        conn.write_all(&ack)
            .and_then(|()| conn.flush())
            .map_err(in_doubt)?;
        let mut answer = [0u8; 1];
        conn.read_exact(&mut answer).map_err(in_doubt)?;
        match answer[0] {
            COMMIT => {}
            ABORT => {
                return Err(Error::Stream(
                    "the source called the migration off and runs the VM again".into(),
                ))
            }
            other => {
                return Err(Error::InDoubt(format!(
                    "the source answered ACK with {other:#x}, neither COMMIT nor ABORT"
                )))
            }
        }
    }
    // A vGPU that cannot run now (its process died) fails the migration here, before the vCPU
    // ever runs: the caller refuses (NAK) and drops the copy, and the source takes the VM back.
    m.gpu().link().set_state(DeviceState::Running)?;
    if handshake {
        // The VM is ours; a lost RESUMED only costs the source its downtime figure.
        let mut resumed = vec![RESUMED];
        resumed.extend_from_slice(&realtime_ns().to_le_bytes());
        let _ = conn.write_all(&resumed).and_then(|()| conn.flush());
    }
    Ok((m, inc))
}

fn apply_pages(mem: &GuestMemoryMmap, pages: u64, rec: &[u8]) -> Result<u64> {
    let mut at = 0;
    let mut n = 0;
    let zero = [0u8; PAGE];
    while at < rec.len() {
        let head = rec
            .get(at..at + 9)
            .ok_or_else(|| Error::Stream("truncated page entry".into()))?;
        let gfn = u64::from_le_bytes([
            head[0], head[1], head[2], head[3], head[4], head[5], head[6], head[7],
        ]);
        if gfn >= pages {
            return Err(Error::Stream(format!(
                "page {gfn:#x} is outside the guest's {pages} pages"
            )));
        }
        at += 9;
        let data: &[u8] = match head[8] {
            0 => &zero,
            1 => {
                let d = rec
                    .get(at..at + PAGE)
                    .ok_or_else(|| Error::Stream("truncated page data".into()))?;
                at += PAGE;
                d
            }
            k => return Err(Error::Stream(format!("page kind {k}"))),
        };
        mem.write_slice(data, GuestAddress(gfn * PAGE as u64))
            .map_err(|e| Error::Ram(e.to_string()))?;
        n += 1;
    }
    Ok(n)
}
