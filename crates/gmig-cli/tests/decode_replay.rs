//! `gmig decode` and `gmig replay`, end to end through the binary, on the committed fixtures.

use gmig_test_support::assert_success;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn gmig(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args(args)
        .output()
        .expect("gmig runs")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `gmig decode --raw` of the Gen9 blitter batch in `path`.
fn decode_raw_gen9_blitter(path: &Path) -> Output {
    gmig(&[
        "decode",
        "--raw",
        "--engine",
        "blitter",
        "--gen",
        "9",
        s(path),
    ])
}

#[test]
fn decode_prints_the_expected_listing() {
    for name in [
        "gen9-blitter-xy-blits",
        "gen9-render-chained-second-level",
        "gen11-render-3d-ppgtt",
        "gen9-render-iris-indirect-draw",
        "gen9-render-iris-privileged-surfaces",
    ] {
        let dir = fixture(name);
        let out = gmig(&["decode", s(&dir.join("capture.aub"))]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let expected = std::fs::read_to_string(dir.join("expected-decode.txt")).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{name}");
    }
}

#[test]
fn decode_listing_names_commands_lengths_and_address_spaces() {
    let out = gmig(&[
        "decode",
        s(&fixture("gen9-render-pipe-control").join("capture.aub")),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("MI_BATCH_BUFFER_START (3 dwords)"), "{text}");
    assert!(text.contains("PIPE_CONTROL (6 dwords)"), "{text}");
    // One post-sync write through the GGTT (hidden slice), one through the PPGTT.
    assert!(text.contains("ggtt  0x000040008000  write"), "{text}");
    assert!(text.contains("ppgtt 0x7f0000200000  write"), "{text}");
}

#[test]
fn decode_json_lines_carry_the_same_listing() {
    let out = gmig(&[
        "--json",
        "decode",
        s(&fixture("gen8-video-flush-dw").join("capture.aub")),
    ]);
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert_eq!(lines[0]["type"], "header");
    assert_eq!(lines[0]["gen"], "8");
    assert_eq!(lines[1]["type"], "submission");
    assert_eq!(lines[1]["engine"], "video");
    let names: Vec<&str> = lines.iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "MI_BATCH_BUFFER_START",
            "MI_FLUSH_DW",
            "MI_FLUSH_DW",
            "MI_STORE_DATA_IMM",
            "MI_BATCH_BUFFER_END",
            "MI_NOOP"
        ]
    );
    let spaces: Vec<&str> = lines
        .iter()
        .filter(|l| l["name"] == "MI_FLUSH_DW")
        .map(|l| l["addresses"][0]["space"].as_str().unwrap())
        .collect();
    assert_eq!(spaces, ["ggtt", "ppgtt"]);
}

#[test]
fn decode_shows_the_surfaces_draws_and_dispatches_use() {
    // Text: the iris draw's render target, texture and depth buffer, each with its range.
    let out = gmig(&[
        "decode",
        s(&fixture("gen9-render-iris-indirect-draw").join("capture.aub")),
    ]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "write ppgtt 0x000200000000+0x4000     ps bt[0]",
        "read  ppgtt 0x000200100000+0x1000     ps bt[1]",
        "write ppgtt 0x000200200000+0x4000     depth",
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }
    assert!(!text.contains("reach"), "every surface resolves:\n{text}");
    // JSON: the compute dispatch's footprint names its storage buffer as written.
    let out = gmig(&[
        "--json",
        "decode",
        s(&fixture("gen11-render-iris-compute").join("capture.aub")),
    ]);
    assert_success(&out);
    let walker: serde_json::Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["name"] == "GPGPU_WALKER")
        .expect("a GPGPU_WALKER line");
    let fp = &walker["footprint"];
    let surfaces = fp["surfaces"].as_array().unwrap();
    assert_eq!(surfaces.len(), 1, "{fp}");
    assert_eq!(surfaces[0]["kind"], "bound");
    assert_eq!(surfaces[0]["stage"], "compute");
    assert_eq!(surfaces[0]["start"], 0x2_0030_0000u64);
    assert_eq!(surfaces[0]["len"], 64 << 10);
    assert_eq!(surfaces[0]["writes"], true);
    assert_eq!(fp["reach"].as_array().unwrap().len(), 0);
    // Commands that are not work carry no footprint.
    let out = gmig(&[
        "--json",
        "decode",
        s(&fixture("gen8-video-flush-dw").join("capture.aub")),
    ]);
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["footprint"].is_null(), "{v}");
    }
}

