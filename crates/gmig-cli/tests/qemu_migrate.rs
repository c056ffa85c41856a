//! QEMU live-migrates a gmig vGPU, with two QEMU processes and two `gmig serve` processes.
//!
//! QEMU 10.2.2 is built by `scripts/qemu/build.sh` with the patch series in
//! `integrations/qemu/patches/` (see `integrations/qemu/README.md`): its vfio-user client then
//! drives the vGPU through QEMU's generic VFIO migration v2 code — DEVICE_FEATURE over the socket,
//! the device state in MIG_DATA_READ / MIG_DATA_WRITE messages, and the device's DMA logging for
//! the guest pages the vGPU writes (QEMU moves guest RAM itself: `gmig serve --ram-by-vmm`).
//!
//! The source QEMU runs the guest GPU driver (`/bin/gmig-guest`) against `gmig serve` in host
//! slot 0; the destination QEMU waits with `-incoming tcp:…` beside its own `gmig serve --slot 1`,
//! so the vGPU's graphics addresses move and the destination remaps them. After the guest's
//! `frame 32` line the source is told to `migrate`; `query-migrate` must end `completed` with the
//! device's bytes in `vfio.transferred`, the destination's console must go on with the next
//! frames (its serial file holds only what the guest printed after the switch-over), and its final
//! checksum must equal an unmigrated run's. The reference run is the same guest in the same QEMU
//! against a fresh `gmig serve`; `crates/gmig-cli/tests/qemu.rs` shows that it prints what
//! `gmig vm run` prints (no QEMU), and with `GMIG_VM_REFERENCE=1` this file checks that too (slow
//! here: `gmig vm run --frames 2000` took 5 minutes on these machines, where QEMU/TCG renders
//! about 2000 frames a second).
//!
//! Negative controls, each where `gmig serve` has the hidden switch it needs (else SKIPPED, said
//! loudly): a source whose DMA logging reports no page (`--x-dma-log blind`) gives the
//! destination stale copies of what the vGPU wrote, and a different checksum; a source that
//! offers no DMA logging (`--x-dma-log off`) makes QEMU refuse the migration with the reason; a
//! destination that does not remap (`--x-no-remap`) faults; a server without migration
//! (`--x-no-migration`) blocks it with the reason. A destination QEMU or its server killed mid-stream
//! leaves the source running, and its guest prints the reference checksum.
//!
//! The other ways QEMU migrates: postcopy is refused with QEMU's reason and the source renders
//! on; a `file:` migration restores in a new QEMU in another slot (and, without remapping,
//! faults); multifd moves the vGPU and the guest renders on.
//!
//! The tests run one at a time (a lock): each runs up to three QEMUs under TCG.
//!
//! Skips (loudly) only where QEMU's source tarball is not beside the repository
//! (`../shared/qemu`).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gmig_test_support::qemu::pair::{hmp, qmp_return as qmp, wait_migration, Pair};
use gmig_test_support::qemu::{checksum_line, qemu_source_present, Serve, Tools, Vm, VmSpec};
use serde_json::Value;

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// Frames the guest renders: enough that the migration (about a second here, a few on a
/// machine loaded to 5 times its cores) ends well before the guest does, at QEMU/TCG's ~2000
/// frames a second on two busy cores (about 1000 at that load): 5 s of rendering, 10 s loaded.
const FRAMES: u32 = 10_000;
/// Frames of the kill tests' guests: their migration is paced (32 MiB/s) until the kill, and
/// with the destination's server dead the source may still send all its RAM before it hears of
/// it (a few seconds at QEMU/TCG's ~130 MB/s here), while the guest renders up to ~2,500 frames
/// a second on a quiet machine.
const KILL_FRAMES: u32 = 20_000;
/// The frame after which the source is told to migrate.
const MIGRATE_AFTER: u32 = 32;
/// Guest RAM: small, so that QEMU's RAM pre-copy is short.
const RAM_MIB: u64 = 256;

