/* Safetensors reader and writer (see ztrain/safetensors.h).
 *
 * The reader maps the file and checks the header as strictly as the reference implementation
 * does (contiguous data that exactly fills the data section), so a file that opens here opens in
 * Python too. The writer emits the same layout the reference writer does: a compact JSON header
 * padded with spaces to a multiple of 8 bytes, so that F32 data starts aligned. */
#define _POSIX_C_SOURCE 200809L /* strndup, O_CLOEXEC, O_DIRECTORY; before any header */
#include "ztrain/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "ztrain/strbuf.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is read in place; a big-endian host needs swapping"
#endif

/* The reference implementation refuses larger headers; so do we, before parsing anything. */
#define ST_MAX_HEADER 100000000ULL
/* Integers in the header go through doubles in cJSON; beyond 2^53 they are no longer exact. */
#define ST_MAX_JSON_INT 9007199254740992.0

typedef struct {
    const char *name;
    zt_st_dtype dtype;
    int bits;
} st_dtype_info;

/* Every dtype name of the reference implementation, with its width in bits. */
static const st_dtype_info st_dtypes[] = {
    {"F32", ZT_ST_F32, 32},      {"F16", ZT_ST_F16, 16},         {"BF16", ZT_ST_BF16, 16},
    {"I32", ZT_ST_I32, 32},      {"I64", ZT_ST_I64, 64},         {"U8", ZT_ST_U8, 8},
    {"BOOL", ZT_ST_OTHER, 8},    {"I8", ZT_ST_OTHER, 8},         {"I16", ZT_ST_OTHER, 16},
    {"U16", ZT_ST_OTHER, 16},    {"U32", ZT_ST_OTHER, 32},       {"U64", ZT_ST_OTHER, 64},
    {"F64", ZT_ST_OTHER, 64},    {"C64", ZT_ST_OTHER, 64},       {"F8_E5M2", ZT_ST_OTHER, 8},
    {"F8_E4M3", ZT_ST_OTHER, 8}, {"F8_E8M0", ZT_ST_OTHER, 8},    {"F6_E2M3", ZT_ST_OTHER, 6},
    {"F6_E3M2", ZT_ST_OTHER, 6}, {"F4", ZT_ST_OTHER, 4},
};

static const st_dtype_info *dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, name) == 0)
            return &st_dtypes[i];
    return NULL;
}

int64_t zt_st_numel(const zt_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Reading */

/* A JSON number that is a whole, non-negative, exactly representable integer, written as one:
 * the safetensors library reads shapes and offsets as usize, and its JSON reader refuses "4.0"
 * there ("invalid type: floating point"), so from_pretrained fails on such a file. */
static bool json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || zt_json_is_float_literal(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_JSON_INT) || d != (double)(uint64_t)d)
        return false;
    *out = (uint64_t)d;
    return true;
}

static void shape_str(const zt_st_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* Fills one tensor entry from its header object and checks it on its own; placement against
 * the other tensors is checked afterwards. */
static zt_status parse_tensor(const zt_st_file *f, const cJSON *obj, zt_st_tensor *t,
                              uint64_t *begin, uint64_t *end) {
    const char *name = obj->string;
    if (!cJSON_IsObject(obj))
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", f->path,
                        name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(obj, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(obj, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(obj, "data_offsets");
    if (!cJSON_IsString(dt))
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"",
                        f->path, name);
    const st_dtype_info *info = dtype_lookup(dt->valuestring);
    if (!info)
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%s\"", f->path, name,
                        dt->valuestring);
    t->dtype = info->dtype;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", info->name);

    if (!cJSON_IsArray(sh))
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", f->path,
                        name);
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > ZT_ST_MAX_DIMS)
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, more than the %d supported",
                        f->path, name, ndim, ZT_ST_MAX_DIMS);
    t->ndim = ndim;
    /* numel * bits is accumulated in 128 bits so that no shape can overflow it unnoticed. */
    unsigned __int128 bits = (unsigned)info->bits;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh) {
        uint64_t v;
        if (!json_uint(d, &v))
            return zt_error(ZT_ERR_FORMAT,
                            "%s: tensor '%s': shape entry %d is not a non-negative integer "
                            "(written without a fraction or exponent)",
                            f->path, name, i);
        t->shape[i++] = (int64_t)v;
        bits *= v;
        if (bits > (unsigned __int128)ST_MAX_JSON_INT * 8)
            return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s': shape is too large", f->path, name);
    }
    if (bits % 8 != 0)
        return zt_error(ZT_ERR_FORMAT,
                        "%s: tensor '%s': %s elements do not fill whole bytes for this shape",
                        f->path, name, info->name);
    t->nbytes = (size_t)(bits / 8);

    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_uint(cJSON_GetArrayItem(off, 0), begin) ||
        !json_uint(cJSON_GetArrayItem(off, 1), end))
        return zt_error(ZT_ERR_FORMAT,
                        "%s: tensor '%s': \"data_offsets\" must be [begin, end] of non-negative "
                        "integers (written without a fraction or exponent)",
                        f->path, name);
    if (*end < *begin)
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                        f->path, name, (unsigned long long)*begin, (unsigned long long)*end);
    if (*end - *begin != t->nbytes) {
        char s[160];
        shape_str(t, s, sizeof s);
        return zt_error(ZT_ERR_FORMAT,
                        "%s: tensor '%s': dtype %s and shape %s need %zu bytes but data_offsets "
                        "[%llu, %llu] span %llu",
                        f->path, name, info->name, s, t->nbytes, (unsigned long long)*begin,
                        (unsigned long long)*end, (unsigned long long)(*end - *begin));
    }
    t->offset = (size_t)*begin;
    return ZT_OK;
}

