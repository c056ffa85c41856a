//! Builds the guest GPU driver (`guest/`) from source: gcc compiles the freestanding platform
//! (`driver.c`), the driver's core it shares with the Linux program (`gpu.c`, `gpu.h`; see
//! `guest/build-linux.sh`) and the entry stub, links them at 1 MiB with `guest/link.ld`, and
//! objcopy makes the flat image the VMM loads (`$OUT_DIR/guest.bin`). The same core with the PVH
//! platform (`pvh.c`, `start-pvh.S`, `link-pvh.ld`) becomes the ELF cloud-hypervisor boots with
//! `--kernel` (`$OUT_DIR/guest-pvh.elf`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot start {shown}: {e} (gcc and binutils are needed)"));
    assert!(status.success(), "{shown} failed with {status}");
}

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let dir = Path::new("guest");
    for f in [
        "driver.c",
        "gpu.c",
        "gpu.h",
        "start.S",
        "link.ld",
        "pvh.c",
        "start-pvh.S",
        "link-pvh.ld",
    ] {
        println!("cargo:rerun-if-changed=guest/{f}");
    }
    let cc = std::env::var("GMIG_GUEST_CC").unwrap_or_else(|_| "gcc".into());
    let elf = out.join("guest.elf");
    run(Command::new(&cc)
        .args(CFLAGS)
        .arg("-Wl,-T")
        .arg(dir.join("link.ld"))
        .arg(dir.join("start.S"))
        .arg(dir.join("driver.c"))
        .arg(dir.join("gpu.c"))
        .arg("-o")
        .arg(&elf));
    // The same driver as a PVH ELF for cloud-hypervisor's `--kernel` (pvh.c, start-pvh.S).
    run(Command::new(&cc)
        .args(CFLAGS)
        .arg("-Wl,-T")
        .arg(dir.join("link-pvh.ld"))
        .arg(dir.join("start-pvh.S"))
        .arg(dir.join("pvh.c"))
        .arg(dir.join("gpu.c"))
        .arg("-o")
        .arg(out.join("guest-pvh.elf")));
    let objcopy = std::env::var("GMIG_GUEST_OBJCOPY").unwrap_or_else(|_| "objcopy".into());
    run(Command::new(objcopy)
        .args(["-O", "binary"])
        .arg(&elf)
        .arg(out.join("guest.bin")));
}

/// gcc's flags for both freestanding images.
const CFLAGS: &[&str] = &[
    "-m64",
    "-O2",
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-tree-loop-distribute-patterns",
    "-fno-stack-protector",
    "-fno-pic",
    "-fno-pie",
    "-no-pie",
    "-mno-red-zone",
    "-mgeneral-regs-only",
    "-nostdlib",
    "-static",
    "-Wl,--build-id=none",
];
