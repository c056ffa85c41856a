//! `gmig vm`: the guest GPU driver under KVM on a vGPU (`gmig vm run`), and whole-VM live
//! migration between two `gmig vm migrate` processes over TCP.

use std::net::{TcpListener, TcpStream};

use anyhow::{anyhow, Context};
use gmig_vgpu::gm::VgpuType;
use gmig_vmm::loopback::{linked_vgpu, RUN_TO_END};
use gmig_vmm::migrate::{migrate_in, migrate_out, Options};
use gmig_vmm::{GpuLink, GuestConfig, GuestProfile, Machine, Remote, Stop};

use crate::cli::{VmCommand, VmGuestArgs, VmMigrateArgs};
use crate::exit::Failure;

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

fn vgpu(a: &VmGuestArgs) -> anyhow::Result<Box<dyn GpuLink>> {
    Ok(match &a.vgpu_socket {
        Some(path) => Box::new(Remote::connect(path)?),
        None => linked_vgpu(VgpuType::V5_8, a.slot)?,
    })
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

fn run_guest(a: &VmGuestArgs, json: bool) -> Result<(), Failure> {
    let cfg = guest_config(a)?;
    let mut m = Machine::boot(a.ram_mib << 20, &cfg, vgpu(a)?).context("booting the VM")?;
    finish(&mut m, json, serde_json::json!({}))
}

fn migrate(a: &VmMigrateArgs, json: bool) -> Result<(), Failure> {
    match (&a.listen, &a.to) {
        (Some(addr), None) => {
            let listener =
                TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
            if !json {
                eprintln!(
                    "gmig vm: waiting for a VM on {}",
                    listener.local_addr().context("address")?
                );
            }
            let (mut conn, peer) = listener.accept().context("accepting the source")?;
            conn.set_nodelay(true).context("TCP_NODELAY")?;
            let (mut m, inc) =
                migrate_in(&mut conn, vgpu(&a.guest)?).context("receiving the VM")?;
            if !json {
                eprintln!(
                    "gmig vm: VM from {peer} running ({} pages, {} vGPU bytes, restored in {:.2} ms)",
                    inc.pages, inc.device_bytes, inc.restore_ms
                );
            }
            finish(
                &mut m,
                json,
                serde_json::json!({ "incoming": serde_json::to_value(inc).context("report")? }),
            )
        }
        (None, Some(addr)) => {
            let cfg = guest_config(&a.guest)?;
            let mut m = Machine::boot(a.guest.ram_mib << 20, &cfg, vgpu(&a.guest)?)
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
            let mut conn =
                TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
            conn.set_nodelay(true).context("TCP_NODELAY")?;
            let opts = Options {
                gpu_dirty: !a.no_gpu_dirty,
                link_gbps: a.link_gbps,
                round_exits: a.round_exits,
                ..Options::default()
            };
            let rep = match migrate_out(&mut m, &cfg, &mut conn, &opts) {
                Ok(r) => r,
                Err(e) => {
                    // Nothing was committed: the VM carries on here.
                    eprintln!("gmig vm: migration failed, the VM keeps running here: {e}");
                    finish(&mut m, json, serde_json::json!({ "migrated": false }))?;
                    return Err(anyhow!(e).context("migrating the VM").into());
                }
            };
            if json {
                println!("{}", serde_json::to_value(rep).context("report")?);
            } else {
                print_report(&rep);
            }
            Ok(())
        }
        _ => Err(anyhow!("give either --listen ADDR or --to ADDR").into()),
    }
}

/// The downtime report of a whole-VM migration, for people.
pub fn print_report(r: &gmig_vmm::migrate::Report) {
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
        "  RAM {:.2} ms | vGPU {:.2} ms ({} B stop-copy) | vCPU+COM1+config {:.2} ms | transfer+restore {:.2} ms",
        r.ram_ms, r.vgpu_ms, r.device_stop_bytes, r.vcpu_ms, r.transfer_ms
    );
    println!(
        "total {:.1} ms, {:.1} MiB on the wire",
        r.total_ms,
        r.wire_bytes as f64 / (1 << 20) as f64
    );
}
