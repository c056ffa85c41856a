//! Reading the dirty logs for a round or for the stop: KVM's (per memory slot) joined with the
//! vGPU's DMA log (per guest RAM range), straight into the sorted list of dirty pages. Nothing
//! here is as wide as guest-physical space: each log is walked once, word by word, in its own
//! range, so beyond what KVM and the vGPU return the cost is one pass over their words and one
//! entry per dirty page.

use std::io::Write;
use std::time::{Duration, Instant};

use gmig_vfio_migration::DeviceState;

use super::copier::{send_pages, Pages};
use super::wire::Wire;
use crate::kvm::{ram_layout, Rearm};
use crate::machine::Machine;
use crate::{Error, Result};

/// The dirty pages since the last call (guest frame numbers, ascending): KVM's log (re-armed as
/// `rearm` says), joined (unless `gpu` is off) with the vGPU's.
pub(super) fn collect_dirty(m: &mut Machine, gpu: bool, rearm: Rearm) -> Result<Vec<u64>> {
    let ram = m.vm().ram_bytes();
    let kvm_logs = m.vm().dirty_log_slots(rearm)?;
    let gpu_logs = if gpu { gpu_logs(m)? } else { Vec::new() };
    let mut dirty = Vec::new();
    join_ranges(ram, &kvm_logs, &gpu_logs, &mut dirty);
    Ok(dirty)
}

/// [`join`] over every range of [`ram_layout`] (`kvm[i]`, `gpu[i]`: range `i`'s logs; a missing
/// one is empty). Returns how many pages only the vGPU's logs had.
fn join_ranges(ram: u64, kvm: &[Vec<u64>], gpu: &[Vec<u64>], out: &mut Vec<u64>) -> u64 {
    let mut gpu_only = 0;
    for (i, (start, len)) in ram_layout(ram).into_iter().enumerate() {
        let k = kvm.get(i).map_or(&[][..], Vec::as_slice);
        let g = gpu.get(i).map_or(&[][..], Vec::as_slice);
        gpu_only += join(start / 4096, len / 4096, k, g, out);
    }
    gpu_only
}

/// The vGPU's DMA log since the last report, one bitmap per range of [`ram_layout`].
fn gpu_logs(m: &mut Machine) -> Result<Vec<Vec<u64>>> {
    let ram = m.vm().ram_bytes();
    let link = m.gpu().link();
    ram_layout(ram)
        .into_iter()
        .map(|(start, len)| link.dma_log_report(start, len))
        .collect()
}

/// What the stop's RAM phase did.
pub(super) struct Final {
    /// Page entries sent (with `overlap`, a page both logs list goes twice: see
    /// [`stop_and_send`]).
    pub(super) pages: u64,
    /// Pages only the vGPU's log had.
    pub(super) gpu_only: u64,
    /// Reading KVM's log, and the vGPU's.
    pub(super) kvm: Duration,
    /// See `kvm`.
    pub(super) gpu: Duration,
    /// The vGPU's STOP_COPY transition (with `overlap`, beside KVM's pages).
    pub(super) vgpu_stop: Duration,
    /// This thread's RAM work: KVM's log and pages, then the vGPU's.
    pub(super) ram: Duration,
    /// Waiting for the vGPU's stop (with `overlap`, once KVM's pages were sent).
    pub(super) stop_wait: Duration,
}

