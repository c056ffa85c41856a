//! Downtime per policy (criterion measures the engine's own downtime figure through
//! `iter_custom`): the reference vGPU under `desktop` (1024×768), 64 MiB of guest RAM, migrated
//! over an in-memory connection, both ends in this process.

use std::thread;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use gmig_core::migration::{
    migrate_destination, migrate_source, source_handle, MigrationConfig, Policy,
};
use gmig_core::transport::mem_pair;
use gmig_vgpu::gm::{HostConfig, PartitionManager, VgpuType};
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
use gmig_vgpu::workload::{Profile, WorkloadConfig};

const RAM: u64 = 64 << 20;

fn downtime(policy: Policy) -> Duration {
    let mut src = PartitionManager::new(HostConfig::default()).expect("host");
    let (_, s) = src.place(VgpuType::V5_8).expect("place");
    let mut dst = PartitionManager::new(HostConfig::default()).expect("host");
    dst.place(VgpuType::V5_4).expect("place");
    let (_, d) = dst.place_avoiding(VgpuType::V5_8, Some(&s)).expect("place");
    let mut vm = VgpuVm::boot(
        VgpuType::V5_8,
        s,
        RAM,
        Profile::Desktop,
        WorkloadConfig::default(),
        1,
    )
    .expect("boot");
    vm.run_steps(5).expect("run");
    let mut cfg = MigrationConfig::new(policy);
    cfg.step_every_batches = 8;
    let factory = VgpuFactory::new(vm.vgpu().config().gen, VgpuType::V5_8, d, RAM);
    let (a, b) = mem_pair(1 << 20);
    let c2 = cfg.clone();
    // The migrated VM comes back to be dropped after the source is done: unmapping its memory
    // earlier would contend for this process's address space with the source's switch-over.
    let dest = thread::spawn(move || migrate_destination(factory, b, &c2));
    let mut h = source_handle(vm, &cfg).expect("handle");
    let r = migrate_source(&mut h, a, &cfg, &mut |_| {}).expect("migration");
    drop(dest.join().expect("thread").expect("destination"));
    Duration::from_secs_f64(r.downtime_ms / 1e3)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("downtime_desktop_64MiB");
    g.sample_size(10);
    for policy in Policy::ALL {
        g.bench_function(policy.name(), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| downtime(policy)).sum());
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
