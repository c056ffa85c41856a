//! Decode + audit + remap throughput over a realistic ring + batch mix, in GB/s of command bytes.
//!
//! The mix: a render ring of MI commands and batch starts, a privileged (GGTT) render batch of
//! 3D state, draws, PIPE_CONTROL post-syncs, register loads and stores, and a blitter batch of
//! XY blits. Run: `cargo bench -p gmig-cmdparser --bench throughput`.
//!
//! Two groups: `cmdparser` measures wall-clock time; `cmdparser-cpu` measures the benchmark
//! thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), which stays meaningful on a loaded machine where
//! the thread is descheduled part of the time. Both report decimal GB/s of command bytes.
//!
//! The `walk/...` benchmarks run the walker over memory (ring → privileged batch), on a batch that
//! adds iris-style draws and dispatches (binding tables, surface states, kernels in a GGTT heap)
//! to the draws above: `walk/walk-only` fetches and decodes every command and does nothing with
//! it (what the walker itself costs); `walk/audit-commands` audits the commands only;
//! `walk/audit-indirect` (`audit_walk`) also follows the indirect state and audits every surface
//! state; `walk/remap-indirect` (`remap_walk`) rebases commands and surface states there and
//! back. The ratio of audit-commands to audit-indirect is what the indirect walk costs.

use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gmig_cmdparser::aub::fixture::iris::{self, IrisLayout};
use gmig_cmdparser::build::{self, Rect};
use gmig_cmdparser::{
    audit, audit_buffer, audit_walk, by_name, remap_in_place, remap_walk, walk, AddressSpace,
    BatchContext, Budget, Decoder, Engine, Gen, GgttOffset, GpuMemory, GpuMemoryMut, MemoryError,
    PageMemory, RingSpan, Slice, SliceMove, VgpuSlices,
};

const MIB: u64 = 1 << 20;
const GGTT: AddressSpace = AddressSpace::Ggtt;

fn slices(ap: u64, hi: u64) -> VgpuSlices {
    VgpuSlices {
        aperture: Slice::new(GgttOffset(ap), 128 * MIB).unwrap(),
        hidden: Slice::new(GgttOffset(hi), 512 * MIB).unwrap(),
    }
}

fn state(gen: Gen, name: &str, len: u32) -> Vec<u32> {
    let d = by_name(gen, Engine::Render, name).unwrap();
    let mut v = vec![0u32; len as usize];
    v[0] = d.header(len);
    v
}

/// One draw's worth of 3D state and the draw (about 1 KiB).
fn draw(gen: Gen, i: u64) -> Vec<u32> {
    let hid = 0x4000_0000 + (i % 1024) * 0x10000;
    let mut vb = state(gen, "3DSTATE_VERTEX_BUFFERS", 9);
    for (k, base) in [(1usize, hid), (5, hid + 0x8000)] {
        vb[k] = (k as u32) << 26 | 64;
        vb[k + 1] = base as u32;
        vb[k + 2] = 0;
        vb[k + 3] = 0x4000;
    }
    let mut ib = state(gen, "3DSTATE_INDEX_BUFFER", 5);
    ib[2] = (hid + 0xc000) as u32;
    ib[4] = 0x1000;
    let mut depth = state(gen, "3DSTATE_DEPTH_BUFFER", 8);
    depth[2] = 0x0800_0000 + (i % 64) as u32 * 0x10000;
    [
        state(gen, "3DSTATE_VS", 9),
        state(gen, "3DSTATE_HS", 9),
        state(gen, "3DSTATE_DS", 11),
        state(gen, "3DSTATE_GS", 10),
        state(gen, "3DSTATE_PS", 12),
        state(gen, "3DSTATE_PS_EXTRA", 2),
        state(gen, "3DSTATE_SBE", 6),
        state(gen, "3DSTATE_RASTER", 5),
        state(gen, "3DSTATE_CONSTANT_VS", 11),
        state(gen, "3DSTATE_CONSTANT_PS", 11),
        state(gen, "3DSTATE_BINDING_TABLE_POINTERS_PS", 2),
        state(gen, "3DSTATE_SAMPLER_STATE_POINTERS_PS", 2),
        state(gen, "3DSTATE_VIEWPORT_STATE_POINTERS_CC", 2),
        state(gen, "3DSTATE_BLEND_STATE_POINTERS", 2),
        state(gen, "3DSTATE_VERTEX_ELEMENTS", 5),
        state(gen, "3DSTATE_VF_TOPOLOGY", 2),
        vb,
        ib,
        depth,
        build::mi_load_register_imm(&[(0x2600, i as u32), (0x2604, 0)]),
        build::primitive_3d(3 * (i as u32 % 100 + 1)),
        build::pipe_control(None),
        build::pipe_control(Some((GGTT, 0x0400_0000 + (i % 4096) * 8, i))),
        build::mi_store_register_mem(GGTT, 0x2358, 0x0400_8000 + (i % 1024) * 4),
    ]
    .concat()
}

