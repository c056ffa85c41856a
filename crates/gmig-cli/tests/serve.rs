//! `gmig serve` as documented in docs/integration.md: it listens on the socket, a vfio-user client
//! attaches, maps its RAM and sees the vGPU; the server serves the next client after one leaves and
//! exits after `--clients N`, removing its socket.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gmig_qemu_bridge::client::Client;

fn connect(path: &std::path::Path) -> Client {
    let start = Instant::now();
    loop {
        match Client::connect(path) {
            Ok(c) => return c,
            Err(e) if start.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("gmig serve never listened: {e}"),
        }
    }
}

#[test]
fn gmig_serve_serves_clients_one_after_another_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vgpu0.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args(["--json", "serve", "--socket"])
        .arg(&sock)
        .args(["--type", "64+384", "--profile", "desktop", "--clients", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for round in 0..2 {
        let mut c = connect(&sock);
        let id = c.region_read(7, 0, 4).unwrap();
        assert_eq!(
            u32::from_le_bytes(id.try_into().unwrap()),
            0x1912_8086,
            "round {round}"
        );
        let ram = tempfile::tempfile().unwrap();
        ram.set_len(32 << 20).unwrap();
        if round == 0 {
            c.dma_map(&ram, 0, 0, 32 << 20).unwrap();
        }
        let magic = c.region_read(0, 0x78000, 8).unwrap();
        assert_eq!(
            u64::from_le_bytes(magic.try_into().unwrap()),
            0x4776_5447_7654_4776
        );
        assert_eq!(c.migration_flags().unwrap() & 5, 5, "STOP_COPY | PRE_COPY");
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "listening",
            "connected",
            "disconnected",
            "connected",
            "disconnected"
        ]
    );
    assert!(!sock.exists(), "the socket is removed on exit");
}

/// `gmig serve` processes of one test, killed when it ends.
struct Servers(Vec<std::process::Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `gmig --json serve --socket DIR/NAME.sock --slot SLOT [--slots REGISTRY]`.
fn serve_in_slot(
    servers: &mut Servers,
    dir: &std::path::Path,
    name: &str,
    slot: u32,
    registry: Option<&std::path::Path>,
) -> std::path::PathBuf {
    let sock = dir.join(format!("{name}.sock"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gmig"));
    cmd.args(["--json", "serve", "--socket"])
        .arg(&sock)
        .args(["--slot", &slot.to_string()]);
    if let Some(r) = registry {
        cmd.arg("--slots").arg(r);
    }
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    servers.0.push(child);
    sock
}

/// The slot whose aperture base the vGPU on `sock` reports in its PVINFO page (what i915 in a
/// GVT-g guest reads to find its graphics memory).
fn served_slot(sock: &std::path::Path) -> u32 {
    let mut c = connect(sock);
    // The vGPU exists once the client has mapped its RAM.
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(32 << 20).unwrap();
    c.dma_map(&ram, 0, 0, 32 << 20).unwrap();
    let base = c.region_read(0, 0x78040, 4).unwrap();
    let base = u64::from(u32::from_le_bytes(base.try_into().unwrap()));
    let ty = gmig_vgpu::migratable::parse_vgpu_type("64+384").unwrap();
    let slot = |n| gmig_vgpu::gm::slot_slices(Default::default(), ty, n).unwrap();
    (0..7u32)
        .find(|&n| slot(n).aperture.base.0 == base)
        .unwrap_or_else(|| panic!("aperture base {base:#x} is no slot's"))
}

#[test]
fn gmig_serve_with_the_hosts_slot_registry_takes_a_slot_no_running_vgpu_overlaps() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("slots");
    let mut servers = Servers(Vec::new());
    let a = serve_in_slot(&mut servers, dir.path(), "a", 1, Some(&reg));
    assert_eq!(served_slot(&a), 1, "a free slot is taken as asked");
    let b = serve_in_slot(&mut servers, dir.path(), "b", 1, Some(&reg));
    assert_eq!(served_slot(&b), 2, "slot 1 is a's: the next one up");
    // Negative control: without the registry the server takes slot 1 over a's vGPU.
    let c = serve_in_slot(&mut servers, dir.path(), "c", 1, None);
    assert_eq!(served_slot(&c), 1);
    // b says where it went and why, on stdout (--json) before it listens.
    let mut b_child = servers.0.remove(1);
    b_child.kill().unwrap();
    let out = b_child.wait_with_output().unwrap();
    let first = String::from_utf8_lossy(&out.stdout);
    let placed: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert_eq!(placed["event"], "placed", "{first}");
    let detail = placed["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("slot 2:")
            && detail.contains("slot 1 overlaps")
            && detail.contains("a.sock"),
        "{detail}"
    );
    // a dies without cleaning up (SIGKILL): its claim is stale and its slot free again; b's
    // slot 2 is free too (b was killed above).
    servers.0[0].kill().unwrap();
    servers.0[0].wait().unwrap();
    let d = serve_in_slot(&mut servers, dir.path(), "d", 1, Some(&reg));
    assert_eq!(served_slot(&d), 1, "a dead server's slot is free");
}

#[test]
fn gmig_serve_started_at_once_take_distinct_slots_and_a_full_host_refuses_with_the_holders() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("slots");
    let mut servers = Servers(Vec::new());
    // The default host has 7 slots of 64+384; seven servers all asking for slot 0, at once.
    let socks: Vec<_> = (0..7)
        .map(|i| serve_in_slot(&mut servers, dir.path(), &format!("s{i}"), 0, Some(&reg)))
        .collect();
    let mut slots: Vec<u32> = socks.iter().map(|s| served_slot(s)).collect();
    slots.sort_unstable();
    assert_eq!(
        slots,
        [0, 1, 2, 3, 4, 5, 6],
        "each server has a slot of its own"
    );
    // An eighth finds no room and says which servers hold the host's slots.
    let out = Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args(["serve", "--socket"])
        .arg(dir.path().join("s7.sock"))
        .arg("--slots")
        .arg(&reg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no free slot for a 64+384 vGPU") && err.contains("s3.sock"),
        "{err}"
    );
    assert!(!dir.path().join("s7.sock").exists(), "it never listened");
}