/// One test at a time: each runs several QEMUs.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// QEMU (with the migration patches) and the guest, or `None` (said loudly) where QEMU's source
/// is not here. A source that is here but does not build fails the test.
fn tools(dir: &Path) -> Option<Tools> {
    if !qemu_source_present() {
        return None;
    }
    let tools = Tools::get(dir).unwrap_or_else(|e| panic!("QEMU or the guest did not build: {e}"));
    // The patched vfio-user-pci has `enable-migration`; stock 10.2.2's has not.
    let out = Command::new(&tools.qemu)
        .args(["-device", "vfio-user-pci,help"])
        .output()
        .expect("qemu -device vfio-user-pci,help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("enable-migration"),
        "{} has no vfio-user migration (are integrations/qemu/patches/*.patch there?):\n{help}",
        tools.qemu.display()
    );
    Some(tools)
}

/// Whether `gmig serve` takes `flag` (the hidden negative-control switches).
fn serve_takes(flag: &[&str]) -> bool {
    Command::new(gmig())
        .args(["serve", "--socket", "/nonexistent/x.sock"])
        .args(flag)
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Skips (loudly) a control whose `gmig serve` switch is missing.
fn control_available(flag: &[&str], what: &str) -> bool {
    if serve_takes(flag) {
        return true;
    }
    eprintln!(
        "SKIPPED: `gmig serve {}` is not there: no negative control for {what}",
        flag.join(" ")
    );
    false
}

/// The guest: the GPU driver with `profile` for `frames` frames.
fn guest(socket: &Path, profile: &str, frames: u32, extra: Vec<String>) -> VmSpec {
    VmSpec {
        gpus: vec![socket.to_path_buf()],
        run: Some(format!(
            "/bin/gmig-guest,--profile,{profile},--frames,{frames}"
        )),
        ram_mib: RAM_MIB,
        extra,
        ..VmSpec::default()
    }
}

/// The checksum line of an unmigrated run of the same guest in the same QEMU (once per profile
/// and frame count).
fn reference(tools: &Tools, dir: &Path, profile: &str, frames: u32) -> String {
    static DONE: Mutex<Option<HashMap<(String, u32), String>>> = Mutex::new(None);
    let key = (profile.to_string(), frames);
    if let Some(c) = DONE.lock().unwrap().get_or_insert_default().get(&key) {
        return c.clone();
    }
    let name = format!("ref-{profile}");
    let serve = Serve::start(gmig(), dir, &name, &["--clients", "1"]);
    let mut vm = Vm::start(
        tools,
        &guest(&serve.socket, profile, frames, vec![]),
        dir,
        &name,
    );
    let status = vm.wait_exit(Duration::from_secs(600));
    let console = vm.console();
    assert!(
        status.is_some_and(|s| s.success()) && console.contains("GMIG-GUEST: exit 0"),
        "the unmigrated reference run failed: {status:?}\n{console}\n{}\n{}",
        vm.stderr_text(),
        serve.log_text()
    );
    let line = checksum_line(&console).expect("no checksum in the reference run");
    assert!(line.contains(" failures 0"), "{line}");
    if std::env::var_os("GMIG_VM_REFERENCE").is_some() {
        let vm_line = gmig_test_support::qemu::vm_run_checksum(gmig(), profile, frames);
        assert_eq!(vm_line, line, "QEMU vs gmig vm run");
    }
    DONE.lock()
        .unwrap()
        .get_or_insert_default()
        .insert(key, line.clone());
    line
}

/// The frame numbers of the guest's `frame N sum …` lines.
fn frames(console: &str) -> Vec<u32> {
    console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("frame "))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect()
}

/// Source and destination rendering `profile` for [`FRAMES`] frames ([`Pair::start`]).
fn pair(tools: &Tools, dir: &Path, tag: &str, profile: &str, src: &[&str], dst: &[&str]) -> Pair {
    Pair::start(gmig(), tools, dir, tag, src, dst, |socket, extra| {
        guest(socket, profile, FRAMES, extra)
    })
}

/// Waits for the guest's `frame MIGRATE_AFTER` line on the source.
fn wait_rendering(p: &mut Pair) {
    let after = format!("frame {MIGRATE_AFTER} ");
    p.wait_source(|l| l.starts_with(&after));
}