fn render_batch(gen: Gen) -> Vec<u32> {
    let mut v = build::state_base_address(0x0410_0000, 0x4100_0000);
    for i in 0..256 {
        v.extend(draw(gen, i));
    }
    v.extend(build::mi_batch_buffer_end());
    v
}

/// Where the iris heaps of the indirect batch lie (hidden slice).
const IRIS: IrisLayout = IrisLayout::packed(0x5000_0000);
const RING_AT: u64 = 0x0400_0000;
const BATCH_AT: u64 = 0x0410_0000;

/// The render batch's draws, each followed by an iris-style draw over the heaps (whole pipeline
/// state, binding table, surface states, kernels), and a dispatch every fourth draw.
fn indirect_batch(gen: Gen) -> Vec<u32> {
    let mut v = Vec::new();
    for i in 0..128 {
        v.extend(draw(gen, i));
        v.extend(iris::draw_batch(gen, &IRIS));
        if i % 4 == 0 {
            v.extend(iris::dispatch_batch(gen, &IRIS));
        }
    }
    v.extend(build::mi_batch_buffer_end());
    v
}

/// GGTT memory in which both slice layouts of `mv` name the same pages, so a remap and its
/// inverse can follow each other on one copy.
struct Aliased {
    mem: PageMemory,
    back: SliceMove,
}

impl Aliased {
    fn at(&self, space: AddressSpace, addr: u64) -> u64 {
        match space {
            AddressSpace::Ggtt => self.back.rebase(GgttOffset(addr)).map_or(addr, |g| g.0),
            AddressSpace::Ppgtt => addr,
        }
    }
}

impl GpuMemory for Aliased {
    fn read(&self, space: AddressSpace, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        self.mem.read(space, self.at(space, addr), out)
    }
}

impl GpuMemoryMut for Aliased {
    fn write(&mut self, space: AddressSpace, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let a = self.at(space, addr);
        self.mem.write(space, a, data)
    }
}

/// A ring that starts the indirect batch, in memory with the iris heaps.
fn indirect_memory(gen: Gen, mv: &SliceMove) -> (Aliased, RingSpan, u64) {
    let mut mem = PageMemory::new();
    let batch = indirect_batch(gen);
    for (at, d) in iris::heaps(gen, &IRIS) {
        mem.put_dwords(GGTT, at, &d).unwrap();
    }
    mem.put_dwords(GGTT, BATCH_AT, &batch).unwrap();
    let ring = [
        build::mi_batch_buffer_start(GGTT, BATCH_AT, false),
        build::mi_noop(),
    ]
    .concat();
    mem.put_dwords(GGTT, RING_AT, &ring).unwrap();
    let span = RingSpan {
        start: GgttOffset(RING_AT),
        size: 4096,
        head: 0,
        tail: ring.len() as u64 * 4,
    };
    let bytes = (batch.len() + ring.len()) as u64 * 4;
    (
        Aliased {
            mem,
            back: mv.inverse(),
        },
        span,
        bytes,
    )
}

fn blit_batch() -> Vec<u32> {
    let mut v = Vec::new();
    for i in 0..2048u64 {
        let r = Rect {
            x1: (i % 64) as u16,
            y1: (i % 32) as u16,
            x2: 64 + (i % 64) as u16,
            y2: 32 + (i % 32) as u16,
        };
        v.extend(build::xy_color_blt(
            0x0400_0000 + (i % 16) * MIB,
            4096,
            4,
            r,
            i as u32,
        ));
        v.extend(build::xy_src_copy_blt(
            0x4000_0000 + (i % 64) * MIB,
            4096,
            r,
            0x0400_0000 + (i % 16) * MIB,
            4096,
            0,
            0,
            4,
        ));
        v.extend(build::xy_fast_copy_blt(
            0x4400_0000,
            2048,
            r,
            0x0500_0000,
            2048,
            0,
            0,
            4,
        ));
        v.extend(build::mi_flush_dw(Some((GGTT, 0x0400_9000, i))));
    }
    v.extend(build::mi_batch_buffer_end());
    v
}

