//! `gmig migrate`: the destination listens (`--listen`), the source boots a guest, runs it and
//! migrates it (`--to`), with a progress bar and a summary.

use anyhow::{anyhow, Context};
use gmig_core::migration::{
    migrate_source, receive_migration, record_stream, restore_stream, source_handle, Incoming,
    MigrationConfig, MigrationPhase, MigrationReport, Policy, Progress,
};
use gmig_core::transport::{Connection, Endpoint, Throttled};
use gmig_vgpu::compare::guest_visible_digest;
use gmig_vgpu::gm::{HostConfig, PartitionManager, VgpuType};
use gmig_vgpu::migratable::{parse_vgpu_type, VgpuFactory, VgpuVm};
use gmig_vgpu::scenario::ScenarioReport;
use gmig_vgpu::workload::{Profile, WorkloadConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{MigrateArgs, PolicyArg, ProfileArg};
use crate::exit::{side_fields, Failure};

/// The engine's policy for a CLI policy.
pub fn policy_of(p: PolicyArg) -> Policy {
    match p {
        PolicyArg::StopAndCopy => Policy::StopAndCopy,
        PolicyArg::Iterative => Policy::Iterative,
        PolicyArg::OneShot => Policy::OneShot,
        PolicyArg::OneShotNarrow => Policy::OneShotNarrow,
    }
}

/// The workload profile for a CLI profile.
pub fn profile_of(p: ProfileArg) -> Profile {
    match p {
        ProfileArg::Idle => Profile::Idle,
        ProfileArg::Desktop => Profile::Desktop,
        ProfileArg::ThreeD => Profile::ThreeD,
        ProfileArg::Video => Profile::Video,
        ProfileArg::Compute => Profile::Compute,
    }
}

/// A progress bar on stderr (hidden with `hidden`, or when stderr is not a terminal) and the
/// callback that drives it.
pub fn progress_bar(hidden: bool) -> (ProgressBar, impl FnMut(&Progress)) {
    let bar = if hidden {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
    };
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} pages  {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let b = bar.clone();
    let cb = move |p: &Progress| {
        b.set_length(p.pages_hint.max(p.pages));
        b.set_position(p.pages);
        b.set_message(format!("{} {} on the wire", p.phase, human_bytes(p.bytes)));
    };
    (bar, cb)
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

fn print_report(r: &MigrationReport) {
    println!("policy            {}", r.policy.name());
    println!(
        "downtime          {:.2} ms = quiesce {:.2} + transfer {:.2} (hash {:.2} overlapped) + destination {:.2} (restore {:.2}, remap {:.2}) + commit {:.2}",
        r.downtime_ms,
        r.quiesce_ms,
        r.transfer_ms,
        r.hash_ms,
        r.dest_finish_ms,
        r.restore_ms,
        r.remap_ms,
        r.commit_ms
    );
    println!(
        "pre-copy          {:.1} ms, {} round(s), {} frames ran meanwhile",
        r.precopy_ms, r.rounds, r.steps_during_precopy
    );
    println!(
        "pages             {} pre-copy + {} stop-copy = {} ({} zero markers), {} re-hashed in downtime{}",
        r.pages_precopy,
        r.pages_stop_copy,
        r.pages_total,
        r.zero_pages,
        r.pages_rehashed,
        if r.widened { " (widened: unknown write set)" } else { "" }
    );
    println!(
        "bytes             {} pre-copy + {} stop-copy = {} on the wire",
        human_bytes(r.bytes_precopy),
        human_bytes(r.bytes_stop_copy),
        human_bytes(r.bytes_on_wire)
    );
    println!("drained workloads {}", r.drained_workloads);
}

/// Print a scenario report for people.
pub fn print_human(r: &ScenarioReport) {
    println!(
        "{} vGPU {} MiB, profile {}, {} frames ({} at the stop; guest clock {}), link {}",
        if r.identical { "✔" } else { "✘" },
        r.vgpu_type,
        r.profile,
        r.frames,
        r.frames_at_stop,
        r.clock.name(),
        r.link_gbps
            .map_or("unlimited".to_string(), |g| format!("{g} Gbit/s"))
    );
    println!(
        "slices            source 0x{:x}/0x{:x} -> destination 0x{:x}/0x{:x}",
        r.source_slices[0], r.source_slices[1], r.dest_slices[0], r.dest_slices[1]
    );
    print_report(&r.report);
    println!(
        "identical         {}",
        if r.identical {
            "yes: destination equals the unmigrated run"
        } else {
            "NO"
        }
    );
}

fn engine_cfg(args: &MigrateArgs) -> anyhow::Result<MigrationConfig> {
    let mut cfg = MigrationConfig::new(policy_of(args.policy));
    cfg.max_drain = crate::cli::drain(Some(args.max_drain), args.max_drain_ms, cfg.max_drain)?;
    cfg.step_every_batches = 8;
    if let Ok(t) = args.hand_over.timeout() {
        cfg.timeout = t;
    }
    Ok(cfg)
}

fn vgpu_type(args: &MigrateArgs) -> anyhow::Result<VgpuType> {
    parse_vgpu_type(&args.vgpu_type).ok_or_else(|| {
        anyhow!(
            "unknown vGPU type `{}` (use 64+384, 128+512, 256+1024 or 512+2048)",
            args.vgpu_type
        )
    })
}

/// Run `gmig migrate`.
pub fn run(args: &MigrateArgs, json: bool) -> Result<(), Failure> {
    args.hand_over.timeout()?;
    match (&args.listen, &args.to, &args.hand_over.resume) {
        (_, _, Some(path)) => resume(args, path, json),
        (Some(addr), _, _) => destination(args, &endpoint(addr)?, json),
        (None, Some(addr), _) => source(args, &endpoint(addr)?, json),
        (None, None, None) => Err(Failure::Error(anyhow!(
            "give --listen ADDR, --to ADDR or --resume FILE"
        ))),
    }
}

/// `HOST:PORT` (TCP) or `unix:PATH` (Unix socket).
fn endpoint(s: &str) -> anyhow::Result<Endpoint> {
    if let Some(path) = s.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(anyhow!("`unix:` needs a socket path"));
        }
        return Ok(Endpoint::Unix(path.into()));
    }
    let addr = s
        .parse()
        .with_context(|| format!("`{s}` is neither HOST:PORT nor unix:PATH"))?;
    Ok(Endpoint::Tcp(addr))
}

