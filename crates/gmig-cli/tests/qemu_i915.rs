//! Linux's own i915 driver probes the gmig vGPU as a GVT-g guest (issue 32, stage 1).
//!
//! QEMU 10.2.2 (TCG) attaches `gmig serve`; the guest is Debian's `linux-image-amd64` (i915 is a
//! module there; the cloud kernel has none) with i915 and the modules it depends on in a busybox
//! initramfs (`scripts/qemu/guest.sh --modules i915`). A script in the guest loads i915, waits
//! for it and for the GT to go idle, then prints the kernel log and debugfs `i915_wedged` on the
//! serial console. The test checks i915's lines one by one: the GVT-g PV info page was found,
//! everything outside the vGPU's slices was ballooned, i915 initialised on the vGPU's PCI
//! address, nothing hung, wedged, reset or failed, and the GT is idle and not wedged. It prints
//! the probe time measured by the guest's kernel log.
//!
//! Skips (loudly) only where QEMU's source tarball is not beside the repository
//! (`../shared/qemu`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gmig_test_support::qemu::{qemu_source_present, repo_root, Serve, Tools, Vm, VmSpec};
use gmig_vgpu::gm::{HostConfig, PartitionManager, VgpuType};

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// The guest's side: loads i915 (parameters from the command line), waits up to LIMIT seconds
/// for modprobe and then for the GT to park, and prints the kernel log since the load
/// (`GMIG-DMESG:` lines) and each device's `i915_wedged`.
const PROBE_SCRIPT: &str = r#"#!/bin/sh
limit=$1; shift
echo "gmig-i915: modprobe i915 $*" >/dev/kmsg
modprobe i915 "$@" &
pid=$!
i=0
while kill -0 $pid 2>/dev/null && [ $i -lt $limit ]; do sleep 1; i=$((i+1)); done
if kill -0 $pid 2>/dev/null; then
    echo "GMIG-I915: modprobe still running after $i s"
else
    wait $pid
    echo "GMIG-I915: modprobe exit $?"
fi
idle=busy
for _ in $(seq 20); do
    if head -n1 /sys/kernel/debug/dri/0/i915_engine_info 2>/dev/null | grep -q 'GT awake? no'; then
        idle=idle
        break
    fi
    sleep 1
