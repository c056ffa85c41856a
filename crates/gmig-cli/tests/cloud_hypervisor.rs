//! cloud-hypervisor attaches `gmig serve` and the guest GPU driver renders on it.
//!
//! cloud-hypervisor (upstream ae44c297) is built from the shared source tarballs by
//! `scripts/cloud-hypervisor/build.sh` (once; cached outside the clone; `.ci/run` builds it). It
//! boots the guest GPU driver as a PVH ELF (`--kernel`, `gmig_vmm::guest::PVH_ELF`) with the vGPU
//! as a vfio-user device (`--user-device`, guest RAM shared by descriptor): the driver finds the
//! vGPU through ports 0xCF8/0xCFC at the BARs cloud-hypervisor assigned and must print the
//! checksum the same driver prints under `gmig vm run`. Controls: without the device the driver
//! finds no GPU and prints no checksum; another seed renders another checksum (the comparison
//! can fail); cloud-hypervisor refuses the device without shared memory.
//!
//! Its live migration: `cloud_hypervisor_migrate.rs`.
//!
//! Skips (loudly) where cloud-hypervisor is not built or `/dev/kvm` is absent.

use std::path::Path;
use std::time::Duration;

use gmig_test_support::cloud_hypervisor::{binaries, Ch, ChSpec};
use gmig_test_support::qemu::{checksum_line, one_at_a_time, Serve};

#[path = "common/ch.rs"]
mod ch;
use ch::{gmig, guest, reference, spec};

/// Runs the VM to its power-off and returns the console.
fn run_to_poweroff(bin: &Path, spec: &ChSpec, dir: &Path, name: &str) -> String {
    let mut ch = Ch::start(bin, spec, dir, name);
    let status = ch.wait_exit(Duration::from_secs(300));
    let console = ch.console_text();
    let Some(status) = status else {
        panic!(
            "cloud-hypervisor did not exit in 300 s; console:\n{console}\nlog:\n{}",
            ch.log_text()
        );
    };
    assert!(
        status.success(),
        "cloud-hypervisor: {status}; console:\n{console}\nlog:\n{}",
        ch.log_text()
    );
    console
}

#[test]
fn cloud_hypervisor_attaches_the_vgpu_and_the_guest_renders_what_gmig_vm_renders() {
    let Some(bin) = binaries() else {
        return;
    };
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let frames = "16";
    let want = reference(&["--profile", "desktop", "--frames", frames]);
    let serve = Serve::start(gmig(), dir.path(), "gpu", &["--clients", "1"]);
    let kernel = guest(dir.path());
    let cmdline = format!("--profile desktop --frames {frames}");
    let console = run_to_poweroff(
        &bin,
        &spec(&kernel, &cmdline, vec![serve.socket.clone()]),
        dir.path(),
        "ch",
    );
    // The driver found the vGPU (vendor 0x8086, the GEN9 device id) on cloud-hypervisor's bus.
    let id = format!(
        "gpu: {:016x}",
        (u32::from(gmig_vgpu::pci::device_id(gmig_cmdparser::Gen::Gen9)) << 16) | 0x8086
    );
    assert!(console.contains(&id), "no `{id}` line:\n{console}");
    assert!(console.contains("guest: done\n"), "{console}");
    assert_eq!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "the checksum differs from `gmig vm run`'s:\n{console}"
    );
    let log = serve.log_text();
    for bad in ["fault", "ERROR", "WARN"] {
        assert!(!log.contains(bad), "the server logged {bad}: {log}");
    }
}

#[test]
fn controls_no_device_another_seed_and_private_memory() {
    let Some(bin) = binaries() else {
        return;
    };
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let kernel = guest(dir.path());

    // No vfio-user device: the driver finds no GPU and renders nothing.
    let console = run_to_poweroff(
        &bin,
        &spec(&kernel, "--frames 16", vec![]),
        dir.path(),
        "nodev",
    );
    assert!(
        console.contains("guest error: no Intel display controller on bus 0"),
        "{console}"
    );
    assert_eq!(checksum_line(&console), None, "{console}");

    // Another seed on the vGPU: the checksum differs from seed 1's reference.
    let seed1 = reference(&["--frames", "16", "--seed", "1"]);
    let serve = Serve::start(gmig(), dir.path(), "gpu", &["--clients", "2"]);
    let console = run_to_poweroff(
        &bin,
        &spec(&kernel, "--frames 16 --seed 2", vec![serve.socket.clone()]),
        dir.path(),
        "seed2",
    );
    let got = checksum_line(&console).expect("no checksum line");
    assert_ne!(got, seed1, "seeds 1 and 2 rendered the same checksum");

    // Private guest memory: cloud-hypervisor refuses the vfio-user device, with the reason.
    let mut private = spec(&kernel, "--frames 16", vec![serve.socket.clone()]);
    private.memory = "size=128M".to_string();
    let mut ch = Ch::start(&bin, &private, dir.path(), "private");
    let status = ch
        .wait_exit(Duration::from_secs(60))
        .expect("still running");
    assert!(!status.success());
    let log = ch.log_text();
    assert!(
        log.contains("Using user devices requires using shared memory"),
        "{log}"
    );
}
