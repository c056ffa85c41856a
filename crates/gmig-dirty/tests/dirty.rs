//! Behavioural tests of gmig-dirty over real `vm-memory` guest memory.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use gmig_dirty::{
    DiffScratch, DirtyBitmap, Gfn, GuestPages, HashSnapshot, Hasher, HasherOptions, Kernel,
    PageKind, PAGE_SIZE,
};
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Two regions with a hole: frames 0x100..0x100+n1 and 0x400..0x400+n2.
fn guest(n1: usize, n2: usize) -> GuestMemoryMmap {
    let mut ranges = vec![(GuestAddress(0x100 * PAGE_SIZE as u64), n1 * PAGE_SIZE)];
    if n2 > 0 {
        ranges.push((GuestAddress(0x400 * PAGE_SIZE as u64), n2 * PAGE_SIZE));
    }
    GuestMemoryMmap::from_ranges(&ranges).unwrap()
}

fn fill(mem: &GuestMemoryMmap, seed: u64) {
    let pages = GuestPages::new(mem).unwrap();
    let frames = pages.frames().unwrap();
    let mut x = seed | 1;
    for g in frames.iter() {
        // Leave every 7th page zero so zero markers are exercised.
        if g.0 % 7 == 0 {
            continue;
        }
        let mut page = [0u8; PAGE_SIZE];
        for chunk in page.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        mem.write_slice(&page, g.addr().unwrap()).unwrap();
    }
}

fn kernels() -> Vec<Kernel> {
    [Kernel::Portable, Kernel::Avx2, Kernel::Avx512]
        .into_iter()
        .filter(|k| k.is_supported())
        .collect()
}

/// Send every tracked page through `copy_for_send`, returning the destination's copy per frame.
fn send_all(
    h: &Hasher,
    pages: &GuestPages<'_>,
    snap: &mut HashSnapshot,
) -> Vec<(Gfn, Vec<u8>, PageKind)> {
    let gfns: Vec<Gfn> = snap.tracked().iter().collect();
    let mut out = Vec::new();
    for batch in gfns.chunks(37) {
        let mut buf = vec![0u8; batch.len() * PAGE_SIZE];
        let d = h.copy_for_send(pages, snap, batch, &mut buf).unwrap();
        for ((g, page), d) in batch.iter().zip(buf.chunks_exact(PAGE_SIZE)).zip(d) {
            out.push((*g, page.to_vec(), d.kind));
        }
    }
    out
}

#[test]
fn sent_pages_are_clean_and_zero_pages_marked() {
    let mem = guest(40, 30);
    fill(&mem, 5);
    let pages = GuestPages::new(&mem).unwrap();
    for k in kernels() {
        let h = Hasher::with_kernel(2, k).unwrap();
        let mut snap = HashSnapshot::new(pages.frames().unwrap()).unwrap();
        // Before anything is recorded, every tracked page is dirty.
        assert_eq!(h.diff(&pages, &snap, None).unwrap().count(), 70);
        let sent = send_all(&h, &pages, &mut snap);
        for (g, bytes, kind) in &sent {
            let zero = bytes.iter().all(|&b| b == 0);
            assert_eq!(*kind == PageKind::Zero, zero, "{k:?} frame {g:?}");
            assert_eq!(zero, g.0 % 7 == 0);
            let mut want = vec![0u8; PAGE_SIZE];
            mem.read_slice(&mut want, g.addr().unwrap()).unwrap();
            assert_eq!(bytes, &want);
        }
        assert_eq!(h.diff(&pages, &snap, None).unwrap().count(), 0, "{k:?}");
    }
}

