//! The same guest with the vGPU out of process, over vfio-user: the same results as in process,
//! and a whole-VM migration between two vfio-user servers (the destination's vGPU in another
//! slot) whose destination completes frames and runs GPU workloads after the switch-over and
//! ends exactly as an unmigrated run. Negative controls beside it, over the same path: the
//! destination server without remapping faults and the guest stalls; without the vGPU's DMA
//! log the destination differs.

mod common;

use std::thread::JoinHandle;

use common::*;
use gmig_qemu_bridge::vgpu_backend::VgpuBackend;
use gmig_vmm::migrate::{migrate_in, Incoming, Options, Report};
use gmig_vmm::{GuestConfig, GuestProfile, Machine, Stop};

/// One migration between two served vGPUs: the destination machine (not yet run), the reports
/// and the two servers, which hand their vGPUs back once their client is gone.
struct Remote {
    dest: Machine,
    rep: Report,
    inc: Incoming,
    src_server: VgpuBackend,
    dst_server: JoinHandle<VgpuBackend>,
}

fn migrate_remote(
    dir: &std::path::Path,
    tag: &str,
    c: &GuestConfig,
    opts: &Options,
    dest_remap: bool,
) -> Remote {
    let (src, src_server) = serve_vgpu_with(dir, &format!("{tag}-src.sock"), 0, true);
    let (dst, dst_server) = serve_vgpu_with(dir, &format!("{tag}-dst.sock"), 1, dest_remap);
    let s = Machine::boot(RAM, c, remote(&src)).expect("boot");
    let point = Point::Frame(u64::from(c.frames) / 3, 3);
    let (s, dest, rep) = migrate_machine_at(s, c, point, opts, move |conn| {
        migrate_in(conn, remote(&dst))
    });
    let rep = rep.unwrap_or_else(|e| panic!("{tag}: migration over vfio-user: {e}"));
    let (dest, inc) = dest.unwrap_or_else(|e| panic!("{tag}: destination: {e}"));
    // The source VMM is done: its server hands back the vGPU as it was at the stop.
    drop(s);
    let src_server = src_server.join().expect("source server");
    Remote {
        dest,
        rep,
        inc,
        src_server,
        dst_server,
    }
}

/// Runs the destination on (a stalled guest stops at the budget); the destination's server hands
/// its vGPU back once the machine (its client) is dropped.
type Finished = (
    Machine,
    Report,
    Incoming,
    VgpuBackend,
    JoinHandle<VgpuBackend>,
);

fn finish(r: Remote, budget: u64) -> Finished {
    let Remote {
        mut dest,
        rep,
        inc,
        src_server,
        dst_server,
    } = r;
    let _ = dest.run(budget);
    (dest, rep, inc, src_server, dst_server)
}

#[test]
fn over_vfio_user_the_guest_gets_the_same_results_and_migrates() {
    if !kvm_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for profile in GuestProfile::ALL {
        let c = GuestConfig {
            profile,
            frames: FRAMES,
            ..GuestConfig::default()
        };
        let base = baseline(&c);
        let name = profile.name();
        // Out of process: the same results (serial output, guest RAM, the vGPU's guest-visible
        // state). Not the same exits: the served vGPU's interrupts reach the vCPU through an
        // eventfd from another thread, so how often the guest polls before one arrives depends
        // on scheduling (a busy host once gave 991 against 989). The counts are reported.
        let path = serve_vgpu(dir.path(), &format!("{name}-run.sock"), 0);
        let mut m = Machine::boot(RAM, &c, remote(&path)).expect("boot over vfio-user");
        assert_eq!(m.run(ALL).expect("run"), Stop::Halted);
        assert_same_run(&base, &m, &format!("{name} over vfio-user"));
        eprintln!(
            "{name}: {} exits in process, {} over vfio-user",
            base.exits, m.exits
        );

        // Migration between two servers: DMA logging and the device state over vfio-user.
        let r = migrate_remote(dir.path(), name, &c, &opts(), true);
        let (d, rep, inc, src_vgpu, dst_server) = finish(r, ALL);
        eprintln!("{name} over vfio-user: {rep:?}");
        assert!(d.halted(), "{name}: the migrated guest did not finish");
        assert_same_run(&base, &d, &format!("{name} migrated over vfio-user"));
        let frames_after = d.frames_done() - inc.at_restore.frames;
        drop(d);
        let dst_vgpu = dst_server.join().expect("destination server");
        let gpu = Some((served_progress(&src_vgpu), served_progress(&dst_vgpu)));
        let what = format!("{name} migrated over vfio-user");
        // The VMM cannot see an out-of-process vGPU's counters: the servers' tell.
        assert!(frames_after > 0, "{what}: no frame on the destination");
        assert_served_work(&what, &rep, &inc, frames_after, gpu);
        assert!(served_faults(&dst_vgpu).is_empty(), "{what}: faults");
    }
}

