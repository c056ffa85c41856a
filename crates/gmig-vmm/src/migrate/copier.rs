//! The source's writing side: the stream's records ([`Wire`]), pages and vGPU data, and the
//! pre-copy copier, a thread that writes pre-copy rounds while the vCPU runs on.
//!
//! Pre-copy reads guest RAM while the guest writes it. A page the copier reads half-written was
//! written after the dirty log that listed it was read, so the log lists it again, and a later
//! round (at the latest the stop, with the vCPU paused) sends it whole; the stream is one FIFO,
//! so the destination keeps the last copy.

use std::io::Write;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::wire::{Tag, Wire, PAGE, PAGES_PER_RECORD};
use crate::gpu::GpuLink;
use crate::{Error, Result};

fn is_zero(page: &[u8]) -> bool {
    page.chunks_exact(8)
        .all(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) == 0)
}

/// Which pages a round sends.
pub(super) enum Pages {
    /// The first full pass: the guest-physical extents `(first gfn, pages)` that hold data (the
    /// rest of guest RAM was never written and reads as zero); zero pages in them are skipped.
    Extents(Vec<(u64, u64)>),
    /// Dirty pages (guest frame numbers), zero pages included (the destination zeroes them).
    List(Vec<u64>),
}

/// Sends `which` pages of `mem`.
pub(super) fn send_pages<S: Write>(
    w: &mut Wire<'_, S>,
    mem: &GuestMemoryMmap,
    which: &Pages,
) -> Result<u64> {
    let mut rec = Vec::with_capacity(PAGES_PER_RECORD * (PAGE + 9));
    let mut in_rec = 0;
    let mut sent = 0;
    let mut page = vec![0u8; PAGE];
    let full = matches!(which, Pages::Extents(_));
    let listed: Box<dyn Iterator<Item = u64> + '_> = match which {
        Pages::Extents(e) => Box::new(e.iter().flat_map(|&(first, n)| first..first + n)),
        Pages::List(l) => Box::new(l.iter().copied()),
    };
    for gfn in listed {
        mem.read_slice(&mut page, GuestAddress(gfn * PAGE as u64))
            .map_err(|e| Error::Ram(e.to_string()))?;
        let zero = is_zero(&page);
        if zero && full {
            continue;
        }
        rec.extend_from_slice(&gfn.to_le_bytes());
        if zero {
            rec.push(0);
        } else {
            rec.push(1);
            rec.extend_from_slice(&page);
        }
        in_rec += 1;
        sent += 1;
        if in_rec == PAGES_PER_RECORD {
            w.record(Tag::Pages, &rec)?;
            rec.clear();
            in_rec = 0;
        }
    }
    if in_rec > 0 {
        w.record(Tag::Pages, &rec)?;
    }
    Ok(sent)
}

/// Sends the vGPU's saving data available now (all of it, in STOP_COPY).
pub(super) fn send_device<S: Write>(w: &mut Wire<'_, S>, gpu: &mut dyn GpuLink) -> Result<u64> {
    let mut n = 0;
    while let Some(chunk) = gpu.save_read(1 << 20)? {
        if chunk.is_empty() {
            break;
        }
        n += chunk.len() as u64;
        w.record(Tag::Device, &chunk)?;
    }
    Ok(n)
}

/// Reads the vGPU's saving data available now (all of it, in STOP_COPY), for the copier.
pub(super) fn read_device(gpu: &mut dyn GpuLink) -> Result<Vec<Vec<u8>>> {
    let mut chunks = Vec::new();
    while let Some(chunk) = gpu.save_read(1 << 20)? {
        if chunk.is_empty() {
            break;
        }
        chunks.push(chunk);
    }
    Ok(chunks)
}

/// One pre-copy round for the copier: pages (every non-zero page, or the dirty ones) and the
/// vGPU's pre-copy data read with them.
pub(super) struct Round {
    /// The pages.
    pub(super) pages: Pages,
    /// The vGPU's pre-copy data.
    pub(super) device: Vec<Vec<u8>>,
}

/// What one written round sent.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Sent {
    pub(super) pages: u64,
    pub(super) device_bytes: u64,
}