#[test]
fn frames_outside_guest_memory_are_errors_not_panics() {
    let mem = guest(4, 4);
    let pages = GuestPages::new(&mem).unwrap();
    let h = Hasher::new(2).unwrap();
    let mut snap = HashSnapshot::for_range(Gfn(0x100), 8).unwrap();
    let mut buf = vec![0u8; 8 * PAGE_SIZE];
    let gfns: Vec<Gfn> = (0x100..0x108).map(Gfn).collect();
    assert!(h.copy_for_send(&pages, &mut snap, &gfns, &mut buf).is_err());
    assert!(h.record_in_place(&pages, &mut snap).is_err());
    // A wrong buffer size is refused before anything is read.
    assert!(h
        .copy_for_send(&pages, &mut snap, &gfns[..2], &mut buf)
        .is_err());
    // Frames the snapshot does not track are refused.
    let mut small = HashSnapshot::for_range(Gfn(0x100), 2).unwrap();
    let mut one = [0u8; PAGE_SIZE];
    assert!(h
        .copy_page_for_send(&pages, &mut small, Gfn(0x102), &mut one)
        .is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// After random writes, diff reports exactly the pages whose bytes changed — for every
    /// kernel, thread count and with or without sampling.
    #[test]
    fn diff_finds_exactly_the_changed_pages(
        writes in prop::collection::vec((0usize..100, 0usize..PAGE_SIZE, any::<u8>()), 0..60),
        threads in 1usize..4,
        sampling in any::<bool>(),
        prefetch_pages in 0usize..=8,
    ) {
        let mem = guest(60, 40);
        fill(&mem, 11);
        let pages = GuestPages::new(&mem).unwrap();
        let frames = pages.frames().unwrap();
        let all: Vec<Gfn> = frames.iter().collect();
        for k in kernels() {
            let h = Hasher::with_options(HasherOptions {
                threads,
                kernel: Some(k),
                prefetch_pages,
            })
            .unwrap();
            let mut snap = HashSnapshot::new(frames.clone()).unwrap();
            if sampling {
                snap = snap.with_sampling();
            }
            let before: Vec<Vec<u8>> = send_all(&h, &pages, &mut snap).into_iter().map(|s| s.1).collect();
            for &(p, off, v) in &writes {
                let addr = all[p].addr().unwrap().0 + off as u64;
                mem.write_obj(v, GuestAddress(addr)).unwrap();
            }
            let mut expect = BTreeSet::new();
            for (i, g) in all.iter().enumerate() {
                let mut now = vec![0u8; PAGE_SIZE];
                mem.read_slice(&mut now, g.addr().unwrap()).unwrap();
                if now != before[i] {
                    expect.insert(*g);
                }
            }
            let streamed = Mutex::new(BTreeSet::new());
            let got = h.diff_with(&pages, &snap, None, &|b| {
                assert!(!b.is_empty() && b.len() <= gmig_dirty::hasher::SINK_BATCH);
                assert!(b.windows(2).all(|w| w[0] < w[1]), "batch not ascending");
                streamed.lock().unwrap().extend(b.iter().copied());
            }).unwrap();
            let got: BTreeSet<Gfn> = got.iter().collect();
            prop_assert_eq!(&got, &expect, "{:?}", k);
            prop_assert_eq!(&*streamed.lock().unwrap(), &expect);
            // Into buffers made beforehand: the same pages; reused, nothing of the last run stays.
            let mut scratch = DiffScratch::prepared(&snap).unwrap();
            h.diff_into(&pages, &snap, None, &|_| {}, &mut scratch).unwrap();
            let into: BTreeSet<Gfn> = scratch.dirty().iter().collect();
            prop_assert_eq!(&into, &expect);
            let none = DirtyBitmap::new(frames.base(), frames.span_pages()).unwrap();
            h.diff_into(&pages, &snap, Some(&none), &|_| {}, &mut scratch).unwrap();
            prop_assert_eq!(scratch.dirty().count(), 0);
            // Undo the writes for the next kernel.
            for (i, g) in all.iter().enumerate() {
                mem.write_slice(&before[i], g.addr().unwrap()).unwrap();
            }
        }
    }

    /// With a candidate set, diff reports exactly the changed candidates (plus never-recorded
    /// pages, which are dirty regardless).
    #[test]
    fn diff_restricted_to_candidates(
        dirty in prop::collection::btree_set(0usize..64, 0..20),
        cands in prop::collection::btree_set(0usize..64, 0..40),
        unrecorded in prop::option::of(0usize..64),
    ) {
        let mem = guest(64, 0);
        fill(&mem, 3);
        let pages = GuestPages::new(&mem).unwrap();
        let h = Hasher::new(2).unwrap();
        let mut snap = HashSnapshot::new(pages.frames().unwrap()).unwrap();
        send_all(&h, &pages, &mut snap);
        let g = |i: usize| Gfn(0x100 + i as u64);
        for &i in &dirty {
            let v: u8 = mem.read_obj(g(i).addr().unwrap()).unwrap();
            mem.write_obj(v ^ 0xff, g(i).addr().unwrap()).unwrap();
        }
        if let Some(u) = unrecorded {
            snap.invalidate(g(u)).unwrap();
        }
        // Candidates in a bitmap with a different, unaligned span.
        let mut c = DirtyBitmap::new(Gfn(0xf3), 200).unwrap();
        for &i in &cands {
            c.set(g(i)).unwrap();
        }
        let got: BTreeSet<usize> = h.diff(&pages, &snap, Some(&c)).unwrap()
            .iter().map(|x| (x.0 - 0x100) as usize).collect();
        let mut want: BTreeSet<usize> = dirty.intersection(&cands).copied().collect();
        want.extend(unrecorded);
        prop_assert_eq!(got, want);
    }

    /// Merging KVM dirty logs (arbitrary slot bases) into a bitmap gives exactly the union, and a
    /// log with pages outside the span is refused without changing anything.
    #[test]
    fn merge_with_kvm_log_is_exact(
        gpu in prop::collection::btree_set(0u64..500, 0..80),
        kvm in prop::collection::btree_set(0u64..300, 0..80),
        slot_base in 0u64..400,
        slot_pages in 1u64..300,
    ) {
        let base = Gfn(100);
        let mut b = DirtyBitmap::new(base, 500).unwrap();
        for &p in &gpu {
            b.set(Gfn(100 + p)).unwrap();
        }
        let kvm: BTreeSet<u64> = kvm.into_iter().filter(|&p| p < slot_pages).collect();
        let mut words = vec![0u64; slot_pages.div_ceil(64) as usize];
        for &p in &kvm {
            words[(p / 64) as usize] |= 1 << (p % 64);
        }
        let before = b.clone();
        let res = b.merge_kvm_log(Gfn(slot_base), slot_pages, &words);
        let abs_kvm: BTreeSet<u64> = kvm.iter().map(|p| slot_base + p).collect();
        let outside = abs_kvm.iter().any(|&g| !(100..600).contains(&g));
        if outside {
            prop_assert!(res.is_err());
            prop_assert_eq!(b, before);
        } else {
            prop_assert!(res.is_ok());
            let want: BTreeSet<u64> = gpu.iter().map(|p| 100 + p).chain(abs_kvm).collect();
            let got: BTreeSet<u64> = b.iter().map(|g| g.0).collect();
            prop_assert_eq!(got, want);
        }
    }
}

/// A writer thread hammers one page while the sender keeps sending it; the writer's *last* write
/// races with the sender's *last* send (the sender stops as soon as the writer does). Re-sending
/// what diff reports must then leave the destination identical to the source. Hashing the source
/// after copying it lost the last write in 94 of 300 trials when tried, so hundreds of trials
/// catch that bug; copy-then-hash-the-copy never loses one.
#[test]
fn racing_writer_loses_no_update() {
    const TRIALS: u64 = 300;
    let mem = Arc::new(guest(2, 0));
    fill(&mem, 1);
    let pages = GuestPages::new(&*mem).unwrap();
    let h = Hasher::new(2).unwrap();
    let gfn = Gfn(0x100);
    let mut lost = 0;
    for trial in 0..TRIALS {
        let mut snap = HashSnapshot::for_range(gfn, 1).unwrap();
        let go = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (mem, go, stop) = (mem.clone(), go.clone(), stop.clone());
            std::thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let n = 200 + (trial * 7919) % 3000;
                for i in 0..n {
                    let off = (i * 8 * 37) % PAGE_SIZE as u64;
                    mem.write_obj(
                        trial << 32 | i,
                        GuestAddress(0x100 * PAGE_SIZE as u64 + off),
                    )
                    .unwrap();
                }
                stop.store(true, Ordering::Release);
            })
        };
        let mut dest = [0u8; PAGE_SIZE];
        go.store(true, Ordering::Release);
        while !stop.load(Ordering::Acquire) {
            if trial % 2 == 0 {
                h.copy_page_for_send(&pages, &mut snap, gfn, &mut dest)
                    .unwrap();
            } else {
                h.copy_for_send(&pages, &mut snap, &[gfn], &mut dest)
                    .unwrap();
            }
        }
        writer.join().unwrap();
        // Downtime: resend what diff reports.
        if h.diff(&pages, &snap, None).unwrap().is_set(gfn) {
            h.copy_page_for_send(&pages, &mut snap, gfn, &mut dest)
                .unwrap();
        }
        let mut src = [0u8; PAGE_SIZE];
        mem.read_slice(&mut src, gfn.addr().unwrap()).unwrap();
        if src != dest {
            lost += 1;
        }
    }
    assert_eq!(
        lost, 0,
        "{lost} of {TRIALS} trials lost the writer's last update"
    );
}

