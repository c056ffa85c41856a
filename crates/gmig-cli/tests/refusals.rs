//! A migration that the destination `gmig serve` refuses says why where a person looks: the
//! destination server logs the engine's reason at ERROR, once; gmig's client gets the refusal
//! (vfio-user replies carry an errno, no text: its message points at the server's log); and the
//! source goes back to running with its vGPU intact. One test per kind of refusal: another vGPU
//! type, a newer stream version, a corrupt section, a header naming no vGPU type.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gmig_qemu_bridge::client::{Client, ClientError};
use gmig_vfio_migration::DeviceState;

const RAM: u64 = 32 << 20;

fn serve(dir: &Path, name: &str, ty: &str, slot: u32, profile: bool) -> (Child, PathBuf) {
    let sock = dir.join(format!("{name}.sock"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gmig"));
    cmd.args(["serve", "--socket"]).arg(&sock).args([
        "--type",
        ty,
        "--clients",
        "1",
        "--slot",
        &slot.to_string(),
    ]);
    if profile {
        cmd.args(["--profile", "desktop"]);
    }
    let child = cmd
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, sock)
}

fn attach(path: &Path) -> (Client, File) {
    let start = Instant::now();
    let mut c = loop {
        match Client::connect(path) {
            Ok(c) => break c,
            Err(e) if start.elapsed() < Duration::from_secs(60) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("gmig serve never listened: {e}"),
        }
    };
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(RAM).unwrap();
    c.dma_map(&ram, 0, 0, RAM).unwrap();
    (c, ram)
}

/// Rewrites the stream header's CRC (bytes 60..64 over 0..60) after a change to the header.
fn fix_header_crc(header: &mut [u8]) {
    let crc = crc32fast::hash(&header[..60]);
    header[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// What the destination refused and said.
struct Refusal {
    /// The client's error for the first refused request.
    client: String,
    /// The destination server's ERROR lines.
    errors: Vec<String>,
    /// The destination server's WARN lines.
    warnings: Vec<String>,
}

/// Migrates a desktop vGPU (64+384) from one `gmig serve` to another of type `dst_ty`, the
/// pre-copy stream changed by `tamper` on its way; the destination must refuse. The source goes
/// back to running and keeps answering; both servers exit when their client leaves.
fn refused(dst_ty: &str, tamper: impl Fn(&mut Vec<u8>)) -> Refusal {
    let dir = tempfile::tempdir().unwrap();
    let (src, src_sock) = serve(dir.path(), "src", "64+384", 0, true);
    let (dst, dst_sock) = serve(dir.path(), "dst", dst_ty, 1, false);
    let (mut sc, _src_ram) = attach(&src_sock);
    let (mut dc, _dst_ram) = attach(&dst_sock);
    for _ in 0..12 {
        sc.device_state().unwrap();
    }
    sc.set_device_state(DeviceState::PreCopy).unwrap();
    dc.set_device_state(DeviceState::Resuming).unwrap();
    let mut stream = Vec::new();
    while let Some(chunk) = sc.mig_read(256 * 1024).unwrap() {
        stream.extend_from_slice(&chunk);
    }
    assert!(
        stream.len() > 4096,
        "a pre-copy stream of {} bytes",
        stream.len()
    );
    tamper(&mut stream);
    let mut first_error = None;
    for chunk in stream.chunks(64 * 1024) {
        if let Err(e) = dc.mig_write(chunk) {
            first_error = Some(e);
            break;
        }
    }
    // A destination that took every byte refuses at the end of resuming at the latest.
    let err = match first_error {
        Some(e) => e,
        None => dc
            .set_device_state(DeviceState::Stop)
            .expect_err("the destination accepted the stream"),
    };
    assert!(matches!(err, ClientError::Refused { .. }), "{err}");
    // The source runs on: back to RUNNING from pre-copy, its registers still answering.
    sc.set_device_state(DeviceState::Running).unwrap();
    assert_eq!(sc.device_state().unwrap(), DeviceState::Running as u32);
    let magic = sc.region_read(0, 0x78000, 8).unwrap();
    assert_eq!(
        u64::from_le_bytes(magic.try_into().unwrap()),
        0x4776_5447_7654_4776
    );
    drop((sc, dc));
    let src = src.wait_with_output().unwrap();
    assert!(
        src.status.success(),
        "{}",
        String::from_utf8_lossy(&src.stderr)
    );
    let dst = dst.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&dst.stderr).into_owned();
    assert!(!log.contains('\u{1b}'), "colour codes in a log file: {log}");
    let lines = |level: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains(level))
            .map(str::to_string)
            .collect()
    };
    eprintln!("destination's log:\n{log}");
    Refusal {
        client: err.to_string(),
        errors: lines(" ERROR "),
        warnings: lines(" WARN "),
    }
}

/// The destination's reason: one ERROR line that holds `reason`.
fn says_once(r: &Refusal, reason: &str) {
    let with: Vec<&String> = r.errors.iter().filter(|l| l.contains(reason)).collect();
    assert_eq!(
        with.len(),
        1,
        "ERROR lines naming {reason:?}: {:?}",
        r.errors
    );
    assert!(
        r.warnings.iter().all(|l| !l.contains("END missing")),
        "a misleading reason: {:?}",
        r.warnings
    );
    assert!(r.client.contains("server's log"), "{}", r.client);
}

#[test]
fn a_destination_of_another_vgpu_type_says_so() {
    let r = refused("128+512", |_| {});
    says_once(
        &r,
        "incompatible vGPU type: stream is 64+384 MiB, this destination expects 128+512 MiB",
    );
}

#[test]
fn a_newer_stream_version_is_refused_with_its_version() {
    let r = refused("64+384", |s| {
        s[10..12].copy_from_slice(&99u16.to_le_bytes());
        fix_header_crc(&mut s[..64]);
    });
    says_once(&r, "unsupported stream format version 1.99");
}

#[test]
fn a_corrupt_section_is_refused_with_its_offset() {
    // A byte in the middle of the stream: inside some section, whose CRC no longer matches.
    let r = refused("64+384", |s| {
        let mid = s.len() / 2;
        s[mid] ^= 0x5a;
    });
    says_once(&r, "bad migration stream at offset 0x");
}

#[test]
fn a_header_naming_no_vgpu_type_is_refused() {
    let r = refused("64+384", |s| {
        s[16..20].copy_from_slice(&96u32.to_le_bytes());
        fix_header_crc(&mut s[..64]);
    });
    says_once(&r, "stream is 96+384 MiB");
}
