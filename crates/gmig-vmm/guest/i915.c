/*
 * gmig-i915-blit: a static guest program that renders frames on the blitter through Linux's own
 * i915 driver and its uAPI only (issue 32, stage 2): GEM_CREATE, GEM_MMAP, EXECBUFFER2 on the
 * blitter engine (I915_EXEC_BLT) with XY_COLOR_BLT fills, XY_SRC_COPY_BLT copies (the last one
 * into an X-tiled surface, which the CPU detiles and compares) and MI_STORE_DATA_IMM stores,
 * GEM_WAIT. The stored values are also read, and one word written, through an aperture
 * mapping (GEM_MMAP_OFFSET with I915_MMAP_OFFSET_GTT). Each frame also has a batch on the render engine
 * (I915_EXEC_RENDER: MI_STORE_DATA_IMM and a PIPE_CONTROL post-sync write into the status object
 * the blitter's batch writes too, so i915 orders it after the blitter's). Every frame is also
 * drawn on the CPU; the program compares the two, and every stored value, and prints one line
 * per frame and a final line:
 *
 *   GMIG-BLIT: ppgtt <I915_PARAM_HAS_ALIASING_PPGTT> softpin <I915_PARAM_HAS_EXEC_SOFTPIN>
 *   GMIG-BLIT: frame <n> fnv <frame checksum, hex> ns <submit to idle>
 *   GMIG-BLIT: done first <F> frames <N> checksum <all frames, hex> cpu <the CPU's, hex> ms <total>
 *
 * and exits 0 only when every frame and every stored dword matched. The image, the checksum and
 * the frame recipe are specified here and recomputed independently by
 * crates/gmig-cli/tests/qemu_i915.rs; keep the two in step.
 *
 *   usage: gmig-i915-blit [FRAMES] [FIRST] [DEVICE]    (defaults 8, 0, /dev/dri/card0)
 *          gmig-i915-blit nop N [DEVICE]              (N empty submissions, each waited for,
 *                                                      between two config-space markers)
 *
 * renders frames FIRST .. FIRST+FRAMES-1 (each frame's picture depends on its number only), so
 * that several instances, each with its own file descriptor and so its own PPGTT, draw different
 * pictures at the same PPGTT addresses.
 *
 * Objects are soft-pinned (EXEC_OBJECT_PINNED) at fixed PPGTT addresses, one of them above 512
 * GiB so that the GPU's walk uses a second PML4 entry. The uAPI structures and ioctl numbers are
 * declared here (the i915_drm.h ABI, stable since Linux 4.x) so the program builds without
 * kernel headers.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---- i915 uAPI (include/uapi/drm/i915_drm.h, drm.h) ---- */
struct gem_create {
    uint64_t size;
    uint32_t handle;
    uint32_t pad;
};
struct gem_mmap {
    uint32_t handle;
    uint32_t pad;
    uint64_t offset;
    uint64_t size;
    uint64_t addr_ptr;
    uint64_t flags;
};
struct gem_mmap_offset {
    uint32_t handle;
    uint32_t pad;
    uint64_t offset;
    uint64_t flags;
    uint64_t extensions;
};
struct gem_set_domain {
    uint32_t handle;
    uint32_t read_domains;
    uint32_t write_domain;
};
struct gem_wait {
    uint32_t bo_handle;
    uint32_t flags;
    int64_t timeout_ns;
};
struct getparam {
    int32_t param;
    int32_t pad;
    uint64_t value; /* int __user * */
};
struct exec_object2 {
    uint32_t handle;
    uint32_t relocation_count;
    uint64_t relocs_ptr;
    uint64_t alignment;
    uint64_t offset;
    uint64_t flags;
    uint64_t rsvd1;
    uint64_t rsvd2;
};
struct execbuffer2 {
    uint64_t buffers_ptr;
    uint32_t buffer_count;
    uint32_t batch_start_offset;
    uint32_t batch_len;
    uint32_t DR1;
    uint32_t DR4;
    uint32_t num_cliprects;
    uint64_t cliprects_ptr;
    uint64_t flags;
    uint64_t rsvd1;
    uint64_t rsvd2;
};