/// Renders, migrates after `frame MIGRATE_AFTER` and returns `query-migrate`'s end.
fn migrate(p: &mut Pair) -> Value {
    wait_rendering(p);
    p.migrate(r#"{"downtime-limit":300}"#)
}

/// The device's bytes in a `query-migrate` answer.
fn vfio_bytes(q: &Value) -> u64 {
    q["vfio"]["transferred"].as_u64().unwrap_or(0)
}

#[test]
fn qemu_live_migrates_the_vgpu_to_another_slot_and_the_guest_renders_on() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let want = reference(&tools, dir.path(), "desktop", FRAMES);
    let mut p = pair(&tools, dir.path(), "live", "desktop", &[], &[]);
    let q = migrate(&mut p);
    eprintln!("query-migrate: {q}");
    assert_eq!(q["status"], "completed", "{q}\n{}", p.logs());
    // QEMU's VFIO migration moved the device's state (stock 10.2.2 says 0 here).
    assert!(vfio_bytes(&q) > 0, "no device state moved: {q}");
    eprintln!(
        "migration: downtime {} ms, total {} ms, vfio {} bytes, RAM {} bytes",
        q["downtime"], q["total-time"], q["vfio"]["transferred"], q["ram"]["transferred"]
    );
    let src_state = qmp(&mut p.src, r#"{"execute":"query-status"}"#);
    assert_eq!(src_state["status"], "postmigrate", "{src_state}");

    let console = p.finish();
    let logs = p.logs();
    // The guest went on where it stopped: the source printed up to some frame L, the
    // destination prints from the next progress line on, to the end.
    let before = frames(&p.src.console());
    let after = frames(&console);
    let last_src = *before.last().expect("the source printed no frame");
    let first_dst = *after.first().unwrap_or_else(|| {
        panic!("the destination rendered no frame after the switch-over:\n{logs}")
    });
    eprintln!(
        "source printed frames {}..={last_src}, destination {first_dst}..={} ({} progress lines)",
        before[0],
        after.last().unwrap(),
        after.len()
    );
    assert!(
        last_src < FRAMES,
        "the guest finished on the source:\n{logs}"
    );
    assert!(
        first_dst > last_src && first_dst <= last_src + 32,
        "the destination's frames do not follow the source's ({last_src} then {first_dst}):\n{logs}"
    );
    assert_eq!(after.last().copied(), Some(FRAMES), "{logs}");
    assert!(
        !p.src.console().contains("checksum"),
        "the source guest finished: {logs}"
    );
    // The destination rendered what an unmigrated guest renders.
    assert!(console.contains("GMIG-GUEST: exit 0"), "{logs}");
    assert_eq!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "the migrated guest's checksum differs from an unmigrated run's:\n{logs}"
    );
    // A normal migration logs nothing at WARN or above, on either server.
    for bad in ["fault", "ERROR", " WARN "] {
        for (side, log) in [
            ("destination", p.dst_serve.log_text()),
            ("source", p.src_serve.log_text()),
        ] {
            assert!(
                !log.contains(bad),
                "the {side} server logged {bad}:\n{logs}"
            );
        }
    }
}

