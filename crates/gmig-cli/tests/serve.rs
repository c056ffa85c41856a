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