#[test]
fn decode_raw_dwords() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("blit.bin");
    // XY_COLOR_BLT 64x8 at GGTT 0x40020000, then MI_BATCH_BUFFER_END.
    let dwords: [u32; 8] = [
        0x5430_0005,
        (3 << 24) | (0xf0 << 16) | 256,
        0,
        (8 << 16) | 64,
        0x4002_0000,
        0,
        0xff00_ff00,
        0x0500_0000,
    ];
    let bytes: Vec<u8> = dwords.iter().flat_map(|d| d.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    let out = decode_raw_gen9_blitter(&path);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("XY_COLOR_BLT (7 dwords)"), "{text}");
    assert!(
        text.contains("dst          ggtt  0x000040020000  write      0x40020000+0x800"),
        "{text}"
    );
    assert!(
        text.contains("+0x001c  MI_BATCH_BUFFER_END (1 dwords)"),
        "{text}"
    );

    // A truncated raw buffer is listed up to the bad command, then fails with exit code 1.
    std::fs::write(&path, &dwords.map(u32::to_le_bytes).concat()[..12]).unwrap();
    let out = decode_raw_gen9_blitter(&path);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("error: dword 0: XY_COLOR_BLT needs 7 dwords"));
}

#[test]
fn decode_of_a_broken_capture_fails_with_offset() {
    let out = gmig(&[
        "decode",
        s(&fixture("gen9-video-enhance-truncated-capture").join("capture.aub")),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("error: AUB packet at byte 0x314 is truncated"),
        "{text}"
    );
    let out = gmig(&[
        "decode",
        s(&fixture("gen8-blitter-self-loop").join("capture.aub")),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("budget"));
}

#[test]
fn replay_accepts_every_committed_fixture() {
    let out = gmig(&["replay", s(&fixtures())]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().count() >= 12, "{text}");
    assert!(
        text.contains("gen8-blitter-self-loop: gen 8 blitter: refused (budget)"),
        "{text}"
    );

    let out = gmig(&[
        "--json",
        "replay",
        s(&fixture("gen9-render-chained-second-level")),
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["expect"], "remap");
}

fn copy_fixture(name: &str, to: &Path) -> PathBuf {
    let dst = to.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

#[test]
fn replay_exits_3_when_the_result_differs() {
    let tmp = tempfile::tempdir().unwrap();

    // A tampered expected remap.
    let dir = copy_fixture("gen9-blitter-xy-blits", tmp.path());
    let remap = dir.join("expected-remap.txt");
    let text = std::fs::read_to_string(&remap)
        .unwrap()
        .replace("0x000060010000", "0x000060010040");
    std::fs::write(&remap, text).unwrap();
    let out = gmig(&["replay", s(&dir)]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected-remap.txt line"));

    // A write set that lost half of the render target.
    let dir = copy_fixture("gen9-render-iris-indirect-draw", tmp.path());
    let writes = dir.join("expected-writes.txt");
    let text = std::fs::read_to_string(&writes).unwrap();
    assert!(text.contains("ppgtt 0x000200000000+0x4000"), "{text}");
    std::fs::write(
        &writes,
        text.replace("0x000200000000+0x4000", "0x000200000000+0x2000"),
    )
    .unwrap();
    let out = gmig(&["replay", s(&dir)]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected-writes.txt line 2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A manifest that expects a remap where the capture is refused.
    let dir = copy_fixture("gen11-blitter-out-of-slice", tmp.path());
    let m = dir.join("manifest.toml");
    let text = std::fs::read_to_string(&m)
        .unwrap()
        .replace("expect = \"refuse\"", "expect = \"remap\"");
    std::fs::write(&m, text).unwrap();
    let out = gmig(&["--json", "replay", s(&dir)]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);

    // A capture changed under its expected decode.
    let dir = copy_fixture("gen8-render-mi-stores", tmp.path());
    let mut cap = std::fs::read(dir.join("capture.aub")).unwrap();
    // The immediate of the batch's MI_STORE_DATA_IMM: the decode is the same, the remap is not.
    let imm = 0xcafe_f00du32.to_le_bytes();
    let at = cap
        .windows(4)
        .position(|w| w == imm)
        .expect("immediate in the capture");
    cap[at] ^= 1;
    std::fs::write(dir.join("capture.aub"), cap).unwrap();
    assert_eq!(gmig(&["replay", s(&dir)]).status.code(), Some(3));

    // No fixture at all is an error, not a check failure.
    assert_eq!(
        gmig(&["replay", s(&tmp.path().join("nothing"))])
            .status
            .code(),
        Some(1)
    );
}

#[test]
fn decode_of_an_empty_file_says_there_is_nothing_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.aub");
    std::fs::write(&empty, b"").unwrap();
    for raw in [false, true] {
        let mut args = vec!["decode", s(&empty)];
        if raw {
            args.push("--raw");
        }
        let out = gmig(&args);
        assert_eq!(out.status.code(), Some(1), "raw={raw}");
        let err = String::from_utf8_lossy(&out.stderr);
        let want = if raw {
            "no dwords to decode"
        } else {
            "no submissions"
        };
        assert!(err.contains(want), "raw={raw}: {err}");
        assert!(out.stdout.is_empty(), "raw={raw}");
    }
}
