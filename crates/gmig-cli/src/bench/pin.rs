//! Pinning the bench's source and destination to disjoint sets of cores.
//!
//! `gmig bench migrate` runs both ends of a migration in one process. On two hosts each end has
//! its own cores; on one machine they compete for the same ones unless they are kept apart. With a
//! [`Pinning`], the thread that runs the source (and every thread it then starts: the hashing
//! pool, the stop-copy pipeline) is bound to the source's cores, and the destination's thread (and
//! its pool and threads) to the destination's. Threads inherit the affinity of the thread that
//! creates them, so pinning the two threads before anything else starts covers both sides.

use std::fmt;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Largest CPU number a [`CpuList`] holds, plus one (the kernel's default `CPU_SETSIZE`).
pub const MAX_CPUS: usize = 1024;

/// A set of CPU numbers, written as in `taskset -c` and `/sys/devices/system/cpu/online`:
/// `0-7`, `8-15`, `0,2,4-6`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CpuList {
    bits: [u64; MAX_CPUS / 64],
}

impl CpuList {
    /// The empty set.
    pub const EMPTY: CpuList = CpuList {
        bits: [0; MAX_CPUS / 64],
    };

    /// The set of `cpus` (`None` when one is `MAX_CPUS` or more).
    #[cfg(test)]
    pub fn of(cpus: impl IntoIterator<Item = usize>) -> Option<CpuList> {
        let mut l = CpuList::EMPTY;
        for c in cpus {
            *l.bits.get_mut(c / 64)? |= 1 << (c % 64);
        }
        Some(l)
    }

    /// Parses `0-7`, `8,10,12-15` …; refuses empty sets, reversed ranges and CPUs past
    /// [`MAX_CPUS`].
    pub fn parse(s: &str) -> Result<CpuList, String> {
        let num = |t: &str| -> Result<usize, String> {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("CPU list `{s}`: `{t}` is not a CPU number"))
        };
        let mut l = CpuList::EMPTY;
        for part in s.split(',') {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(part)?, num(part)?),
            };
            if a > b {
                return Err(format!("CPU list `{s}`: range `{part}` runs backwards"));
            }
            if b >= MAX_CPUS {
                return Err(format!("CPU list `{s}`: CPU {b} is past {}", MAX_CPUS - 1));
            }
            for c in a..=b {
                l.bits[c / 64] |= 1 << (c % 64);
            }
        }
        if l.is_empty() {
            return Err(format!("CPU list `{s}` is empty"));
        }
        Ok(l)
    }

    /// The CPUs, ascending.
    pub fn cpus(&self) -> Vec<usize> {
        (0..MAX_CPUS)
            .filter(|&c| self.bits[c / 64] >> (c % 64) & 1 == 1)
            .collect()
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// Whether `self` and `other` share no CPU.
    pub fn is_disjoint(&self, other: &CpuList) -> bool {
        self.bits.iter().zip(&other.bits).all(|(a, b)| a & b == 0)
    }

    /// Binds the calling thread (and the threads it starts afterwards) to these CPUs.
    pub fn pin_current_thread(&self) -> nix::Result<()> {
        let mut set = CpuSet::new();
        for c in self.cpus() {
            set.set(c)?;
        }
        // Pid 0: the calling thread (affinity is per thread on Linux).
        sched_setaffinity(Pid::from_raw(0), &set)
    }

    /// The CPUs the calling thread may run on.
    pub fn of_current_thread() -> nix::Result<CpuList> {
        let set = sched_getaffinity(Pid::from_raw(0))?;
        let n = CpuSet::count().min(MAX_CPUS);
        let mut l = CpuList::EMPTY;
        for c in 0..n {
            if set.is_set(c)? {
                l.bits[c / 64] |= 1 << (c % 64);
            }
        }
        Ok(l)
    }
}

