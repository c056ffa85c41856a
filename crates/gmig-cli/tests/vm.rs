//! `gmig vm migrate` between two processes: over loopback, and across two network namespaces
//! joined by a veth pair. Pre-copy starts at frame 8 of 24 and the switch-over comes at frame
//! 16; the destination renders the 8 frames left, running their GPU workloads, and its guest
//! prints the checksum an unmigrated run prints.

use std::process::{Command, Output};

fn kvm_present() -> bool {
    if std::path::Path::new("/dev/kvm").exists() {
        return true;
    }
    eprintln!("SKIPPED: /dev/kvm is absent; `gmig vm` needs KVM");
    false
}

fn gmig() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gmig"))
}

/// The guest's serial output in `gmig --json vm …`'s report.
fn serial(out: &Output) -> String {
    let s = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(s.lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {s}"));
    v["serial"].as_str().unwrap_or_default().to_string()
}

fn checksum(out: &Output) -> String {
    let serial = serial(out);
    serial
        .lines()
        .find(|l| l.starts_with("checksum"))
        .unwrap_or_else(|| panic!("no checksum line in {serial}"))
        .to_string()
}

fn assert_both_succeeded(src: &Output, dst: &Output) {
    for (who, o) in [("source", src), ("destination", dst)] {
        assert!(
            o.status.success(),
            "{who}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Asserts the switch-over came at frame 16 with the guest still rendering, and that the
/// destination then completed frames and ran GPU workloads.
fn assert_destination_worked(src: &Output, dst: &Output) {
    let s = String::from_utf8_lossy(&src.stdout);
    let rep: serde_json::Value = serde_json::from_str(s.lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("source report not JSON ({e}): {s}"));
    assert_eq!(rep["at_stop"]["frames"], 16, "switch-over frame: {rep}");
    assert_eq!(rep["at_stop"]["halted"], false, "halted at the stop: {rep}");
    let d = String::from_utf8_lossy(&dst.stdout);
    let v: serde_json::Value = serde_json::from_str(d.lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("destination report not JSON ({e}): {d}"));
    let frames = v["destination_frames"].as_u64().unwrap_or(0);
    let workloads = v["destination_workloads"].as_u64().unwrap_or(0);
    assert!(
        frames > 0 && workloads > 0,
        "the destination did no work after the switch-over: {v}"
    );
}

const GUEST: [&str; 4] = ["--frames", "24", "--ram-mib", "64"];

fn unmigrated() -> String {
    let out = gmig()
        .args(["--json", "vm", "run"])
        .args(GUEST)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    checksum(&out)
}

/// Runs a destination (under `wrap_dst`) and a source (under `wrap_src`) and returns both.
fn pair(wrap_dst: &[&str], wrap_src: &[&str], listen: &str, to: &str) -> (Output, Output) {
    let cmd = |wrap: &[&str]| {
        let mut c = if wrap.is_empty() {
            gmig()
        } else {
            let mut c = Command::new(wrap[0]);
            c.args(&wrap[1..]).arg(env!("CARGO_BIN_EXE_gmig"));
            c
        };
        c.args(["--json", "vm", "migrate"]).args(GUEST);
        c
    };
    let dst = cmd(wrap_dst)
        .args(["--listen", listen, "--slot", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut src_out = None;
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let o = cmd(wrap_src)
            .args(["--to", to, "--at-frame", "8", "--switch-at-frame", "16"])
            .output()
            .unwrap();
        let refused = String::from_utf8_lossy(&o.stderr).contains("connecting to");
        if !refused {
            src_out = Some(o);
            break;
        }
    }
    let dst = dst.wait_with_output().unwrap();
    (
        dst,
        src_out.expect("the source never reached the destination"),
    )
}

#[test]
fn two_vmm_processes_migrate_a_vm_over_tcp() {
    if !kvm_present() {
        return;
    }
    let want = unmigrated();
    let (dst, src) = pair(&[], &[], "127.0.0.1:47311", "127.0.0.1:47311");
    assert_both_succeeded(&src, &dst);
    let rep: serde_json::Value =
        serde_json::from_slice(&src.stdout).expect("source report is JSON");
    assert!(rep["downtime_ms"].as_f64().unwrap() > 0.0, "{rep}");
    assert_destination_worked(&src, &dst);
    assert_eq!(checksum(&dst), want);
}

struct Netns;

impl Netns {
    fn ip(args: &[&str]) -> bool {
        Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Two namespaces, gmig-a (10.77.0.1) and gmig-b (10.77.0.2), joined by a veth pair.
    fn up() -> Option<Netns> {
        Self::down();
        let steps: [&[&str]; 9] = [
            &["netns", "add", "gmig-a"],
            &["netns", "add", "gmig-b"],
            &[
                "link", "add", "gmig-va", "type", "veth", "peer", "name", "gmig-vb",
            ],
            &["link", "set", "gmig-va", "netns", "gmig-a"],
            &["link", "set", "gmig-vb", "netns", "gmig-b"],
            &[
                "-n",
                "gmig-a",
                "addr",
                "add",
                "10.77.0.1/24",
                "dev",
                "gmig-va",
            ],
            &[
                "-n",
                "gmig-b",
                "addr",
                "add",
                "10.77.0.2/24",
                "dev",
                "gmig-vb",
            ],
            &["-n", "gmig-a", "link", "set", "gmig-va", "up"],
            &["-n", "gmig-b", "link", "set", "gmig-vb", "up"],
        ];
        for s in steps {
            if !Self::ip(s) {
                Self::down();
                return None;
            }
        }
        Some(Netns)
    }

    fn down() {
        for ns in ["gmig-a", "gmig-b"] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        Self::down();
    }
}

#[test]
fn two_vmm_processes_in_two_network_namespaces_over_veth() {
    if !kvm_present() {
        return;
    }
    let Some(_ns) = Netns::up() else {
        eprintln!("SKIPPED: cannot make network namespaces here (needs root and iproute2)");
        return;
    };
    let want = unmigrated();
    let (dst, src) = pair(
        &["ip", "netns", "exec", "gmig-b"],
        &["ip", "netns", "exec", "gmig-a"],
        "10.77.0.2:47312",
        "10.77.0.2:47312",
    );
    assert_both_succeeded(&src, &dst);
    assert_destination_worked(&src, &dst);
    assert_eq!(checksum(&dst), want);
}

/// The guest's running sum at frame N (printed every 16 frames) is the checksum an N-frame run
/// of the same guest ends with: one unmigrated run checks every `frame N sum S` line a migrated,
/// restored or resumed guest prints (the libvirt and QEMU recipes rely on it). A different seed
/// is the control: its sums differ.
#[test]
fn the_running_sum_at_frame_n_is_the_checksum_of_an_n_frame_run() {
    if !kvm_present() {
        return;
    }
    let run = |frames: &str, seed: &str| {
        let out = gmig()
            .args(["--json", "vm", "run", "--profile", "desktop", "--frames"])
            .args([frames, "--seed", seed])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let sum_at_16 = |out: &Output| {
        let serial = serial(out);
        let line = serial
            .lines()
            .find(|l| l.starts_with("frame 16 sum "))
            .unwrap_or_else(|| panic!("no frame 16 line in {serial}"))
            .to_string();
        line["frame 16 sum ".len()..].to_string()
    };
    let short = checksum(&run("16", "1"));
    assert_eq!(
        short,
        format!(
            "checksum {} frames 16 failures 0",
            sum_at_16(&run("32", "1"))
        )
    );
    assert_ne!(
        short,
        format!(
            "checksum {} frames 16 failures 0",
            sum_at_16(&run("32", "2"))
        ),
        "control: another seed's sums differ"
    );
}
