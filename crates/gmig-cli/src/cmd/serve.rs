//! `gmig serve`: the reference vGPU as a vfio-user PCI device on a UNIX socket.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;

use anyhow::{anyhow, Context};
use gmig_cmdparser::Gen;
use gmig_core::migration::{MigrationConfig, Policy};
use gmig_qemu_bridge::server::{DmaLogControl, NegativeControls, Server};
use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec, GUEST_GPU_PACE};
use gmig_vgpu::gm::{slot_slices, HostConfig};
use gmig_vgpu::migratable::parse_vgpu_type;

use crate::cli::ServeArgs;
use crate::cmd::migrate::profile_of;
use crate::exit::Failure;
use crate::slots::Record;

fn event(json: bool, kind: &str, detail: &str) {
    if json {
        println!("{}", serde_json::json!({ "event": kind, "detail": detail }));
    } else {
        eprintln!("gmig serve: {kind}: {detail}");
    }
}

/// Run `gmig serve`.
pub fn run(args: &ServeArgs, json: bool) -> Result<(), Failure> {
    let ty = parse_vgpu_type(&args.vgpu_type)
        .ok_or_else(|| anyhow!("unknown vGPU type `{}`", args.vgpu_type))?;
    let host = HostConfig::default();
    // `_claim`, held for as long as the server runs: the registry's record of its slices.
    let (slices, _claim) = match &args.slots {
        None => (
            slot_slices(host, ty, args.slot)
                .with_context(|| format!("placing the vGPU in slot {}", args.slot))?,
            None,
        ),
        Some(dir) => {
            let claim = crate::slots::claim(dir, host, ty, args.slot, &args.socket)?;
            let why = if claim.displaced_by.is_empty() {
                String::new()
            } else {
                let held: Vec<String> = claim.displaced_by.iter().map(Record::describe).collect();
                format!(
                    " (slot {} overlaps the running vGPU of {})",
                    args.slot,
                    held.join(", ")
                )
            };
            event(
                json,
                "placed",
                &format!(
                    "slot {}: aperture {:#x}, hidden {:#x}{why}",
                    claim.slot, claim.slices.aperture.base.0, claim.slices.hidden.base.0
                ),
            );
            (claim.slices, Some(claim))
        }
    };
    // A socket file left by an earlier run is replaced; any other file is not touched.
    if let Ok(meta) = std::fs::symlink_metadata(&args.socket) {
        if !meta.file_type().is_socket() {
            return Err(anyhow!("{} exists and is not a socket", args.socket.display()).into());
        }
        std::fs::remove_file(&args.socket)
            .with_context(|| format!("removing the old {}", args.socket.display()))?;
    }
    let listener = UnixListener::bind(&args.socket)
        .with_context(|| format!("listening on {}", args.socket.display()))?;
    let spec = VgpuSpec {
        gen: Gen::Gen9,
        ty,
        slices,
        aperture: host.aperture_size,
        profile: args.profile.map(|p| (profile_of(p), 1)),
        // A real guest polls: its GPU keeps pace with its register accesses.
        gpu_pace: args.profile.is_none().then_some(GUEST_GPU_PACE),
        ram_by_vmm: args.ram_by_vmm,
        remap: !args.x_no_remap,
        max_drain: crate::cli::drain(
            args.max_drain,
            args.max_drain_ms,
            MigrationConfig::new(Policy::OneShotNarrow).max_drain,
        )?,
        gpu_ahead: 0,
        monitor: !args.x_no_monitor,
    };
    event(
        json,
        "listening",
        &format!("{} ({} vGPU)", args.socket.display(), args.vgpu_type),
    );
    let dma_log = match args.x_dma_log.as_str() {
        "on" => DmaLogControl::On,
        "off" => DmaLogControl::Off,
        "blind" => DmaLogControl::Blind,
        other => return Err(anyhow!("--x-dma-log: on, off or blind, not `{other}`").into()),
    };
    let mut backend = VgpuBackend::new(spec);
    if let Some(path) = &args.screen {
        backend = backend.with_screen(path.clone());
    }
    let mut server = Server::new(backend);
    server.set_poll(Some(std::time::Duration::from_micros(args.poll_us)));
    server.set_negative_controls(NegativeControls {
        dma_log,
        no_migration: args.x_no_migration,
    });
    let mut served = 0u64;
    while args.clients.is_none_or(|n| served < n) {
        let (stream, _) = listener.accept().context("accepting a client")?;
        served += 1;
        event(json, "connected", &format!("client {served}"));
        match server.serve(stream) {
            Ok(()) => event(json, "disconnected", &format!("client {served}")),
            Err(e) => event(json, "dropped", &format!("client {served}: {e}")),
        }
    }
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}
