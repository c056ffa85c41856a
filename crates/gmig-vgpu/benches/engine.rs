//! The reference engine on a `desktop` frame (1024x768 scanout, 6 windows, cursor): how much CPU
//! one frame costs. `frame_exec` times only the engine running the frame's queued workloads;
//! `frame_total` adds the guest driver building it and the vGPU walking, auditing and shadowing it.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use gmig_vgpu::vgpu::Vgpu;
use gmig_vgpu::workload::{GuestDriver, Profile, WorkloadConfig};

fn setup(profile: Profile) -> (Vgpu, GuestDriver) {
    let mut v = gmig_test_support::lone_vgpu(64 << 20);
    let mut d = GuestDriver::boot(&mut v, profile, WorkloadConfig::default(), 1).unwrap();
    d.run_frames(&mut v, 4).unwrap();
    (v, d)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("desktop");
    let (mut v, mut d) = setup(Profile::Desktop);
    // What a frame does, for the report: pages the engine writes and commands it runs.
    let (mut pages, mut cmds) = (0usize, 0u64);
    for _ in 0..32 {
        d.submit_frame(&mut v).unwrap();
        d.wait(&mut v).unwrap();
        let log = v.take_write_log();
        pages += log.actual.len();
        cmds += log.commands;
    }
    eprintln!(
        "desktop frame (1024x768, 6 windows): {:.0} pages written, {:.1} commands on average",
        pages as f64 / 32.0,
        cmds as f64 / 32.0
    );
    g.bench_function("frame_exec", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                d.submit_frame(&mut v).unwrap();
                let start = Instant::now();
                v.run_until_idle();
                t += start.elapsed();
                let _ = v.take_write_log();
            }
            t
        });
    });
    g.bench_function("frame_total", |b| {
        b.iter(|| {
            d.submit_frame(&mut v).unwrap();
            d.wait(&mut v).unwrap();
            let _ = v.take_write_log();
        });
    });
    assert_eq!(d.failures(), 0);
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
