/*
 * gmig-kms-draw: shows a known image on the first connected connector through Linux's KMS uAPI
 * (a dumb buffer and a mode set), flips to a second known image with a page-flip event, and
 * counts vblanks; then holds the screen so the host can capture it.
 *
 *   usage: gmig-kms-draw HOLD_SECONDS [BACK_SECONDS]
 *
 * With BACK_SECONDS, after the hold it flips back to image 0 (waiting for the event again),
 * prints "GMIG-KMS: flipped back" and holds that for BACK_SECONDS.
 *
 * Prints (stdout):
 *   GMIG-KMS: mode WxH clock KHZ crtc ID
 *   GMIG-KMS: vblanks N in MS ms
 *   GMIG-KMS: flip done sequence S user 0x...
 *   GMIG-KMS: shown
 * Image k (0 shown by the mode set, 1 by the flip), pixel (x, y), XRGB8888:
 *   ((x * 255 / (w - 1)) << 16) | ((y * 255 / (h - 1)) << 8) | ((x ^ y ^ (0x55 * k)) & 0xff)
 *
 * The uAPI structures are written out here (include/uapi/drm/drm.h, drm_mode.h) so that the
 * program builds without libdrm's headers.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct mode_card_res {
    uint64_t fb_id_ptr, crtc_id_ptr, connector_id_ptr, encoder_id_ptr;
    uint32_t count_fbs, count_crtcs, count_connectors, count_encoders;
    uint32_t min_width, max_width, min_height, max_height;
};
struct modeinfo {
    uint32_t clock;
    uint16_t hdisplay, hsync_start, hsync_end, htotal, hskew;
    uint16_t vdisplay, vsync_start, vsync_end, vtotal, vscan;
    uint32_t vrefresh, flags, type;
    char name[32];
};
struct mode_get_connector {
    uint64_t encoders_ptr, modes_ptr, props_ptr, prop_values_ptr;
    uint32_t count_modes, count_props, count_encoders;
    uint32_t encoder_id, connector_id, connector_type, connector_type_id;
    uint32_t connection, mm_width, mm_height, subpixel, pad;
};
struct mode_get_encoder {
    uint32_t encoder_id, encoder_type, crtc_id, possible_crtcs, possible_clones;
};
struct mode_crtc {
    uint64_t set_connectors_ptr;
    uint32_t count_connectors, crtc_id, fb_id, x, y, gamma_size, mode_valid;
    struct modeinfo mode;
};
struct mode_create_dumb {
    uint32_t height, width, bpp, flags, handle, pitch;
    uint64_t size;
};
struct mode_map_dumb {
    uint32_t handle, pad;
    uint64_t offset;
};
struct mode_fb_cmd {
    uint32_t fb_id, width, height, pitch, bpp, depth, handle;
};
struct mode_crtc_page_flip {
    uint32_t crtc_id, fb_id, flags, reserved;
    uint64_t user_data;
};
struct event_vblank {
    uint32_t type, length;
    uint64_t user_data;
    uint32_t tv_sec, tv_usec, sequence, crtc_id;
};
struct wait_vblank {
    uint32_t type, sequence;
    int64_t tval_sec, tval_usec;
};

#define IOC(dir, nr, size) (((unsigned long)(dir) << 30) | ((unsigned long)(size) << 16) | ('d' << 8) | (nr))
#define IOWR(nr, t) IOC(3, nr, sizeof(t))
#define IOCTL_SET_MASTER IOC(0, 0x1e, 0)
#define IOCTL_WAIT_VBLANK IOWR(0x3a, struct wait_vblank)
#define IOCTL_MODE_GETRESOURCES IOWR(0xa0, struct mode_card_res)
#define IOCTL_MODE_SETCRTC IOWR(0xa2, struct mode_crtc)
#define IOCTL_MODE_GETENCODER IOWR(0xa6, struct mode_get_encoder)
#define IOCTL_MODE_GETCONNECTOR IOWR(0xa7, struct mode_get_connector)
#define IOCTL_MODE_ADDFB IOWR(0xae, struct mode_fb_cmd)
#define IOCTL_MODE_PAGE_FLIP IOWR(0xb0, struct mode_crtc_page_flip)
#define IOCTL_MODE_CREATE_DUMB IOWR(0xb2, struct mode_create_dumb)
#define IOCTL_MODE_MAP_DUMB IOWR(0xb3, struct mode_map_dumb)
#define PAGE_FLIP_EVENT 0x01
#define EVENT_FLIP_COMPLETE 0x02
#define VBLANK_RELATIVE 0x1
#define FLIP_USER_DATA 0x6d69676dULL

_Static_assert(sizeof(struct modeinfo) == 68, "drm_mode_modeinfo");
_Static_assert(sizeof(struct mode_get_connector) == 80, "drm_mode_get_connector");
_Static_assert(sizeof(struct mode_crtc) == 104, "drm_mode_crtc");
_Static_assert(sizeof(struct wait_vblank) == 24, "drm_wait_vblank");

static int fd;

static void die(const char *what)
{
    printf("GMIG-KMS: %s failed: %s\n", what, strerror(errno));
    exit(1);
}

static void xioctl(unsigned long req, void *arg, const char *what)
{
    while (ioctl(fd, req, arg) != 0) {
        if (errno != EINTR && errno != EAGAIN)
            die(what);
    }
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static uint32_t pixel(uint32_t x, uint32_t y, uint32_t w, uint32_t h, uint32_t k)
{
    return ((x * 255 / (w - 1)) << 16) | ((y * 255 / (h - 1)) << 8) | ((x ^ y ^ (0x55 * k)) & 0xff);
}

/* A dumb buffer with image k: its framebuffer id. */
static uint32_t image(uint32_t w, uint32_t h, uint32_t k)
{
    struct mode_create_dumb c = { .height = h, .width = w, .bpp = 32 };
    xioctl(IOCTL_MODE_CREATE_DUMB, &c, "CREATE_DUMB");
    struct mode_map_dumb m = { .handle = c.handle };
    xioctl(IOCTL_MODE_MAP_DUMB, &m, "MAP_DUMB");
    uint8_t *p = mmap(NULL, c.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, m.offset);
    if (p == MAP_FAILED)
        die("mmap");
    for (uint32_t y = 0; y < h; y++) {
        uint32_t *row = (uint32_t *)(p + (size_t)y * c.pitch);
        for (uint32_t x = 0; x < w; x++)
            row[x] = pixel(x, y, w, h, k);
    }
    munmap(p, c.size);
    struct mode_fb_cmd f = { .width = w, .height = h, .pitch = c.pitch, .bpp = 32, .depth = 24, .handle = c.handle };
    xioctl(IOCTL_MODE_ADDFB, &f, "ADDFB");
    return f.fb_id;
}