/// The side that runs the vGPU finishes the work queued on it, then states a digest of its
/// guest-visible state (registers, GGTT, faults, guest RAM) so that a migrated, a rolled-back and
/// a resumed vGPU can be checked against a reference computed elsewhere.
fn finish_owned(vm: &mut VgpuVm) -> serde_json::Map<String, serde_json::Value> {
    // The carried workload the source's GPU had begun resumes at the command it stopped at.
    let preempted = vm.vgpu().preempted().map(|(_, next)| next);
    let ran = vm.run_queued();
    let mut m = serde_json::Map::new();
    m.insert("carried_workloads_run".into(), ran.into());
    m.insert("carried_preempted_at".into(), preempted.into());
    m.insert("gpu_faults".into(), vm.vgpu().faults().len().into());
    m.insert(
        "state_digest".into(),
        format!("{:016x}", guest_visible_digest(vm.vgpu())).into(),
    );
    m
}

/// Save the stopped copy a side in doubt holds: a whole migration stream of it (the format
/// `--resume` reads), written to a temporary name, synced, then renamed into place.
fn save_checkpoint(
    vm: VgpuVm,
    args: &MigrateArgs,
    role: &str,
) -> anyhow::Result<std::path::PathBuf> {
    let path = args
        .hand_over
        .checkpoint
        .clone()
        .unwrap_or_else(|| format!("gmig-in-doubt-{role}-{}.gmig", std::process::id()).into());
    let mut cfg = MigrationConfig::new(Policy::StopAndCopy);
    // The copy is already stopped and drained as far as the migration drained it: save it as is.
    cfg.max_drain = gmig_core::migration::Drain::CARRY;
    let (bytes, _) = record_stream(vm, &cfg).context("encoding the stopped vGPU")?;
    let tmp = path.with_extension("partial");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().with_context(|| format!("writing the checkpoint {}", path.display()))?;
    Ok(path)
}

