/*
 * gmig guest GPU driver, the freestanding platform: an x86-64 program that runs in a KVM guest
 * of the gmig VMM as the driver of a gmig (GVT-g style) vGPU. It is built from this source and
 * the core (gpu.c, see gpu.h) at build time (gcc + objcopy) and loaded as a flat image at 1 MiB.
 *
 * The platform part:
 *   - the boot parameters the VMM wrote at 0x7000 and the telemetry page at 0x6000;
 *   - finds the vGPU on PCI bus 0 through configuration mechanism 1 (ports 0xCF8/0xCFC), sizes
 *     and places its BARs above 4 GiB, turns on memory decoding and bus mastering, enables MSI
 *     (it polls all the same);
 *   - RAM is identity-mapped: a layout address is the guest-physical address and the pointer;
 *   - prints on COM1 and halts.
 */

#include "gpu.h"

/* ---- shared with the VMM (crates/gmig-vmm/src/guest.rs) ---- */
#define BOOT_PARAMS 0x7000ULL
#define TELEMETRY 0x6000ULL
#define BOOT_MAGIC 0x746f6f6267696d67ULL /* "gmigboot" */

struct boot_params {
    u64 magic;
    u32 version;
    u32 profile; /* 0: desktop, 1: compute */
    u32 frames;
    u32 width;
    u32 height;
    u32 scratch_pages;
    u64 seed;
    u64 ram_bytes;
    u64 tsc_khz;
    u64 alloc_base;
};

/* ---- port access ---- */
static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline u8 inb(u16 port) {
    u8 v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline u32 inl(u16 port) {
    u32 v;
    __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

/* ---- platform: console (COM1, 16550), halt, time, RAM ---- */
void plat_putc(char c) {
    while (!(inb(0x3f8 + 5) & 0x20)) {
    }
    outb(0x3f8, (u8)c);
}

void plat_halt(void) {
    for (;;)
        __asm__ volatile("hlt");
}

u64 plat_now(void) {
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}

/* Identity-mapped: the layout is guest-physical RAM. */
void *plat_ram(u64 addr, u64 size, int dma) {
    (void)size;
    (void)dma;
    return (void *)addr;
}

u64 plat_dma(u64 addr) { return addr; }

/* ---- platform: PCI ---- */
static u32 cfg_read(u32 dev, u32 off) {
    outl(0xcf8, 0x80000000u | (dev << 11) | (off & 0xfc));
    return inl(0xcfc);
}
static void cfg_write(u32 dev, u32 off, u32 v) {
    outl(0xcf8, 0x80000000u | (dev << 11) | (off & 0xfc));
    outl(0xcfc, v);
}

/* Sizes 64-bit memory BAR `off` and places it at the next address at or above *next that is
 * aligned to its size. */
static u64 place_bar(u32 dev, u32 off, u64 *next) {
    cfg_write(dev, off, 0xffffffffu);
    cfg_write(dev, off + 4, 0xffffffffu);
    u64 mask = ((u64)cfg_read(dev, off + 4) << 32) | (cfg_read(dev, off) & ~0xfu);
    u64 size = ~mask + 1;
    if (!size || (size & (size - 1)))
        gpu_fail("BAR size");
    u64 base = (*next + size - 1) & ~(size - 1);
    cfg_write(dev, off, (u32)base);
    cfg_write(dev, off + 4, (u32)(base >> 32));
    *next = base + size;
    return base;
}

void plat_find_gpu(void) {
    for (u32 dev = 0; dev < 32; dev++) {
        u32 id = cfg_read(dev, 0);
        if ((id & 0xffff) != 0x8086)
            continue;
        if ((cfg_read(dev, 8) >> 16) != 0x0300)
            continue;
        u64 next = 0x100000000ULL; /* above 4 GiB, identity-mapped by the VMM */
        u64 bar2 = place_bar(dev, 0x18, &next); /* the aperture is the larger: place it first */
        bar0 = place_bar(dev, 0x10, &next);
        cfg_write(dev, 4, cfg_read(dev, 4) | 0x6); /* memory decoding, bus master */
        /* MSI (capability at 0x90, as the config space's list says): the LAPIC's address,
         * vector 0x41, enabled. The VMM counts them; this guest polls. */
        u32 cap = cfg_read(dev, 0x34) & 0xfc;
        if (cap && (cfg_read(dev, cap) & 0xff) == 0x05) {
            cfg_write(dev, cap + 4, 0xfee00000u);
            cfg_write(dev, cap + 8, 0);
            cfg_write(dev, cap + 12, 0x41);
            cfg_write(dev, cap, cfg_read(dev, cap) | (1u << 16));
        }
        con_puts("gpu: ");
        con_puthex(id);
        con_puts(" bar0 ");
        con_puthex(bar0);
        con_puts(" bar2 ");
        con_puthex(bar2);
        con_puts("\n");
        return;
    }
    gpu_fail("no Intel display controller on bus 0");
}

/* ---- main ---- */
void guest_main(void) {
    const struct boot_params *bp = (const struct boot_params *)BOOT_PARAMS;
    if (bp->magic != BOOT_MAGIC || bp->version != 1)
        gpu_fail("no boot parameters");
    struct gpu_params p = {
        .profile = bp->profile,
        .frames = bp->frames,
        .width = bp->width,
        .height = bp->height,
        .scratch_pages = bp->scratch_pages,
        .seed = bp->seed,
        .ram_bytes = bp->ram_bytes,
        .tsc_khz = bp->tsc_khz,
        .alloc_base = bp->alloc_base,
    };
    gpu_main(&p, (volatile struct telemetry *)TELEMETRY);
}
