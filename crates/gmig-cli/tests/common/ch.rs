//! Helpers shared by the cloud-hypervisor tests: the guest, its VM and the references.

#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};

use gmig_test_support::cloud_hypervisor::ChSpec;
use gmig_test_support::qemu::checksum_line;

pub fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// The output of the driver under `gmig vm run ARGS` (KVM, gmig's own VMM).
pub fn reference_run(args: &[&str]) -> String {
    gmig_test_support::qemu::vm_run_output(gmig(), args)
}

/// The checksum line of the driver under `gmig vm run ARGS`.
pub fn reference(args: &[&str]) -> String {
    checksum_line(&reference_run(args)).expect("gmig vm run: no checksum")
}

/// Writes the PVH guest into `dir`.
pub fn guest(dir: &Path) -> PathBuf {
    let path = dir.join("guest-pvh.elf");
    std::fs::write(&path, gmig_vmm::guest::PVH_ELF).expect("write the guest ELF");
    path
}

/// A VM of 128 MiB shared memory, one vCPU, running `kernel` with `cmdline`.
pub fn spec(kernel: &Path, cmdline: &str, gpus: Vec<PathBuf>) -> ChSpec {
    ChSpec {
        kernel: kernel.to_path_buf(),
        cmdline: cmdline.to_string(),
        memory: "size=128M,shared=on".to_string(),
        user_devices: gpus,
        api_socket: None,
        console: None,
    }
}

/// The running sums (`frame N sum …` lines) of a console; a line still being written (no
/// newline yet) is not one.
pub fn sums(console: &str) -> Vec<String> {
    console
        .split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
        .filter(|l| l.starts_with("frame ") && l.contains(" sum "))
        .map(str::to_string)
        .collect()
}