/// The stop's RAM phase, with the source's vCPU paused for good.
///
/// Without `overlap`, the vGPU goes to STOP_COPY (its bounded drain may still write), then both
/// logs are read and joined (KVM's re-armed as `rearm` says, the vGPU's unless `gpu` is off) and
/// the pages they list go, once each.
///
/// With `overlap`, the vGPU goes to STOP_COPY on a thread of its own while this one reads KVM's
/// log and sends the pages it lists; then the vGPU's DMA log is read and every page it lists
/// goes. The drain may write a page after KVM's copy of it was read: the vGPU's log, read after
/// the stop, lists it, so it goes again (the destination keeps the last copy). KVM's pages then
/// cross while STOP_COPY is in flight: a watcher of the vGPU's requests (the fault matrix's
/// relay, which marks the pause at STOP_COPY) sees the pause after some of them.
pub(super) fn stop_and_send<S: Write>(
    m: &mut Machine,
    w: &mut Wire<'_, S>,
    gpu: bool,
    rearm: Rearm,
    overlap: bool,
) -> Result<Final> {
    let ram = m.vm().ram_bytes();
    if !overlap {
        let t = Instant::now();
        m.gpu().link().set_state(DeviceState::StopCopy)?;
        let vgpu_stop = t.elapsed();
        let t = Instant::now();
        let kvm_logs = m.vm().dirty_log_slots(rearm)?;
        let kvm = t.elapsed();
        let gpu_logs = if gpu { gpu_logs(m)? } else { Vec::new() };
        let gpu_t = t.elapsed().saturating_sub(kvm);
        let mut list = Vec::new();
        let gpu_only = join_ranges(ram, &kvm_logs, &gpu_logs, &mut list);
        let mem = m.vm().memory().clone();
        let pages = send_pages(w, &mem, &Pages::List(list))?;
        return Ok(Final {
            pages,
            gpu_only,
            kvm,
            gpu: gpu_t,
            vgpu_stop,
            ram: t.elapsed(),
            stop_wait: vgpu_stop,
        });
    }
    let mem = m.vm().memory().clone();
    let (vm, pci) = m.split();
    let start = Instant::now();
    let (kvm_part, stop) = std::thread::scope(|s| {
        let stopper = s.spawn(|| {
            let t = Instant::now();
            pci.link()
                .set_state(DeviceState::StopCopy)
                .map(|()| t.elapsed())
        });
        let kvm_part = (|| -> Result<_> {
            let t = Instant::now();
            let logs = vm.dirty_log_slots(rearm)?;
            let kvm = t.elapsed();
            let mut list = Vec::new();
            join_ranges(ram, &logs, &[], &mut list);
            let sent = send_pages(w, &mem, &Pages::List(list))?;
            Ok((logs, kvm, sent, t.elapsed()))
        })();
        let stop = stopper
            .join()
            .unwrap_or_else(|_| Err(Error::Device("the vGPU's stop panicked".into())));
        (kvm_part, stop)
    });
    let (logs, kvm, sent, kvm_ram) = kvm_part?;
    let vgpu_stop = stop?;
    let stop_wait = start.elapsed().saturating_sub(kvm_ram);
    let t = Instant::now();
    let mut fin = Final {
        pages: sent,
        gpu_only: 0,
        kvm,
        gpu: Duration::ZERO,
        vgpu_stop,
        ram: kvm_ram,
        stop_wait,
    };
    if gpu {
        let gpu_logs = gpu_logs(m)?;
        fin.gpu = t.elapsed();
        let mut list = Vec::new();
        for (i, (first, len)) in ram_layout(ram).into_iter().enumerate() {
            let k = logs.get(i).map_or(&[][..], Vec::as_slice);
            let g = gpu_logs.get(i).map_or(&[][..], Vec::as_slice);
            join(first / 4096, len / 4096, &[], g, &mut list);
            fin.gpu_only += only(len / 4096, g, k);
        }
        fin.pages += send_pages(w, &mem, &Pages::List(list))?;
    }
    fin.ram += t.elapsed();
    Ok(fin)
}

/// Pages of a range of `pages` pages set in `a` and not in `b`.
fn only(pages: u64, a: &[u64], b: &[u64]) -> u64 {
    let words = pages.div_ceil(64) as usize;
    let mut n = 0;
    for (w, &x) in a.iter().enumerate().take(words) {
        let mut bits = x & !b.get(w).copied().unwrap_or(0);
        let at = w as u64 * 64;
        if at + 64 > pages {
            bits &= (1u64 << (pages - at)) - 1;
        }
        n += u64::from(bits.count_ones());
    }
    n
}

/// Appends to `out` the pages of a range of `pages` pages from gfn `first` set in `kvm` or in
/// `gpu` (bit `n` = page `first + n`; bits past the range are ignored), ascending. Returns how
/// many only `gpu` had.
fn join(first: u64, pages: u64, kvm: &[u64], gpu: &[u64], out: &mut Vec<u64>) -> u64 {
    let words = pages.div_ceil(64) as usize;
    let mut gpu_only = 0;
    for w in 0..words.min(kvm.len().max(gpu.len())) {
        let k = kvm.get(w).copied().unwrap_or(0);
        let g = gpu.get(w).copied().unwrap_or(0);
        let mut bits = k | g;
        if bits == 0 {
            continue;
        }
        let at = w as u64 * 64;
        if at + 64 > pages {
            bits &= (1u64 << (pages - at)) - 1;
        }
        gpu_only += u64::from((g & !k & bits).count_ones());
        while bits != 0 {
            out.push(first + at + u64::from(bits.trailing_zeros()));
            bits &= bits - 1;
        }
    }
    gpu_only
}

#[cfg(test)]
mod tests {
    use super::{join, only};

    #[test]
    fn join_lists_either_logs_pages_in_order_and_counts_the_vgpus_own() {
        let mut out = Vec::new();
        let kvm = [0b1010, 0, 1 << 63];
        let gpu = [0b0110, 1 << 5];
        let gpu_only = join(1000, 192, &kvm, &gpu, &mut out);
        assert_eq!(out, vec![1001, 1002, 1003, 1000 + 64 + 5, 1000 + 128 + 63]);
        assert_eq!(gpu_only, 2);
        // Bits past the range are not pages of it; an empty log is no page.
        out.clear();
        assert_eq!(join(0, 70, &[0, u64::MAX], &[], &mut out), 0);
        assert_eq!(out, vec![64, 65, 66, 67, 68, 69]);
        out.clear();
        assert_eq!(join(0, 64, &[], &[], &mut out), 0);
        assert!(out.is_empty());
        // `only` counts what `join` calls the vGPU's own.
        assert_eq!(only(192, &gpu, &kvm), 2);
        assert_eq!(only(70, &[0, u64::MAX], &[]), 6);
    }
}