/// [`assert_destination_worked`] for a destination machine already gone: its frames after the
/// restore and the servers' counters.
fn assert_served_work(
    what: &str,
    rep: &Report,
    inc: &Incoming,
    frames_after: u64,
    gpu: Option<(gmig_vmm::Progress, gmig_vmm::Progress)>,
) {
    assert!(!rep.at_stop.halted, "{what}: the source had finished");
    assert_eq!(rep.at_stop.frames, inc.at_restore.frames, "{what}");
    let (stop, end) = gpu.expect("server counters");
    let workloads = end.work_since(&stop).workloads.unwrap_or(0);
    assert!(
        workloads > 0,
        "{what}: the destination's server ran no workload after the switch-over"
    );
    eprintln!(
        "{what}: switch-over at frame {}; the destination ran {frames_after} frames and \
         {workloads} GPU workloads after it",
        rep.at_stop.frames
    );
}

/// A scratch directory, the desktop guest and its unmigrated run, for the controls.
fn desktop() -> (tempfile::TempDir, GuestConfig, Machine) {
    let c = GuestConfig {
        frames: FRAMES,
        ..GuestConfig::default()
    };
    let base = baseline(&c);
    (tempfile::tempdir().expect("tempdir"), c, base)
}

#[test]
fn over_vfio_user_without_remapping_the_destination_faults_and_the_guest_stalls() {
    if !kvm_present() {
        return;
    }
    let (dir, c, base) = desktop();
    let r = migrate_remote(dir.path(), "noremap", &c, &opts(), false);
    let (d, _, inc, _, dst_server) = finish(r, base.exits * 3);
    let halted = d.halted();
    let frames_after = d.frames_done() - inc.at_restore.frames;
    drop(d);
    let f = served_faults(&dst_server.join().expect("destination server"));
    eprintln!("remapping off over vfio-user: halted {halted}, {frames_after} frames after; {f:?}");
    assert!(
        f.iter().any(|r| r.contains("outside this vGPU's slices")),
        "remapping off: no out-of-slice fault in the destination's server: {f:?}"
    );
    assert!(!halted, "remapping off: the guest did not stall");
}

#[test]
fn over_vfio_user_with_kvm_dirty_log_only_the_destination_differs() {
    if !kvm_present() {
        return;
    }
    let (dir, c, base) = desktop();
    let no_gpu = Options {
        gpu_dirty: false,
        ..opts()
    };
    let r = migrate_remote(dir.path(), "nolog", &c, &no_gpu, true);
    assert!(r.rep.rounds > 1, "no pre-copy round for the vGPU to dirty");
    let (d, _, _, _, _) = finish(r, base.exits * 3);
    let same = d.halted()
        && d.serial_results() == base.serial_results()
        && differing_pages(&ram(&base), &ram(&d)).is_empty();
    assert!(
        !same,
        "over vfio-user, KVM's dirty log alone gave the same result: the vGPU's writes were \
         not exercised"
    );
}
