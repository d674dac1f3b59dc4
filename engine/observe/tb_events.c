/* TensorBoard event files: TFRecord framing around Event protocol buffers, encoded by hand.
 *
 * A record is the payload's length (uint64, little-endian), the masked CRC-32C of those 8 bytes,
 * the payload, and the payload's masked CRC-32C. The payloads are tensorflow.Event messages
 * (tensorboard/compat/proto/event.proto): wall_time = 1 (double), step = 2 (int64),
 * file_version = 3 (string), summary = 5 (Summary); Summary.value = 1 (repeated Value);
 * Value.tag = 1 (string), Value.simple_value = 2 (float). Six fields of four wire types are
 * fewer lines written out than a generated encoder and its build rule, and TensorBoard's own
 * reader checks the result in tests/reference/test_monitors.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ztrain/fsutil.h"
#include "ztrain/tb_events.h"

/* ---- CRC-32C ----------------------------------------------------------------------------- */

/* The reflected Castagnoli polynomial, one byte at a time through a table built on first use. */
uint32_t zt_crc32c(const void *data, size_t n) {
    static uint32_t table[256];
    static bool ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = true;
    }
    const uint8_t *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* TFRecord's masking, so that a CRC stored inside CRC'd data does not look like data. */
static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = zt_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/* ---- protocol buffer encoding ------------------------------------------------------------ */

/* An encoded message under construction in a fixed buffer; `ok` turns false when it overflows. */
typedef struct {
    uint8_t b[1024];
    size_t n;
    bool ok;
} pb_buf;

static void put_bytes(pb_buf *o, const void *p, size_t n) {
    if (!o->ok || n > sizeof o->b - o->n) {
        o->ok = false;
        return;
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void put_varint(pb_buf *o, uint64_t v) {
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put_bytes(o, b, n);
}

static void put_le(pb_buf *o, uint64_t v, size_t bytes) {
    uint8_t b[8];
    for (size_t i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put_bytes(o, b, bytes);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static void put_key(pb_buf *o, unsigned field, unsigned wire) { put_varint(o, field << 3 | wire); }

static void put_len_field(pb_buf *o, unsigned field, const void *p, size_t n) {
    put_key(o, field, WIRE_LEN);
    put_varint(o, n);
    put_bytes(o, p, n);
}

static void put_double(pb_buf *o, unsigned field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(o, field, WIRE_FIXED64);
    put_le(o, bits, 8);
}

static void put_float(pb_buf *o, unsigned field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(o, field, WIRE_FIXED32);
    put_le(o, bits, 4);
}

/* ---- records ----------------------------------------------------------------------------- */

static zt_status write_record(zt_tb_writer *w, const pb_buf *event) {
    if (!event->ok)
        return zt_error(ZT_ERR_INVALID, "%s: a TensorBoard event is longer than %zu bytes",
                        w->path, sizeof event->b);
    uint8_t head[12];
    uint64_t len = event->n;
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = masked_crc(head, 8), d = masked_crc(event->b, event->n);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (uint8_t)(c >> (8 * i));
    uint8_t tail[4];
    for (int i = 0; i < 4; i++)
        tail[i] = (uint8_t)(d >> (8 * i));
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
        fwrite(event->b, 1, event->n, w->f) != event->n ||
        fwrite(tail, 1, sizeof tail, w->f) != sizeof tail)
        return zt_error(ZT_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    return ZT_OK;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

zt_status zt_tb_open(zt_tb_writer *w, const char *dir) {
    /* SummaryWriter's last name part counts the writers of the process (_global_uid), so two
     * writers opened in one second never share a file. */
    static int writers;
    memset(w, 0, sizeof *w);
    ZT_TRY(zt_mkdirs(dir));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    double now = wall_now();
    int uid = __atomic_fetch_add(&writers, 1, __ATOMIC_RELAXED);
    int n = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%d.%d", dir,
                     (long long)now, host, (int)getpid(), uid);
    if (n < 0 || (size_t)n >= sizeof w->path)
        return zt_error(ZT_ERR_INVALID, "%s: the TensorBoard directory's path is too long", dir);
    w->f = fopen(w->path, "wb");
    if (!w->f)
        return zt_error(ZT_ERR_IO, "%s: cannot create: %s", w->path, strerror(errno));
    pb_buf e = {.ok = true};
    put_double(&e, 1, now);
    put_len_field(&e, 3, "brain.Event:2", strlen("brain.Event:2"));
    ZT_TRY(write_record(w, &e));
    return zt_tb_flush(w);
}

zt_status zt_tb_scalar(zt_tb_writer *w, const char *tag, double value, int64_t step,
                       double wall_time) {
    pb_buf v = {.ok = true}, s = {.ok = true}, e = {.ok = true};
    put_len_field(&v, 1, tag, strlen(tag));
    put_float(&v, 2, (float)value);
    put_len_field(&s, 1, v.b, v.n);
    put_double(&e, 1, wall_time > 0 ? wall_time : wall_now());
    put_key(&e, 2, WIRE_VARINT);
    put_varint(&e, (uint64_t)step);
    put_len_field(&e, 5, s.b, s.n);
    e.ok = e.ok && v.ok && s.ok;
    return write_record(w, &e);
}

zt_status zt_tb_flush(zt_tb_writer *w) {
    if (fflush(w->f) != 0)
        return zt_error(ZT_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    return ZT_OK;
}

void zt_tb_close(zt_tb_writer *w) {
    if (w->f)
        fclose(w->f);
    w->f = NULL;
}