/// The pre-copy copier: a thread that owns the [`Wire`] and writes [`Round`]s in order while
/// the vCPU runs. At most one round is in flight: the VMM asks [`Copier::idle`] before it reads
/// the logs for the next one, and runs the guest on while the copier is busy.
pub(super) struct Copier<'scope, 'w, S: Write + Send> {
    rounds: Option<Sender<Round>>,
    done: Receiver<Sent>,
    busy: bool,
    sent: Sent,
    thread: ScopedJoinHandle<'scope, (Wire<'w, S>, Result<()>)>,
}

impl<'scope, 'w: 'scope, S: Write + Send> Copier<'scope, 'w, S> {
    /// Starts the copier on `wire`, reading pages from `mem`.
    pub(super) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        mut wire: Wire<'w, S>,
        mem: GuestMemoryMmap,
    ) -> Self
    where
        'w: 'env,
    {
        let (rounds, rx) = channel::<Round>();
        let (done_tx, done) = channel::<Sent>();
        let thread = scope.spawn(move || {
            let mut write = |r: Round| -> Result<Sent> {
                let pages = send_pages(&mut wire, &mem, &r.pages)?;
                let mut device_bytes = 0;
                for chunk in &r.device {
                    device_bytes += chunk.len() as u64;
                    wire.record(Tag::Device, chunk)?;
                }
                Ok(Sent {
                    pages,
                    device_bytes,
                })
            };
            for round in rx {
                match write(round) {
                    Ok(sent) => {
                        // The VMM may have stopped listening (it is stopping): nothing to tell.
                        let _ = done_tx.send(sent);
                    }
                    Err(e) => return (wire, Err(e)),
                }
            }
            (wire, Ok(()))
        });
        Copier {
            rounds: Some(rounds),
            done,
            busy: false,
            sent: Sent::default(),
            thread,
        }
    }

    /// Whether the last round is written (and the copier alive): the VMM may read the logs for
    /// the next. `Err` when the copier stopped on a write error ([`Copier::finish`] says which).
    pub(super) fn idle(&mut self) -> std::result::Result<bool, ()> {
        if !self.busy {
            return Ok(true);
        }
        match self.done.try_recv() {
            Ok(s) => {
                self.account(s);
                Ok(true)
            }
            Err(TryRecvError::Empty) => Ok(false),
            Err(TryRecvError::Disconnected) => Err(()),
        }
    }

    /// Whether a round is being written.
    pub(super) fn busy(&self) -> bool {
        self.busy
    }

    /// Waits until the last round is written. `Err` when the copier stopped on a write error.
    pub(super) fn wait(&mut self) -> std::result::Result<(), ()> {
        if self.busy {
            let s = self.done.recv().map_err(|_| ())?;
            self.account(s);
        }
        Ok(())
    }

    fn account(&mut self, s: Sent) {
        self.busy = false;
        self.sent.pages += s.pages;
        self.sent.device_bytes += s.device_bytes;
    }

    /// Hands the copier a round. `Err` when it stopped on a write error.
    pub(super) fn push(&mut self, round: Round) -> std::result::Result<(), ()> {
        let tx = self.rounds.as_ref().ok_or(())?;
        tx.send(round).map_err(|_| ())?;
        self.busy = true;
        Ok(())
    }

    /// Waits until every round handed over is written; the wire back and what pre-copy sent,
    /// or the write error that stopped the copier. How long this waited is part of the
    /// downtime when the vCPU is already paused.
    pub(super) fn finish(self) -> Result<(Wire<'w, S>, Sent, Duration)> {
        let t = Instant::now();
        let Copier {
            rounds,
            done,
            busy: _,
            mut sent,
            thread,
        } = self;
        drop(rounds);
        let (wire, r) = thread
            .join()
            .map_err(|_| Error::Stream("the pre-copy copier panicked".into()))?;
        r?;
        while let Ok(s) = done.try_recv() {
            sent.pages += s.pages;
            sent.device_bytes += s.device_bytes;
        }
        Ok((wire, sent, t.elapsed()))
    }
}