#[test]
fn sampling_prefilter_marks_sampled_changes_and_never_declares_clean() {
    let mem = guest(8, 0);
    fill(&mem, 9);
    let pages = GuestPages::new(&mem).unwrap();
    let h = Hasher::new(1).unwrap();
    let mut snap = HashSnapshot::new(pages.frames().unwrap())
        .unwrap()
        .with_sampling();
    send_all(&h, &pages, &mut snap);
    // Page 0: change a sampled word (offset 0). Page 1: change an unsampled byte.
    mem.write_obj(0xdead_beef_u64, GuestAddress(0x100 * PAGE_SIZE as u64))
        .unwrap();
    let a = GuestAddress(0x101 * PAGE_SIZE as u64 + 100);
    let v: u8 = mem.read_obj(a).unwrap();
    mem.write_obj(v ^ 1, a).unwrap();
    let got: Vec<u64> = h
        .diff(&pages, &snap, None)
        .unwrap()
        .iter()
        .map(|g| g.0)
        .collect();
    assert_eq!(got, vec![0x100, 0x101]);
}

#[test]
fn record_in_place_matches_copy_for_send() {
    let mem = guest(33, 17);
    fill(&mem, 21);
    let pages = GuestPages::new(&mem).unwrap();
    let h = Hasher::new(2).unwrap();
    let mut a = HashSnapshot::new(pages.frames().unwrap()).unwrap();
    let mut b = a.clone();
    h.record_in_place(&pages, &mut a).unwrap();
    send_all(&h, &pages, &mut b);
    for g in pages.frames().unwrap().iter() {
        assert_eq!(a.get(g), b.get(g));
        assert!(a.get(g).is_some());
    }
    assert_ne!(
        h.read_probe(&pages, &pages.frames().unwrap(), true)
            .unwrap(),
        0
    );
}

