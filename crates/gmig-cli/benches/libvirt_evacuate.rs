//! Host evacuation under libvirt, N = 2: two domains, each with its own gmig vGPU, leave one
//! libvirt daemon for another with `virsh migrate --live` started at the same moment, against
//! each domain migrated alone.
//!
//! `cargo bench -p gmig-cli --bench libvirt_evacuate [-- --reps 2 --frames 60000 --ram-mib 512]`
//!
//! The lab of `crates/gmig-cli/tests/libvirt.rs` (`gmig_test_support::libvirt`): two private
//! libvirtds, each in its own network namespace joined by a veth pair; the domains of
//! `integrations/libvirt/domain.xml.in` (QEMU 10.2.2 with `integrations/qemu/patches`, TCG, the
//! Linux guest rendering the desktop profile). Both domains' XML name slot 0, and each hook gives
//! each vGPU a free slot (`gmig serve --slots /run/gmig/slots`, the host's slot registry): on the
//! source A takes slot 0 and B, started after it, slot 1; the destination's hook adds 2
//! (`--slot-offset 2`), so the first of the two incoming vGPUs takes slot 2 and the other, finding
//! it taken, slot 3. The bench reads each slot from the hooks' logs and checks that no two vGPUs
//! of one host share a slot and that every vGPU moves.
//!
//! Each rep migrates A alone, then B alone (solo), then both at once (two threads released by
//! one barrier, each running `virsh migrate --live --verbose NAME DEST` against the source,
//! client-driven). After each migration: the destination runs the domain, its hook served the
//! vGPU in the expected slot, the source's hook stopped its server; the guest renders on and
//! finishes on the destination, and every running sum it printed (source and destination) and
//! its final checksum equal an unmigrated QEMU run's of the same guest (run first, alone). It
//! prints one markdown row per domain and migration: `virsh domjobinfo --completed` on the
//! destination (`Total downtime`, `Time elapsed`, `Data total`) and virsh's wall clock.
//!
//! Skips, saying why, where libvirtd cannot run here, where QEMU's source tarball is absent, or
//! where QEMU would be built without gmig's patches (it then moves no vGPU state).

use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use gmig_test_support::libvirt::{
    assert_renders_as_unmigrated, assert_switched_over, domain_xml, frame_sums, last_frame,
    libvirt_ready, qemu_patched, unmigrated, Daemon, NetPair,
};
use gmig_test_support::qemu::{qemu_source_present, Tools};

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

/// `--name value` from the command line (after cargo's own `--bench`), as a number.
fn arg(name: &str, default: u32) -> u32 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
        })
}

/// The destination's hook adds this to every vGPU's slot.
const DEST_SLOT_OFFSET: u32 = 2;

/// The slot the hook's latest server for `name` took, from the hook's log (`NAME: gmig serve
/// PID on SOCKET, type T, slot N[ (slot W is taken)]`).
fn served_slot(hook_log: &str, name: &str) -> u32 {
    let key = format!("on /run/gmig/{name}.sock, type 64+384, slot ");
    hook_log
        .lines()
        .rev()
        .find_map(|l| l.split_once(&key))
        .and_then(|(_, rest)| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the hook's log has no server for {name}:\n{hook_log}"))
}

/// What one domain's migration measured.
struct Row {
    name: String,
    slots: (u32, u32),
    downtime_ms: String,
    elapsed_ms: String,
    data: String,
    virsh_s: f64,
    dest_frames: (u64, u64),
}

/// The value of `Key:` in `virsh domjobinfo` output, its unit kept ("?" where absent).
fn job_field(info: &str, key: &str) -> String {
    info.lines().find_map(|l| l.strip_prefix(key)).map_or_else(
        || "?".into(),
        |v| v.split_whitespace().collect::<Vec<_>>().join(" "),
    )
}

struct Lab<'a> {
    src: &'a Daemon,
    dst: &'a Daemon,
    tools: &'a Tools,
    scratch: &'a Path,
    frames: u32,
    ram_mib: u32,
    reference: &'a str,
}