#[test]
fn the_pages_the_vgpu_writes_reach_the_destination_through_dma_logging() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    // The compute profile rewrites scattered words of one buffer with the GPU every frame (no
    // CPU write there), and folds a copy of it: a page the GPU wrote after QEMU sent it, and that
    // the destination lacks, shows in every later frame.
    let want = reference(&tools, dir.path(), "compute", FRAMES);
    let mut p = pair(&tools, dir.path(), "logged", "compute", &[], &[]);
    // This one is driven with HMP, the commands of docs/integration.md's recipe (the others use
    // QMP): each answers nothing when it is accepted.
    wait_rendering(&mut p);
    let port = p.port;
    for line in [
        "migrate_set_parameter downtime-limit 300".to_string(),
        format!("migrate -d tcp:127.0.0.1:{port}"),
    ] {
        let said = hmp(&mut p.src, &line);
        assert!(said.trim().is_empty(), "HMP {line}: {said}\n{}", p.logs());
    }
    let q = p.wait_migration();
    assert_eq!(q["status"], "completed", "{q}\n{}", p.logs());
    assert!(vfio_bytes(&q) > 0, "{q}");
    let info = hmp(&mut p.src, "info migrate");
    eprintln!("HMP info migrate:\n{info}");
    assert!(info.contains("completed"), "info migrate: {info}");
    let console = p.finish();
    assert_eq!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "{}",
        p.logs()
    );
    drop(p);

    // Negative control: the source's device reports no dirty page.
    if !control_available(
        &["--x-dma-log", "blind"],
        "DMA logging that reports nothing",
    ) {
        return;
    }
    let mut p = pair(
        &tools,
        dir.path(),
        "blind",
        "compute",
        &["--x-dma-log", "blind"],
        &[],
    );
    let q = migrate(&mut p);
    assert_eq!(q["status"], "completed", "{q}\n{}", p.logs());
    let console = p.finish();
    let got = checksum_line(&console);
    eprintln!("blind DMA logging: {got:?} (unmigrated: {want})");
    assert_ne!(
        got.as_deref(),
        Some(want.as_str()),
        "without the vGPU's dirty pages the destination still rendered the reference:\n{}",
        p.logs()
    );
}

#[test]
fn without_dma_logging_qemu_refuses_to_migrate_and_says_why() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    if !control_available(&["--x-dma-log", "off"], "a device without DMA logging") {
        return;
    }
    let mut p = pair(
        &tools,
        dir.path(),
        "nolog",
        "desktop",
        &["--x-dma-log", "off"],
        &[],
    );
    wait_rendering(&mut p);
    let answer = p.start_migration(r#"{"downtime-limit":300}"#);
    eprintln!("migrate: {answer}");
    assert!(
        answer.contains("\"error\"") && answer.contains("dirty tracking"),
        "QEMU migrated a device that cannot report what it writes: {answer}\n{}",
        p.logs()
    );
    // The guest goes on on the source.
    let state = qmp(&mut p.src, r#"{"execute":"query-status"}"#);
    assert_eq!(state["status"], "running", "{state}");
}

#[test]
fn a_destination_of_another_vgpu_type_refuses_and_its_server_says_why() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let mut p = pair(
        &tools,
        dir.path(),
        "type",
        "desktop",
        &[],
        &["--type", "128+512"],
    );
    let q = migrate(&mut p);
    eprintln!("query-migrate: {q}");
    assert_eq!(q["status"], "failed", "{q}\n{}", p.logs());
    // QEMU's vfio-user carries an errno, not text: the destination's server says why, once.
    let log = p.dst_serve.log_text();
    let why: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" ERROR ") && l.contains("incompatible vGPU type"))
        .collect();
    assert_eq!(
        why.len(),
        1,
        "the destination server's reason:\n{}",
        p.logs()
    );
    assert!(
        why[0].contains("stream is 64+384 MiB, this destination expects 128+512 MiB"),
        "{}",
        why[0]
    );
    assert!(!log.contains("END missing"), "a misleading reason:\n{log}");
    // The guest renders on on the source, its vGPU intact: it ends as an unmigrated run.
    let state = qmp(&mut p.src, r#"{"execute":"query-status"}"#);
    assert_eq!(state["status"], "running", "{state}");
    p.wait_source(|l| l.starts_with("GMIG-GUEST: exit"));
    let console = p.src.console();
    assert!(console.contains("GMIG-GUEST: exit 0"), "{}", p.logs());
    let want = reference(&tools, dir.path(), "desktop", FRAMES);
    assert_eq!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "the source's checksum after the refused migration differs from an unmigrated run's"
    );
}

#[test]
fn a_server_without_migration_blocks_it_with_the_reason() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    if !control_available(&["--x-no-migration"], "a server without migration") {
        return;
    }
    let mut p = pair(
        &tools,
        dir.path(),
        "nomig",
        "desktop",
        &["--x-no-migration"],
        &[],
    );
    wait_rendering(&mut p);
    let answer = p.start_migration(r#"{"downtime-limit":300}"#);
    eprintln!("migrate: {answer}");
    assert!(
        answer.contains("\"error\"") && answer.contains("does not support migration"),
        "{answer}\n{}",
        p.logs()
    );
}

