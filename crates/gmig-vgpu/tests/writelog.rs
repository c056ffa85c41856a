//! What the migration engine relies on: every page the GPU writes is GTT-backed, and the parser's
//! write sets — indirect state followed for draws, dispatches and decodes — cover every page
//! actually written, without widening to the context's reach for any profile the guest model
//! runs.

use std::collections::BTreeSet;

use gmig_vgpu::workload::{GuestDriver, Profile, WorkloadConfig};

#[test]
fn write_sets_cover_actual_writes_and_stay_in_gtt_backed_pages() {
    for profile in Profile::ALL {
        let mut v = gmig_test_support::lone_vgpu(32 << 20);
        let mut d = GuestDriver::boot(&mut v, profile, WorkloadConfig::small(), 9).unwrap();
        let backed: BTreeSet<_> = v.gtt_backed_pages().into_iter().collect();
        let mut footprints = 0;
        for _ in 0..5 {
            d.submit_frame(&mut v).unwrap();
            d.wait(&mut v).unwrap();
            let log = v.take_write_log();
            assert!(
                !log.actual.is_empty(),
                "{profile:?}: every frame writes something"
            );
            assert!(
                log.actual.is_subset(&backed),
                "{profile:?}: GPU wrote a page no GTT maps"
            );
            assert!(!log.unknown, "{profile:?}: every command decodes");
            assert_eq!(
                log.reach_workloads, 0,
                "{profile:?}: the state bounds every write without the GTT reach"
            );
            let missed: Vec<_> = log.actual.difference(&log.candidate).collect();
            assert!(
                missed.is_empty(),
                "{profile:?}: write sets missed {missed:?}"
            );
            footprints += log.candidate.len();
            let cpu = d.take_cpu_dirty();
            assert!(
                !cpu.is_empty(),
                "{profile:?}: the guest CPU writes rings/batches every frame"
            );
        }
        // Narrow, not everything: a frame's candidates are a small part of what the GTTs map
        // (the 3D frame rewrites its render target and depth buffer, about half of it here).
        assert!(
            footprints < 5 * backed.len() * 3 / 4,
            "{profile:?}: {footprints} candidate pages over 5 frames of {} GTT-backed",
            backed.len()
        );
    }
}