static int cmp_by_offsets(const void *a, const void *b) {
    const zt_st_tensor *x = *(const zt_st_tensor *const *)a, *y = *(const zt_st_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const zt_st_tensor *const *)a)->name, (*(const zt_st_tensor *const *)b)->name);
}

/* The data section must be tiled exactly by the tensors: no gaps, no overlap, nothing left
 * over. Names must be unique. */
static zt_status check_layout(const zt_st_file *f, size_t data_len) {
    int n = f->n_tensors;
    if (n == 0) {
        if (data_len != 0)
            return zt_error(ZT_ERR_FORMAT, "%s: no tensors but %zu bytes of data", f->path,
                            data_len);
        return ZT_OK;
    }
    const zt_st_tensor **v = malloc((size_t)n * sizeof *v);
    if (!v)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < n; i++)
        v[i] = &f->tensors[i];
    zt_status s = ZT_OK;
    qsort(v, (size_t)n, sizeof *v, cmp_by_name);
    for (int i = 1; i < n && s == ZT_OK; i++)
        if (strcmp(v[i - 1]->name, v[i]->name) == 0)
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", f->path,
                         v[i]->name);
    qsort(v, (size_t)n, sizeof *v, cmp_by_offsets);
    size_t at = 0;
    for (int i = 0; i < n && s == ZT_OK; i++) {
        const zt_st_tensor *t = v[i];
        if (t->offset < at)
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' at data_offsets [%zu, %zu] overlaps tensor '%s'",
                         f->path, t->name, t->offset, t->offset + t->nbytes, v[i - 1]->name);
        else if (t->offset > at)
            s = zt_error(ZT_ERR_FORMAT,
                         "%s: tensor '%s' starts at data offset %zu, leaving a gap after byte %zu",
                         f->path, t->name, t->offset, at);
        else if (t->offset + t->nbytes > data_len)
            s = zt_error(ZT_ERR_FORMAT,
                         "%s: tensor '%s' at data_offsets [%zu, %zu] runs past the end of the "
                         "%zu-byte data section",
                         f->path, t->name, t->offset, t->offset + t->nbytes, data_len);
        at = t->offset + t->nbytes;
    }
    if (s == ZT_OK && at != data_len)
        s = zt_error(ZT_ERR_FORMAT, "%s: tensors end at data offset %zu but the data section has %zu bytes",
                     f->path, at, data_len);
    free(v);
    return s;
}

static zt_status parse_metadata(zt_st_file *f, const cJSON *meta) {
    /* The library's __metadata__ is optional: null is its absence. */
    if (cJSON_IsNull(meta))
        return ZT_OK;
    if (!cJSON_IsObject(meta))
        return zt_error(ZT_ERR_FORMAT, "%s: \"__metadata__\" is not an object", f->path);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, meta) {
        if (!cJSON_IsString(kv))
            return zt_error(ZT_ERR_FORMAT, "%s: metadata value of '%s' is not a string", f->path,
                            kv->string);
    }
    char *text = cJSON_PrintUnformatted(meta);
    if (!text)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", f->path);
    f->metadata_json = strdup(text);
    cJSON_free(text);
    if (!f->metadata_json)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", f->path);
    return ZT_OK;
}

