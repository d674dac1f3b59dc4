/* Fuzz target: the safetensors reader (zt_st_open), which opens model.init_from files and
 * checkpoints. The input is the whole file. What a successful open returns is checked against
 * the format: every tensor lies inside the file's data section, its byte count is its element
 * count times its element size, zt_st_find finds it by name, zt_st_read_f32 converts exactly the
 * float dtypes (F32, F16, BF16, F64) and gives an F32 tensor's raw little-endian bytes back. */
#include <limits.h>

#include "fuzz_util.h"
#include "ztrain/safetensors.h"

/* Tensors larger than this are not read back, to keep each input fast. */
#define MAX_READ_ELEMENTS (1 << 16)

static int element_bytes(zt_st_dtype d) {
    switch (d) {
    case ZT_ST_F32: case ZT_ST_I32: return 4;
    case ZT_ST_F16: case ZT_ST_BF16: return 2;
    case ZT_ST_I64: return 8;
    case ZT_ST_U8: return 1;
    default: return 0;
    }
}

static void check_tensor(const zt_st_file *f, const zt_st_tensor *t) {
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ZT_ST_MAX_DIMS, "tensor '%s': ndim %d", t->name,
               t->ndim);
    FUZZ_CHECK(t->offset <= f->map_size - f->data_start &&
                   t->nbytes <= f->map_size - f->data_start - t->offset,
               "tensor '%s' [%zu, +%zu) runs past the %zu-byte data section", t->name, t->offset,
               t->nbytes, f->map_size - f->data_start);
    FUZZ_CHECK(zt_st_find(f, t->name) == t, "zt_st_find('%s') is another tensor", t->name);
    int64_t numel = zt_st_numel(t);
    int eb = element_bytes(t->dtype);
    if (eb > 0)
        FUZZ_CHECK((unsigned __int128)numel * (unsigned)eb == t->nbytes,
                   "tensor '%s': %lld elements of %d bytes in %zu bytes", t->name,
                   (long long)numel, eb, t->nbytes);
    if (numel > MAX_READ_ELEMENTS)
        return;
    size_t n = (size_t)numel;
    float *dst = malloc((n ? n : 1) * sizeof *dst);
    FUZZ_CHECK(dst != NULL, "out of memory");
    zt_status s = zt_st_read_f32(f, t, dst, n);
    bool is_float = t->dtype == ZT_ST_F32 || t->dtype == ZT_ST_F16 || t->dtype == ZT_ST_BF16 ||
                    strcmp(t->dtype_name, "F64") == 0;
    FUZZ_CHECK((s == ZT_OK) == is_float, "tensor '%s' (%s): zt_st_read_f32 gave %d", t->name,
               t->dtype_name, (int)s);
    if (s == ZT_OK && t->dtype == ZT_ST_F32) {
        const unsigned char *raw = (const unsigned char *)f->map + f->data_start + t->offset;
        FUZZ_CHECK(memcmp(dst, raw, n * sizeof *dst) == 0,
                   "tensor '%s': F32 values differ from the file's bytes", t->name);
    }
    /* A wrong element count must be refused, never read past the tensor. */
    if (is_float && n < MAX_READ_ELEMENTS) {
        float *more = malloc((n + 1) * sizeof *more);
        FUZZ_CHECK(more != NULL, "out of memory");
        FUZZ_CHECK(zt_st_read_f32(f, t, more, n + 1) != ZT_OK,
                   "tensor '%s': read %zu elements of %zu", t->name, n + 1, n);
        free(more);
    }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/input.safetensors", fuzz_tmpdir());
    fuzz_write_file(path, data, size);
    zt_st_file f;
    if (zt_st_open(&f, path) != ZT_OK)
        return 0;
    FUZZ_CHECK(f.map_size == size, "mapped %zu bytes of %zu", f.map_size, size);
    FUZZ_CHECK(f.data_start >= 8 && f.data_start <= size, "data section at %zu of %zu",
               f.data_start, size);
    for (int i = 0; i < f.n_tensors; i++)
        check_tensor(&f, &f.tensors[i]);
    zt_st_close(&f);
    return 0;
}
