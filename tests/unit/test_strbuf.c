/* The growable byte buffer (engine/util/strbuf.c), against strings built independently: a
 * plain array filled with memcpy, and snprintf into a buffer sized by snprintf itself. Growth from
 * empty, appends of megabytes, printf past the room reserved, take and clear, and the
 * out-of-memory latch. fault_inject.h cannot make malloc fail, so the latch is tripped by sizes
 * no allocation can give: one whose sum with the length wraps size_t, and one past PTRDIFF_MAX,
 * which glibc's realloc refuses. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/strbuf.h"

/* Under ASan an allocation past its limit aborts unless told to return NULL as malloc does
 * elsewhere; the latch test needs the NULL. Unused in other builds. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* b holds exactly the n bytes of want: length, bytes, the NUL after them, room for it. */
static void check_holds_at(int line, const zt_strbuf *b, const char *want, size_t n) {
    if (!check_at(__FILE__, line, b->data != NULL && !b->oom, "buffer empty or latched"))
        return;
    check_at(__FILE__, line, b->len == n, "len %zu, want %zu", b->len, n);
    check_at(__FILE__, line, b->cap >= b->len + 1, "cap %zu below len %zu + 1", b->cap, b->len);
    check_at(__FILE__, line, b->len == n && memcmp(b->data, want, n) == 0, "bytes differ");
    check_at(__FILE__, line, b->len == n && b->data[n] == '\0', "no NUL after the bytes");
}
#define CHECK_HOLDS(b, want, n) check_holds_at(__LINE__, (b), (want), (n))

/* A deterministic byte stream without NULs (xorshift), so strlen also sees all of it. */
static void fill(char *p, size_t n, uint32_t seed) {
    uint32_t x = seed ? seed : 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (char)(1 + x % 255);
    }
}

static void check_empty(void) {
    zt_strbuf z = {0}, b;
    zt_strbuf_init(&b);
    CHECK(memcmp(&z, &b, sizeof b) == 0, "init differs from {0}");
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0 && !b.oom);
    /* nothing appended still takes as "" */
    size_t len = 99;
    char *s = zt_strbuf_take(&b, &len);
    CHECK(s != NULL && s[0] == '\0' && len == 0);
    free(s);
    /* an empty append or an empty printf allocates the NUL and nothing else */
    zt_strbuf_append(&b, NULL, 0);
    CHECK_HOLDS(&b, "", 0);
    zt_strbuf_printf(&b, "%s", "");
    CHECK_HOLDS(&b, "", 0);
    zt_strbuf_free(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0 && !b.oom);
}

/* One byte at a time from empty, through many doublings, checked after every byte. */
static void check_growth(void) {
    enum { N = 70000 };
    static char want[N];
    fill(want, N, 7);
    zt_strbuf b = {0};
    size_t reallocs = 0, cap = 0;
    for (size_t i = 0; i < N; i++) {
        zt_strbuf_putc(&b, want[i]);
        reallocs += b.cap != cap;
        cap = b.cap;
        if (b.len != i + 1 || b.data[i] != want[i] || b.data[i + 1] != '\0') {
            CHECK(false, "after byte %zu: len %zu", i, b.len);
            break;
        }
    }
    CHECK_HOLDS(&b, want, N);
    CHECK(strlen(b.data) == N);
    /* doubling: about log2(N / first capacity) reallocations, not N */
    CHECK(reallocs < 20, "%zu reallocations for %d bytes", reallocs, N);
    zt_strbuf_free(&b);
    /* a reserve past double the capacity gets what it asks for, the NUL included */
    zt_strbuf_reserve(&b, 100000);
    CHECK(b.cap == 100001 && b.len == 0 && b.data[0] == '\0', "cap %zu", b.cap);
    zt_strbuf_free(&b);
}

