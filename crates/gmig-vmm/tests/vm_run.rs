//! The guest GPU driver runs under KVM on the in-process vGPU: it finds the device, maps its
//! objects, renders, and prints a checksum of what the GPU produced.

mod common;

use common::{kvm_present, linked};
use gmig_vmm::{GuestConfig, GuestProfile, Machine, Stop};

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
        let mut m = Machine::boot(64 << 20, &cfg, linked(0, true)).expect("boot");
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
