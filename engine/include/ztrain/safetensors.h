/* Reading and writing safetensors files (https://github.com/huggingface/safetensors format:
 * 8-byte little-endian header length, a JSON header mapping names to dtype/shape/data_offsets,
 * then the raw little-endian data).
 *
 * Only what ztrain needs: F32, F16 and BF16 tensors are written (from fp32 values, rounded to
 * nearest even); those and F64 are read (converted to fp32 on request). */
#ifndef ZTRAIN_SAFETENSORS_H
#define ZTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

#define ZT_ST_MAX_DIMS 8

typedef enum { ZT_ST_F32 = 0, ZT_ST_F16, ZT_ST_BF16, ZT_ST_I32, ZT_ST_I64, ZT_ST_U8, ZT_ST_OTHER } zt_st_dtype;

typedef struct {
    char *name;
    zt_st_dtype dtype;
    char dtype_name[16];  /* as written in the file, e.g. "F32" */
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    size_t offset;        /* byte offset of the data from the start of the data section */
    size_t nbytes;
} zt_st_tensor;

typedef struct {
    char *path;
    int n_tensors;
    zt_st_tensor *tensors;
    char *metadata_json;  /* the "__metadata__" object as JSON text, or NULL */
    size_t data_start;    /* file offset of the data section */
    void *map;            /* the whole file, mmap'ed read-only */
    size_t map_size;
} zt_st_file;

/* Opens and validates a safetensors file as the safetensors library reads it: header size within
 * the file, well-formed JSON (no byte-order mark; shapes and offsets integers written without a
 * fraction or exponent; a null "__metadata__" is none), offsets in bounds, contiguous and
 * non-overlapping, nbytes = prod(shape) * element size. Messages name the file and the tensor at
 * fault. Close with zt_st_close(). */
zt_status zt_st_open(zt_st_file *f, const char *path);
void zt_st_close(zt_st_file *f);

/* The tensor with this name, or NULL. */
const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name);

/* Pointer to the tensor's raw bytes inside the mapping (valid until zt_st_close). Files from other
 * writers need not align the data section, so read through memcpy unless the dtype's alignment
 * has been checked. */
const void *zt_st_data(const zt_st_file *f, const zt_st_tensor *t);

/* The tensor's element count: the product of its shape (1 for a scalar). */
int64_t zt_st_numel(const zt_st_tensor *t);

/* Copies a tensor into dst[n] as fp32, converting F16, BF16 and F64 (rounded to nearest). Fails
 * (naming file and tensor) when the element count is not n or the dtype is another. */
zt_status zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, float *dst, size_t n);

/* Whether x[0..n), elements [first, first + n) of tensor t of f as read, are all finite. A
 * NaN or an infinity in stored weights or optimizer state is damage (overwritten bytes) that
 * training would otherwise report much later as a diverging gradient norm; it is refused here
 * (ZT_ERR_FORMAT) naming the file, the tensor, the element and the value. */
zt_status zt_st_check_finite(const zt_st_file *f, const zt_st_tensor *t, const float *x,
                             size_t first, size_t n);

/* The same for elements [first, first + n) of an F32, F16, BF16 or F64 tensor (read in place
 * from the mapping, so only those pages are touched). Fails, naming file and tensor, when the
 * range is outside the tensor or the dtype is another. */
zt_status zt_st_read_f32_range(const zt_st_file *f, const zt_st_tensor *t, size_t first,
                               float *dst, size_t n);

/* ---- Sets of files: a model's weights as Hugging Face stores them ----------------------------
 *
 * One file, or shards model-0000k-of-0000n.safetensors beside model.safetensors.index.json,
 * whose "weight_map" maps every tensor name to the shard holding it. */

typedef struct {
    const zt_st_file *file;      /* the shard that holds it */
    const zt_st_tensor *tensor;
} zt_st_ref;

typedef struct {
    char *path;          /* what was opened: the file, or the index */
    int n_files;
    zt_st_file *files;
    int n_tensors;
    zt_st_ref *tensors;  /* every tensor of every file, shard by shard in the index's order */
} zt_st_set;

/* Opens a set from `path`: a safetensors file; an index (a path ending in ".json"); or a
 * directory, which is read as DIR/model.safetensors when that is a file, else through
 * DIR/model.safetensors.index.json, the order of transformers' from_pretrained. Each shard is
 * opened with zt_st_open (mapped, headers checked) and the index checked against them: a shard
 * name must be a plain file name in the index's directory, and every listed tensor must be in the
 * shard the index names, every tensor of a shard listed there, and no name in two shards. Messages
 * name the index, the shard and the tensor at fault ("DIR/model.safetensors.index.json: shard
 * model-00002-of-00002.safetensors (holding 'h.1.mlp.c_fc.weight'):
 * DIR/model-00002-of-00002.safetensors: cannot open: No such file or directory"). Close with
 * zt_st_set_close. */
zt_status zt_st_set_open(zt_st_set *set, const char *path);
void zt_st_set_close(zt_st_set *set);

/* The tensor with this name and its file, or NULL. */
const zt_st_ref *zt_st_set_find(const zt_st_set *set, const char *name);

/* One tensor to write. */
typedef struct {
    const char *name;
    const float *data;
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
} zt_st_entry;

/* The data of a tensor that does not live in memory (offloaded optimizer state): read() fills dst
 * with the tensor's elements [first, first + n). */
typedef struct {
    zt_status (*read)(void *ctx, size_t first, float *dst, size_t n);
    void *ctx;
} zt_st_source;

/* Writes the tensors (in the given order) with optional string metadata pairs
 * (meta_keys[i] -> meta_values[i]) to path, via a temporary file renamed into place, so a reader
 * never sees a partial file. */
zt_status zt_st_write(const char *path, const zt_st_entry *entries, int n_entries,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta);

/* The same where a tensor's data may come in pieces: an entry with data NULL is written from
 * sources[i] through a bounded buffer (sources may be NULL when every entry has data). */
zt_status zt_st_write_sources(const char *path, const zt_st_entry *entries,
                              const zt_st_source *sources, int n_entries,
                              const char *const *meta_keys, const char *const *meta_values,
                              int n_meta);

/* The same with each tensor stored as dtypes[i]: ZT_ST_F32, ZT_ST_F16 or ZT_ST_BF16, into which
 * its fp32 values are rounded to nearest even (dtypes NULL: all F32). */
zt_status zt_st_write_typed(const char *path, const zt_st_entry *entries,
                            const zt_st_source *sources, const zt_st_dtype *dtypes,
                            int n_entries, const char *const *meta_keys,
                            const char *const *meta_values, int n_meta);

#endif