static zt_status parse_header(zt_st_file *f, const char *text, size_t len) {
    /* cJSON skips a UTF-8 byte-order mark, which the library's JSON reader does not. */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        return zt_error(ZT_ERR_FORMAT, "%s: header starts with a UTF-8 byte-order mark, which "
                        "the safetensors library refuses", f->path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return zt_error(ZT_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu of %zu)",
                        f->path, at, len);
    }
    zt_json_mark_floats(root, text, (size_t)(end - text));
    zt_status s = ZT_OK;
    /* The reference writer pads with spaces; anything else after the JSON is corruption. */
    for (const char *p = end; p < text + len && s == ZT_OK; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            s = zt_error(ZT_ERR_FORMAT, "%s: unexpected byte 0x%02x after the JSON header at byte %zu",
                         f->path, (unsigned char)*p, (size_t)(p - text));
    if (s == ZT_OK && !cJSON_IsObject(root))
        s = zt_error(ZT_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    if (s != ZT_OK) {
        cJSON_Delete(root);
        return s;
    }
    int n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") != 0)
            n++;
    }
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        cJSON_Delete(root);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for %d tensors", f->path, n);
    }
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (f->metadata_json)
                s = zt_error(ZT_ERR_FORMAT, "%s: \"__metadata__\" appears twice", f->path);
            else
                s = parse_metadata(f, item);
        } else {
            zt_st_tensor *t = &f->tensors[f->n_tensors];
            uint64_t b = 0, e = 0;
            t->name = strdup(item->string);
            if (!t->name) {
                s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", f->path);
                break;
            }
            f->n_tensors++;
            s = parse_tensor(f, item, t, &b, &e);
        }
        if (s != ZT_OK)
            break;
    }
    cJSON_Delete(root);
    return s;
}

zt_status zt_st_open(zt_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    zt_status s = zt_map_file(path, &f->map, &f->map_size);
    if (s != ZT_OK)
        goto fail;
    size_t size = f->map_size;
    const void *map = f->map;
    if (size < 8) {
        s = zt_error(ZT_ERR_FORMAT, "%s: file has %zu bytes, too short for the 8-byte header length",
                     path, size);
        goto fail;
    }

    uint64_t hlen;
    memcpy(&hlen, map, sizeof hlen);
    if (hlen > size - 8) {
        s = zt_error(ZT_ERR_FORMAT,
                     "%s: header length %llu is larger than the %zu bytes that follow it (truncated "
                     "or not a safetensors file)",
                     path, (unsigned long long)hlen, size - 8);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        s = zt_error(ZT_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit", path,
                     (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    f->data_start = 8 + (size_t)hlen;
    s = parse_header(f, (const char *)map + 8, (size_t)hlen);
    if (s == ZT_OK)
        s = check_layout(f, size - f->data_start);
    if (s == ZT_OK)
        return ZT_OK;
fail:
    zt_st_close(f);
    return s;
}

void zt_st_close(zt_st_file *f) {
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->metadata_json);
    zt_unmap_file(f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const void *zt_st_data(const zt_st_file *f, const zt_st_tensor *t) {
    return (const char *)f->map + f->data_start + t->offset;
}

/* IEEE binary16 to binary32, exact for every input: subnormals are renormalised, infinities
 * and NaNs keep their sign and payload. */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {
            int e = 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                e--;
            }
            bits = sign | ((uint32_t)(e + 112) << 23) | ((mant & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

zt_status zt_st_read_f32_range(const zt_st_file *f, const zt_st_tensor *t, size_t first,
                               float *dst, size_t n) {
    size_t numel = (size_t)zt_st_numel(t);
    if (first > numel || n > numel - first)
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has %zu elements, not [%zu, %zu)", f->path,
                        t->name, numel, first, first + n);
    /* Data need not be aligned (other writers do not pad the header), so it is read with memcpy. */
    const unsigned char *src = zt_st_data(f, t);
    if (t->dtype == ZT_ST_F32) {
        memcpy(dst, src + first * sizeof(float), n * sizeof(float));
    } else if (t->dtype == ZT_ST_F16 || t->dtype == ZT_ST_BF16) {
        bool bf = t->dtype == ZT_ST_BF16;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * (first + i), 2);
            dst[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
        }
    } else if (strcmp(t->dtype_name, "F64") == 0) {
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, src + 8 * (first + i), 8);
            dst[i] = (float)d;
        }
    } else {
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, not a float type ztrain "
                        "reads (F32, F16, BF16, F64)", f->path, t->name, t->dtype_name);
    }
    return ZT_OK;
}

zt_status zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, float *dst, size_t n) {
    int64_t numel = zt_st_numel(t);
    if ((uint64_t)numel != n)
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has %lld elements, expected %zu", f->path,
                        t->name, (long long)numel, n);
    return zt_st_read_f32_range(f, t, 0, dst, n);
}