#[test]
fn without_remapping_the_destination_vgpu_faults() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    if !control_available(&["--x-no-remap"], "a destination that does not remap") {
        return;
    }
    let want = reference(&tools, dir.path(), "desktop", FRAMES);
    let mut p = pair(
        &tools,
        dir.path(),
        "noremap",
        "desktop",
        &[],
        &["--x-no-remap"],
    );
    let q = migrate(&mut p);
    assert_eq!(q["status"], "completed", "{q}\n{}", p.logs());
    // The guest's GPU addresses now point outside the destination vGPU's slices: its GPU
    // faults and the guest times out, or at best renders something else.
    let faulted = p.dst.wait_for(Duration::from_secs(120), |l| {
        l.contains("seqno timeout") || l.starts_with("checksum")
    });
    let console = p.dst.console();
    let server = p.dst_serve.log_text();
    eprintln!(
        "no remap: guest {:?}, server faults {}",
        checksum_line(&console),
        server.matches("GPU fault").count()
    );
    assert!(
        faulted,
        "the destination guest neither failed nor finished:\n{}",
        p.logs()
    );
    assert!(
        server.contains("GPU fault") || console.contains("seqno timeout"),
        "no fault without remapping:\n{}",
        p.logs()
    );
    assert_ne!(checksum_line(&console).as_deref(), Some(want.as_str()));
}

/// What dies on the destination side in the middle of a migration.
#[derive(Clone, Copy, Debug)]
enum Victim {
    /// The destination QEMU (SIGKILL).
    Qemu,
    /// The destination's `gmig serve` (SIGKILL): its QEMU loses the vGPU mid-load.
    Server,
}