int main(int argc, char **argv)
{
    int hold = argc > 1 ? atoi(argv[1]) : 5;
    setvbuf(stdout, NULL, _IOLBF, 0);
    fd = open("/dev/dri/card0", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        die("open /dev/dri/card0");
    ioctl(fd, IOCTL_SET_MASTER, 0);
    struct mode_card_res res = { 0 };
    xioctl(IOCTL_MODE_GETRESOURCES, &res, "GETRESOURCES");
    uint32_t crtcs[8] = { 0 }, conns[16] = { 0 }, encs[16] = { 0 };
    if (res.count_crtcs > 8 || res.count_connectors > 16 || res.count_encoders > 16) {
        errno = E2BIG;
        die("GETRESOURCES counts");
    }
    res.count_fbs = 0;
    res.crtc_id_ptr = (uintptr_t)crtcs;
    res.connector_id_ptr = (uintptr_t)conns;
    res.encoder_id_ptr = (uintptr_t)encs;
    xioctl(IOCTL_MODE_GETRESOURCES, &res, "GETRESOURCES");
    struct modeinfo modes[64];
    uint32_t conn_encs[8];
    struct mode_get_connector conn;
    uint32_t c;
    for (c = 0; c < res.count_connectors; c++) {
        memset(&conn, 0, sizeof(conn));
        conn.connector_id = conns[c];
        xioctl(IOCTL_MODE_GETCONNECTOR, &conn, "GETCONNECTOR");
        if (conn.connection != 1 || conn.count_modes == 0)
            continue;
        if (conn.count_modes > 64)
            conn.count_modes = 64;
        if (conn.count_encoders > 8)
            conn.count_encoders = 8;
        conn.count_props = 0;
        conn.modes_ptr = (uintptr_t)modes;
        conn.encoders_ptr = (uintptr_t)conn_encs;
        xioctl(IOCTL_MODE_GETCONNECTOR, &conn, "GETCONNECTOR");
        break;
    }
    if (c == res.count_connectors) {
        errno = ENODEV;
        die("finding a connected connector");
    }
    struct mode_get_encoder enc = { .encoder_id = conn.encoder_id ? conn.encoder_id : conn_encs[0] };
    xioctl(IOCTL_MODE_GETENCODER, &enc, "GETENCODER");
    uint32_t crtc = enc.crtc_id;
    for (uint32_t i = 0; !crtc && i < res.count_crtcs; i++)
        if (enc.possible_crtcs & (1u << i))
            crtc = crtcs[i];
    struct modeinfo mode = modes[0];
    uint32_t w = mode.hdisplay, h = mode.vdisplay;
    uint32_t fb0 = image(w, h, 0), fb1 = image(w, h, 1);

    struct mode_crtc set = { .set_connectors_ptr = (uintptr_t)&conns[c], .count_connectors = 1, .crtc_id = crtc, .fb_id = fb0, .mode_valid = 1, .mode = mode };
    xioctl(IOCTL_MODE_SETCRTC, &set, "SETCRTC");
    printf("GMIG-KMS: mode %ux%u clock %u crtc %u\n", w, h, mode.clock, crtc);

    struct wait_vblank v = { .type = VBLANK_RELATIVE, .sequence = 1 };
    xioctl(IOCTL_WAIT_VBLANK, &v, "WAIT_VBLANK");
    uint32_t seq0 = v.sequence;
    double t0 = now_ms();
    v = (struct wait_vblank){ .type = VBLANK_RELATIVE, .sequence = 60 };
    xioctl(IOCTL_WAIT_VBLANK, &v, "WAIT_VBLANK");
    printf("GMIG-KMS: vblanks %u in %.0f ms\n", v.sequence - seq0, now_ms() - t0);

    struct mode_crtc_page_flip flip = { .crtc_id = crtc, .fb_id = fb1, .flags = PAGE_FLIP_EVENT, .user_data = FLIP_USER_DATA };
    xioctl(IOCTL_MODE_PAGE_FLIP, &flip, "PAGE_FLIP");
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    if (poll(&pfd, 1, 10000) != 1)
        die("waiting for the flip event");
    char buf[256];
    ssize_t n = read(fd, buf, sizeof(buf));
    struct event_vblank ev;
    if (n < (ssize_t)sizeof(ev))
        die("reading the flip event");
    memcpy(&ev, buf, sizeof(ev));
    if (ev.type != EVENT_FLIP_COMPLETE || ev.user_data != FLIP_USER_DATA) {
        errno = EPROTO;
        die("the flip event");
    }
    printf("GMIG-KMS: flip done sequence %u user 0x%llx\n", ev.sequence, (unsigned long long)ev.user_data);
    printf("GMIG-KMS: shown\n");
    sleep(hold);
    if (argc > 2) {
        flip.fb_id = fb0;
        xioctl(IOCTL_MODE_PAGE_FLIP, &flip, "PAGE_FLIP");
        if (poll(&pfd, 1, 10000) != 1 || read(fd, buf, sizeof(buf)) < (ssize_t)sizeof(ev))
            die("waiting for the second flip event");
        printf("GMIG-KMS: flipped back\n");
        sleep(atoi(argv[2]));
    }
    return 0;
}
