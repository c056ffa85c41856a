/*
 * gmig guest GPU driver, the PVH platform: the driver's core (gpu.c) as an ELF that
 * cloud-hypervisor boots with `--kernel` (start-pvh.S enters long mode and calls pvh_main).
 *
 * The platform part:
 *   - parameters from the kernel command line (`--cmdline`), with the Linux program's option
 *     names and defaults (linux.c): `--profile desktop|compute --frames N --width W --height H
 *     --scratch-pages N --seed S --ram-mib M --tsc-khz K`, NAME VALUE or NAME=VALUE (the TSC's
 *     rate, for the telemetry line only, defaults to KVM's timing leaf 0x40000010);
 *   - finds the vGPU on PCI bus 0 through configuration mechanism 1 (ports 0xCF8/0xCFC), keeps
 *     the BAR addresses the VMM assigned, sizes them, maps them (identity, 2 MiB pages), turns on
 *     memory decoding and bus mastering and enables MSI (it polls all the same);
 *   - RAM below 4 GiB is identity-mapped: a layout address is the guest-physical address;
 *   - prints on COM1 (the VMM's 16550 at 0x3F8) and, at the end or on an error, powers the VM
 *     off through cloud-hypervisor's ACPI shutdown port (0x600, S5).
 * It prints the lines and the checksum `gmig vm run` prints for the same parameters.
 */

#include "gpu.h"

#define ALLOC_BASE (4ULL << 20)
#define HVM_START_MAGIC 0x336ec578u

/* xen/include/public/arch-x86/hvm/start_info.h */
struct hvm_start_info {
    u32 magic;
    u32 version;
    u32 flags;
    u32 nr_modules;
    u64 modlist_paddr;
    u64 cmdline_paddr;
    u64 rsdp_paddr;
    u64 memmap_paddr;
    u32 memmap_entries;
    u32 reserved;
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

/* ---- platform: console, power-off, time, RAM ---- */
void plat_putc(char c) {
    while (!(inb(0x3f8 + 5) & 0x20)) {
    }
    outb(0x3f8, (u8)c);
}

/* cloud-hypervisor's ACPI shutdown device: SLP_TYP 5 (S5) | SLP_EN. */
void plat_halt(void) {
    outb(0x600, (5 << 2) | (1 << 5));
    for (;;)
        __asm__ volatile("cli; hlt");
}

u64 plat_now(void) {
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}

void *plat_ram(u64 addr, u64 size, int dma) {
    (void)size;
    (void)dma;
    return (void *)addr;
}

u64 plat_dma(u64 addr) { return addr; }

/* The TSC's kHz from KVM's timing leaf (0x40000010), which cloud-hypervisor fills; 0 if absent. */
static u64 tsc_khz_from_cpuid(void) {
    u32 a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x40000000u), "c"(0));
    if (a < 0x40000010u)
        return 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x40000010u), "c"(0));
    return a;
}

/* ---- page tables: start-pvh.S maps 0-4 GiB; BARs elsewhere get 2 MiB pages from a pool ---- */
extern u64 pvh_pml4[512];
#define POOL_PAGES 24
static u64 pool[POOL_PAGES][512] __attribute__((aligned(4096)));
static u32 pool_used;

static u64 *table_below(u64 *table, u32 index) {
    if (!(table[index] & 1)) {
        if (pool_used == POOL_PAGES)
            gpu_fail("out of page-table pages for the BARs");
        u64 *t = pool[pool_used++];
        table[index] = (u64)t | 3;
    }
    return (u64 *)(table[index] & 0x000ffffffffff000ULL);
}

static void map_identity(u64 base, u64 size) {
    for (u64 a = base & ~0x1fffffULL; a < base + size; a += 0x200000) {
        u64 *pdpt = table_below(pvh_pml4, (a >> 39) & 511);
        u64 *pd = table_below(pdpt, (a >> 30) & 511);
        pd[(a >> 21) & 511] = a | 0x83;
    }
    u64 cr3;
    __asm__ volatile("mov %%cr3, %0; mov %0, %%cr3" : "=r"(cr3)::"memory");
}

/* ---- platform: PCI ---- */
static u32 cfg_read(u32 dev, u32 off) {
    outl(0xcf8, 0x80000000u | (dev << 11) | (off & 0xfc));
    return inl(0xcfc);
}
static void cfg_write(u32 dev, u32 off, u32 v) {
    outl(0xcf8, 0x80000000u | (dev << 11) | (off & 0xfc));
    outl(0xcfc, v);
}

/* The address the VMM gave 64-bit memory BAR `off`; its size by the usual probe (all ones,
 * read back, restore), with decoding off. */
static u64 bar(u32 dev, u32 off, u64 *size) {
    u32 lo = cfg_read(dev, off), hi = cfg_read(dev, off + 4);
    if ((lo & 0x7) != 0x4)
        gpu_fail("BAR is not a 64-bit memory BAR");
    cfg_write(dev, off, 0xffffffffu);
    cfg_write(dev, off + 4, 0xffffffffu);
    u64 mask = ((u64)cfg_read(dev, off + 4) << 32) | (cfg_read(dev, off) & ~0xfu);
    cfg_write(dev, off, lo);
    cfg_write(dev, off + 4, hi);
    *size = ~mask + 1;
    if (!*size || (*size & (*size - 1)))
        gpu_fail("BAR size");
    u64 base = ((u64)hi << 32) | (lo & ~0xfu);
    if (!base)
        gpu_fail("BAR not assigned by the VMM");
    return base;
}