/// A side in doubt: save its copy and say so (exit code 4).
fn in_doubt(
    vm: VgpuVm,
    args: &MigrateArgs,
    role: &str,
    error: anyhow::Error,
    json: bool,
) -> Failure {
    let mut fields = side_fields(role, "vgpu", "in-doubt");
    match save_checkpoint(vm, args, role) {
        Ok(path) => {
            if !json {
                eprintln!(
                    "gmig: in doubt: this {role} holds a stopped copy of the vGPU, saved to {}; resume it with `gmig migrate --resume {}` only once the other side is known not to run the vGPU",
                    path.display(),
                    path.display()
                );
            }
            fields.insert("checkpoint".into(), path.display().to_string().into());
            Failure::Migration {
                error,
                fields,
                in_doubt: true,
            }
        }
        Err(e) => Failure::Migration {
            error: error.context(format!(
                "in doubt, and the stopped copy could not be saved ({e:#}); this process held the last copy on this side"
            )),
            fields,
            in_doubt: true,
        },
    }
}

fn destination(args: &MigrateArgs, ep: &Endpoint, json: bool) -> Result<(), Failure> {
    let ty = vgpu_type(args)?;
    // This host already runs another vGPU, so the incoming one lands at other offsets.
    let mut pm = PartitionManager::new(HostConfig::default()).context("host")?;
    pm.place(VgpuType::V5_4)
        .context("placing a neighbour vGPU")?;
    let (_, slices) = pm.place(ty).context("placing the incoming vGPU")?;
    let listener = ep.listen().context("listening")?;
    if !json {
        eprintln!("gmig: waiting for a migration on {ep}");
    }
    let conn = listener.accept().context("accepting")?;
    let factory = VgpuFactory::new(gmig_cmdparser::Gen::Gen9, ty, slices, args.ram_mib << 20);
    let (mut vm, rep) = match receive_migration(factory, conn, &engine_cfg(args)?) {
        Ok(Incoming::Running(vm, rep)) => (vm, rep),
        Ok(Incoming::InDoubt { vm, error }) => {
            return Err(in_doubt(
                vm,
                args,
                "destination",
                anyhow!(error).context("incoming migration"),
                json,
            ))
        }
        Err(e) => {
            return Err(Failure::Migration {
                error: anyhow!(e).context("incoming migration; nothing of the vGPU is kept here"),
                fields: side_fields("destination", "vgpu", "none"),
                in_doubt: false,
            });
        }
    };
    let owned = finish_owned(&mut vm);
    if json {
        let mut obj = serde_json::json!({
            "ok": true,
            "role": "destination",
            "vgpu": "running",
            "pages_received": rep.pages,
            "bytes_received": rep.bytes,
            "restore_ms": rep.times.restore_ns as f64 / 1e6,
            "remap_ms": rep.times.remap_ns as f64 / 1e6,
            "phases_ns": rep.phases,
            "slices": [slices.aperture.base.0, slices.hidden.base.0],
        });
        if let Some(o) = obj.as_object_mut() {
            o.extend(owned);
        }
        println!("{obj}");
    } else {
        println!(
            "received {} pages ({}), restored in {:.3} ms + remapped in {:.3} ms onto slices 0x{:x}/0x{:x}; the vGPU runs here: ran {} carried workload(s), {} GPU fault(s), state digest {}",
            rep.pages,
            human_bytes(rep.bytes),
            rep.times.restore_ns as f64 / 1e6,
            rep.times.remap_ns as f64 / 1e6,
            slices.aperture.base.0,
            slices.hidden.base.0,
            owned["carried_workloads_run"],
            owned["gpu_faults"],
            owned["state_digest"].as_str().unwrap_or_default(),
        );
    }
    Ok(())
}

