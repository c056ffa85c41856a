//! Reading the dirty logs for a round: KVM's (per memory slot) joined with the vGPU's DMA log
//! (per guest RAM range), straight into the sorted list of dirty pages. Nothing here is as wide
//! as guest-physical space: each log is walked once, word by word, in its own range, so beyond
//! what KVM and the vGPU return the cost is one pass over their words and one entry per dirty
//! page.

use std::time::{Duration, Instant};

use crate::kvm::{ram_layout, Rearm};
use crate::machine::Machine;
use crate::Result;

/// What one read of the dirty logs found.
pub(super) struct Collected {
    /// The dirty pages (guest frame numbers), ascending.
    pub(super) dirty: Vec<u64>,
    /// Pages only the vGPU's log had.
    pub(super) gpu_only: u64,
    /// Reading KVM's log took this long,
    pub(super) kvm: Duration,
    /// and the vGPU's this long.
    pub(super) gpu: Duration,
}

/// The dirty pages since the last call: KVM's log (re-armed as `rearm` says), joined (unless
/// `gpu` is off) with the vGPU's.
pub(super) fn collect_dirty(m: &mut Machine, gpu: bool, rearm: Rearm) -> Result<Collected> {
    let ram = m.vm().ram_bytes();
    let t = Instant::now();
    let kvm_logs = m.vm().dirty_log_slots(rearm)?;
    let kvm = t.elapsed();
    let t = Instant::now();
    let gpu_logs = if gpu {
        let link = m.gpu().link();
        ram_layout(ram)
            .into_iter()
            .map(|(start, len)| link.dma_log_report(start, len))
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    let gpu = t.elapsed();
    let mut dirty = Vec::new();
    let mut gpu_only = 0;
    for (i, (start, len)) in ram_layout(ram).into_iter().enumerate() {
        let k = kvm_logs.get(i).map_or(&[][..], Vec::as_slice);
        let g = gpu_logs.get(i).map_or(&[][..], Vec::as_slice);
        gpu_only += join(start / 4096, len / 4096, k, g, &mut dirty);
    }
    Ok(Collected {
        dirty,
        gpu_only,
        kvm,
        gpu,
    })
}

/// Appends to `out` the pages of a range of `pages` pages from gfn `first` set in `kvm` or in
/// `gpu` (bit `n` = page `first + n`; bits past the range are ignored), ascending. Returns how
/// many only `gpu` had.
pub(super) fn join(first: u64, pages: u64, kvm: &[u64], gpu: &[u64], out: &mut Vec<u64>) -> u64 {
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
    use super::join;

    #[test]
    fn join_lists_either_logs_pages_in_order_and_counts_the_vgpus_own() {
        let mut out = Vec::new();
        let kvm = [0b1010, 0, 1 << 63];
        let gpu = [0b0110, 1 << 5];
        let only = join(1000, 192, &kvm, &gpu, &mut out);
        assert_eq!(out, vec![1001, 1002, 1003, 1000 + 64 + 5, 1000 + 128 + 63]);
        assert_eq!(only, 2);
        // Bits past the range are not pages of it; an empty log is no page.
        out.clear();
        assert_eq!(join(0, 70, &[0, u64::MAX], &[], &mut out), 0);
        assert_eq!(out, vec![64, 65, 66, 67, 68, 69]);
        out.clear();
        assert_eq!(join(0, 64, &[], &[], &mut out), 0);
        assert!(out.is_empty());
    }
}