#define IOC(dir, nr, size) (((unsigned long)(dir) << 30) | ((unsigned long)(size) << 16) | ('d' << 8) | (nr))
#define IOWR(nr, t) IOC(3, nr, sizeof(t))
#define IOW(nr, t) IOC(1, nr, sizeof(t))
#define DRM_CMD 0x40
#define IOCTL_GETPARAM IOWR(DRM_CMD + 0x06, struct getparam)
#define IOCTL_GEM_CREATE IOWR(DRM_CMD + 0x1b, struct gem_create)
#define IOCTL_GEM_MMAP IOWR(DRM_CMD + 0x1e, struct gem_mmap)
#define IOCTL_GEM_SET_DOMAIN IOW(DRM_CMD + 0x1f, struct gem_set_domain)
#define IOCTL_GEM_EXECBUFFER2 IOWR(DRM_CMD + 0x29, struct execbuffer2)
#define IOCTL_GEM_WAIT IOWR(DRM_CMD + 0x2c, struct gem_wait)
#define IOCTL_GEM_MMAP_OFFSET IOWR(DRM_CMD + 0x24, struct gem_mmap_offset)
#define MMAP_OFFSET_GTT 0

#define PARAM_HAS_ALIASING_PPGTT 18
#define PARAM_HAS_EXEC_SOFTPIN 37
#define EXEC_RENDER 1
#define EXEC_BLT 3
#define EXEC_NO_RELOC (1u << 11)
#define OBJ_WRITE (1u << 2)
#define OBJ_48B (1u << 3)
#define OBJ_PINNED (1u << 4)
#define DOMAIN_CPU 0x1
#define DOMAIN_GTT 0x40

/* ---- GEN9 commands (the blitter's and MI) ---- */
#define MI_BATCH_BUFFER_END 0x05000000u
#define MI_NOOP 0u
#define MI_FLUSH_DW (0x26u << 23 | 2) /* 4 dwords, no post-sync */
#define MI_STORE_DATA_IMM (0x20u << 23 | 2) /* PPGTT, 64-bit address, one dword */
#define PIPE_CONTROL (3u << 29 | 3u << 27 | 2u << 24 | 4) /* 6 dwords */
#define PC_WRITE_IMMEDIATE (1u << 14)
#define PC_CS_STALL (1u << 20)
#define XY_COLOR_BLT (2u << 29 | 0x50u << 22 | 3u << 20 | 5) /* 32 bpp: write alpha and RGB */
#define XY_SRC_COPY_BLT (2u << 29 | 0x53u << 22 | 3u << 20 | 8)
#define XY_DST_TILED (1u << 11) /* X-tiled destination; its pitch in dwords */
#define BR13_32BPP (3u << 24)
#define ROP_PATCOPY (0xf0u << 16)
#define ROP_SRCCOPY (0xccu << 16)

/* ---- the scene (the test recomputes it: keep in step) ---- */
#define W 256
#define H 256
#define PITCH (W * 4)
#define FB_BYTES (PITCH * H)
#define FB_ADDR 0x0000000001000000ull     /* 16 MiB */
#define SPRITE_ADDR 0x0000008000000000ull /* 512 GiB: PML4 entry 1 */
#define STATUS_ADDR 0x0000000003000000ull
#define BATCH_ADDR 0x0000000004000000ull
#define RBATCH_ADDR 0x0000000005000000ull
#define TILED_ADDR 0x0000000006000000ull /* the frame, X-tiled */
#define BATCH_BYTES 4096
#define STORES 4

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint32_t sprite_pixel(uint32_t x, uint32_t y) { return mix(y * W + x) | 0xff000000u; }

struct rect {
    uint32_t x, y, w, h;
};

/* Fill k (0..3) of frame f: a rectangle inside the frame and its colour. */
static struct rect fill_rect(uint32_t f, uint32_t k, uint32_t *color) {
    uint32_t r = mix(f * 8 + k + 1);
    struct rect q = {r % (W - 64), (r >> 8) % (H - 64), 16 + (r >> 16) % 48, 16 + (r >> 24) % 48};
    *color = mix(r) | 0xff000000u;
    return q;
}

/* The sprite copy of frame f: a 64x64 block from the sprite at (sx, sy) to (dx, dy). */
static void sprite_copy(uint32_t f, uint32_t *sx, uint32_t *sy, uint32_t *dx, uint32_t *dy) {
    uint32_t r = mix(0x5000 + f);
    *sx = r % (W - 64);
    *sy = (r >> 8) % (H - 64);
    *dx = (r >> 16) % (W - 64);
    *dy = (r >> 24) % (H - 128); /* the upper part: the block copy below reads the lower part */
}

