use gmig_core::gm::{HostConfig, PartitionManager, VgpuType};
use gmig_core::gtt::new_guest_ram;
use gmig_core::vgpu::{Vgpu, VgpuConfig};
use gmig_core::workload::{GuestDriver, Profile, WorkloadConfig};

#[test]
fn every_profile_runs() {
    for p in Profile::ALL {
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        let (_, slices) = pm.place(VgpuType::V5_8).unwrap();
        let mem = new_guest_ram(64 << 20).unwrap();
        let mut v = Vgpu::new(VgpuConfig::new(VgpuType::V5_8, 1), slices, mem).unwrap();
        let mut d = GuestDriver::boot(&mut v, p, WorkloadConfig::small(), 7).unwrap();
        d.run_frames(&mut v, 4).unwrap();
        eprintln!("{p:?}: faults {:?} stats {:?}", v.faults(), v.stats());
        assert_eq!(d.failures(), 0, "{p:?}");
        assert!(v.faults().is_empty());
    }
}