fn source(args: &MigrateArgs, ep: &Endpoint, json: bool) -> Result<(), Failure> {
    let ty = vgpu_type(args)?;
    let mut pm = PartitionManager::new(HostConfig::default()).context("host")?;
    let (_, slices) = pm.place(ty).context("placing the vGPU")?;
    let mut vm = VgpuVm::boot(
        ty,
        slices,
        args.ram_mib << 20,
        profile_of(args.profile),
        WorkloadConfig::default(),
        args.seed,
    )
    .context("booting the guest")?
    .with_gpu_ahead(args.gpu_ahead);
    vm.run_steps(args.frames_before)
        .context("running the guest")?;
    // The destination may still be starting: retry a refused connection for a few seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let conn = loop {
        match ep.connect() {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!("connect: {e}; retrying");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(Failure::Error(anyhow!(e).context("connecting"))),
        }
    };
    let conn: Box<dyn Connection> = match args.link_gbps {
        Some(g) => Box::new(Throttled::new(conn, g).context("link speed")?),
        None => conn,
    };
    let cfg = engine_cfg(args)?;
    let mut handle = source_handle(vm, &cfg).context("migration handle")?;
    let (bar, mut progress) = progress_bar(json);
    let result = migrate_source(&mut handle, conn, &cfg, &mut progress);
    bar.finish_and_clear();
    let frames = handle.device().vm().frames();
    match result {
        Ok(report) => {
            if json {
                let mut obj = serde_json::to_value(&report).context("encoding")?;
                if let Some(m) = obj.as_object_mut() {
                    m.insert("ok".into(), true.into());
                    m.insert("role".into(), "source".into());
                    m.insert("vgpu".into(), "none".into());
                    m.insert("frames".into(), frames.into());
                }
                println!("{obj}");
            } else {
                print_report(&report);
                println!("the vGPU runs on the destination ({frames} guest frames submitted here)");
            }
            Ok(())
        }
        Err(e) if e.in_doubt() => {
            let phase = MigrationPhase::from(&e);
            let vm = handle.into_device().into_vm();
            let mut f = in_doubt(
                vm,
                args,
                "source",
                anyhow!(e).context(format!("migration broke during {phase}, after COMMIT")),
                json,
            );
            if let Failure::Migration { fields, .. } = &mut f {
                fields.insert("frames".into(), frames.into());
            }
            Err(f)
        }
        Err(e) => {
            let phase = MigrationPhase::from(&e);
            let mut vm = handle.into_device().into_vm();
            let mut fields = finish_owned(&mut vm);
            fields.extend(side_fields("source", "vgpu", "running"));
            fields.insert("frames".into(), frames.into());
            if !json {
                eprintln!(
                    "gmig: the vGPU runs on the source again; state digest {}",
                    fields["state_digest"].as_str().unwrap_or_default()
                );
            }
            Err(Failure::Migration {
                error: anyhow!(e).context(format!(
                    "migration failed during {phase}; the vGPU is running on the source again"
                )),
                fields,
                in_doubt: false,
            })
        }
    }
}

/// `gmig migrate --resume FILE`: restore the copy a side in doubt saved, and run it.
fn resume(args: &MigrateArgs, path: &std::path::Path, json: bool) -> Result<(), Failure> {
    let ty = vgpu_type(args)?;
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the checkpoint {}", path.display()))?;
    let mut pm = PartitionManager::new(HostConfig::default()).context("host")?;
    let (_, slices) = pm.place(ty).context("placing the vGPU")?;
    let factory = VgpuFactory::new(gmig_cmdparser::Gen::Gen9, ty, slices, args.ram_mib << 20);
    let mut vm = restore_stream(factory, &bytes, &engine_cfg(args)?)
        .with_context(|| format!("resuming from {}", path.display()))?;
    let owned = finish_owned(&mut vm);
    if json {
        let mut obj = serde_json::json!({ "ok": true, "role": "resumed", "vgpu": "running" });
        if let Some(o) = obj.as_object_mut() {
            o.extend(owned);
        }
        println!("{obj}");
    } else {
        println!(
            "resumed the vGPU from {}: it runs here; ran {} carried workload(s), {} GPU fault(s), state digest {}",
            path.display(),
            owned["carried_workloads_run"],
            owned["gpu_faults"],
            owned["state_digest"].as_str().unwrap_or_default(),
        );
    }
    Ok(())
}