/* The frame-to-frame copy: the top-left 32x32 block, drawn so far, to the bottom-right corner. */
#define BLOCK 32

static uint32_t background(uint32_t f) { return mix(0x9000 + f) | 0xff000000u; }
static uint32_t stored(uint32_t f, uint32_t i) { return mix(0xa000 + f * STORES + i); }
/* The render engine's stores: dwords at status[RSTORE0 ..], a qword at status[RQWORD0 ..]. */
#define RSTORE0 256
#define RQWORD0 512
#define APERTURE_WORD 1000 /* written by the CPU through the aperture */
static uint32_t rstored(uint32_t f, uint32_t i) { return mix(0xb000 + f * STORES + i); }
static uint64_t rqword(uint32_t f) { return (uint64_t)mix(0xc000 + f) << 32 | f; }

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define FNV0 0xcbf29ce484222325ull

/* ---- CPU reference ---- */
static void cpu_fill(uint32_t *fb, struct rect q, uint32_t c) {
    for (uint32_t y = q.y; y < q.y + q.h; y++)
        for (uint32_t x = q.x; x < q.x + q.w; x++) fb[y * W + x] = c;
}

static void cpu_frame(uint32_t *fb, const uint32_t *sprite, uint32_t f) {
    cpu_fill(fb, (struct rect){0, 0, W, H}, background(f));
    for (uint32_t k = 0; k < 4; k++) {
        uint32_t c;
        struct rect q = fill_rect(f, k, &c);
        cpu_fill(fb, q, c);
    }
    uint32_t sx, sy, dx, dy;
    sprite_copy(f, &sx, &sy, &dx, &dy);
    for (uint32_t y = 0; y < 64; y++)
        for (uint32_t x = 0; x < 64; x++) fb[(dy + y) * W + dx + x] = sprite[(sy + y) * W + sx + x];
    for (uint32_t y = 0; y < BLOCK; y++)
        for (uint32_t x = 0; x < BLOCK; x++) fb[(H - BLOCK + y) * W + W - BLOCK + x] = fb[y * W + x];
}

/* ---- the GPU's side ---- */
static int fd = -1;

static void fail(const char *what) {
    printf("GMIG-BLIT: error: %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

static void xioctl(unsigned long req, void *arg, const char *what) {
    int r;
    do {
        r = ioctl(fd, req, arg);
    } while (r < 0 && (errno == EINTR || errno == EAGAIN));
    if (r < 0) fail(what);
}

static int getparam(int p) {
    int v = -1;
    struct getparam g = {.param = p, .value = (uint64_t)(uintptr_t)&v};
    if (ioctl(fd, IOCTL_GETPARAM, &g) < 0) return -errno;
    return v;
}

static uint32_t gem_create(uint64_t size) {
    struct gem_create c = {.size = size};
    xioctl(IOCTL_GEM_CREATE, &c, "GEM_CREATE");
    return c.handle;
}

static void *gem_mmap(uint32_t handle, uint64_t size) {
    struct gem_mmap m = {.handle = handle, .size = size};
    xioctl(IOCTL_GEM_MMAP, &m, "GEM_MMAP");
    return (void *)(uintptr_t)m.addr_ptr;
}

/* A mapping through the aperture (GEM_MMAP_OFFSET, I915_MMAP_OFFSET_GTT): i915 binds the object
 * into the mappable GGTT (the vGPU's aperture slice) and the CPU's accesses go through BAR2. */
static void *gem_mmap_gtt(uint32_t handle, uint64_t size) {
    struct gem_mmap_offset m = {.handle = handle, .flags = MMAP_OFFSET_GTT};
    xioctl(IOCTL_GEM_MMAP_OFFSET, &m, "GEM_MMAP_OFFSET(GTT)");
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)m.offset);
    if (p == MAP_FAILED) fail("mmap(GTT)");
    return p;
}

static void gtt_domain(uint32_t handle, int write) {
    struct gem_set_domain d = {handle, DOMAIN_GTT, write ? DOMAIN_GTT : 0};
    xioctl(IOCTL_GEM_SET_DOMAIN, &d, "GEM_SET_DOMAIN(GTT)");
}