/* ---------------------------------------------------------------------------------------------
 * Writing */

/* A JSON string literal; bytes >= 0x80 pass through, so UTF-8 names stay as they are. */
static void json_string(zt_strbuf *b, const char *s) {
    zt_strbuf_putc(b, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            zt_strbuf_printf(b, "\\%c", c);
        else if (c < 0x20)
            zt_strbuf_printf(b, "\\u%04x", c);
        else
            zt_strbuf_putc(b, (char)c);
    }
    zt_strbuf_putc(b, '"');
}

static zt_status check_entries(const char *path, const zt_st_entry *e, const zt_st_source *src,
                               int n, const char *const *mk, const char *const *mv, int n_meta) {
    if (n < 0 || n_meta < 0 || (n > 0 && !e) || (n_meta > 0 && (!mk || !mv)))
        return zt_error(ZT_ERR_INVALID, "%s: bad tensor or metadata list", path);
    for (int i = 0; i < n; i++) {
        if (!e[i].name || !e[i].name[0] || strcmp(e[i].name, "__metadata__") == 0)
            return zt_error(ZT_ERR_INVALID, "%s: tensor %d has an empty or reserved name", path, i);
        if (e[i].ndim < 0 || e[i].ndim > ZT_ST_MAX_DIMS)
            return zt_error(ZT_ERR_INVALID, "%s: tensor '%s' has %d dimensions", path, e[i].name,
                            e[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++) {
            if (e[i].shape[d] < 0 || (e[i].shape[d] > 0 && numel > INT64_MAX / 4 / e[i].shape[d]))
                return zt_error(ZT_ERR_INVALID, "%s: tensor '%s' has a bad shape", path,
                                e[i].name);
            numel *= e[i].shape[d];
        }
        if (numel > 0 && !e[i].data && !(src && src[i].read))
            return zt_error(ZT_ERR_INVALID, "%s: tensor '%s' has no data", path, e[i].name);
        for (int j = 0; j < i; j++)
            if (strcmp(e[i].name, e[j].name) == 0)
                return zt_error(ZT_ERR_INVALID, "%s: tensor '%s' is listed twice", path, e[i].name);
    }
    for (int i = 0; i < n_meta; i++) {
        if (!mk[i] || !mv[i])
            return zt_error(ZT_ERR_INVALID, "%s: metadata entry %d is NULL", path, i);
        for (int j = 0; j < i; j++)
            if (strcmp(mk[i], mk[j]) == 0)
                return zt_error(ZT_ERR_INVALID, "%s: metadata key '%s' is listed twice", path,
                                mk[i]);
    }
    return ZT_OK;
}

static size_t entry_numel(const zt_st_entry *e) {
    size_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= (size_t)e->shape[d];
    return n;
}

static size_t entry_bytes(const zt_st_entry *e, zt_st_dtype dtype) {
    return entry_numel(e) * (dtype == ZT_ST_F32 ? sizeof(float) : 2);
}

/* fp32 to bfloat16, rounded to nearest even (NaN stays a quiet NaN). */
static uint16_t f32_to_bf16(float v) {
    uint32_t x;
    memcpy(&x, &v, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* fp32 to IEEE half, rounded to nearest even: overflow to infinity, subnormals and underflow to
 * zero as the format has them. */
static uint16_t f32_to_f16(float v) {
    uint32_t x;
    memcpy(&x, &v, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* rounds to beyond 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
        if (ax < 0x33000000u)
            return (uint16_t)sign;
        uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half = mant >> shift, rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* A tensor without data in memory, through a bounded buffer. */
/* A tensor without data in memory, or one rounded to 16 bits, through a bounded buffer. */
static zt_status write_streamed(int fd, const zt_st_entry *e, const zt_st_source *src,
                                zt_st_dtype dtype, const char *path) {
    enum { PIECE = 1 << 16 };
    size_t n = entry_numel(e);
    if (n == 0)
        return ZT_OK;
    size_t piece = n < PIECE ? n : PIECE;
    float *buf = e->data ? NULL : malloc(piece * sizeof(float));
    uint16_t *half = dtype == ZT_ST_F32 ? NULL : malloc(piece * 2);
    if ((!e->data && !buf) || (dtype != ZT_ST_F32 && !half)) {
        free(buf);
        free(half);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    zt_status s = ZT_OK;
    for (size_t first = 0; first < n && s == ZT_OK; first += PIECE) {
        size_t len = n - first < PIECE ? n - first : PIECE;
        const float *v = e->data ? e->data + first : buf;
        if (!e->data)
            s = src->read(src->ctx, first, buf, len);
        if (s == ZT_OK && half) {
            for (size_t i = 0; i < len; i++)
                half[i] = dtype == ZT_ST_BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
            s = zt_write_all(fd, half, len * 2, path);
        } else if (s == ZT_OK) {
            s = zt_write_all(fd, v, len * sizeof(float), path);
        }
    }
    free(buf);
    free(half);
    return s;
}

zt_status zt_st_write(const char *path, const zt_st_entry *entries, int n_entries,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta) {
    return zt_st_write_sources(path, entries, NULL, n_entries, meta_keys, meta_values, n_meta);
}

zt_status zt_st_write_sources(const char *path, const zt_st_entry *entries,
                              const zt_st_source *sources, int n_entries,
                              const char *const *meta_keys, const char *const *meta_values,
                              int n_meta) {
    return zt_st_write_typed(path, entries, sources, NULL, n_entries, meta_keys, meta_values,
                             n_meta);
}

zt_status zt_st_write_typed(const char *path, const zt_st_entry *entries,
                            const zt_st_source *sources, const zt_st_dtype *dtypes,
                            int n_entries, const char *const *meta_keys,
                            const char *const *meta_values, int n_meta) {
    ZT_TRY(check_entries(path, entries, sources, n_entries, meta_keys, meta_values, n_meta));
    for (int i = 0; dtypes && i < n_entries; i++)
        if (dtypes[i] != ZT_ST_F32 && dtypes[i] != ZT_ST_F16 && dtypes[i] != ZT_ST_BF16)
            return zt_error(ZT_ERR_INVALID, "%s: tensor '%s': only F32, F16 and BF16 are written",
                            path, entries[i].name);

    zt_strbuf h = {0};
    zt_strbuf_puts(&h, "{");
    if (n_meta > 0) {
        zt_strbuf_puts(&h, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i)
                zt_strbuf_puts(&h, ",");
            json_string(&h, meta_keys[i]);
            zt_strbuf_puts(&h, ":");
            json_string(&h, meta_values[i]);
        }
        zt_strbuf_puts(&h, "}");
    }
    size_t offset = 0;
    for (int i = 0; i < n_entries; i++) {
        const zt_st_entry *e = &entries[i];
        zt_st_dtype dt = dtypes ? dtypes[i] : ZT_ST_F32;
        size_t nb = entry_bytes(e, dt);
        if (i || n_meta > 0)
            zt_strbuf_puts(&h, ",");
        json_string(&h, e->name);
        zt_strbuf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[",
                         dt == ZT_ST_BF16 ? "BF16" : dt == ZT_ST_F16 ? "F16" : "F32");
        for (int d = 0; d < e->ndim; d++)
            zt_strbuf_printf(&h, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        zt_strbuf_printf(&h, "],\"data_offsets\":[%lld", (long long)offset);
        zt_strbuf_printf(&h, ",%lld]}", (long long)(offset + nb));
        offset += nb;
    }
    zt_strbuf_puts(&h, "}");
    while (!h.oom && h.len % 8 != 0)
        zt_strbuf_puts(&h, " ");
    if (h.oom) {
        zt_strbuf_free(&h);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the header", path);
    }

    char *tmp;
    int fd;
    zt_status s = zt_atomic_write_begin(path, &tmp, &fd);
    if (s != ZT_OK) {
        zt_strbuf_free(&h);
        return s;
    }
    uint64_t hlen = h.len;
    s = zt_write_all(fd, &hlen, sizeof hlen, tmp);
    if (s == ZT_OK)
        s = zt_write_all(fd, h.data, h.len, tmp);
    for (int i = 0; i < n_entries && s == ZT_OK; i++) {
        zt_st_dtype dt = dtypes ? dtypes[i] : ZT_ST_F32;
        if (entries[i].data && dt == ZT_ST_F32)
            s = zt_write_all(fd, entries[i].data, entry_bytes(&entries[i], dt), tmp);
        else
            s = write_streamed(fd, &entries[i], sources ? &sources[i] : NULL, dt, tmp);
    }
    zt_strbuf_free(&h);
    return zt_atomic_write_end(fd, tmp, path, s);
}

zt_status zt_st_check_finite(const zt_st_file *f, const zt_st_tensor *t, const float *x,
                             size_t first, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' holds %g at element %zu: the file is "
                            "damaged (stored weights and optimizer state are always finite)",
                            f->path, t->name, (double)x[i], first + i);
    return ZT_OK;
}