/// Kills `victim` once 8 MiB of RAM crossed (32 MiB/s, so the stream still runs), then checks
/// that the source runs its guest to the reference checksum. A destination QEMU that dies breaks
/// the stream and the source's `migrate` fails; one whose server dies fails its load and exits,
/// which the source may hear only after it sent everything (QEMU without a return path calls
/// that `completed` and leaves the source paused in `postmigrate`, where a manager such as
/// libvirt resumes it with `cont` when the destination does not start): the test does the same.
fn kill_mid_stream_and_check_the_source(victim: Victim, tag: &str) {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let want = reference(&tools, dir.path(), "desktop", KILL_FRAMES);
    let mut p = Pair::start(
        gmig(),
        &tools,
        dir.path(),
        tag,
        &[],
        &[],
        |socket, extra| guest(socket, "desktop", KILL_FRAMES, extra),
    );
    wait_rendering(&mut p);
    // Slow enough (32 MiB/s) that the stream is still running when the destination dies.
    let answer = p.start_migration(r#"{"downtime-limit":300,"max-bandwidth":33554432}"#);
    assert!(answer.contains("\"return\""), "migrate: {answer}");
    let t = Instant::now();
    loop {
        let q = qmp(&mut p.src, r#"{"execute":"query-migrate"}"#);
        assert!(
            q["status"] == "setup" || q["status"] == "active",
            "the migration ended first: {q}\n{}",
            p.logs()
        );
        if q["ram"]["transferred"].as_u64().unwrap_or(0) > 8 << 20 {
            eprintln!("killing the destination's {victim:?} at: {q}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "{q}");
        std::thread::sleep(Duration::from_millis(50));
    }
    match victim {
        Victim::Qemu => p.dst.kill(),
        Victim::Server => {
            let _ = p.dst_serve.child.kill();
            let _ = p.dst_serve.child.wait();
            // The rest of the stream at full speed: the destination hears of its dead server
            // only when it loads the device's state, after the RAM.
            qmp(
                &mut p.src,
                r#"{"execute":"migrate-set-parameters","arguments":{"max-bandwidth":10737418240}}"#,
            );
        }
    }
    let q = p.wait_migration();
    eprintln!("query-migrate: {q}");
    let mut state = qmp(&mut p.src, r#"{"execute":"query-status"}"#);
    match victim {
        Victim::Qemu => assert_eq!(q["status"], "failed", "{q}"),
        Victim::Server => {
            // The destination must not run the guest without its vGPU.
            let dst_ended = p.dst.wait_exit(Duration::from_secs(60));
            assert!(
                dst_ended.is_some_and(|s| !s.success()),
                "the destination QEMU went on without its vGPU server ({dst_ended:?}):\n{}",
                p.logs()
            );
            if state["status"] == "postmigrate" {
                eprintln!("the source is paused in postmigrate: cont, as libvirt does");
                qmp(&mut p.src, r#"{"execute":"cont"}"#);
                state = qmp(&mut p.src, r#"{"execute":"query-status"}"#);
            }
        }
    }
    assert_eq!(state["status"], "running", "{state}\n{}", p.logs());
    // The source's device went back to RUNNING and the guest finishes there, unharmed.
    let status = p.src.wait_exit(Duration::from_secs(600));
    let console = p.src.console();
    assert!(
        status.is_some_and(|s| s.success()) && console.contains("GMIG-GUEST: exit 0"),
        "{status:?}\n{}",
        p.logs()
    );
    assert_eq!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "{}",
        p.logs()
    );
}

#[test]
fn a_destination_killed_mid_stream_leaves_the_source_running_intact() {
    kill_mid_stream_and_check_the_source(Victim::Qemu, "killed");
}

#[test]
fn a_destination_server_killed_mid_stream_leaves_the_source_running_intact() {
    kill_mid_stream_and_check_the_source(Victim::Server, "server-killed");
}

/// Postcopy is refused with QEMU's reason (its VFIO migration does not support postcopy), and the
/// source's guest renders on with its vGPU. The live migration test above, without postcopy, is
/// the control: the same pair migrates.
#[test]
fn postcopy_is_refused_with_the_reason_and_the_source_renders_on() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let mut p = pair(&tools, dir.path(), "postcopy", "desktop", &[], &[]);
    let cap = r#"{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"postcopy-ram","state":true}]}}"#;
    qmp(&mut p.src, cap);
    qmp(&mut p.dst, cap);
    wait_rendering(&mut p);
    let answer = p.start_migration(r#"{"downtime-limit":300}"#);
    let refusal = if answer.contains("\"error\"") {
        answer
    } else {
        let q = p.wait_migration();
        assert_eq!(q["status"], "failed", "{q}\n{}", p.logs());
        q["error-desc"].to_string()
    };
    eprintln!("postcopy: {refusal}");
    assert!(
        refusal.contains("not supported with postcopy"),
        "{refusal}\n{}",
        p.logs()
    );
    let state = qmp(&mut p.src, r#"{"execute":"query-status"}"#);
    assert_eq!(state["status"], "running", "{state}");
    // The source's guest renders on: frames well past the refusal, no failed submission.
    let later = format!("frame {} ", MIGRATE_AFTER + 64);
    p.wait_source(|l| l.starts_with(&later));
    let console = p.src.console();
    assert!(!console.contains("seqno timeout"), "{}", p.logs());
}

/// QEMU's `file:` migration (what `virsh save` and `restore` use underneath): the running guest
/// is migrated into a file, and a new QEMU in another slot restores from it with
/// `-incoming file:` and renders on to the unmigrated checksum, its frames following the
/// source's. Control: the same file restored onto a server in that slot that does not remap
/// faults (or renders something else).
#[test]
fn a_vm_saved_to_a_file_restores_in_another_slot_and_renders_on() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let want = reference(&tools, dir.path(), "desktop", FRAMES);
    let src_serve = Serve::start(gmig(), dir.path(), "file-src-gpu", &["--clients", "1"]);
    let mut src = Vm::start(
        &tools,
        &guest(&src_serve.socket, "desktop", FRAMES, vec![]),
        dir.path(),
        "file-src",
    );
    let after = format!("frame {MIGRATE_AFTER} ");
    assert!(
        src.wait_for(Duration::from_secs(300), |l| l.starts_with(&after)),
        "{}",
        src.console()
    );
    let image = dir.path().join("vm.image");
    qmp(
        &mut src,
        &format!(
            r#"{{"execute":"migrate","arguments":{{"uri":"file:{}"}}}}"#,
            image.display()
        ),
    );
    let q = wait_migration(&mut src).unwrap_or_else(|q| panic!("the save did not end: {q}"));
    assert_eq!(q["status"], "completed", "{q}\n{}", src.stderr_text());
    assert!(vfio_bytes(&q) > 0, "no device state saved: {q}");
    let saved = frames(&src.console());
    drop(src);
    // A new QEMU restoring the image, its vGPU served in slot 1 with `serve_args` besides.
    let restore = |tag: &str, serve_args: &[&str]| {
        let mut args = vec!["--slot", "1", "--clients", "1"];
        args.extend_from_slice(serve_args);
        let serve = Serve::start(gmig(), dir.path(), &format!("{tag}-gpu"), &args);
        let incoming = vec!["-incoming".to_string(), format!("file:{}", image.display())];
        let vm = Vm::start(
            &tools,
            &guest(&serve.socket, "desktop", FRAMES, incoming),
            dir.path(),
            tag,
        );
        (serve, vm)
    };
    let (dst_serve, mut dst) = restore("file-dst", &[]);
    let status = dst.wait_exit(Duration::from_secs(600));
    let console = dst.console();
    let logs = format!("{console}\n{}\n{}", dst.stderr_text(), dst_serve.log_text());
    assert!(
        status.is_some(),
        "the restored guest did not finish:\n{logs}"
    );
    let restored = frames(&console);
    let (last, first) = (*saved.last().unwrap(), *restored.first().expect("no frame"));
    assert!(
        first > last && first <= last + 32,
        "the restored frames do not follow the saved ones ({last} then {first}):\n{logs}"
    );
    assert_eq!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "the restored guest's checksum differs from an unmigrated run's:\n{logs}"
    );
    drop(dst);
    if !control_available(&["--x-no-remap"], "a restore that does not remap") {
        return;
    }
    let (_bad_serve, mut bad) = restore("file-bad", &["--x-no-remap"]);
    let ended = bad.wait_for(Duration::from_secs(120), |l| {
        l.contains("seqno timeout") || l.starts_with("checksum")
    });
    let console = bad.console();
    assert!(ended, "control: neither failed nor finished:\n{console}");
    assert_ne!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "control: restored without remapping, the guest still rendered right"
    );
}

/// QEMU's multifd migration (`multifd` on both sides, `-global migration.x-multifd=on`: RAM
/// over several channels, the device's state on the main one): it completes, the device's state moves, and the destination renders
/// on to the unmigrated checksum. The control is the no-remap test's (the device state is the
/// same whichever channels carry the RAM).
#[test]
fn a_multifd_migration_moves_the_vgpu_and_the_guest_renders_on() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(tools) = tools(dir.path()) else {
        return;
    };
    let want = reference(&tools, dir.path(), "desktop", FRAMES);
    // The capability must be on before the destination's `-incoming` starts: set on both
    // sides by QEMU's migration object property.
    let mut p = Pair::start(
        gmig(),
        &tools,
        dir.path(),
        "multifd",
        &[],
        &[],
        |socket, mut extra| {
            extra.extend(["-global".to_string(), "migration.x-multifd=on".to_string()]);
            guest(socket, "desktop", FRAMES, extra)
        },
    );
    let caps = qmp(&mut p.src, r#"{"execute":"query-migrate-capabilities"}"#);
    assert!(
        caps.as_array().is_some_and(|c| c
            .iter()
            .any(|c| c["capability"] == "multifd" && c["state"] == true)),
        "multifd is not on: {caps}"
    );
    let q = migrate(&mut p);
    eprintln!("multifd: {q}");
    assert_eq!(q["status"], "completed", "{q}\n{}", p.logs());
    assert!(vfio_bytes(&q) > 0, "no device state moved: {q}");
    let console = p.finish();
    assert!(console.contains("GMIG-GUEST: exit 0"), "{}", p.logs());
    assert_eq!(
        checksum_line(&console).as_deref(),
        Some(want.as_str()),
        "the guest's checksum after a multifd migration differs:\n{}",
        p.logs()
    );
}