/* Appends of every size from nothing to megabytes, with puts and NUL bytes mixed in. */
static void check_large(void) {
    size_t total = 9u << 20;
    char *src = malloc(total + 1);
    char *want = malloc(total + 64);
    if (!src || !want) {
        CHECK(false, "cannot allocate the reference");
        free(src), free(want);
        return;
    }
    fill(src, total, 11);
    src[total] = '\0';
    zt_strbuf b = {0};
    size_t n = 0, at = 0;
    size_t sizes[] = {0, 1, 255, 256, 257, 4096, 1u << 20, 3u << 20, 17, 4u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && at + sizes[k] <= total; k++) {
        zt_strbuf_append(&b, src + at, sizes[k]);
        memcpy(want + n, src + at, sizes[k]);
        n += sizes[k], at += sizes[k];
        CHECK_HOLDS(&b, want, n);
    }
    zt_strbuf_append(&b, "a\0b", 3);
    memcpy(want + n, "a\0b", 3);
    n += 3;
    CHECK_HOLDS(&b, want, n);
    /* puts stops at the NUL: all that is left of src */
    zt_strbuf_puts(&b, src + at);
    memcpy(want + n, src + at, total - at);
    n += total - at;
    CHECK_HOLDS(&b, want, n);
    size_t len = 0;
    char *s = zt_strbuf_take(&b, &len);
    CHECK(s && len == n && memcmp(s, want, n) == 0 && s[n] == '\0');
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0 && !b.oom, "take left b non-empty");
    free(s);
    free(src);
    free(want);
}

/* snprintf's own output, in a buffer of the size snprintf says. */
static char *ref_printf(const char *fmt, const char *s, int i) {
    int n = snprintf(NULL, 0, fmt, s, i);
    char *p = malloc((size_t)n + 1);
    if (p)
        snprintf(p, (size_t)n + 1, fmt, s, i);
    return p;
}

/* printf output shorter than, exactly filling, one past and far past the room left. */
static void check_printf(void) {
    char arg[5000];
    fill(arg, sizeof arg - 1, 3);
    arg[sizeof arg - 1] = '\0';
    for (int boundary = 0; boundary < 2; boundary++) {
        for (int d = -3; d <= 3; d++) {
            zt_strbuf b = {0};
            zt_strbuf_reserve(&b, 10);
            zt_strbuf_puts(&b, "head:");
            /* room counts the NUL: output of room - 1 bytes is the most that fits */
            size_t room = b.cap - b.len;
            size_t out = (boundary ? room - 1 : 4000) + (size_t)(d + 3) - 3;
            char fmt[16];
            snprintf(fmt, sizeof fmt, "%%.%zus#%%d", out - 2);
            char *tail = ref_printf(fmt, arg, 7);
            zt_strbuf_printf(&b, fmt, arg, 7);
            char want[6000];
            int n = snprintf(want, sizeof want, "head:%s", tail ? tail : "");
            CHECK(tail && strlen(tail) == out, "reference has %zu bytes", tail ? strlen(tail) : 0);
            CHECK_HOLDS(&b, want, (size_t)n);
            /* and an append after it lands after it */
            zt_strbuf_printf(&b, "%d|%s", -12, "end");
            snprintf(want + n, sizeof want - (size_t)n, "%d|%s", -12, "end");
            CHECK_HOLDS(&b, want, strlen(want));
            free(tail);
            zt_strbuf_free(&b);
        }
    }
}

/* take hands over the bytes and leaves b usable; clear keeps the memory. */
static void check_take_clear(void) {
    zt_strbuf b = {0};
    zt_strbuf_puts(&b, "first");
    char *one = zt_strbuf_take(&b, NULL);
    CHECK_STR(one, "first");
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    zt_strbuf_puts(&b, "second");
    size_t len;
    char *two = zt_strbuf_take(&b, &len);
    CHECK_STR(two, "second");
    CHECK(len == 6 && one != two);
    free(one);
    free(two);

    zt_strbuf_printf(&b, "%0300d", 5);
    char *kept = b.data;
    size_t cap = b.cap;
    zt_strbuf_clear(&b);
    CHECK(b.len == 0 && b.cap == cap && b.data == kept && b.data[0] == '\0');
    zt_strbuf_puts(&b, "again");
    CHECK_HOLDS(&b, "again", 5);
    CHECK(b.data == kept, "clear gave the memory back");
    zt_strbuf_free(&b);
}