#[test]
fn count_zero_counts_exactly_the_all_zero_pages_it_is_given() {
    let mem = guest(40, 30);
    fill(&mem, 13);
    // One set byte at the very end of a page that is otherwise zero: not a zero page.
    let last = GuestAddress(0x103 * PAGE_SIZE as u64 + PAGE_SIZE as u64 - 1);
    mem.write_obj(1u8, last).unwrap();
    let pages = GuestPages::new(&mem).unwrap();
    let all = pages.frames().unwrap();
    // `fill` leaves every 7th frame zero; 0x103 is one of them but now has a byte set.
    let want = all.iter().filter(|g| g.0 % 7 == 0 && g.0 != 0x103).count() as u64;
    for k in kernels() {
        for threads in [1, 3] {
            let h = Hasher::with_kernel(threads, k).unwrap();
            assert_eq!(h.count_zero(&pages, &all).unwrap(), want, "{k:?} {threads}");
            // A subset: only the frames it names are looked at.
            let mut some = DirtyBitmap::new(all.base(), all.span_pages()).unwrap();
            // 0x10a and 0x405 are zero; 0x100 holds data; 0x103 has its last byte set.
            for g in [0x100, 0x103, 0x10a, 0x405] {
                some.set(Gfn(g)).unwrap();
            }
            assert_eq!(h.count_zero(&pages, &some).unwrap(), 2, "{k:?} {threads}");
        }
    }
    // A frame outside guest memory is an error, not a guess.
    let h = Hasher::new(1).unwrap();
    let mut hole = DirtyBitmap::new(all.base(), all.span_pages()).unwrap();
    hole.set(Gfn(0x200)).unwrap();
    assert!(h.count_zero(&pages, &hole).is_err());
}