impl Lab<'_> {
    /// Starts every `(name, slot)` domain on the source, waits until each renders, migrates them
    /// all at once, and checks each destination guest against the reference; one row each, and
    /// the evacuation's wall clock (first virsh start to last virsh end).
    fn evacuate(&self, doms: &[String]) -> (Vec<Row>, f64) {
        let (src, dst) = (self.src, self.dst);
        for name in doms {
            let xml = domain_xml(self.tools, name, self.frames, self.ram_mib, 0);
            src.define(self.scratch, name, &xml);
            src.ok(&["start", name]);
        }
        for name in doms {
            src.assert_rendering(name, Duration::from_secs(180));
        }
        let gate = Barrier::new(doms.len());
        let started = Instant::now();
        let outs: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = doms
                .iter()
                .map(|name| {
                    let gate = &gate;
                    s.spawn(move || {
                        gate.wait();
                        let t = Instant::now();
                        let o = src.virsh(&["migrate", "--live", "--verbose", name, &dst.uri]);
                        (o, t.elapsed().as_secs_f64())
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("a migrating thread"))
                .collect()
        });
        let wall = started.elapsed().as_secs_f64();
        // First what must be read while every domain still runs on the destination (a guest
        // that finishes there powers off, and its transient domain is gone).
        let mut jobs = Vec::new();
        for (name, (o, virsh_s)) in doms.iter().zip(outs) {
            let on_source = assert_switched_over(src, dst, name, &o);
            let info = dst.ok(&["domjobinfo", name, "--completed"]);
            let from = served_slot(&src.file("log/gmig-hook.log"), name);
            let to = served_slot(&dst.file("log/gmig-hook.log"), name);
            assert!(
                to >= DEST_SLOT_OFFSET && to != from,
                "{name}: served in slot {from} on the source and {to} on the destination"
            );
            jobs.push((name, from, to, info, virsh_s, on_source));
        }
        for (side, pick) in [("source", 1), ("destination", 2)] {
            let mut slots: Vec<u32> = jobs
                .iter()
                .map(|j| if pick == 1 { j.1 } else { j.2 })
                .collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(
                slots.len(),
                jobs.len(),
                "two vGPUs share a slot on the {side}"
            );
        }
        let mut rows = Vec::new();
        for (name, from, to, info, virsh_s, on_source) in jobs {
            assert!(src.servers_gone(name), "{}", src.logs());
            let console = dst.wait_finished(name, Duration::from_secs(600));
            let on_dest = frame_sums(&console);
            let first = on_dest.keys().next().copied().unwrap_or(0);
            assert!(
                first > last_frame(&on_source),
                "{name}: the destination rendered nothing after the switch-over:\n{console}"
            );
            assert_renders_as_unmigrated(self.reference, &[&on_source, &console], &console, name);
            rows.push(Row {
                name: name.clone(),
                slots: (from, to),
                downtime_ms: job_field(&info, "Total downtime:"),
                elapsed_ms: job_field(&info, "Time elapsed:"),
                data: job_field(&info, "Data total:"),
                virsh_s,
                dest_frames: (first, last_frame(&console)),
            });
        }
        for name in doms {
            // The guest powered off on the destination (a transient domain there, gone); the
            // source keeps the definition, shut off.
            let _ = dst.virsh(&["destroy", name]);
            assert!(dst.servers_gone(name), "{}", dst.logs());
            for d in [src, dst] {
                if d.knows(name) {
                    d.ok(&["undefine", name]);
                }
            }
        }
        (rows, wall)
    }
}

fn main() {
    if !qemu_source_present() {
        eprintln!("SKIPPED: QEMU's source tarball is not in ../shared/qemu: no QEMU to measure");
        return;
    }
    if !libvirt_ready() {
        return;
    }
    if !qemu_patched() {
        eprintln!("SKIPPED: no integrations/qemu/patches: QEMU would move no vGPU state");
        return;
    }
    let reps = arg("--reps", 1);
    let frames = arg("--frames", 60_000);
    let ram_mib = arg("--ram-mib", 512);
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let dir = scratch.path();
    let tools = Tools::get(dir).unwrap_or_else(|e| panic!("QEMU or the guest: {e}"));
    // Both domains run the same guest: one unmigrated run, alone, serves every check.
    let reference = unmigrated(
        gmig(),
        &tools,
        &dir.join("unmigrated"),
        frames,
        ram_mib.into(),
    );
    let net = NetPair::up("e");
    let src = Daemon::start(
        gmig(),
        dir.join("src"),
        &[
            "--netns",
            &net.a,
            "--hostname",
            "gmig-src",
            "--migration-host",
            NetPair::ADDR_A,
        ],
    );
    let offset = DEST_SLOT_OFFSET.to_string();
    let dst = Daemon::start(
        gmig(),
        dir.join("dst"),
        &[
            "--netns",
            &net.b,
            "--hostname",
            "gmig-dst",
            "--migration-host",
            NetPair::ADDR_B,
            "--slot-offset",
            &offset,
        ],
    );
    let lab = Lab {
        src: &src,
        dst: &dst,
        tools: &tools,
        scratch: dir,
        frames,
        ram_mib,
        reference: &reference,
    };
    println!("| rep | migration | domain | slot src → dst | downtime | time elapsed | data | virsh (s) | destination frames |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let print = |rep: u32, how: &str, rows: &[Row]| {
        for r in rows {
            println!(
                "| {rep} | {how} | {} | {} → {} | {} | {} | {} | {:.1} | {}..={} |",
                r.name,
                r.slots.0,
                r.slots.1,
                r.downtime_ms,
                r.elapsed_ms,
                r.data,
                r.virsh_s,
                r.dest_frames.0,
                r.dest_frames.1
            );
        }
    };
    let mut walls = Vec::new();
    for rep in 1..=reps {
        for dom in ["a", "b"] {
            let (rows, _) = lab.evacuate(&[format!("evac-{dom}-{rep}-solo")]);
            print(rep, "solo", &rows);
        }
        let both = [format!("evac-a-{rep}-pair"), format!("evac-b-{rep}-pair")];
        let (rows, wall) = lab.evacuate(&both);
        print(rep, "both at once", &rows);
        walls.push(wall);
    }
    for (i, w) in walls.iter().enumerate() {
        println!(
            "\nrep {}: both migrations done {w:.1} s after they started; every guest's running \
             sums and checksum equal the unmigrated run's",
            i + 1
        );
    }
}
