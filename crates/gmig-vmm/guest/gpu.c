/*
 * gmig guest GPU driver, the platform-independent core (see gpu.h for the platforms).
 *
 * What it does, as i915 does under GVT-g (in miniature):
 *   - (the platform finds the vGPU, turns on memory decoding and bus mastering, maps BAR0);
 *   - reads the GVT-g PV info page (BAR0 + 0x78000) for its ballooned aperture and hidden slices;
 *   - allocates objects in its own RAM and maps them by writing GGTT entries through BAR0, one
 *     per 4 KiB page (the pages need not be physically contiguous);
 *   - builds a logical-ring context (register state page, ring, status page) for the blitter;
 *   - per frame: writes a batch (blits, stores), appends BB_START + seqno breadcrumb + user
 *     interrupt to the ring, updates the context's tail, submits through the ELSP, flips the
 *     plane, and waits for the seqno (polling a BAR0 register, so the vGPU makes progress);
 *   - folds what the GPU produced into a running checksum, prints progress and the final
 *     checksum.
 * The CPU also writes ordinary RAM each frame ("scratch"), so a dirty log has real work.
 *
 * Everything it computes depends only on its parameters, so a migrated run and an unmigrated
 * one print the same checksum; the TSC gap it observes (downtime as the guest sees it) lives in
 * the telemetry only and is printed on a separate "tsc" line.
 */

#include "gpu.h"

/* ---- vGPU interface (gmig_vgpu::mmio) ---- */
#define PVINFO 0x78000u
#define PV_MAGIC 0x00u
#define PV_VERSION_MAJOR 0x08u
#define PV_APERTURE_BASE 0x40u
#define PV_APERTURE_SIZE 0x44u
#define PV_HIDDEN_BASE 0x48u
#define PV_HIDDEN_SIZE 0x4cu
#define VGT_MAGIC 0x4776544776544776ULL
#define GTT_MMIO_BASE 0x800000ULL
#define PLANE_SURF0 0x7019cu
#define PLANE_STRIDE0 0x70188u
#define BCS_BASE 0x22000u
#define RING_TAIL 0x30u
#define RING_HEAD 0x34u
#define RING_START 0x38u
#define RING_CTL 0x3cu
#define RING_HWS_PGA 0x80u
#define RING_ELSP 0x230u
#define RING_EXECLIST_STATUS 0x234u
#define CTX_CONTROL 0x244u
#define PDP0_UDW 0x274u
#define PDP0_LDW 0x270u
#define HWS_SEQNO_INDEX 0x30u
#define RING_PAGES 4u
#define BATCH_BYTES (16 * 1024ULL)
#define NBATCH 4

u64 bar0;