impl fmt::Display for CpuList {
    /// Ranges joined by commas: `0-3,8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus = self.cpus();
        let mut first = true;
        let mut i = 0;
        while let Some(&a) = cpus.get(i) {
            let mut j = i;
            while cpus.get(j + 1) == Some(&(cpus[j] + 1)) {
                j += 1;
            }
            let sep = if first { "" } else { "," };
            first = false;
            if j == i {
                write!(f, "{sep}{a}")?;
            } else {
                write!(f, "{sep}{a}-{}", cpus[j])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

impl fmt::Debug for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuList({self})")
    }
}

impl serde::Serialize for CpuList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where the source and the destination run: two disjoint, non-empty sets of CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Pinning {
    /// The source's CPUs: its migration thread, hashing pool and stop-copy pipeline.
    pub source: CpuList,
    /// The destination's CPUs.
    pub dest: CpuList,
}

impl Pinning {
    /// Checks that both sets are non-empty and share no CPU.
    pub fn new(source: CpuList, dest: CpuList) -> Result<Pinning, String> {
        if source.is_empty() || dest.is_empty() {
            return Err("the source and destination CPU lists must not be empty".into());
        }
        if !source.is_disjoint(&dest) {
            return Err(format!(
                "the source CPUs ({source}) and destination CPUs ({dest}) overlap; two hosts \
                 have separate cores"
            ));
        }
        Ok(Pinning { source, dest })
    }

    /// The default number of hashing threads with this pinning: one per source CPU less the one
    /// left to the source's sender (the destination's applier has its own cores), at least one.
    pub fn hash_threads(&self) -> usize {
        self.source.len().saturating_sub(1).max(1)
    }
}

/// The CPUs the source and destination threads of one pinned repetition ran on, read back from
/// the kernel inside each thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Affinity {
    /// Read back by the source's thread after pinning.
    pub source: CpuList,
    /// Read back by the destination's thread after pinning.
    pub dest: CpuList,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print() {
        let l = CpuList::parse("0-3,8,10-11").unwrap();
        assert_eq!(l.cpus(), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(l.len(), 7);
        assert_eq!(l.to_string(), "0-3,8,10-11");
        assert_eq!(CpuList::parse(" 5 ").unwrap().cpus(), [5]);
        assert_eq!(CpuList::parse("1023").unwrap().cpus(), [1023]);
        assert_eq!(CpuList::parse("8-15").unwrap().to_string(), "8-15");
        for bad in ["", "a", "3-1", "0-", "-2", "1024", "0,,1", "0-2000"] {
            assert!(CpuList::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(CpuList::of([1, 2]), CpuList::parse("1-2").ok());
        assert_eq!(CpuList::of([MAX_CPUS]), None);
    }

    #[test]
    fn pinning_wants_two_disjoint_sets() {
        let a = CpuList::parse("0-7").unwrap();
        let b = CpuList::parse("8-15").unwrap();
        let p = Pinning::new(a, b).unwrap();
        assert_eq!(p.hash_threads(), 7);
        assert!(Pinning::new(a, CpuList::parse("7-9").unwrap()).is_err());
        assert!(Pinning::new(a, CpuList::EMPTY).is_err());
        let one = CpuList::parse("0").unwrap();
        assert_eq!(Pinning::new(one, b).unwrap().hash_threads(), 1);
    }

    #[test]
    fn pinning_a_thread_reads_back() {
        // In a thread of its own, so the test harness's threads keep their affinity.
        std::thread::spawn(|| {
            let all = CpuList::of_current_thread().unwrap();
            let last = *all.cpus().last().unwrap();
            let one = CpuList::of([last]).unwrap();
            one.pin_current_thread().unwrap();
            assert_eq!(CpuList::of_current_thread().unwrap(), one);
            // A thread started now inherits it.
            let child = std::thread::spawn(CpuList::of_current_thread)
                .join()
                .unwrap()
                .unwrap();
            assert_eq!(child, one);
            all.pin_current_thread().unwrap();
            assert_eq!(CpuList::of_current_thread().unwrap(), all);
        })
        .join()
        .unwrap();
    }
}