done
echo "GMIG-I915: gt $idle"
dmesg | sed -n '/gmig-i915: modprobe/,$p' | sed 's/^/GMIG-DMESG: /'
for f in /sys/kernel/debug/dri/*/i915_wedged; do
    echo "GMIG-I915: i915_wedged $(cat "$f")"
done
"#;

/// Runs a repository script; its stdout lines.
fn script(args: &[&str]) -> Vec<String> {
    let out = Command::new(repo_root().join(args[0]))
        .args(&args[1..])
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    assert!(
        out.status.success(),
        "{} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// QEMU and a guest with i915 and the probe script, or `None` (said loudly) where QEMU's source
/// is not here.
fn tools(dir: &Path) -> Option<Tools> {
    if !qemu_source_present() {
        return None;
    }
    let qemu = script(&["scripts/qemu/build.sh"])
        .pop()
        .expect("scripts/qemu/build.sh printed no path");
    let probe = dir.join("i915-probe");
    std::fs::write(&probe, PROBE_SCRIPT).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let add = format!("{}:/bin/i915-probe", probe.display());
    let out = dir.join("guest");
    let lines = script(&[
        "scripts/qemu/guest.sh",
        "--modules",
        "i915",
        "--add",
        &add,
        "--out",
        &out.to_string_lossy(),
    ]);
    let find = |k: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(k))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("scripts/qemu/guest.sh printed no {k}"))
    };
    Some(Tools {
        qemu: PathBuf::from(qemu),
        kernel: find("KERNEL="),
        initrd: find("INITRD="),
    })
}

/// The kernel log lines the guest printed: `(seconds, text)`.
fn dmesg(console: &str) -> Vec<(f64, String)> {
    console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("GMIG-DMESG: "))
        .filter_map(|l| {
            let (ts, text) = l.strip_prefix('[')?.split_once(']')?;
            Some((ts.trim().parse().ok()?, text.trim().to_string()))
        })
        .collect()
}

/// The lines i915 must print for the vGPU that `gmig serve` places first on the default host:
/// the PV info page, the slices, and a balloon over every range of the GGTT outside them.
fn expected_lines() -> Vec<String> {
    let host = HostConfig::default();
    let (_, s) = PartitionManager::new(host)
        .unwrap()
        .place(VgpuType::V5_8)
        .unwrap();
    let (ap, ap_end) = (s.aperture.base.0, s.aperture.base.0 + s.aperture.size);
    let (hid, hid_end) = (s.hidden.base.0, s.hidden.base.0 + s.hidden.size);
    let (mappable_end, ggtt_end) = (host.aperture_size, host.total_size);
    let mut want = vec![
        "Virtual GPU for Intel GVT-g detected.".to_string(),
        "VGT ballooning configuration:".to_string(),
        format!(
            "Mappable graphic memory: base {ap:#x} size {}KiB",
            s.aperture.size / 1024
        ),
        format!(
            "Unmappable graphic memory: base {hid:#x} size {}KiB",
            s.hidden.size / 1024
        ),
    ];
    // i915_vgpu.c's order: unmappable below, above; mappable below, above.
    for (start, end) in [
        (mappable_end, hid),
        (hid_end, ggtt_end),
        (0, ap),
        (ap_end, mappable_end),
    ] {
        if start < end {
            want.push(format!(
                "balloon space: range [ {start:#x} - {end:#x} ] {} KiB.",
                (end - start) / 1024
            ));
        }
    }
    want.push("VGT balloon successfully".to_string());
    want
}

#[test]
fn linux_i915_probes_the_vgpu_as_a_gvt_g_guest() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let mut serve = Serve::start(gmig(), dir.path(), "gpu", &["--clients", "1"]);
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        run: Some("/bin/i915-probe,300".into()),
        ..VmSpec::default()
    };
    let mut vm = Vm::start(&tools, &spec, dir.path(), "i915");
    let console = vm.run_to_poweroff(Duration::from_secs(900), &serve);
    let has = |l: &str| console.lines().any(|c| c.trim_end_matches('\r') == l);
    assert!(has("GMIG-I915: modprobe exit 0"), "modprobe i915 failed");
    // The vGPU's PCI address, as the guest's PCI core enumerated it.
    let addr = console
        .lines()
        .find(|l| l.starts_with("GMIG-PCI:") && l.contains(" 0x8086 ") && l.contains(" 0x0300"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("the guest did not enumerate the vGPU")
        .to_string();

    let log = dmesg(&console);
    assert!(!log.is_empty(), "no kernel log from the guest");
    let find = |want: &str| log.iter().find(|(_, l)| l.ends_with(want));
    // In i915's order: the PV info page, the ballooning of everything outside the slices.
    let mut last = 0.0;
    for want in expected_lines() {
        let (t, _) = find(&want).unwrap_or_else(|| panic!("no `{want}` in the kernel log"));
        assert!(*t >= last, "`{want}` out of order");
        last = *t;
    }
    let init = log
        .iter()
        .find(|(_, l)| l.contains("[drm] Initialized i915") && l.contains(&format!("for {addr} ")))
        .unwrap_or_else(|| panic!("i915 did not initialise on {addr}"));
    // Nothing hung, wedged, reset or failed; no driver error or kernel warning.
    for (_, l) in &log {
        let lower = l.to_lowercase();
        for bad in [
            "gpu hang",
            "wedged",
            "resetting",
            "reset request timed out",
            "*error*",
            "warning:",
            "call trace",
            "probe with driver i915 failed",
            "device initialization failed",
            "failed to idle",
            "timed out",
        ] {
            assert!(!lower.contains(bad), "kernel log: {l}");
        }
    }
    assert!(has("GMIG-I915: gt idle"), "the GT did not go idle");
    assert!(has("GMIG-I915: i915_wedged 0"), "i915_wedged is not 0");
    // The server refused nothing i915 submitted.
    let server = serve.log_text();
    for bad in ["fault", "ERROR", "WARN"] {
        assert!(!server.contains(bad), "the server logged {bad}: {server}");
    }
    // Probe time, by the guest's clock: from modprobe (dependencies loaded first) and from the
    // PV info page's detection, to "Initialized".
    let (t0, _) = log
        .iter()
        .find(|(_, l)| l.contains("gmig-i915: modprobe"))
        .expect("no modprobe mark");
    let (t1, _) = find("Virtual GPU for Intel GVT-g detected.").unwrap();
    eprintln!(
        "i915 probe (QEMU TCG): modprobe to Initialized {:.2} s, GVT-g detected to Initialized \
         {:.2} s",
        init.0 - t0,
        init.0 - t1
    );
    let _ = serve.child.wait();
}
