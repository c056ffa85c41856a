/*
 * gmig guest GPU driver, the Linux platform: `gmig-guest`, a static program that drives a gmig
 * vGPU attached to a Linux guest (QEMU's vfio-user-pci) from userspace, as root, with no GPU
 * kernel driver bound. The driver itself is the core (gpu.c, see gpu.h), the same one the
 * freestanding guest runs; it prints the same lines and the same checksum for the same
 * parameters (`gmig vm run --profile P --frames N --width W --height H --seed S --ram-mib M`).
 *
 * The platform part:
 *   - parameters from the command line instead of the boot-parameters page;
 *   - finds the vGPU in /sys/bus/pci/devices (vendor 0x8086, class 0x0300xx), enables it
 *     (`enable`), sets memory decoding and bus mastering in the command register (`config`) and
 *     maps BAR0 (`resource0`: registers, GGTT at +0x800000) and the aperture (`resource2`);
 *     no MSI: userspace has no interrupt, the core polls (as the freestanding guest does too);
 *   - RAM: the core's layout [alloc_base, ram_bytes) is one anonymous mapping; what the GPU
 *     reaches is locked (mlock) and its pages' physical addresses come from /proc/self/pagemap
 *     (PFNs are visible to root); the pages need not be contiguous, each GGTT entry maps one;
 *   - console: stdout; time: CLOCK_MONOTONIC in ns (the "tsc" line is the largest gap between
 *     two polls, in microseconds, as the freestanding guest's).
 */

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"

#define ALLOC_BASE (4ULL << 20) /* crates/gmig-vmm/src/guest.rs ALLOC_BASE */

static const char *device;           /* --device: a PCI address, or the first match */
static u8 *arena;                    /* the RAM layout: arena[0] is layout address alloc_base */
static u64 arena_base, arena_bytes;  /* layout addresses it covers */
static int pagemap_fd = -1;