#[test]
fn diff_into_refuses_buffers_made_for_another_span() {
    let mem = guest(64, 0);
    let pages = GuestPages::new(&mem).unwrap();
    let h = Hasher::new(1).unwrap();
    let frames = pages.frames().unwrap();
    let snap = HashSnapshot::new(frames.clone()).unwrap();
    let smaller = HashSnapshot::new(DirtyBitmap::new(frames.base(), 8).unwrap()).unwrap();
    let mut scratch = DiffScratch::prepared(&smaller).unwrap();
    assert!(h
        .diff_into(&pages, &snap, None, &|_| {}, &mut scratch)
        .is_err());
}

#[test]
fn diff_with_never_calls_its_sink_more_often_than_its_bound() {
    let mem = guest(600, 300);
    fill(&mem, 3);
    let pages = GuestPages::new(&mem).unwrap();
    for threads in [1, 2, 4] {
        let h = Hasher::new(threads).unwrap();
        let mut snap = HashSnapshot::new(pages.frames().unwrap()).unwrap();
        send_all(&h, &pages, &mut snap);
        // Dirty a scattered set: every third page of the first region, every page of the second.
        let mut dirtied = 0u64;
        for g in pages.frames().unwrap().iter() {
            if g.0 >= 0x400 || g.0 % 3 == 0 {
                let a = GuestAddress(g.addr().unwrap().0 + 9);
                let v: u8 = mem.read_obj(a).unwrap();
                mem.write_obj(v ^ 0xff, a).unwrap();
                dirtied += 1;
            }
        }
        let calls = Mutex::new(0u64);
        let found = h
            .diff_with(&pages, &snap, None, &|b: &[Gfn]| {
                assert!(!b.is_empty());
                *calls.lock().unwrap() += 1;
            })
            .unwrap();
        assert_eq!(found.count(), dirtied);
        let calls = calls.into_inner().unwrap();
        assert!(
            calls <= h.diff_sink_calls_bound(dirtied),
            "{threads} threads: {calls} sink calls > bound {}",
            h.diff_sink_calls_bound(dirtied)
        );
        assert!(h.diff_sink_calls_bound(3) <= 3);
    }
}

#[test]
fn diff_update_reports_each_change_once_and_then_settles() {
    let mem = guest(300, 90);
    fill(&mem, 17);
    let pages = GuestPages::new(&mem).unwrap();
    for threads in [1, 3] {
        let h = Hasher::new(threads).unwrap();
        let mut snap = HashSnapshot::new(pages.frames().unwrap())
            .unwrap()
            .with_sampling();
        // Nothing recorded yet: everything is new.
        assert_eq!(h.diff_update(&pages, &mut snap).unwrap().count(), 390);
        assert_eq!(h.diff_update(&pages, &mut snap).unwrap().count(), 0);
        let mut want = BTreeSet::new();
        for g in [0x100u64, 0x13f, 0x140, 0x22b, 0x400, 0x459] {
            let a = GuestAddress(g * PAGE_SIZE as u64 + 4000);
            let v: u8 = mem.read_obj(a).unwrap();
            mem.write_obj(v ^ 0x11, a).unwrap();
            want.insert(g);
        }
        let got: BTreeSet<u64> = h
            .diff_update(&pages, &mut snap)
            .unwrap()
            .iter()
            .map(|g| g.0)
            .collect();
        assert_eq!(got, want, "{threads} threads");
        // Reported once: the snapshot now holds the new contents.
        assert_eq!(h.diff_update(&pages, &mut snap).unwrap().count(), 0);
        assert_eq!(h.diff(&pages, &snap, None).unwrap().count(), 0);
    }
}
