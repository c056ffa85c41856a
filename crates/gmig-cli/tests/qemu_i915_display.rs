//! The guest's screen (issue 40): Linux's i915 (Debian's 6.1, a GVT-g guest under QEMU TCG)
//! finds the vGPU's virtual DisplayPort monitor on port D, reads its EDID over AUX, trains the
//! link, lights pipe A and brings fbcon up on it; without the monitor (`gmig serve
//! --x-no-monitor`) it finds no connected connector and no frame buffer.
//!
//! The guest script loads i915, waits for it, prints each DRM connector's status and first mode
//! (`GMIG-CONN:` lines) and the kernel log (`GMIG-DMESG:` lines).
//!
//! Skips (loudly) only where QEMU's source tarball is not beside the repository
//! (`../shared/qemu`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gmig_test_support::qemu::{
    one_at_a_time, qemu_source_present, repo_root, Serve, Tools, Vm, VmSpec,
};

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// The guest's side (`display-probe LIMIT`).
const PROBE_SCRIPT: &str = r#"#!/bin/sh
limit=$1
echo "gmig-display: modprobe i915" >/dev/kmsg
modprobe i915 &
pid=$!
i=0
while kill -0 $pid 2>/dev/null && [ $i -lt $limit ]; do sleep 1; i=$((i+1)); done
if kill -0 $pid 2>/dev/null; then
    echo "GMIG-I915: modprobe still running after $i s"
else
    wait $pid
    echo "GMIG-I915: modprobe exit $?"
fi
sleep 2
for c in /sys/class/drm/card*-*; do
    [ -e "$c/status" ] || continue
    echo "GMIG-CONN: ${c##*/} $(cat $c/status) $(head -n1 $c/modes)"
done
for f in /sys/class/graphics/fb*; do
    [ -e "$f/name" ] && echo "GMIG-FB: ${f##*/} $(cat $f/name) $(cat $f/virtual_size)"
done
dmesg | sed -n '/gmig-display: modprobe/,$p' | sed 's/^/GMIG-DMESG: /'
"#;

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

/// QEMU and a guest with i915 and the probe script, or `None` (said loudly).
fn tools(dir: &Path) -> Option<Tools> {
    if !qemu_source_present() {
        return None;
    }
    let qemu = script(&["scripts/qemu/build.sh"])
        .pop()
        .expect("scripts/qemu/build.sh printed no path");
    let probe = dir.join("display-probe");
    std::fs::write(&probe, PROBE_SCRIPT).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let add = format!("{}:/bin/display-probe", probe.display());
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

/// Boots the guest on a `gmig serve` with `serve_args`: the console and the server's log.
fn boot(serve_args: &[&str]) -> Option<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let tools = tools(dir.path())?;
    let mut args = vec!["--clients", "1"];
    args.extend_from_slice(serve_args);
    let mut serve = Serve::start(gmig(), dir.path(), "gpu", &args);
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        run: Some("/bin/display-probe,300".into()),
        ..VmSpec::default()
    };
    let mut vm = Vm::start(&tools, &spec, dir.path(), "display");
    let console = vm.run_to_poweroff(Duration::from_secs(900), &serve);
    let _ = serve.child.wait();
    Some((console, serve.log_text()))
}

fn lines<'a>(console: &'a str, prefix: &str) -> Vec<&'a str> {
    console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix(prefix))
        .collect()
}

/// The kernel log since modprobe, for a failure's message.
fn kernel_log(console: &str) -> String {
    lines(console, "GMIG-DMESG: ").join("\n")
}

/// Nothing went wrong in the kernel log: no driver error, warning or timeout.
fn assert_clean(console: &str) {
    for l in lines(console, "GMIG-DMESG: ") {
        let lower = l.to_lowercase();
        for bad in [
            "*error*",
            "warning:",
            "call trace",
            "timed out",
            "gpu hang",
            "wedged",
            "atomic update failure",
        ] {
            assert!(
                !lower.contains(bad),
                "kernel log: {l}\n{}",
                kernel_log(console)
            );
        }
    }
}

#[test]
fn linux_i915_lights_the_virtual_monitor_and_fbcon_comes_up() {
    let _one = one_at_a_time();
    let Some((console, server)) = boot(&[]) else {
        return;
    };
    let log = kernel_log(&console);
    assert!(
        lines(&console, "GMIG-I915: ").contains(&"modprobe exit 0"),
        "modprobe i915 failed\n{log}"
    );
    let conns = lines(&console, "GMIG-CONN: ");
    eprintln!("connectors: {conns:#?}");
    let connected: Vec<_> = conns
        .iter()
        .filter(|c| c.split_whitespace().nth(1) == Some("connected"))
        .collect();
    assert_eq!(
        connected.len(),
        1,
        "one connector is connected: {conns:?}\n{log}"
    );
    // The smallest type's monitor: 1024x768, on a DisplayPort connector.
    let c = connected[0];
    assert!(c.contains("-DP-"), "{c}");
    assert!(c.ends_with(" 1024x768"), "{c}: its preferred mode");
    assert!(
        log.contains("fb0: i915drmfb frame buffer device"),
        "no fbcon on the vGPU\n{log}"
    );
    let fbs = lines(&console, "GMIG-FB: ");
    assert!(
        fbs.contains(&"fb0 i915drmfb 1024,768"),
        "frame buffers: {fbs:?}"
    );
    assert_clean(&console);
    for bad in ["fault", "ERROR", "WARN"] {
        assert!(!server.contains(bad), "the server logged {bad}: {server}");
    }
}

#[test]
fn without_the_monitor_i915_finds_no_connector_and_no_fbcon() {
    let _one = one_at_a_time();
    let Some((console, _)) = boot(&["--x-no-monitor"]) else {
        return;
    };
    let log = kernel_log(&console);
    assert!(
        lines(&console, "GMIG-I915: ").contains(&"modprobe exit 0"),
        "modprobe i915 failed\n{log}"
    );
    let conns = lines(&console, "GMIG-CONN: ");
    assert!(
        conns
            .iter()
            .all(|c| c.split_whitespace().nth(1) != Some("connected")),
        "{conns:?}"
    );
    assert!(!log.contains("i915drmfb frame buffer device"), "{log}");
    assert!(lines(&console, "GMIG-FB: ").is_empty());
}
