//! `gmig vm`: the guest GPU driver under KVM on a vGPU (`gmig vm run`), and whole-VM live
//! migration between two `gmig vm migrate` processes over TCP.

use std::net::{TcpListener, TcpStream};
use std::path::Path;

use anyhow::{anyhow, Context};
use gmig_vgpu::gm::VgpuType;
use gmig_vmm::loopback::{linked_vgpu, RUN_TO_END};
use gmig_vmm::migrate::{
    migrate_in_with, migrate_out, migrate_out_at, resume_in, Incoming, Options,
};
use gmig_vmm::{
    DirtyLogWant, GpuLink, GuestConfig, GuestProfile, Machine, Progress, Remote, Stop, VmOptions,
};

use crate::cli::{DirtyLogArg, OnOff, VmCommand, VmGuestArgs, VmMigrateArgs};
use crate::exit::{side_fields, Failure};

#[path = "vm_journal.rs"]
mod journal;
use journal::Journaled;

/// Run `gmig vm …`.
pub fn run(cmd: &VmCommand, json: bool) -> Result<(), Failure> {
    if !std::path::Path::new("/dev/kvm").exists() {
        return Err(anyhow!("/dev/kvm is absent: `gmig vm` needs KVM").into());
    }
    match cmd {
        VmCommand::Run(a) => run_guest(&a.guest, json),
        VmCommand::Migrate(a) => migrate(a, json),
    }
}

fn guest_config(a: &VmGuestArgs) -> anyhow::Result<GuestConfig> {
    let profile = GuestProfile::from_name(&a.profile)
        .ok_or_else(|| anyhow!("unknown guest profile `{}` (desktop, compute)", a.profile))?;
    Ok(GuestConfig {
        profile,
        frames: a.frames,
        width: a.width,
        height: a.height,
        seed: a.seed,
        ..GuestConfig::default()
    })
}

/// The VM as `--dirty-log` and `--thp` ask.
pub fn vm_options(dirty_log: DirtyLogArg, thp: OnOff) -> VmOptions {
    VmOptions {
        dirty_log: match dirty_log {
            DirtyLogArg::Auto => DirtyLogWant::Auto,
            DirtyLogArg::Manual => DirtyLogWant::ManualProtect,
            DirtyLogArg::Get => DirtyLogWant::Get,
        },
        thp: thp == OnOff::On,
    }
}

fn vgpu(a: &VmGuestArgs) -> anyhow::Result<Box<dyn GpuLink>> {
    vgpu_within(a, None)
}

/// The vGPU; one over vfio-user fails any request its server leaves unanswered past `timeout`
/// (a migrating VMM gives it half the hand-over timeout, so that it can still tell its peer in
/// time that its vGPU is gone).
fn vgpu_within(
    a: &VmGuestArgs,
    timeout: Option<std::time::Duration>,
) -> anyhow::Result<Box<dyn GpuLink>> {
    Ok(match &a.vgpu_socket {
        Some(path) => {
            let mut r = Remote::connect(path)?;
            r.0.set_timeout(timeout)
                .context("the vGPU connection's timeout")?;
            Box::new(r)
        }
        None => linked_vgpu(VgpuType::V5_8, a.slot)?,
    })
}

/// [`vgpu_within`] half the hand-over timeout.
fn migrating_vgpu(a: &VmMigrateArgs) -> anyhow::Result<Box<dyn GpuLink>> {
    vgpu_within(&a.guest, Some(a.hand_over.timeout()? / 2))
}