/* After a size no allocation can give: nothing more is appended, what was there stays, the
 * latch survives clear, and take returns NULL and resets. */
static void check_latch_after(size_t huge, const char *what) {
    zt_strbuf b = {0};
    zt_strbuf_puts(&b, "kept");
    CHECK(!zt_strbuf_reserve(&b, huge), "%s: reserve succeeded", what);
    CHECK(b.oom, "%s: not latched", what);
    CHECK(b.len == 4 && memcmp(b.data, "kept", 5) == 0, "%s: bytes lost", what);
    zt_strbuf_puts(&b, "more");
    zt_strbuf_putc(&b, 'x');
    zt_strbuf_append(&b, "y", 1);
    zt_strbuf_printf(&b, "%d", 12345);
    CHECK(b.len == 4 && memcmp(b.data, "kept", 5) == 0, "%s: appended after the latch", what);
    CHECK(!zt_strbuf_reserve(&b, 1), "%s: the latch let a reserve through", what);
    zt_strbuf_clear(&b);
    CHECK(b.oom && b.len == 0, "%s: clear dropped the latch", what);
    size_t len = 99;
    CHECK(zt_strbuf_take(&b, &len) == NULL && len == 0, "%s: take after the latch", what);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0 && !b.oom, "%s: take did not reset", what);
    /* and the buffer works again */
    zt_strbuf_puts(&b, "fresh");
    CHECK_HOLDS(&b, "fresh", 5);
    zt_strbuf_free(&b);
}

static void check_oom(void) {
    check_latch_after(SIZE_MAX, "len + SIZE_MAX wraps");
    check_latch_after(SIZE_MAX - 4, "len + n + 1 wraps to 0");
    check_latch_after((size_t)PTRDIFF_MAX, "past PTRDIFF_MAX");
    /* a free after the latch clears it too */
    zt_strbuf b = {0};
    zt_strbuf_reserve(&b, SIZE_MAX);
    zt_strbuf_free(&b);
    CHECK(!b.oom);
    zt_strbuf_puts(&b, "ok");
    CHECK_HOLDS(&b, "ok", 2);
    zt_strbuf_free(&b);
}

/* A random mix of every append and clear, mirrored in a plain array. */
static void check_mixed(void) {
    enum { CAP = 1 << 20 };
    static char want[CAP];
    char piece[600];
    size_t n = 0;
    zt_strbuf b = {0};
    uint32_t x = 99;
    for (int op = 0; op < 20000; op++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        size_t k = x % 500;
        fill(piece, k, x);
        piece[k] = '\0';
        if (n + 600 > CAP || x % 97 == 0) {
            zt_strbuf_clear(&b);
            n = 0;
            continue;
        }
        switch (x % 4) {
        case 0: zt_strbuf_append(&b, piece, k); break;
        case 1: zt_strbuf_puts(&b, piece); break;
        case 2: zt_strbuf_putc(&b, piece[0] ? piece[0] : 'z'); break;
        case 3: zt_strbuf_printf(&b, "<%s:%zu>", piece, k); break;
        }
        switch (x % 4) {
        case 0:
        case 1: memcpy(want + n, piece, k), n += k; break;
        case 2: want[n++] = piece[0] ? piece[0] : 'z'; break;
        case 3: n += (size_t)snprintf(want + n, CAP - n, "<%s:%zu>", piece, k); break;
        }
        if (b.len != n || memcmp(b.data, want, n) != 0) {
            CHECK(false, "operation %d: len %zu, want %zu", op, b.len, n);
            break;
        }
    }
    CHECK_HOLDS(&b, want, n);
    zt_strbuf_free(&b);
}

int main(void) {
    check_empty();
    check_growth();
    check_large();
    check_printf();
    check_take_clear();
    check_oom();
    check_mixed();
    return check_summary("test_strbuf");
}
