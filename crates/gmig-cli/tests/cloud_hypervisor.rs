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
//! And cloud-hypervisor's live migration of such a VM: with `integrations/cloud-hypervisor/
//! patches/0003` it is refused with the reason before any memory is sent, and the source's guest
//! renders on (without the patch it completes and moves no vGPU state: the docs warn of it).
//!
//! Skips (loudly) where cloud-hypervisor is not built or `/dev/kvm` is absent.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gmig_test_support::cloud_hypervisor::{binaries, ch_remote, wait_path, Ch, ChSpec};
use gmig_test_support::qemu::{checksum_line, one_at_a_time, Serve};

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// The checksum line of the driver under `gmig vm run` (KVM, gmig's own VMM).
fn reference(args: &[&str]) -> String {
    let out = std::process::Command::new(gmig())
        .args(["vm", "run"])
        .args(args)
        .output()
        .expect("gmig vm run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    checksum_line(&String::from_utf8_lossy(&out.stdout)).expect("gmig vm run: no checksum")
}

/// Writes the PVH guest into `dir`.
fn guest(dir: &Path) -> PathBuf {
    let path = dir.join("guest-pvh.elf");
    std::fs::write(&path, gmig_vmm::guest::PVH_ELF).expect("write the guest ELF");
    path
}

fn spec(kernel: &Path, cmdline: &str, gpus: Vec<PathBuf>) -> ChSpec {
    ChSpec {
        kernel: kernel.to_path_buf(),
        cmdline: cmdline.to_string(),
        memory: "size=128M,shared=on".to_string(),
        user_devices: gpus,
        api_socket: None,
        console: None,
    }
}

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

/// The running sums (`frame N sum …` lines) of a console.
fn sums(console: &str) -> Vec<String> {
    console
        .lines()
        .filter(|l| l.starts_with("frame ") && l.contains(" sum "))
        .map(str::to_string)
        .collect()
}

#[test]
fn cloud_hypervisor_refuses_to_migrate_the_vm_with_the_reason_and_the_guest_renders_on() {
    let Some(bin) = binaries() else {
        return;
    };
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kernel = guest(d);
    let out = std::process::Command::new(gmig())
        .args(["vm", "run", "--frames", "64"])
        .output()
        .expect("gmig vm run");
    assert!(out.status.success());
    let want = sums(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(want.len(), 4, "gmig vm run: {want:?}");

    let src_gpu = Serve::start(gmig(), d, "a", &["--clients", "1"]);
    let dst_gpu = Serve::start(gmig(), d, "b", &["--slot", "1", "--clients", "1"]);
    // The destination takes the source's configuration, paths included, and opens (truncates)
    // the serial file on receiving it: the vfio-user socket and the serial file are symlinks,
    // pointed at the destination's before the migration.
    let (gpu, console) = (d.join("gpu.sock"), d.join("console"));
    std::os::unix::fs::symlink(&src_gpu.socket, &gpu).unwrap();
    std::os::unix::fs::symlink(d.join("src.console"), &console).unwrap();
    let (src_api, dst_api) = (d.join("src.api"), d.join("dst.api"));
    let mut s = spec(&kernel, "--frames 1000000", vec![gpu.clone()]);
    s.api_socket = Some(src_api.clone());
    s.console = Some(console.clone());
    let mut src = Ch::start(&bin, &s, d, "src");
    src.console = d.join("src.console"); // read past the link, which moves
    let dst = Ch::start_destination(&bin, &dst_api, d, "dst");
    assert!(wait_path(&src_api, Duration::from_secs(20)));
    assert!(wait_path(&dst_api, Duration::from_secs(20)));
    assert!(
        src.wait_for(Duration::from_secs(120), |c, _| c.contains("frame 32 sum")),
        "the source's guest did not render:\n{}",
        src.console_text()
    );

    for (link, to) in [
        (&gpu, dst_gpu.socket.clone()),
        (&console, d.join("dst.console")),
    ] {
        std::fs::remove_file(link).unwrap();
        std::os::unix::fs::symlink(to, link).unwrap();
    }
    let url = format!("unix:{}", d.join("mig.sock").display());
    let receiver = {
        let (bin, api, url) = (bin.clone(), dst_api.clone(), url.clone());
        std::thread::spawn(move || {
            ch_remote(
                &bin,
                &api,
                &["receive-migration", &format!("receiver_url={url}")],
            )
        })
    };
    assert!(wait_path(&d.join("mig.sock"), Duration::from_secs(20)));
    // ch-remote returns at once; the outcome is in the source's log.
    ch_remote(
        &bin,
        &src_api,
        &["send-migration", &format!("destination_url={url}")],
    )
    .unwrap();
    assert!(
        src.wait_for(Duration::from_secs(120), |_, l| l
            .contains("Migration completed")
            || l.contains("Migration failed")),
        "no outcome in the source's log:\n{}",
        src.log_text()
    );
    let log = src.log_text();
    assert!(
        log.contains(
            "Migration failed: Failed to start migration for migratable component: vfio-user \
             device _vfio_user0: cloud-hypervisor does not migrate the state of vfio-user devices"
        ),
        "not refused with the reason (is cloud-hypervisor built with patch 0003?):\n{log}"
    );
    let receiver = receiver.join().unwrap();
    assert!(receiver.is_err(), "the destination received: {receiver:?}");
    let rendered = sums(&src.console_text()).len();

    // The source's guest renders on, on its vGPU, what it rendered before the attempt; the
    // destination's server never had a client.
    assert!(
        src.wait_for(Duration::from_secs(120), |c, _| sums(c).len()
            >= rendered + 8),
        "the source's guest stopped after the refused migration:\n{}",
        src.console_text()
    );
    let console = src.console_text();
    assert_eq!(sums(&console)[..4], want[..], "{console}");
    for bad in ["guest error", "seqno timeout"] {
        assert!(!console.contains(bad), "{console}");
    }
    assert!(
        !src_gpu.log_text().contains("fault"),
        "{}",
        src_gpu.log_text()
    );
    assert!(
        !dst_gpu.log_text().contains("connected"),
        "{}",
        dst_gpu.log_text()
    );
    drop(dst);
}