fn finish(m: &mut Machine, json: bool, extra: serde_json::Value) -> Result<(), Failure> {
    if m.run(RUN_TO_END).context("running the guest")? != Stop::Halted {
        return Err(anyhow!("the guest did not halt").into());
    }
    let serial = String::from_utf8_lossy(m.serial()).to_string();
    if json {
        let mut v = serde_json::json!({
            "serial": serial,
            "exits": m.exits,
            "msis": m.msis(),
        });
        if let (Some(o), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        println!("{v}");
    } else {
        print!("{serial}");
        let msis = m.msis();
        eprintln!("gmig vm: {} exits, {msis} MSIs signalled", m.exits);
    }
    Ok(())
}

/// The destination runs the VM to its end and says what it did after the switch-over.
fn finish_migrated(m: &mut Machine, inc: &Incoming, json: bool) -> Result<(), Failure> {
    // The VM is this side's alone now: if it cannot run on (its vGPU's process died), it is lost.
    let lost = |e: anyhow::Error| Failure::Migration {
        error: e.context("the VM ran here after the hand-over and cannot run on; it is lost"),
        fields: side_fields("destination", "vm", "none"),
        in_doubt: false,
    };
    match m.run(RUN_TO_END).context("running the guest") {
        Ok(Stop::Halted) => {}
        Ok(_) => return Err(lost(anyhow!("the guest did not halt"))),
        Err(e) => return Err(lost(e)),
    }
    let work = Progress::of(m).work_since(&inc.at_restore);
    if !json {
        eprintln!(
            "gmig vm: destination ran {} frames / {} GPU workloads after the switch-over (restored at frame {})",
            work.frames,
            work.workloads
                .map_or_else(|| "(not visible: vGPU out of process)".into(), |w| w.to_string()),
            inc.at_restore.frames
        );
    }
    finish(
        m,
        json,
        serde_json::json!({
            "incoming": serde_json::to_value(inc).context("report")?,
            "destination_frames": work.frames,
            "destination_workloads": work.workloads,
            "vm": "running",
            "role": "destination",
        }),
    )
}

fn run_guest(a: &VmGuestArgs, json: bool) -> Result<(), Failure> {
    let cfg = guest_config(a)?;
    let vm = vm_options(a.dirty_log, a.thp);
    let mut m =
        Machine::boot_with(a.ram_mib << 20, &cfg, vgpu(a)?, &vm).context("booting the VM")?;
    finish(&mut m, json, serde_json::json!({}))
}

/// The migration connection with its journal (see [`journal`]), `role`'s default file name
/// unless `--checkpoint` names one.
fn journaled(conn: TcpStream, a: &VmMigrateArgs, role: &str) -> anyhow::Result<Journaled> {
    let t = Some(a.hand_over.timeout()?);
    conn.set_read_timeout(t)
        .and_then(|()| conn.set_write_timeout(t))
        .and_then(|()| conn.set_nodelay(true))
        .context("connection options")?;
    let path =
        a.hand_over.checkpoint.clone().unwrap_or_else(|| {
            format!("gmig-vm-in-doubt-{role}-{}.gmigvm", std::process::id()).into()
        });
    Journaled::new(conn, path, role == "destination", a.x_journal)
}

/// A side in doubt: keep its journal and say so (exit code 4).
fn vm_in_doubt(j: Journaled, role: &str, e: gmig_vmm::Error) -> Failure {
    let mut fields = side_fields(role, "vm", "in-doubt");
    let error = match j.keep() {
        Ok(path) => {
            eprintln!(
                "gmig vm: in doubt: this {role} holds the VM stopped; its state is in {}: resume it with `gmig vm migrate --resume {}` only once the other side is known not to run the VM",
                path.display(),
                path.display()
            );
            fields.insert("checkpoint".into(), path.display().to_string().into());
            anyhow!(e).context("migration broke during the switch-over")
        }
        Err(w) => anyhow!(e).context(format!(
            "in doubt, and the journal could not be kept ({w:#}): this side's copy is lost"
        )),
    };
    Failure::Migration {
        error,
        fields,
        in_doubt: true,
    }
}

fn resume(a: &VmMigrateArgs, path: &Path, json: bool) -> Result<(), Failure> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = std::io::BufReader::with_capacity(1 << 20, file);
    let (mut m, inc) = resume_in(&mut r, vgpu(&a.guest)?)
        .with_context(|| format!("resuming the VM from {}", path.display()))?;
    if !json {
        eprintln!(
            "gmig vm: VM resumed from {} ({} pages, {} vGPU bytes)",
            path.display(),
            inc.pages,
            inc.device_bytes
        );
    }
    finish(
        &mut m,
        json,
        serde_json::json!({ "vm": "running", "role": "resumed" }),
    )
}

