//! Every profile runs cleanly on every generation the model presents.

use gmig_vgpu::gm::{Gen, HostConfig, PartitionManager, VgpuType};
use gmig_vgpu::gtt::new_guest_ram;
use gmig_vgpu::vgpu::{Vgpu, VgpuConfig};
use gmig_vgpu::workload::{GuestDriver, Profile, WorkloadConfig};

#[test]
fn every_profile_runs_on_every_gen() {
    for gen in [Gen::Gen8, Gen::Gen9, Gen::Gen11] {
        for p in Profile::ALL {
            let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
            let (_, slices) = pm.place(VgpuType::V5_8).unwrap();
            let mem = new_guest_ram(16 << 20).unwrap();
            let cfg = VgpuConfig {
                gen,
                ..VgpuConfig::new(VgpuType::V5_8, 1)
            };
            let mut v = Vgpu::new(cfg, slices, mem).unwrap();
            let mut d = GuestDriver::boot(&mut v, p, WorkloadConfig::small(), 7).unwrap();
            d.run_frames(&mut v, 4).unwrap();
            assert!(v.faults().is_empty(), "{gen:?} {p:?}: {:?}", v.faults());
            assert_eq!(d.failures(), 0, "{gen:?} {p:?}");
            assert!(v.stats().executed > 0);
        }
    }
}
