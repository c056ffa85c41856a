//! A real QEMU attaches `gmig serve` and a real Linux guest drives the vGPU.
//!
//! QEMU 10.2.2 is built from the shared source tarball by `scripts/qemu/build.sh` (once; cached
//! outside the clone), the guest is Debian's cloud kernel with a busybox initramfs carrying the
//! guest GPU driver as a static Linux program (`crates/gmig-vmm/guest/linux.c`), and QEMU runs
//! it under TCG with the vGPU as a `vfio-user-pci` device. The guest's PCI core must enumerate
//! the vGPU with its documented ids and BAR sizes, and the driver must print the checksum the
//! same driver prints under `gmig vm run` (computed without QEMU). QEMU hot-unplugs the device
//! and the server survives; a QEMU killed mid-frame leaves the server ready for the next one.
//!
//! Skips (loudly) only where QEMU's source tarball is not beside the repository
//! (`../shared/qemu`), or where `/dev/kvm` is absent for the reference checksum.

use std::path::Path;
use std::time::Duration;

use gmig_test_support::qemu::{checksum_line, qemu_source_present, Serve, Tools, Vm, VmSpec};

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// QEMU and the guest, or `None` (said loudly) where QEMU's source is not here. A source that is
/// here but does not build fails the test.
fn tools(dir: &Path) -> Option<Tools> {
    if !qemu_source_present() {
        return None;
    }
    Some(Tools::get(dir).unwrap_or_else(|e| panic!("QEMU or the guest did not build: {e}")))
}

/// The checksum line of the same driver, same profile and frames, under `gmig vm run` (KVM, no
/// QEMU), or `None` (said loudly) without `/dev/kvm`.
fn reference(profile: &str, frames: u32) -> Option<String> {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm is absent: no reference run of the guest driver");
        return None;
    }
    Some(gmig_test_support::qemu::vm_run_checksum(
        gmig(),
        profile,
        frames,
    ))
}

/// The guest's line for the vGPU: `GMIG-PCI: <addr> 0x8086 <device> 0x030000 bar0=… bar2=…`.
fn vgpu_line(console: &str) -> Option<String> {
    console
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| l.starts_with("GMIG-PCI:") && l.contains(" 0x8086 ") && l.contains(" 0x0300"))
        .map(str::to_string)
}

fn expected_ids() -> (String, String, String) {
    let device = format!(
        "{:#06x}",
        gmig_vgpu::pci::device_id(gmig_cmdparser::Gen::Gen9)
    );
    let bar0 = format!("bar0={:#x}", gmig_vgpu::pci::BAR0_SIZE);
    let bar2 = format!(
        "bar2={:#x}",
        gmig_vgpu::gm::HostConfig::default().aperture_size
    );
    (device, bar0, bar2)
}

#[test]
fn a_linux_guest_in_qemu_enumerates_the_vgpu_and_renders_what_gmig_vm_renders() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let frames = 16;
    let want = reference("desktop", frames);
    let mut serve = Serve::start(gmig(), dir.path(), "gpu", &["--clients", "1"]);
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        run: Some(format!(
            "/bin/gmig-guest,--profile,desktop,--frames,{frames}"
        )),
        ..VmSpec::default()
    };
    let mut vm = Vm::start(&tools, &spec, dir.path(), "qemu");
    let console = vm.run_to_poweroff(Duration::from_secs(600), &serve);
    // The guest's PCI core found the vGPU with the documented ids and BAR sizes.
    let line = vgpu_line(&console).expect("the guest did not enumerate an Intel device");
    let (device, bar0, bar2) = expected_ids();
    for want in [&device, "0x030000", &bar0, &bar2] {
        assert!(line.contains(want), "{line}: no {want}");
    }
    // The driver ran to its end and computed what the driver computes without QEMU.
    assert!(
        console.contains("GMIG-GUEST: exit 0"),
        "the guest driver failed"
    );
    let got = checksum_line(&console).expect("no checksum line");
    if let Some(want) = want {
        assert_eq!(got, want, "the checksum differs from `gmig vm run`'s");
    }
    // The server served the one client and logged no fault.
    let log = serve.log_text();
    for bad in ["fault", "ERROR", "WARN"] {
        assert!(!log.contains(bad), "the server logged {bad}: {log}");
    }
    let _ = serve.child.wait();
}

#[test]
fn qemu_hot_unplugs_the_vgpu_and_a_killed_qemu_leaves_the_server_ready() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let frames = 16;
    let want = reference("desktop", frames);
    let mut serve = Serve::start(gmig(), dir.path(), "gpu", &[]);

    // 1. Hot-unplug: the guest sees the vGPU behind a PCIe root port, QEMU deletes it.
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        root_ports: true,
        run: Some("/bin/sleep,600".into()),
        ..VmSpec::default()
    };
    let mut vm = Vm::start(&tools, &spec, dir.path(), "unplug");
    assert!(
        vm.wait_for(Duration::from_secs(120), |l| vgpu_line(l).is_some()),
        "the guest did not enumerate the vGPU: {}\n{}",
        vm.console(),
        vm.stderr_text()
    );
    let mut events = Vec::new();
    let answer = vm
        .qmp(
            r#"{"execute":"device_del","arguments":{"id":"gpu0"}}"#,
            &mut events,
        )
        .expect("QMP device_del");
    assert!(answer.contains("\"return\""), "device_del: {answer}");
    assert!(
        vm.qmp_event("DEVICE_DELETED", Duration::from_secs(120), &mut events),
        "the guest never released the vGPU: {events:?}\n{}",
        vm.console()
    );
    assert!(
        serve.alive(),
        "the server died with the unplug: {}",
        serve.log_text()
    );
    vm.kill();

    // 2. A QEMU killed mid-run: the guest is rendering when QEMU dies.
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        run: Some("/bin/gmig-guest,--profile,desktop,--frames,100000".into()),
        ..VmSpec::default()
    };
    let mut vm = Vm::start(&tools, &spec, dir.path(), "killed");
    assert!(
        vm.wait_for(Duration::from_secs(300), |l| l.starts_with("frame 16")),
        "the guest did not render: {}\n{}",
        vm.console(),
        serve.log_text()
    );
    vm.kill();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        serve.alive(),
        "the server died with QEMU: {}",
        serve.log_text()
    );

    // 3. The next QEMU gets a working vGPU and the same results as an unmigrated run.
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        run: Some(format!(
            "/bin/gmig-guest,--profile,desktop,--frames,{frames}"
        )),
        ..VmSpec::default()
    };
    let mut vm = Vm::start(&tools, &spec, dir.path(), "next");
    let status = vm.wait_exit(Duration::from_secs(600));
    let console = vm.console();
    assert!(
        status.is_some_and(|s| s.success()) && console.contains("GMIG-GUEST: exit 0"),
        "the next guest failed: {status:?}\n{console}\n{}\n{}",
        vm.stderr_text(),
        serve.log_text()
    );
    if let Some(want) = want {
        assert_eq!(checksum_line(&console), Some(want), "after a killed client");
    }
    assert!(serve.alive(), "the server stopped: {}", serve.log_text());
}