fn ring() -> Vec<u32> {
    let mut v = Vec::new();
    for i in 0..512u64 {
        v.extend(build::mi_batch_buffer_start(
            GGTT,
            0x4800_0000 + i * 0x1000,
            false,
        ));
        v.extend(build::pipe_control(Some((GGTT, 0x0400_a000, i))));
        v.extend(build::mi_store_data_imm(GGTT, 0x0400_b000, &[i as u32]));
        v.extend(build::mi_user_interrupt());
        v.extend(build::mi_noop());
    }
    v
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Criterion measurement: thread CPU time.
struct ThreadCpu;

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        for v in values {
            *v /= 1e3;
        }
        "µs (cpu)"
    }

    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let bytes = match *t {
            Throughput::Bytes(b) | Throughput::BytesDecimal(b) => b as f64,
            Throughput::Elements(e) => e as f64,
            Throughput::Bits(b) => b as f64 / 8.0,
        };
        for v in values {
            *v = bytes / *v; // bytes per ns = GB/s
        }
        "GB/s (cpu)"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }

    fn end(&self, i: u64) -> u64 {
        thread_cpu_ns().saturating_sub(i)
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

fn bench(c: &mut Criterion) {
    run(c, "cmdparser");
}

fn bench_cpu(c: &mut Criterion<ThreadCpu>) {
    run(c, "cmdparser-cpu");
}

fn run<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let gen = Gen::Gen9;
    let mv = SliceMove::new(
        slices(0x0400_0000, 0x4000_0000),
        slices(0x1000_0000, 0x8000_0000),
    )
    .unwrap();
    let back = mv.inverse();
    let ctx = BatchContext::RING;
    let mix: Vec<(Engine, Vec<u32>)> = vec![
        (Engine::Render, ring()),
        (Engine::Render, render_batch(gen)),
        (Engine::Blitter, blit_batch()),
    ];
    let bytes: u64 = mix.iter().map(|(_, b)| b.len() as u64 * 4).sum();
    // Sanity: the mix audits and remaps.
    for (e, b) in &mix {
        audit_buffer(gen, *e, b, &ctx, &mv.from).unwrap();
    }
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::BytesDecimal(bytes));
    g.bench_function("decode", |bch| {
        bch.iter(|| {
            let mut n = 0usize;
            for (e, b) in &mix {
                for cmd in Decoder::new(gen, *e, black_box(b)) {
                    n += cmd.unwrap().len();
                }
            }
            n
        });
    });
    g.bench_function("decode+audit", |bch| {
        bch.iter(|| {
            for (e, b) in &mix {
                audit_buffer(gen, *e, black_box(b), &ctx, &mv.from).unwrap();
            }
        });
    });
    let mut bufs: Vec<(Engine, Vec<u32>)> = mix.clone();
    let mut there = true;
    g.bench_function("decode+audit+remap", |bch| {
        bch.iter(|| {
            let m = if there { &mv } else { &back };
            for (e, b) in &mut bufs {
                remap_in_place(gen, *e, black_box(b), &ctx, m).unwrap();
            }
            there = !there;
        });
    });
    g.finish();

    let (mut mem, span, bytes) = indirect_memory(gen, &mv);
    let budget = Budget::default();
    let commands_only = |mem: &Aliased| {
        walk(gen, Engine::Render, mem, span, budget, &mut |w| {
            audit(&w.cmd, &w.ctx, &mv.from).map_err(|err| gmig_cmdparser::WalkError::Audit {
                space: w.space,
                addr: w.addr,
                err,
            })
        })
        .unwrap()
    };
    // Sanity: the surface states are found, audited and counted.
    let rep = audit_walk(gen, Engine::Render, &mem, span, budget, &mv.from).unwrap();
    assert!(rep.ggtt_uses > 0);
    commands_only(&mem);
    let mut g = c.benchmark_group(format!("{group}/walk"));
    g.throughput(Throughput::BytesDecimal(bytes));
    g.bench_function("walk-only", |bch| {
        bch.iter(|| {
            walk(
                gen,
                Engine::Render,
                black_box(&mem),
                span,
                budget,
                &mut |_| Ok(()),
            )
            .unwrap()
        });
    });
    g.bench_function("audit-commands", |bch| {
        bch.iter(|| commands_only(black_box(&mem)));
    });
    g.bench_function("audit-indirect", |bch| {
        bch.iter(|| {
            audit_walk(gen, Engine::Render, black_box(&mem), span, budget, &mv.from).unwrap()
        });
    });
    let mut there = true;
    g.bench_function("remap-indirect", |bch| {
        bch.iter(|| {
            let m = if there { &mv } else { &back };
            remap_walk(gen, Engine::Render, black_box(&mut mem), span, budget, m).unwrap();
            there = !there;
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_group! {
    name = benches_cpu;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench_cpu
}
criterion_main!(benches, benches_cpu);
