//! What the migration engine relies on: every page the GPU writes is GTT-backed, and unless a
//! command's write set was unknown, the parser's write sets cover every page actually written.

use std::collections::BTreeSet;

use gmig_vgpu::workload::{GuestDriver, Profile, WorkloadConfig};

#[test]
fn write_sets_cover_actual_writes_and_stay_in_gtt_backed_pages() {
    for profile in Profile::ALL {
        let mut v = gmig_test_support::lone_vgpu(32 << 20);
        let mut d = GuestDriver::boot(&mut v, profile, WorkloadConfig::small(), 9).unwrap();
        let backed: BTreeSet<_> = v.gtt_backed_pages().into_iter().collect();
        let mut any_unknown = false;
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
            any_unknown |= log.unknown;
            if !log.unknown {
                let missed: Vec<_> = log.actual.difference(&log.candidate).collect();
                assert!(
                    missed.is_empty(),
                    "{profile:?}: write sets missed {missed:?}"
                );
            }
            let cpu = d.take_cpu_dirty();
            assert!(
                !cpu.is_empty(),
                "{profile:?}: the guest CPU writes rings/batches every frame"
            );
        }
        let expect_unknown = matches!(profile, Profile::ThreeD | Profile::Video | Profile::Compute);
        assert_eq!(any_unknown, expect_unknown, "{profile:?}");
    }
}
