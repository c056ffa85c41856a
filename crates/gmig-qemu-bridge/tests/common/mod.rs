//! Helpers the tests of the served vGPU share.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::thread::{self, JoinHandle};

use gmig_cmdparser::{Gen, VgpuSlices};
use gmig_qemu_bridge::server::Server;
use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vgpu::gm::{HostConfig, VgpuType};

/// A GEN9 vGPU of type `ty` on `slices` of the default host: no guest-driver model, no pacing
/// (what is queued runs at each BAR0 write), remapping on, a monitor, a stop that runs nothing
/// (`Drain::CARRY`: the work in flight travels); `ram_by_vmm` as given. Tests change the rest
/// with `..`.
pub fn spec(ty: VgpuType, slices: VgpuSlices, ram_by_vmm: bool) -> VgpuSpec {
    VgpuSpec {
        gen: Gen::Gen9,
        ty,
        slices,
        aperture: HostConfig::default().aperture_size,
        profile: None,
        gpu_pace: None,
        ram_by_vmm,
        remap: true,
        max_drain: gmig_core::migration::Drain::CARRY,
        gpu_ahead: 0,
        monitor: true,
    }
}

/// A vfio-user server of `spec` on a socket in a new temporary directory, serving `clients`
/// clients one after the other on a thread that then returns the backend: the socket's path,
/// the thread and the directory (kept for as long as the socket is used).
pub fn serve(
    spec: VgpuSpec,
    clients: usize,
) -> (PathBuf, JoinHandle<VgpuBackend>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gmig.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let t = thread::spawn(move || {
        let mut server = Server::new(VgpuBackend::new(spec));
        for _ in 0..clients {
            let (s, _) = listener.accept().unwrap();
            server.serve(s).unwrap();
        }
        server.into_device()
    });
    (path, t, dir)
}