static void die(const char *what) {
    fprintf(stdout, "guest error: %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

/* ---- platform: console, halt, time ---- */
void plat_putc(char c) { putchar(c); }

void plat_halt(void) {
    fflush(stdout);
    exit(1);
}

u64 plat_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (u64)ts.tv_sec * 1000000000ULL + (u64)ts.tv_nsec;
}

/* ---- platform: RAM ---- */
void *plat_ram(u64 addr, u64 size, int dma) {
    if (addr < arena_base || size > arena_bytes || addr - arena_base > arena_bytes - size)
        gpu_fail("RAM outside the layout");
    u8 *p = arena + (addr - arena_base);
    if (dma && size) {
        /* Locked pages stay resident at one physical address (compaction aside, which main
         * asks the kernel not to do to them). mlock faults them in writable. */
        if (mlock(p, size))
            die("mlock");
        for (u64 off = 0; off < size; off += PAGE)
            ((volatile u8 *)p)[off] = ((volatile u8 *)p)[off];
    }
    return p;
}

u64 plat_dma(u64 addr) {
    u64 va = (u64)(uintptr_t)(arena + (addr - arena_base));
    uint64_t e;
    if (pread(pagemap_fd, &e, sizeof e, (off_t)(va / PAGE * 8)) != (ssize_t)sizeof e)
        die("/proc/self/pagemap");
    u64 pfn = e & ((1ULL << 55) - 1);
    if (!(e >> 63))
        gpu_fail("a pinned page is not present");
    if (!pfn)
        gpu_fail("no PFNs in /proc/self/pagemap (not root?)");
    return pfn * PAGE + (va & (PAGE - 1));
}

/* ---- platform: PCI through sysfs ---- */
#define SYSFS_PCI "/sys/bus/pci/devices"

static int read_text(const char *dir, const char *name, char *buf, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return 0;
}

static int read_hex(const char *dir, const char *name, unsigned long *v) {
    char buf[64];
    if (read_text(dir, name, buf, sizeof buf))
        return -1;
    char *end;
    *v = strtoul(buf, &end, 16);
    return end == buf ? -1 : 0;
}

/* The physical range of resource `index` (the `resource` file, one "start end flags" line each). */
static void resource_range(const char *dir, int index, u64 *start, u64 *size) {
    char path[512];
    snprintf(path, sizeof path, "%s/resource", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        die(path);
    unsigned long long s = 0, e = 0, flags = 0;
    for (int i = 0; i <= index; i++)
        if (fscanf(f, "%llx %llx %llx", &s, &e, &flags) != 3)
            gpu_fail("cannot parse the device's resource file");
    fclose(f);
    if (!s || e < s)
        gpu_fail("a BAR is not assigned");
    *start = s;
    *size = e - s + 1;
}

static void *map_resource(const char *dir, int index, u64 size) {
    char path[512];
    snprintf(path, sizeof path, "%s/resource%d", dir, index);
    int fd = open(path, O_RDWR | O_SYNC);
    if (fd < 0)
        die(path);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        die(path);
    close(fd);
    return p;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        die(path);
    if (write(fd, text, strlen(text)) < 0 && errno != EBUSY)
        die(path);
    close(fd);
}

void plat_find_gpu(void) {
    DIR *d = opendir(SYSFS_PCI);
    if (!d)
        die(SYSFS_PCI);
    struct dirent *de;
    char dir[300];
    int found = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        if (device && strcmp(device, de->d_name))
            continue;
        snprintf(dir, sizeof dir, "%s/%s", SYSFS_PCI, de->d_name);
        unsigned long vendor, class;
        if (read_hex(dir, "vendor", &vendor) || read_hex(dir, "class", &class))
            continue;
        if (vendor != 0x8086 || (class >> 8) != 0x0300)
            continue;
        found = 1;
        break;
    }
    closedir(d);
    if (!found)
        gpu_fail("no Intel display controller in " SYSFS_PCI);

    write_text(dir, "enable", "1");
    char path[512];
    snprintf(path, sizeof path, "%s/config", dir);
    int cfg = open(path, O_RDWR);
    if (cfg < 0)
        die(path);
    u32 id;
    u16 cmd;
    if (pread(cfg, &id, 4, 0) != 4 || pread(cfg, &cmd, 2, 4) != 2)
        die(path);
    cmd |= 0x6; /* memory decoding, bus master */
    if (pwrite(cfg, &cmd, 2, 4) != 2)
        die(path);
    close(cfg);

    u64 bar0_phys, bar0_size, bar2_phys, bar2_size;
    resource_range(dir, 0, &bar0_phys, &bar0_size);
    resource_range(dir, 2, &bar2_phys, &bar2_size);
    if (bar0_size < (16ULL << 20))
        gpu_fail("BAR0 is smaller than 16 MiB");
    bar0 = (u64)(uintptr_t)map_resource(dir, 0, bar0_size);
    (void)map_resource(dir, 2, bar2_size); /* the aperture: mapped, as a driver does; unused */

    con_puts("gpu: ");
    con_puthex(id);
    con_puts(" bar0 ");
    con_puthex(bar0_phys);
    con_puts(" bar2 ");
    con_puthex(bar2_phys);
    con_puts("\n");
}

/* ---- main ---- */
static void usage(FILE *f) {
    fprintf(f,
            "usage: gmig-guest [--profile desktop|compute] [--frames N] [--width W] [--height H]\n"
            "                  [--scratch-pages N] [--seed S] [--ram-mib M] [--device BDF]\n"
            "Drives a gmig vGPU from userspace (as root) as the freestanding guest of\n"
            "`gmig vm run` does, and prints the same lines and checksum for the same parameters\n"
            "(defaults: desktop, 48 frames, 256x192, 64 scratch pages, seed 1, a 64 MiB layout).\n");
}

static u64 number(const char *opt, const char *v, u64 max) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 0);
    if (errno || end == v || *end || n > max) {
        fprintf(stderr, "gmig-guest: bad value for %s: %s\n", opt, v);
        exit(2);
    }
    return n;
}

