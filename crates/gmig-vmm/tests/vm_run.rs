//! The guest GPU driver runs under KVM on the in-process vGPU: it finds the device, maps its
//! objects, renders, and prints a checksum of what the GPU produced.

use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vgpu::gm::VgpuType;
use gmig_vmm::{GpuLink, GuestConfig, GuestProfile, Linked, Machine, Stop};

fn kvm_present() -> bool {
    if std::path::Path::new("/dev/kvm").exists() {
        return true;
    }
    eprintln!("SKIPPED: /dev/kvm is absent; the real-guest tests need KVM");
    false
}

fn linked() -> Box<dyn GpuLink> {
    let spec = VgpuSpec::for_guest(VgpuType::V5_8, 0, true).expect("spec");
    Box::new(Linked(VgpuBackend::new(spec)))
}

#[test]
fn guest_renders_and_prints_its_checksum() {
    if !kvm_present() {
        return;
    }
    for profile in GuestProfile::ALL {
        let cfg = GuestConfig {
            profile,
            frames: 8,
            ..GuestConfig::default()
        };
        let mut m = Machine::boot(64 << 20, &cfg, linked()).expect("boot");
        let stop = m.run(5_000_000).expect("run");
        let out = String::from_utf8_lossy(m.serial()).to_string();
        eprintln!("{out}");
        assert_eq!(stop, Stop::Halted, "{out}");
        assert!(out.contains("checksum "), "{out}");
        assert!(out.contains(" failures 0"), "{out}");
        let stats = m
            .gpu_ref()
            .link_ref()
            .backend()
            .unwrap()
            .vm()
            .unwrap()
            .vgpu()
            .stats()
            .clone();
        eprintln!("{stats:?} exits {}", m.exits);
        // The GPU did the work: every frame's batch ran, nothing faulted, and each completion
        // raised an MSI the guest had enabled.
        assert_eq!(stats.workloads, u64::from(cfg.frames), "{stats:?}");
        assert!(stats.executed > u64::from(cfg.frames), "{stats:?}");
        assert!(m.msis() >= 1, "no MSI signalled");
    }
}