/* ---- console ---- */
void con_puts(const char *s) {
    while (*s)
        plat_putc(*s++);
}
void con_puthex(u64 v) {
    static const char d[] = "0123456789abcdef";
    for (int i = 60; i >= 0; i -= 4)
        plat_putc(d[(v >> i) & 15]);
}
void con_putdec(u64 v) {
    char b[21];
    int n = 0;
    do {
        b[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        plat_putc(b[--n]);
    /* Leave no digits behind on the stack: a printed timing would make RAM differ between runs. */
    for (int i = 0; i < 21; i++)
        ((volatile char *)b)[i] = 0;
}

void gpu_fail(const char *why) {
    con_puts("guest error: ");
    con_puts(why);
    con_puts("\n");
    plat_halt();
}

/* ---- telemetry (excluded from the differential comparison) ---- */
static volatile struct telemetry *tel;

static inline void tsc_tick(void) {
    u64 now = plat_now();
    u64 last = tel->last_tsc;
    if (last && now > last && now - last > tel->max_gap_tsc)
        tel->max_gap_tsc = now - last;
    tel->last_tsc = now;
}

/* ---- deterministic random numbers (xorshift64*) ---- */
static u64 rng_state;
static u32 rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (u32)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}
static u32 rnd_range(u32 lo, u32 hi) { /* inclusive */
    return lo + rnd() % (hi - lo + 1);
}

/* ---- memory: RAM and GGTT allocation ---- */
static u64 ram_next, ram_end;
static u64 ap_next, ap_end, hid_next, hid_end;

struct obj {
    u64 gpu;  /* GGTT offset (guest view) */
    u64 addr; /* layout address of the backing pages (guest-physical on the freestanding guest) */
    u8 *cpu;  /* where the CPU reaches them */
    u64 size;
};

static u64 page_align(u64 n) { return (n + PAGE - 1) & ~(PAGE - 1); }

static u64 alloc_ram(u64 size) {
    size = page_align(size);
    u64 a = ram_next;
    if (a + size > ram_end)
        gpu_fail("out of guest RAM");
    ram_next += size;
    return a;
}

static struct obj alloc_ggtt(int hidden, u64 size) {
    struct obj o;
    size = page_align(size);
    u64 *next = hidden ? &hid_next : &ap_next;
    u64 end = hidden ? hid_end : ap_end;
    if (*next + size > end)
        gpu_fail("out of GGTT balloon");
    o.gpu = *next;
    o.size = size;
    *next += size;
    o.addr = alloc_ram(size);
    o.cpu = (u8 *)plat_ram(o.addr, size, 1);
    for (u64 p = 0; p < size / PAGE; p++) {
        u64 entry = (o.gpu + p * PAGE) / PAGE;
        wr64(bar0 + GTT_MMIO_BASE + entry * 8, plat_dma(o.addr + p * PAGE) | 1);
    }
    return o;
}

static void memset32(u8 *at, u32 v, u64 dwords) {
    volatile u32 *p = (volatile u32 *)at;
    for (u64 i = 0; i < dwords; i++)
        p[i] = v;
}

/* ---- the blitter context ---- */
static struct obj hws, image, ring, batches[NBATCH], timeline;
static u32 ring_tail, seqno, next_batch;

static void setup_context(void) {
    hws = alloc_ggtt(0, PAGE);
    wr32(bar0 + BCS_BASE + RING_HWS_PGA, (u32)hws.gpu);
    image = alloc_ggtt(1, 2 * PAGE);
    ring = alloc_ggtt(1, RING_PAGES * PAGE);
    for (int i = 0; i < NBATCH; i++)
        batches[i] = alloc_ggtt(1, BATCH_BYTES);
    volatile u32 *st = (volatile u32 *)(image.cpu + PAGE);
    st[1] = (0x22u << 23) | (2 * 14 - 1); /* MI_LOAD_REGISTER_IMM, 14 pairs */
#define PAIR(i, reg, v)                                                                            \
    do {                                                                                           \
        st[(i) - 1] = BCS_BASE + (reg);                                                            \
        st[(i)] = (v);                                                                             \
    } while (0)
    PAIR(0x03, CTX_CONTROL, 0);
    PAIR(0x05, RING_HEAD, 0);
    PAIR(0x07, RING_TAIL, 0);
    PAIR(0x09, RING_START, (u32)ring.gpu);
    PAIR(0x0b, RING_CTL, ((RING_PAGES - 1) << 12) | 1);
    PAIR(0x31, PDP0_UDW, 0);
    PAIR(0x33, PDP0_LDW, 0);
#undef PAIR
}

/* ---- command encoding (GEN8+ blitter and MI commands) ---- */
static u32 *cmd_at;

static void emit(u32 v) { *cmd_at++ = v; }

static void xy_color_blt(u64 dst, u32 pitch, u32 x1, u32 y1, u32 x2, u32 y2, u32 color) {
    emit((2u << 29) | (0x50u << 22) | (3u << 20) | 5);
    emit((3u << 24) | (0xf0u << 16) | pitch);
    emit((y1 << 16) | x1);
    emit((y2 << 16) | x2);
    emit((u32)dst);
    emit((u32)(dst >> 32) & 0xffff);
    emit(color);
}

static void xy_src_copy_blt(u64 dst, u32 dpitch, u32 x1, u32 y1, u32 x2, u32 y2, u64 src,
                            u32 spitch, u32 sx, u32 sy) {
    emit((2u << 29) | (0x53u << 22) | (3u << 20) | 8);
    emit((3u << 24) | (0xccu << 16) | dpitch);
    emit((y1 << 16) | x1);
    emit((y2 << 16) | x2);
    emit((u32)dst);
    emit((u32)(dst >> 32) & 0xffff);
    emit((sy << 16) | sx);
    emit(spitch);
    emit((u32)src);
    emit((u32)(src >> 32) & 0xffff);
}

static void store_dword(u64 gpu, u32 v) { /* MI_STORE_DATA_IMM, GGTT */
    emit((0x20u << 23) | (1u << 22) | 2);
    emit((u32)gpu & ~3u);
    emit((u32)(gpu >> 32) & 0xffff);
    emit(v);
}

static struct obj begin_batch(void) {
    struct obj b = batches[next_batch++ % NBATCH];
    cmd_at = (u32 *)b.cpu;
    return b;
}

static void end_batch(struct obj b) {
    emit(0x0au << 23); /* MI_BATCH_BUFFER_END */
    if ((u64)((u8 *)cmd_at - b.cpu) > b.size)
        gpu_fail("batch overflow");
}

/* Appends BB_START(batch) + seqno breadcrumb + user interrupt to the ring, writes the new tail
 * into the context image and submits the context through the ELSP. */
static void submit(struct obj batch) {
    u32 cmds[12];
    u32 n = 0;
    cmds[n++] = (0x31u << 23) | 1; /* MI_BATCH_BUFFER_START, GGTT */
    cmds[n++] = (u32)batch.gpu & ~3u;
    cmds[n++] = (u32)(batch.gpu >> 32) & 0xffff;
    seqno++;
    u64 slot = hws.gpu + 4 * HWS_SEQNO_INDEX;
    cmds[n++] = (0x20u << 23) | (1u << 22) | 2; /* MI_STORE_DATA_IMM, GGTT */
    cmds[n++] = (u32)slot;
    cmds[n++] = (u32)(slot >> 32);
    cmds[n++] = seqno;
    cmds[n++] = 0x02u << 23; /* MI_USER_INTERRUPT */
    if (n & 1)
        cmds[n++] = 0; /* MI_NOOP */
    u32 ring_size = (u32)ring.size;
    if (ring_tail + n * 4 >= ring_size) {
        memset32(ring.cpu + ring_tail, 0, (ring_size - ring_tail) / 4);
        ring_tail = 0;
    }
    volatile u32 *r = (volatile u32 *)(ring.cpu + ring_tail);
    for (u32 i = 0; i < n; i++)
        r[i] = cmds[i];
    ring_tail = (ring_tail + n * 4) % ring_size;
    ((volatile u32 *)(image.cpu + PAGE))[0x07] = ring_tail;
    u64 desc = 1 | (image.gpu & 0xfffff000ULL) | (1ULL << 32) | (1u << 3) | (1u << 8);
    u64 elsp = bar0 + BCS_BASE + RING_ELSP;
    wr32(elsp, 0);
    wr32(elsp, 0);
    wr32(elsp, (u32)(desc >> 32));
    wr32(elsp, (u32)desc);
}

/* Waits for the last seqno: polls the status page, reading an engine register each time round
 * (an MMIO access: the vGPU makes progress between them). The poll count depends on when the
 * GPU ran, which a migration may shift, so it lives in the telemetry, not in RAM the
 * differential comparison covers. */
static u64 failures;
static void wait_idle(void) {
    volatile u32 *s = (volatile u32 *)(hws.cpu + 4 * HWS_SEQNO_INDEX);
    for (tel->spins = 0; *s != seqno; tel->spins++) {
        (void)rd32(bar0 + BCS_BASE + RING_EXECLIST_STATUS);
        tsc_tick();
        if (tel->spins > 100000) {
            failures++;
            con_puts("guest: seqno timeout\n");
            return;
        }
    }
}

/* ---- checksum (FNV-1a 64 over what the GPU wrote) ---- */
static u64 checksum = 0xcbf29ce484222325ULL;
static void fold(const u8 *at, u64 bytes) {
    const volatile u64 *p = (const volatile u64 *)at;
    u64 h = checksum;
    for (u64 i = 0; i < bytes / 8; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    checksum = h;
}

/* ---- CPU work on ordinary RAM ---- */
/* Each scratch page's words hold the page's layout address: that is what makes the Linux
 * program keep the freestanding guest's RAM layout. */
static u64 scratch_base, scratch_pages_total, scratch_cursor;
static u8 *scratch_cpu;
static void scratch_work(u32 pages, u32 frame) {
    for (u32 i = 0; i < pages && scratch_pages_total; i++) {
        u64 index = scratch_cursor++ % scratch_pages_total;
        u64 page = scratch_base + index * PAGE;
        volatile u64 *p = (volatile u64 *)(scratch_cpu + index * PAGE);
        for (u32 w = 0; w < PAGE / 8; w += 8)
            p[w] = ((u64)frame << 32) ^ (page + w);
        checksum ^= p[(frame * 8) % (PAGE / 8)];
    }
}

/* ---- profiles ---- */
#define MAX_WINDOWS 4
static struct obj fb[2], win[MAX_WINDOWS], buf[2];
static u32 win_w[MAX_WINDOWS], win_h[MAX_WINDOWS], win_x[MAX_WINDOWS], win_y[MAX_WINDOWS];
static u32 width, height;

static void setup_desktop(void) {
    for (int i = 0; i < 2; i++)
        fb[i] = alloc_ggtt(0, (u64)width * height * 4);
    wr32(bar0 + PLANE_SURF0, (u32)fb[0].gpu);
    wr32(bar0 + PLANE_STRIDE0, width * 4 / 64);
    for (int i = 0; i < MAX_WINDOWS; i++) {
        win_w[i] = rnd_range(width / 8, width / 2);
        win_h[i] = rnd_range(height / 8, height / 2);
        win_x[i] = rnd_range(0, width - win_w[i]);
        win_y[i] = rnd_range(0, height - win_h[i]);
        win[i] = alloc_ggtt(1, (u64)win_w[i] * win_h[i] * 4);
    }
}

static void frame_desktop(u32 frame) {
    struct obj back = fb[frame & 1];
    struct obj b = begin_batch();
    /* Clients: one or two windows get a damage rectangle (GPU fill) and a text row (CPU). */
    u32 damaged = rnd_range(1, 2);
    for (u32 k = 0; k < damaged; k++) {
        u32 i = rnd() % MAX_WINDOWS;
        u32 x1 = rnd_range(0, win_w[i] / 2 - 1), y1 = rnd_range(0, win_h[i] / 2 - 1);
        u32 x2 = rnd_range(x1 + 1, win_w[i]), y2 = rnd_range(y1 + 1, win_h[i]);
        xy_color_blt(win[i].gpu, win_w[i] * 4, x1, y1, x2, y2, rnd());
        u32 row = rnd() % win_h[i];
        volatile u32 *text = (volatile u32 *)(win[i].cpu + (u64)row * win_w[i] * 4);
        for (u32 x = 0; x < win_w[i]; x++)
            text[x] = rnd();
    }
    /* Compositor: background fill, every window, and a timeline breadcrumb. */
    xy_color_blt(back.gpu, width * 4, 0, 0, width, height, 0xff203040u + frame);
    for (u32 i = 0; i < MAX_WINDOWS; i++)
        xy_src_copy_blt(back.gpu, width * 4, win_x[i], win_y[i], win_x[i] + win_w[i],
                        win_y[i] + win_h[i], win[i].gpu, win_w[i] * 4, 0, 0);
    store_dword(timeline.gpu + 4 * (frame % 1024), frame);
    end_batch(b);
    submit(b);
    wr32(bar0 + PLANE_SURF0, (u32)fb[(frame + 1) & 1].gpu); /* flip to the last frame */
    wait_idle();
    fold(back.cpu, back.size);
}

static void setup_compute(void) {
    for (int i = 0; i < 2; i++)
        buf[i] = alloc_ggtt(1, 64 * PAGE);
}

static void frame_compute(u32 frame) {
    struct obj b = begin_batch();
    /* A "kernel": scattered stores into buffer 0, then a copy of a random band into buffer 1. */
    for (u32 k = 0; k < 64; k++)
        store_dword(buf[0].gpu + 4 * (rnd() % (buf[0].size / 4)), rnd() ^ frame);
    u32 rows = (u32)(buf[0].size / 4096);
    u32 y1 = rnd_range(0, rows / 2), y2 = rnd_range(y1 + 1, rows);
    xy_src_copy_blt(buf[1].gpu, 4096, 0, y1, 1024, y2, buf[0].gpu, 4096, 0, y1);
    store_dword(timeline.gpu + 4 * (frame % 1024), frame);
    end_batch(b);
    submit(b);
    wait_idle();
    fold(buf[1].cpu, buf[1].size);
}

/* ---- main ---- */
static volatile u64 mmio_before_main;
volatile u64 *mmio_count = &mmio_before_main;

u64 gpu_main(const struct gpu_params *bp, volatile struct telemetry *t) {
    tel = t;
    mmio_count = &tel->mmio;
    tel->magic = TELEMETRY_MAGIC;
    tel->phase = 1;
    rng_state = bp->seed | 1;
    width = bp->width;
    height = bp->height;
    ram_next = bp->alloc_base;
    ram_end = bp->ram_bytes;
    con_puts("gmig guest: profile ");
    con_puts(bp->profile ? "compute" : "desktop");
    con_puts(" frames ");
    con_putdec(bp->frames);
    con_puts("\n");

    plat_find_gpu();
    if (rd64(bar0 + PVINFO + PV_MAGIC) != VGT_MAGIC || (rd32(bar0 + PVINFO + PV_VERSION_MAJOR) & 0xffff) != 1)
        gpu_fail("no GVT-g PV info");
    ap_next = rd32(bar0 + PVINFO + PV_APERTURE_BASE);
    ap_end = ap_next + rd32(bar0 + PVINFO + PV_APERTURE_SIZE);
    hid_next = rd32(bar0 + PVINFO + PV_HIDDEN_BASE);
    hid_end = hid_next + rd32(bar0 + PVINFO + PV_HIDDEN_SIZE);

    tel->phase = 2;
    setup_context();
    timeline = alloc_ggtt(1, PAGE);
    if (bp->profile)
        setup_compute();
    else
        setup_desktop();
    /* Whatever RAM is left (up to 1/4 of the guest) is the CPU's scratch. */
    scratch_base = page_align(ram_next);
    u64 left = ram_end > scratch_base ? ram_end - scratch_base : 0;
    if (left > bp->ram_bytes / 4)
        left = bp->ram_bytes / 4;
    scratch_pages_total = left / PAGE;
    if (scratch_pages_total)
        scratch_cpu = (u8 *)plat_ram(scratch_base, scratch_pages_total * PAGE, 0);

    tel->phase = 3;
    tel->frames_t0 = plat_now();
    tel->frames_mmio0 = tel->mmio;
    for (u32 f = 0; f < bp->frames; f++) {
        if (bp->profile)
            frame_compute(f);
        else
            frame_desktop(f);
        scratch_work(bp->scratch_pages, f);
        tel->frames_done = f + 1;
        if ((f + 1) % 16 == 0) {
            con_puts("frame ");
            con_putdec(f + 1);
            con_puts(" sum ");
            con_puthex(checksum);
            con_puts("\n");
        }
    }
    tel->phase = 4;
    tel->frames_t1 = plat_now();
    tel->frames_mmio1 = tel->mmio;
    con_puts("checksum ");
    con_puthex(checksum);
    con_puts(" frames ");
    con_putdec(bp->frames);
    con_puts(" failures ");
    con_putdec(failures);
    con_puts("\n");
    u64 khz = bp->tsc_khz ? bp->tsc_khz : 1;
    con_puts("tsc max-gap-us ");
    con_putdec(tel->max_gap_tsc * 1000 / khz);
    con_puts("\n");
    return failures;
}
