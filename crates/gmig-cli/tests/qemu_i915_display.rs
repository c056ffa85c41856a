//! The guest's screen (issue 40): Linux's i915 (Debian's 6.1, a GVT-g guest under QEMU TCG)
//! finds the vGPU's virtual DisplayPort monitor on port D, reads its EDID over AUX, trains the
//! link, lights pipe A and brings fbcon up on it; without the monitor (`gmig serve
//! --x-no-monitor`) it finds no connected connector and no frame buffer.
//!
//! The host sees the screen: `gmig-kms-draw` (`crates/gmig-vmm/guest/kms.c`) shows a known image
//! through KMS (dumb buffer, mode set), counts 60 vblanks, flips to a second known image and
//! waits for the flip's event; the PNG that `gmig serve --screen` writes from the vGPU's primary
//! plane then equals the second image, pixel for pixel (both are computed here on their own).
//!
//! QEMU shows it too: with `vfio-user-pci,display=on` (gmig's QEMU patch 0006: the plane over
//! vfio-user as a region-type GFX plane) QMP `screendump` equals the same image, pixel for
//! pixel; with `display` off (the no-monitor test) QEMU has no console to take a screendump from.
//!
//! Across a live migration (QEMU with gmig's patches) to a `gmig serve` in another slot, the
//! destination's screen (its `--screen` PNG and its QEMU's `screendump`) equals the source's
//! last one, and the guest's next flip appears on it; with remapping off on the destination,
//! its screen is never the guest's image. `GMIG_DOCS_SCREENSHOT=PATH` makes the migration test
//! write the destination's last `screendump` there as PNG (`docs/img/migrated-screen.png`).
//!
//! The guest script loads i915, waits for it, prints each DRM connector's status and first mode
//! (`GMIG-CONN:` lines), runs a program if given, and prints the kernel log (`GMIG-DMESG:`
//! lines).
//!
//! Skips (loudly) where QEMU's source tarball is not beside the repository (`../shared/qemu`);
//! the `screendump` checks skip loudly where QEMU's `vfio-user-pci` has no `display` property.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gmig_test_support::qemu::pair::Pair;
use gmig_test_support::qemu::screen::{
    kms_image, qemu_has_display, screendump, wait_png, write_png, Picture,
};
use gmig_test_support::qemu::{
    one_at_a_time, qemu_source_present, repo_root, Serve, Tools, Vm, VmSpec,
};

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// The guest's side (`display-probe LIMIT [PROGRAM ARGS...]`).
const PROBE_SCRIPT: &str = r#"#!/bin/sh
limit=$1; shift
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
if [ $# -gt 0 ]; then
    "$@"
    echo "GMIG-PROG: exit $?"
fi
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

/// QEMU and a guest with i915, the probe script and `gmig-kms-draw`, or `None` (said loudly).
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
    let prog = script(&[
        "crates/gmig-vmm/guest/build-kms.sh",
        &dir.join("gmig-kms-draw").to_string_lossy(),
    ])
    .pop()
    .expect("build-kms.sh printed no path");
    let add_prog = format!("{prog}:/bin/gmig-kms-draw");
    let out = dir.join("guest");
    let lines = script(&[
        "scripts/qemu/guest.sh",
        "--modules",
        "i915",
        "--add",
        &add,
        "--add",
        &add_prog,
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

/// Boots the guest on a `gmig serve` with `serve_args`, running `prog` (with its arguments,
/// comma-separated) after the probe, with QEMU's `display=on` if `display` (and QEMU has it);
/// `during` runs while the guest does, with the VM, the work directory and whether QEMU has the
/// display property. The console and the server's log.
fn boot(
    serve_args: &[&str],
    prog: Option<&str>,
    display: bool,
    during: impl FnOnce(&mut Vm, &Path, bool),
) -> Option<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let tools = tools(dir.path())?;
    let has_display = qemu_has_display(&tools.qemu);
    // `{dir}` in an argument: the work directory.
    let d = dir.path().to_string_lossy().into_owned();
    let mut args: Vec<String> = vec!["--clients".into(), "1".into()];
    args.extend(serve_args.iter().map(|a| a.replace("{dir}", &d)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut serve = Serve::start(gmig(), dir.path(), "gpu", &args);
    let run = match prog {
        Some(p) => format!("/bin/display-probe,300,{p}"),
        None => "/bin/display-probe,300".into(),
    };
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        run: Some(run),
        display: display && has_display,
        ..VmSpec::default()
    };
    let mut vm = Vm::start(&tools, &spec, dir.path(), "display");
    during(&mut vm, dir.path(), has_display);
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

/// i915 loaded, found one connected connector (the smallest type's monitor: 1024x768 on
/// DisplayPort) and brought fbcon up on it.
fn assert_monitor_lit_and_fbcon_up(console: &str) {
    let log = kernel_log(console);
    assert!(
        lines(console, "GMIG-I915: ").contains(&"modprobe exit 0"),
        "modprobe i915 failed\n{log}"
    );
    let conns = lines(console, "GMIG-CONN: ");
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
    let c = connected[0];
    assert!(c.contains("-DP-"), "{c}");
    assert!(c.ends_with(" 1024x768"), "{c}: its preferred mode");
    assert!(
        log.contains("fb0: i915drmfb frame buffer device"),
        "no fbcon on the vGPU\n{log}"
    );
    let fbs = lines(console, "GMIG-FB: ");
    assert!(
        fbs.contains(&"fb0 i915drmfb 1024,768"),
        "frame buffers: {fbs:?}"
    );
}

/// The negative controls, in one boot with the monitor removed (`--x-no-monitor`) and QEMU's
/// `display` off (its default): i915 finds no connected connector and brings up no fbcon, and
/// QEMU has no console to take a screendump from.
#[test]
fn without_the_monitor_i915_finds_no_connector_and_no_fbcon() {
    let _one = one_at_a_time();
    let mut dump = None;
    let Some((console, _)) = boot(&["--x-no-monitor"], None, false, |vm, dir, has_display| {
        if has_display {
            let up = vm.wait_for(Duration::from_secs(300), |l| {
                l.trim_end_matches('\r') == "GMIG-I915: modprobe exit 0"
            });
            assert!(up, "i915 did not load:\n{}", vm.console());
            dump = Some(screendump(vm, &dir.join("off.ppm")));
        }
    }) else {
        return;
    };
    if let Some(dump) = dump {
        let err = dump.expect_err("a screendump without display=on");
        assert!(
            err.contains("There is no console to take a screendump from"),
            "{err}"
        );
    }
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

/// One boot with the monitor: i915 lights it and fbcon comes up on it (checked from the probe's
/// lines, printed before the program runs), then the program's KMS image reaches the host.
#[test]
fn i915_lights_the_monitor_fbcon_comes_up_and_the_host_sees_the_kms_image() {
    let _one = one_at_a_time();
    let want = kms_image(1024, 768, 1);
    let mut seen = None;
    let mut dumped = None;
    let Some((console, server)) = boot(
        &["--screen", "{dir}/screen.png"],
        Some("/bin/gmig-kms-draw,8"),
        true,
        |vm, dir, has_display| {
            let shown = vm.wait_for(Duration::from_secs(600), |l| {
                l.trim_end_matches('\r') == "GMIG-KMS: shown"
            });
            assert!(
                shown,
                "the guest program did not show its image:\n{}",
                vm.console()
            );
            seen = wait_png(&dir.join("screen.png"), &want, Duration::from_secs(5));
            // QEMU's screendump asks the server for the plane at once (no polling).
            if has_display {
                dumped = Some(screendump(vm, &dir.join("qemu.ppm")));
            }
        },
    ) else {
        return;
    };
    let log = kernel_log(&console);
    assert_monitor_lit_and_fbcon_up(&console);
    let kms = lines(&console, "GMIG-KMS: ");
    eprintln!("{kms:#?}");
    assert!(
        kms.iter()
            .any(|l| l.starts_with("mode 1024x768 clock 65000 ")),
        "the EDID's mode: {kms:?}\n{log}"
    );
    // 60 vblanks waited for, counted by the vGPU's frame counter.
    let vblanks = kms
        .iter()
        .find_map(|l| l.strip_prefix("vblanks "))
        .expect("no vblank count");
    assert!(vblanks.starts_with("60 in "), "{vblanks}");
    assert!(
        kms.iter()
            .any(|l| l.starts_with("flip done sequence ") && l.ends_with(" user 0x6d69676d")),
        "no flip event reached the program: {kms:?}"
    );
    assert!(lines(&console, "GMIG-PROG: ").contains(&"exit 0"), "{log}");
    let (w, h, px) = seen.expect("the server wrote no screen");
    assert_eq!((w, h), (1024, 768));
    let wrong = px.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert_eq!(wrong, 0, "{wrong} pixels differ from the flipped image");
    assert!(kms_image(1024, 768, 0) != want, "the two images differ");
    if let Some(dumped) = dumped {
        let (w, h, px) = dumped.expect("QEMU's screendump with display=on");
        assert_eq!((w, h), (1024, 768), "QEMU's screendump size");
        let wrong = px.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(wrong, 0, "{wrong} pixels of QEMU's screendump differ");
    }
    assert_clean(&console);
    for bad in ["fault", "ERROR", "WARN"] {
        assert!(!server.contains(bad), "the server logged {bad}: {server}");
    }
}

/// A migration of a guest that shows image 1 (and, 20 s later, flips back to image 0), done:
/// the pair, the source's last screendump before it (`None`: QEMU has no display property).
struct Migrated {
    p: Pair,
    src_dump: Option<Picture>,
}

/// Migrates a guest that shows image 1 to a destination with `dst_args`, both QEMUs with
/// `display=on` where QEMU has it; returns once the migration completed and the source showed
/// image 1 (in its `--screen` PNG and its screendump).
fn migrate_screen(dir: &Path, dst_args: &[&str]) -> Option<Migrated> {
    let tools = tools(dir)?;
    let display = qemu_has_display(&tools.qemu);
    let d = dir.to_string_lossy().into_owned();
    let src_png = format!("{d}/src.png");
    let dst_png = format!("{d}/dst.png");
    let mut dst: Vec<&str> = vec!["--screen", &dst_png];
    dst.extend_from_slice(dst_args);
    let mut p = Pair::start(
        gmig(),
        &tools,
        dir,
        "screen",
        &["--screen", &src_png],
        &dst,
        |socket, extra| VmSpec {
            gpus: vec![socket.to_path_buf()],
            run: Some("/bin/display-probe,300,/bin/gmig-kms-draw,20,5".into()),
            ram_mib: 256,
            extra,
            display,
            ..VmSpec::default()
        },
    );
    p.wait_source(|l| l.trim_end_matches('\r') == "GMIG-KMS: shown");
    let want = kms_image(1024, 768, 1);
    let src = wait_png(Path::new(&src_png), &want, Duration::from_secs(10));
    assert!(
        src.is_some_and(|(_, _, px)| px == want),
        "the source's screen is not the guest's image:\n{}",
        p.logs()
    );
    let src_dump = display.then(|| {
        let dump = screendump(&mut p.src, &dir.join("src.ppm"));
        let dump = dump.unwrap_or_else(|e| panic!("source screendump: {e}\n{}", p.logs()));
        assert!(
            dump.2 == want,
            "the source QEMU does not show the guest's image"
        );
        dump
    });
    let q = p.migrate(r#"{"downtime-limit":300}"#);
    assert_eq!(q["status"], "completed", "{q}\n{}", p.logs());
    Some(Migrated { p, src_dump })
}

#[test]
fn the_screen_survives_a_live_migration_to_other_slices() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(Migrated { mut p, src_dump }) = migrate_screen(dir.path(), &[]) else {
        return;
    };
    let dst_png = dir.path().join("dst.png");
    let want = kms_image(1024, 768, 1);
    let seen = wait_png(&dst_png, &want, Duration::from_secs(10));
    assert!(
        seen.is_some_and(|(_, _, px)| px == want),
        "the destination's screen is not the source's last one:\n{}",
        p.logs()
    );
    let dst_ppm = dir.path().join("dst.ppm");
    if let Some(src_dump) = &src_dump {
        let dump = screendump(&mut p.dst, &dst_ppm).expect("destination screendump");
        assert!(
            dump == *src_dump,
            "the destination QEMU's screendump is not the source's last one"
        );
    }
    // The guest's next drawing (a flip back to image 0) appears on the destination.
    let back = p.dst.wait_for(Duration::from_secs(120), |l| {
        l.trim_end_matches('\r') == "GMIG-KMS: flipped back"
    });
    assert!(back, "the guest did not flip back:\n{}", p.logs());
    let want0 = kms_image(1024, 768, 0);
    let seen = wait_png(&dst_png, &want0, Duration::from_secs(10));
    assert!(
        seen.is_some_and(|(_, _, px)| px == want0),
        "the flip after the migration is not on the destination's screen:\n{}",
        p.logs()
    );
    if src_dump.is_some() {
        let dump = screendump(&mut p.dst, &dst_ppm).expect("destination screendump");
        assert!(
            dump.2 == want0,
            "the flip after the migration is not in the destination QEMU's screendump"
        );
        if let Some(path) = std::env::var_os("GMIG_DOCS_SCREENSHOT") {
            write_png(Path::new(&path), &dump).expect("writing the screenshot");
        }
    }
    let console = p.finish();
    assert!(
        lines(&console, "GMIG-PROG: ").contains(&"exit 0"),
        "{}",
        p.logs()
    );
    assert_clean(&console);
}

/// The negative control: a destination that does not remap (`--x-no-remap`) keeps the source's
/// host address of the plane's surface, which lies outside its own slices: its scan-out never
/// shows the guest's image, in its `--screen` PNG nor in its QEMU's screendump (which then
/// shows QEMU's placeholder: the server answers that no plane is shown).
#[test]
fn without_remapping_the_destination_never_shows_the_guests_screen() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let Some(Migrated { mut p, src_dump }) = migrate_screen(dir.path(), &["--x-no-remap"]) else {
        return;
    };
    let want = kms_image(1024, 768, 1);
    let seen = wait_png(&dir.path().join("dst.png"), &want, Duration::from_secs(10));
    assert!(
        seen.as_ref().is_none_or(|(_, _, px)| *px != want),
        "the destination showed the image without remapping"
    );
    if src_dump.is_some() {
        let dump = screendump(&mut p.dst, &dir.path().join("dst.ppm"));
        let dump = dump.unwrap_or_else(|e| panic!("destination screendump: {e}"));
        assert!(
            dump.2 != want,
            "the destination QEMU showed the image without remapping"
        );
        // QEMU's "Display output is not active" picture: the server shows no plane.
        assert_eq!(
            (dump.0, dump.1),
            (640, 480),
            "the destination QEMU's picture"
        );
    }
    let _ = p.dst.wait_exit(Duration::from_secs(120));
}