void plat_find_gpu(void) {
    for (u32 dev = 0; dev < 32; dev++) {
        u32 id = cfg_read(dev, 0);
        if ((id & 0xffff) != 0x8086)
            continue;
        if ((cfg_read(dev, 8) >> 16) != 0x0300)
            continue;
        cfg_write(dev, 4, cfg_read(dev, 4) & ~0x7u);
        u64 size0, size2;
        bar0 = bar(dev, 0x10, &size0);
        u64 bar2 = bar(dev, 0x18, &size2);
        map_identity(bar0, size0);
        map_identity(bar2, size2);
        cfg_write(dev, 4, cfg_read(dev, 4) | 0x6); /* memory decoding, bus master */
        /* MSI (capability at 0x90, as the config space's list says): the LAPIC's address,
         * vector 0x41, enabled. Interrupts stay off in this guest; it polls. */
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

/* ---- parameters ---- */
static int str_eq(const char *a, const char *b) {
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

/* Parses an unsigned decimal or 0x hexadecimal number up to `max`; fails the guest otherwise. */
static u64 number(const char *opt, const char *v, u64 max) {
    u64 n = 0, base = 10;
    int digits = 0;
    if (v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
        base = 16;
        v += 2;
    }
    for (; *v; v++, digits++) {
        u64 d;
        if (*v >= '0' && *v <= '9')
            d = (u64)(*v - '0');
        else if (base == 16 && *v >= 'a' && *v <= 'f')
            d = (u64)(*v - 'a' + 10);
        else if (base == 16 && *v >= 'A' && *v <= 'F')
            d = (u64)(*v - 'A' + 10);
        else
            d = base;
        if (d >= base || n > (max - d) / base) {
            con_puts("guest: bad value for ");
            con_puts(opt);
            con_puts("\n");
            gpu_fail("bad command line");
        }
        n = n * base + d;
    }
    if (!digits)
        gpu_fail("bad command line: empty number");
    return n;
}

#define MAX_WORDS 32
#define CMDLINE_MAX 1024
static char cmdline[CMDLINE_MAX];
static char *words[MAX_WORDS];
static struct telemetry telemetry;

/* Splits the command line (copied out of the VMM's page: the driver allocates above it) at
 * spaces and '='. */
static u32 split(u64 paddr) {
    const char *src = (const char *)paddr;
    u32 n = 0, i = 0;
    if (!paddr)
        return 0;
    for (; i + 1 < CMDLINE_MAX && src[i]; i++)
        cmdline[i] = src[i] == '=' ? ' ' : src[i];
    cmdline[i] = 0;
    for (char *p = cmdline; *p;) {
        while (*p == ' ')
            *p++ = 0;
        if (!*p)
            break;
        if (n == MAX_WORDS)
            gpu_fail("command line: too many words");
        words[n++] = p;
        while (*p && *p != ' ')
            p++;
    }
    return n;
}

void pvh_main(const struct hvm_start_info *si) {
    struct gpu_params p = {
        .profile = 0,
        .frames = 48,
        .width = 256,
        .height = 192,
        .scratch_pages = 64,
        .seed = 1,
        .ram_bytes = 64ULL << 20,
        .tsc_khz = tsc_khz_from_cpuid(),
        .alloc_base = ALLOC_BASE,
    };
    if (si->magic != HVM_START_MAGIC)
        gpu_fail("no PVH start info");
    u32 n = split(si->cmdline_paddr);
    for (u32 i = 0; i < n; i += 2) {
        const char *opt = words[i];
        if (i + 1 >= n) {
            con_puts("guest: ");
            con_puts(opt);
            con_puts(" needs a value\n");
            gpu_fail("bad command line");
        }
        const char *val = words[i + 1];
        if (str_eq(opt, "--profile")) {
            if (str_eq(val, "desktop"))
                p.profile = 0;
            else if (str_eq(val, "compute"))
                p.profile = 1;
            else
                gpu_fail("unknown profile (desktop, compute)");
        } else if (str_eq(opt, "--frames"))
            p.frames = (u32)number(opt, val, 0xffffffffu);
        else if (str_eq(opt, "--width"))
            p.width = (u32)number(opt, val, 8192);
        else if (str_eq(opt, "--height"))
            p.height = (u32)number(opt, val, 8192);
        else if (str_eq(opt, "--scratch-pages"))
            p.scratch_pages = (u32)number(opt, val, 0xffffffffu);
        else if (str_eq(opt, "--seed"))
            p.seed = number(opt, val, ~0ULL);
        else if (str_eq(opt, "--ram-mib"))
            p.ram_bytes = number(opt, val, 3072) << 20;
        else if (str_eq(opt, "--tsc-khz"))
            p.tsc_khz = number(opt, val, 0xffffffffu);
        else {
            con_puts("guest: unknown option ");
            con_puts(opt);
            con_puts("\n");
            gpu_fail("bad command line");
        }
    }
    if (p.width < 16 || p.height < 16)
        gpu_fail("--width and --height must be at least 16");
    if (p.ram_bytes <= p.alloc_base)
        gpu_fail("--ram-mib must exceed the 4 MiB below the layout");
    u64 failures = gpu_main(&p, &telemetry);
    con_puts(failures ? "guest: done, failures\n" : "guest: done\n");
    plat_halt();
}