fn migrate(a: &VmMigrateArgs, json: bool) -> Result<(), Failure> {
    if let Some(path) = &a.hand_over.resume {
        return resume(a, path, json);
    }
    match (&a.listen, &a.to) {
        (Some(addr), None) => {
            // The vGPU first: a destination without one fails before it accepts a source.
            let link = migrating_vgpu(a)?;
            let listener =
                TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
            if !json {
                eprintln!(
                    "gmig vm: waiting for a VM on {}",
                    listener.local_addr().context("address")?
                );
            }
            let (conn, peer) = listener.accept().context("accepting the source")?;
            let mut conn = journaled(conn, a, "destination")?;
            let vm = vm_options(a.guest.dirty_log, a.guest.thp);
            let (mut m, inc) = match migrate_in_with(&mut conn, link, &vm) {
                Ok(r) => r,
                Err(e) if e.in_doubt() => return Err(vm_in_doubt(conn, "destination", e)),
                Err(e) => {
                    return Err(Failure::Migration {
                        error: anyhow!(e).context("receiving the VM; nothing of it is kept here"),
                        fields: side_fields("destination", "vm", "none"),
                        in_doubt: false,
                    });
                }
            };
            drop(conn);
            if !json {
                eprintln!(
                    "gmig vm: VM from {peer} running ({} pages, {} vGPU bytes, restored in {:.2} ms)",
                    inc.pages, inc.device_bytes, inc.restore_ms
                );
            }
            finish_migrated(&mut m, &inc, json)
        }
        (None, Some(addr)) => {
            let cfg = guest_config(&a.guest)?;
            let vm = vm_options(a.guest.dirty_log, a.guest.thp);
            let mut m = Machine::boot_with(a.guest.ram_mib << 20, &cfg, migrating_vgpu(a)?, &vm)
                .context("booting the VM")?;
            let bar = (!json).then(|| {
                let b = indicatif::ProgressBar::new(a.at_frame);
                b.set_message("frames before migrating");
                b
            });
            m.run_until(RUN_TO_END, |m| {
                let f = m.frames_done();
                if let Some(b) = &bar {
                    b.set_position(f);
                }
                f >= a.at_frame
            })
            .context("running the guest")?;
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            let conn = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
            let mut conn = journaled(conn, a, "source")?;
            let opts = Options {
                gpu_dirty: !a.no_gpu_dirty,
                link_gbps: a.link_gbps,
                round_exits: a.round_exits,
                ..Options::default()
            };
            let out = match a.switch_at_frame {
                Some(f) => migrate_out_at(&mut m, &cfg, &mut conn, &opts, &mut |m: &Machine| {
                    m.frames_done() >= f
                }),
                None => migrate_out(&mut m, &cfg, &mut conn, &opts),
            };
            let rep = match out {
                Ok(r) => r,
                Err(e) if e.in_doubt() => return Err(vm_in_doubt(conn, "source", e)),
                Err(e) => {
                    // Nothing was committed: the VM carries on here.
                    drop(conn);
                    eprintln!("gmig vm: migration failed, the VM keeps running here: {e}");
                    if let Err(run) = finish(
                        &mut m,
                        json,
                        serde_json::json!({ "migrated": false, "vm": "running", "role": "source" }),
                    ) {
                        // Its vGPU is gone (its process died or hangs): nothing here can run
                        // the VM, and no other side holds it.
                        return Err(Failure::Migration {
                            error: anyhow!(e).context(format!(
                                "migrating the VM failed and the VM cannot run here either ({}); it is lost",
                                run_error(run)
                            )),
                            fields: side_fields("source", "vm", "none"),
                            in_doubt: false,
                        });
                    }
                    return Err(Failure::Migration {
                        error: anyhow!(e).context("migrating the VM"),
                        fields: side_fields("source", "vm", "running"),
                        in_doubt: false,
                    });
                }
            };
            drop(conn);
            if json {
                let mut v = serde_json::to_value(rep).context("report")?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("vm".into(), "none".into());
                    o.insert("role".into(), "source".into());
                }
                println!("{v}");
            } else {
                print_report(&rep);
            }
            Ok(())
        }
        _ => Err(anyhow!("give either --listen ADDR or --to ADDR").into()),
    }
}

/// Why [`finish`] failed, in one line.
fn run_error(f: Failure) -> String {
    match f {
        Failure::Error(e) | Failure::Migration { error: e, .. } => format!("{e:#}"),
        Failure::Check(c) => c,
    }
}

/// The downtime report of a whole-VM migration, for people.
pub fn print_report(r: &gmig_vmm::migrate::Report) {
    println!(
        "switch-over at frame {} (the guest {})",
        r.at_stop.frames,
        if r.at_stop.halted {
            "had already finished: the destination has nothing left to do"
        } else {
            "still rendering"
        }
    );
    println!(
        "VM migrated: {} MiB guest RAM, {} pre-copy rounds, {} pages before the stop, {} after ({} only the vGPU's DMA log had)",
        r.ram_bytes >> 20,
        r.rounds,
        r.precopy_pages,
        r.final_pages,
        r.final_gpu_only_pages
    );
    println!(
        "downtime {:.2} ms (source paused -> destination acknowledged); {:.2} ms paused -> destination runnable",
        r.downtime_ms, r.dest_downtime_ms
    );
    println!(
        "  dirty log ({}) {:.2} ms, of it KVM's {:.2} ms",
        r.dirty_log_mode.name(),
        r.dirty_log_ms,
        r.kvm_log_ms
    );
    println!(
        "  RAM {:.2} ms | vGPU {:.2} ms ({} B stop-copy) | vCPU+COM1+config {:.2} ms | transfer+restore {:.2} ms",
        r.ram_ms, r.vgpu_ms, r.device_stop_bytes, r.vcpu_ms, r.transfer_ms
    );
    println!(
        "total {:.1} ms, {:.1} MiB on the wire",
        r.total_ms,
        r.wire_bytes as f64 / (1 << 20) as f64
    );
}