static void cpu_domain(uint32_t handle, int write) {
    struct gem_set_domain d = {handle, DOMAIN_CPU, write ? DOMAIN_CPU : 0};
    xioctl(IOCTL_GEM_SET_DOMAIN, &d, "GEM_SET_DOMAIN");
}

static uint32_t *emit_addr(uint32_t *cs, uint64_t a) {
    *cs++ = (uint32_t)a;
    *cs++ = (uint32_t)(a >> 32);
    return cs;
}

static uint32_t *emit_fill(uint32_t *cs, struct rect q, uint32_t c) {
    *cs++ = XY_COLOR_BLT;
    *cs++ = BR13_32BPP | ROP_PATCOPY | PITCH;
    *cs++ = q.y << 16 | q.x;
    *cs++ = (q.y + q.h) << 16 | (q.x + q.w);
    cs = emit_addr(cs, FB_ADDR);
    *cs++ = c;
    return cs;
}

static uint32_t *emit_copy(uint32_t *cs, uint64_t src, uint32_t sx, uint32_t sy, uint32_t dx,
                           uint32_t dy, uint32_t w, uint32_t h) {
    *cs++ = XY_SRC_COPY_BLT;
    *cs++ = BR13_32BPP | ROP_SRCCOPY | PITCH;
    *cs++ = dy << 16 | dx;
    *cs++ = (dy + h) << 16 | (dx + w);
    cs = emit_addr(cs, FB_ADDR);
    *cs++ = sy << 16 | sx;
    *cs++ = PITCH;
    return emit_addr(cs, src);
}

/* The whole frame, linear, to the X-tiled copy. */
static uint32_t *emit_copy_to_tiled(uint32_t *cs) {
    *cs++ = XY_SRC_COPY_BLT | XY_DST_TILED;
    *cs++ = BR13_32BPP | ROP_SRCCOPY | PITCH / 4;
    *cs++ = 0;
    *cs++ = H << 16 | W;
    cs = emit_addr(cs, TILED_ADDR);
    *cs++ = 0;
    *cs++ = PITCH;
    return emit_addr(cs, FB_ADDR);
}

/* Byte offset of pixel (x, y) in an X-tiled surface of PITCH bytes a row: 4 KiB tiles of 512
 * bytes by 8 rows, row-major (GEN9: no bit-6 swizzling). */
static uint32_t x_tiled(uint32_t x, uint32_t y) {
    uint32_t bx = x * 4;
    return ((y / 8) * (PITCH / 512) + bx / 512) * 4096 + (y % 8) * 512 + bx % 512;
}

static uint32_t *emit_flush(uint32_t *cs) {
    *cs++ = MI_FLUSH_DW;
    *cs++ = 0;
    *cs++ = 0;
    *cs++ = 0;
    return cs;
}

/* Frame f's batch; its length in bytes. */
static uint32_t build_batch(uint32_t *batch, uint32_t f) {
    uint32_t *cs = batch;
    cs = emit_fill(cs, (struct rect){0, 0, W, H}, background(f));
    for (uint32_t k = 0; k < 4; k++) {
        uint32_t c;
        struct rect q = fill_rect(f, k, &c);
        cs = emit_fill(cs, q, c);
    }
    uint32_t sx, sy, dx, dy;
    sprite_copy(f, &sx, &sy, &dx, &dy);
    cs = emit_copy(cs, SPRITE_ADDR, sx, sy, dx, dy, 64, 64);
    cs = emit_flush(cs); /* the block copy reads what the fills wrote */
    cs = emit_copy(cs, FB_ADDR, 0, 0, W - BLOCK, H - BLOCK, BLOCK, BLOCK);
    cs = emit_flush(cs); /* the tiled copy reads the finished frame */
    cs = emit_copy_to_tiled(cs);
    for (uint32_t i = 0; i < STORES; i++) {
        *cs++ = MI_STORE_DATA_IMM;
        cs = emit_addr(cs, STATUS_ADDR + 4 * (f % 64 * STORES + i));
        *cs++ = stored(f, i);
    }
    cs = emit_flush(cs);
    *cs++ = MI_BATCH_BUFFER_END;
    if ((cs - batch) & 1) *cs++ = MI_NOOP;
    return (uint32_t)((cs - batch) * 4);
}

