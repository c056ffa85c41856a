/*
 * gmig guest GPU driver: the platform-independent core (gpu.c) and the small interface each
 * platform provides. Two platforms use it:
 *   - driver.c: the freestanding guest of the gmig VMM (port-I/O PCI, COM1, identity-mapped RAM,
 *     boot parameters in a page at 0x7000);
 *   - linux.c: a static Linux program (`gmig-guest`) that drives the same vGPU attached to a
 *     QEMU guest (sysfs PCI, mmap of the BAR resource files, pinned RAM found in
 *     /proc/self/pagemap, stdout, command-line parameters).
 * Both print the same lines and the same checksum for the same parameters.
 *
 * RAM: the core allocates in "layout" addresses, the freestanding guest's guest-physical
 * addresses: from alloc_base up to ram_bytes. The checksum folds some of them (the CPU's scratch
 * pages hold their own address), so the Linux program keeps the same layout and asks its
 * platform for a CPU pointer (plat_ram) and a bus address per page (plat_dma).
 */
#ifndef GMIG_GPU_H
#define GMIG_GPU_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

/* ---- shared with the VMM (crates/gmig-vmm/src/guest.rs) ---- */
#define TELEMETRY_MAGIC 0x6d6c657467696d67ULL /* "gmigtelm" */

struct telemetry {
    u64 magic;
    u64 last_tsc;
    u64 max_gap_tsc;
    u64 frames_done;
    u64 phase; /* 1: PCI, 2: GGTT setup, 3: frames, 4: done */
    u64 spins; /* polls of the current wait: how many depends on when the GPU ran */
    /* Rates for a platform that reports them (the Linux program); like spins and the TSC they
       differ from run to run, so they live here, outside what two runs must agree on. */
    u64 mmio;            /* BAR0 accesses so far (each one trap to the VMM) */
    u64 frames_t0;       /* plat_now() when the frames started, and when they ended */
    u64 frames_t1;
    u64 frames_mmio0;    /* mmio then */
    u64 frames_mmio1;
};

/* What the driver does (the freestanding guest's boot parameters). */
struct gpu_params {
    u32 profile; /* 0: desktop, 1: compute */
    u32 frames;
    u32 width;
    u32 height;
    u32 scratch_pages;
    u64 seed;
    u64 ram_bytes;  /* end of the RAM layout */
    u64 tsc_khz;    /* plat_now() ticks per millisecond */
    u64 alloc_base; /* start of the RAM layout the driver allocates from */
};

#define PAGE 4096ULL

/* ---- device access (BAR0 is mapped at the CPU address `bar0`) ---- */
/* Device accesses are also compiler barriers: RAM the GPU will read is written before them. */
#define barrier() __asm__ volatile("" ::: "memory")
/* Where BAR0 accesses are counted: the telemetry's `mmio` once gpu_main runs. */
extern volatile u64 *mmio_count;
static inline u32 rd32(u64 a) {
    (*mmio_count)++;
    barrier();
    u32 v = *(volatile u32 *)a;
    barrier();
    return v;
}
static inline u64 rd64(u64 a) {
    (*mmio_count)++;
    barrier();
    u64 v = *(volatile u64 *)a;
    barrier();
    return v;
}
static inline void wr32(u64 a, u32 v) {
    (*mmio_count)++;
    barrier();
    *(volatile u32 *)a = v;
    barrier();
}
static inline void wr64(u64 a, u64 v) {
    (*mmio_count)++;
    barrier();
    *(volatile u64 *)a = v;
    barrier();
}

/* ---- the core (gpu.c) ---- */
/* CPU address of BAR0 (registers; GGTT at +0x800000): set by plat_find_gpu. */
extern u64 bar0;
/* Runs the driver: banner, plat_find_gpu, PV info, context, frames, checksum. `tel` is where it
 * keeps its telemetry (the freestanding guest's telemetry page). Returns the failure count. */
u64 gpu_main(const struct gpu_params *p, volatile struct telemetry *tel);
/* Console output, through plat_putc. */
void con_puts(const char *s);
void con_puthex(u64 v);
void con_putdec(u64 v);
/* Prints "guest error: <why>" and stops (plat_halt). */
__attribute__((noreturn)) void gpu_fail(const char *why);

/* ---- what each platform provides ---- */
/* Writes one console character. */
void plat_putc(char c);
/* Stops after an error; does not return. */
__attribute__((noreturn)) void plat_halt(void);
/* Finds the vGPU, enables memory decoding and bus mastering, maps BAR0 (sets `bar0`) and prints
 * the "gpu: <id> bar0 <addr> bar2 <addr>" line; calls gpu_fail when there is none. */
void plat_find_gpu(void);
/* A timestamp in units of 1/tsc_khz ms (telemetry only). */
u64 plat_now(void);
/* The CPU pointer of layout RAM [addr, addr + size). `dma`: the GPU will access it (pin it:
 * every page stays at the bus address plat_dma gives). */
void *plat_ram(u64 addr, u64 size, int dma);
/* The bus (guest-physical) address of the pinned layout page at `addr`. */
u64 plat_dma(u64 addr);

#endif