int main(int argc, char **argv) {
    struct gpu_params p = {
        .profile = 0,
        .frames = 48,
        .width = 256,
        .height = 192,
        .scratch_pages = 64,
        .seed = 1,
        .ram_bytes = 64ULL << 20,
        .tsc_khz = 1000000, /* plat_now ticks in ns */
        .alloc_base = ALLOC_BASE,
    };
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *val = NULL;
        char name[64];
        const char *eq = strchr(opt, '=');
        if (eq && (size_t)(eq - opt) < sizeof name) {
            memcpy(name, opt, (size_t)(eq - opt));
            name[eq - opt] = 0;
            opt = name;
            val = eq + 1;
        }
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gmig-guest: %s needs a value\n", opt);
                return 2;
            }
            val = argv[++i];
        }
        if (!strcmp(opt, "--profile")) {
            if (!strcmp(val, "desktop"))
                p.profile = 0;
            else if (!strcmp(val, "compute"))
                p.profile = 1;
            else {
                fprintf(stderr, "gmig-guest: unknown profile %s (desktop, compute)\n", val);
                return 2;
            }
        } else if (!strcmp(opt, "--frames"))
            p.frames = (u32)number(opt, val, 0xffffffffu);
        else if (!strcmp(opt, "--width"))
            p.width = (u32)number(opt, val, 8192);
        else if (!strcmp(opt, "--height"))
            p.height = (u32)number(opt, val, 8192);
        else if (!strcmp(opt, "--scratch-pages"))
            p.scratch_pages = (u32)number(opt, val, 0xffffffffu);
        else if (!strcmp(opt, "--seed"))
            p.seed = number(opt, val, ~0ULL);
        else if (!strcmp(opt, "--ram-mib"))
            p.ram_bytes = number(opt, val, 1ULL << 20) << 20;
        else if (!strcmp(opt, "--device"))
            device = val;
        else {
            fprintf(stderr, "gmig-guest: unknown option %s\n", opt);
            usage(stderr);
            return 2;
        }
    }
    if (p.width < 16 || p.height < 16) {
        fprintf(stderr, "gmig-guest: --width and --height must be at least 16\n");
        return 2;
    }
    if (p.ram_bytes <= p.alloc_base) {
        fprintf(stderr, "gmig-guest: --ram-mib must exceed the 4 MiB below the layout\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* The RAM layout: reserved, not committed; what the GPU reaches is locked as allocated,
     * the CPU's scratch is faulted in as it is written. */
    arena_base = p.alloc_base;
    arena_bytes = p.ram_bytes - p.alloc_base;
    arena = mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED)
        die("mmap of the RAM layout");
    /* Keep the pinned pages where pagemap found them: no transparent huge pages to collapse
     * or split, and (best effort) no compaction of locked pages. */
    (void)madvise(arena, arena_bytes, MADV_NOHUGEPAGE);
    int fd = open("/proc/sys/vm/compact_unevictable_allowed", O_WRONLY);
    if (fd >= 0) {
        (void)!write(fd, "0", 1);
        close(fd);
    }
    pagemap_fd = open("/proc/self/pagemap", O_RDONLY);
    if (pagemap_fd < 0)
        die("/proc/self/pagemap");

    static struct telemetry tel;
    u64 failures = gpu_main(&p, &tel);
    /* Rates, on a "tsc" line like the other timing (comparisons of output leave those out):
       CLOCK_MONOTONIC counts from the guest kernel's boot. */
    u64 ns = tel.frames_t1 - tel.frames_t0, mmio = tel.frames_mmio1 - tel.frames_mmio0;
    printf("tsc first-frame-after-boot-ms %llu frames-per-s %llu mmio-per-frame %llu ns-per-mmio %llu\n",
           tel.frames_t0 / 1000000, ns ? (u64)p.frames * 1000000000ULL / ns : 0,
           p.frames ? mmio / p.frames : 0, mmio ? ns / mmio : 0);
    fflush(stdout);
    return failures ? 1 : 0;
}