/* Frame f's render-engine batch; its length in bytes. */
static uint32_t build_render_batch(uint32_t *batch, uint32_t f) {
    uint32_t *cs = batch;
    for (uint32_t i = 0; i < STORES; i++) {
        *cs++ = MI_STORE_DATA_IMM;
        cs = emit_addr(cs, STATUS_ADDR + 4 * (RSTORE0 + f % 64 * STORES + i));
        *cs++ = rstored(f, i);
    }
    *cs++ = PIPE_CONTROL;
    *cs++ = PC_WRITE_IMMEDIATE | PC_CS_STALL;
    cs = emit_addr(cs, STATUS_ADDR + 4 * (RQWORD0 + f % 64 * 2));
    *cs++ = (uint32_t)rqword(f);
    *cs++ = (uint32_t)(rqword(f) >> 32);
    *cs++ = MI_BATCH_BUFFER_END;
    if ((cs - batch) & 1) *cs++ = MI_NOOP;
    return (uint32_t)((cs - batch) * 4);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A PCI configuration read of the GPU at `off` (through sysfs): a marker in QEMU's trace of the
 * device's accesses (nothing else reads offsets 0xf0 and 0xf4). */
static void config_marker(unsigned off) {
    int c = open("/sys/class/drm/card0/device/config", O_RDONLY | O_CLOEXEC);
    uint32_t v;
    if (c < 0 || pread(c, &v, 4, off) != 4) fail("config marker");
    close(c);
}

/* `nop N`: N submissions of an empty batch (MI_BATCH_BUFFER_END) on the blitter, each waited
 * for (GEM_WAIT), between two configuration-space markers: what one EXECBUFFER2 costs in register
 * accesses and time, as IGT's gem_exec_nop measures it. */
static int nop_loop(uint32_t n) {
    uint32_t h = gem_create(4096);
    uint32_t *b = gem_mmap(h, 4096);
    cpu_domain(h, 1);
    b[0] = MI_BATCH_BUFFER_END;
    b[1] = MI_NOOP;
    struct exec_object2 o = {.handle = h, .offset = BATCH_ADDR, .flags = OBJ_PINNED | OBJ_48B};
    struct execbuffer2 eb = {
        .buffers_ptr = (uint64_t)(uintptr_t)&o,
        .buffer_count = 1,
        .batch_len = 8,
        .flags = EXEC_BLT | EXEC_NO_RELOC,
    };
    /* One round first, so the context is created and pinned outside the window. */
    xioctl(IOCTL_GEM_EXECBUFFER2, &eb, "EXECBUFFER2(nop)");
    struct gem_wait w = {.bo_handle = h, .timeout_ns = 20ll * 1000000000ll};
    xioctl(IOCTL_GEM_WAIT, &w, "GEM_WAIT(nop)");
    config_marker(0xf0);
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < n; i++) {
        xioctl(IOCTL_GEM_EXECBUFFER2, &eb, "EXECBUFFER2(nop)");
        w.timeout_ns = 20ll * 1000000000ll;
        xioctl(IOCTL_GEM_WAIT, &w, "GEM_WAIT(nop)");
    }
    uint64_t t1 = now_ns();
    config_marker(0xf4);
    printf("GMIG-NOP: submissions %u ns-per-submission %llu\n", n,
           (unsigned long long)((t1 - t0) / (n ? n : 1)));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "nop") == 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        fd = open(argc > 3 ? argv[3] : "/dev/dri/card0", O_RDWR | O_CLOEXEC);
        if (fd < 0) fail("open");
        return nop_loop((uint32_t)strtoul(argv[2], NULL, 0));
    }
    uint32_t frames = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 0) : 8;
    uint32_t first = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 0) : 0;
    const char *dev = argc > 3 ? argv[3] : "/dev/dri/card0";
    setvbuf(stdout, NULL, _IOLBF, 0);
    fd = open(dev, O_RDWR | O_CLOEXEC);
    if (fd < 0) fail(dev);
    int ppgtt = getparam(PARAM_HAS_ALIASING_PPGTT);
    int softpin = getparam(PARAM_HAS_EXEC_SOFTPIN);
    printf("GMIG-BLIT: ppgtt %d softpin %d\n", ppgtt, softpin);
    if (softpin != 1) {
        errno = ENODEV;
        fail("no soft-pinning (needs full PPGTT)");
    }

    uint32_t h_fb = gem_create(FB_BYTES), h_sprite = gem_create(FB_BYTES);
    uint32_t h_status = gem_create(4096), h_batch = gem_create(BATCH_BYTES);
    uint32_t h_rbatch = gem_create(BATCH_BYTES), h_tiled = gem_create(FB_BYTES);
    uint32_t *fb = gem_mmap(h_fb, FB_BYTES), *sprite = gem_mmap(h_sprite, FB_BYTES);
    uint32_t *status = gem_mmap(h_status, 4096), *batch = gem_mmap(h_batch, BATCH_BYTES);
    uint32_t *rbatch = gem_mmap(h_rbatch, BATCH_BYTES), *tiled = gem_mmap(h_tiled, FB_BYTES);
    volatile uint32_t *status_gtt = gem_mmap_gtt(h_status, 4096);
    cpu_domain(h_sprite, 1);
    for (uint32_t y = 0; y < H; y++)
        for (uint32_t x = 0; x < W; x++) sprite[y * W + x] = sprite_pixel(x, y);
    cpu_domain(h_status, 1);
    memset(status, 0, 4096);

    uint32_t *ref = malloc(FB_BYTES), *ref_sprite = malloc(FB_BYTES);
    if (!ref || !ref_sprite) fail("malloc");
    for (uint32_t y = 0; y < H; y++)
        for (uint32_t x = 0; x < W; x++) ref_sprite[y * W + x] = sprite_pixel(x, y);

    struct exec_object2 obj[5] = {
        {.handle = h_tiled, .offset = TILED_ADDR, .flags = OBJ_PINNED | OBJ_48B | OBJ_WRITE},
        {.handle = h_fb, .offset = FB_ADDR, .flags = OBJ_PINNED | OBJ_48B | OBJ_WRITE},
        {.handle = h_sprite, .offset = SPRITE_ADDR, .flags = OBJ_PINNED | OBJ_48B},
        {.handle = h_status, .offset = STATUS_ADDR, .flags = OBJ_PINNED | OBJ_48B | OBJ_WRITE},
        {.handle = h_batch, .offset = BATCH_ADDR, .flags = OBJ_PINNED | OBJ_48B},
    };
    struct exec_object2 robj[2] = {
        {.handle = h_status, .offset = STATUS_ADDR, .flags = OBJ_PINNED | OBJ_48B | OBJ_WRITE},
        {.handle = h_rbatch, .offset = RBATCH_ADDR, .flags = OBJ_PINNED | OBJ_48B},
    };
    uint64_t all = FNV0, all_cpu = FNV0, t_start = now_ns();
    int bad = 0;
    for (uint32_t f = first; f < first + frames; f++) {
        cpu_domain(h_batch, 1);
        uint32_t len = build_batch(batch, f);
        cpu_domain(h_rbatch, 1);
        uint32_t rlen = build_render_batch(rbatch, f);
        struct execbuffer2 eb = {
            .buffers_ptr = (uint64_t)(uintptr_t)obj,
            .buffer_count = 5,
            .batch_len = len,
            .flags = EXEC_BLT | EXEC_NO_RELOC,
        };
        uint64_t t0 = now_ns();
        xioctl(IOCTL_GEM_EXECBUFFER2, &eb, "EXECBUFFER2");
        static const uint64_t pinned[5] = {TILED_ADDR, FB_ADDR, SPRITE_ADDR, STATUS_ADDR, BATCH_ADDR};
        for (int i = 0; i < 5; i++) {
            if (obj[i].offset != pinned[i]) {
                errno = EFAULT;
                fail("a soft-pinned object moved");
            }
        }
        struct execbuffer2 reb = {
            .buffers_ptr = (uint64_t)(uintptr_t)robj,
            .buffer_count = 2,
            .batch_len = rlen,
            .flags = EXEC_RENDER | EXEC_NO_RELOC,
        };
        xioctl(IOCTL_GEM_EXECBUFFER2, &reb, "EXECBUFFER2(render)");
        struct gem_wait w = {.bo_handle = h_fb, .timeout_ns = 20ll * 1000000000ll};
        xioctl(IOCTL_GEM_WAIT, &w, "GEM_WAIT");
        struct gem_wait ws = {.bo_handle = h_status, .timeout_ns = 20ll * 1000000000ll};
        xioctl(IOCTL_GEM_WAIT, &ws, "GEM_WAIT(status)");
        uint64_t t1 = now_ns();
        struct gem_wait wt = {.bo_handle = h_tiled, .timeout_ns = 20ll * 1000000000ll};
        xioctl(IOCTL_GEM_WAIT, &wt, "GEM_WAIT(tiled)");
        cpu_domain(h_fb, 0);
        cpu_domain(h_status, 0);
        cpu_domain(h_tiled, 0);

        cpu_frame(ref, ref_sprite, f);
        uint32_t diffs = 0, first_diff = 0;
        for (uint32_t i = 0; i < W * H; i++) {
            if (fb[i] != ref[i]) {
                if (!diffs) first_diff = i;
                diffs++;
            }
        }
        for (uint32_t i = 0; i < STORES; i++) {
            uint32_t got = status[RSTORE0 + f % 64 * STORES + i];
            if (got != rstored(f, i)) {
                printf("GMIG-BLIT: frame %u render store %u: got %#x want %#x\n", f, i, got,
                       rstored(f, i));
                bad = 1;
            }
        }
        uint64_t q;
        memcpy(&q, &status[RQWORD0 + f % 64 * 2], 8);
        if (q != rqword(f)) {
            printf("GMIG-BLIT: frame %u render PIPE_CONTROL: got %#llx want %#llx\n", f,
                   (unsigned long long)q, (unsigned long long)rqword(f));
            bad = 1;
        }
        for (uint32_t i = 0; i < STORES; i++) {
            uint32_t got = status[f % 64 * STORES + i];
            if (got != stored(f, i)) {
                printf("GMIG-BLIT: frame %u store %u: got %#x want %#x\n", f, i, got, stored(f, i));
                bad = 1;
            }
        }
        /* The same stores read through the aperture, and a word written back through it. */
        gtt_domain(h_status, 1);
        for (uint32_t i = 0; i < STORES; i++) {
            uint32_t at = f % 64 * STORES + i, got = status_gtt[at];
            if (got != stored(f, i) || status_gtt[RSTORE0 + at] != rstored(f, i)) {
                printf("GMIG-BLIT: frame %u store %u through the aperture: got %#x want %#x\n", f,
                       i, got, stored(f, i));
                bad = 1;
            }
        }
        status_gtt[APERTURE_WORD] = ~f;
        cpu_domain(h_status, 0);
        if (status[APERTURE_WORD] != ~f) {
            printf("GMIG-BLIT: frame %u: a write through the aperture reads back %#x\n", f,
                   status[APERTURE_WORD]);
            bad = 1;
        }
        uint32_t tdiffs = 0;
        for (uint32_t y = 0; y < H; y++)
            for (uint32_t x = 0; x < W; x++)
                tdiffs += tiled[x_tiled(x, y) / 4] != ref[y * W + x];
        if (tdiffs) {
            printf("GMIG-BLIT: frame %u: %u pixels of the X-tiled copy differ\n", f, tdiffs);
            bad = 1;
        }
        if (diffs) {
            printf("GMIG-BLIT: frame %u: %u pixels differ, first at (%u,%u): got %#x want %#x\n", f,
                   diffs, first_diff % W, first_diff / W, fb[first_diff], ref[first_diff]);
            bad = 1;
        }
        uint64_t h = fnv(FNV0, (const uint8_t *)fb, FB_BYTES);
        uint64_t hc = fnv(FNV0, (const uint8_t *)ref, FB_BYTES);
        all = fnv(all, (const uint8_t *)&h, 8);
        all_cpu = fnv(all_cpu, (const uint8_t *)&hc, 8);
        printf("GMIG-BLIT: frame %u fnv %016llx ns %llu\n", f, (unsigned long long)h,
               (unsigned long long)(t1 - t0));
    }
    uint64_t ms = (now_ns() - t_start) / 1000000;
    printf("GMIG-BLIT: done first %u frames %u checksum %016llx cpu %016llx ms %llu%s\n", first, frames,
           (unsigned long long)all, (unsigned long long)all_cpu, (unsigned long long)ms,
           bad || all != all_cpu ? " MISMATCH" : "");
    return bad || all != all_cpu ? 1 : 0;
}
