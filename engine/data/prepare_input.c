/* The inputs of `ztrain prepare`: files, directories and glob patterns become one sorted list of
 * files, and each file yields its documents (the whole text, its lines, or one JSON field per
 * JSONL line). */
#define _DEFAULT_SOURCE /* DT_DIR, strdup */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ztrain/fsutil.h"
#include "prepare_internal.h"

static zt_status add_file(prep_files *f, const char *path, uint64_t size) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        char **p = realloc(f->paths, cap * sizeof *p);
        if (!p)
            return zt_error(ZT_ERR_NOMEM, "out of memory listing inputs");
        f->paths = p;
        f->cap = cap;
    }
    if (!(f->paths[f->n] = strdup(path)))
        return zt_error(ZT_ERR_NOMEM, "out of memory listing inputs");
    f->n++;
    f->total_bytes += size;
    return ZT_OK;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Where this run writes: its own shards there are never inputs. */
typedef struct {
    bool exists;
    dev_t dev;
    ino_t ino;
    const char *out_dir, *pattern; /* pattern: NAME_*_[0-9]*.bin* (shards, masks, temporaries) */
} own_output;

/* True when path is one of the run's own shards (or their masks or temporaries): a file of the
 * output directory named as prepare names them. */
static bool is_own_shard(const own_output *own, const char *path) {
    if (!own->exists)
        return false;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (fnmatch(own->pattern, base, 0) != 0)
        return false;
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    char *dir = malloc(dlen + 2);
    if (!dir)
        return false;
    if (dlen > 0) {
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
    } else {
        strcpy(dir, slash ? "/" : ".");
    }
    struct stat st;
    bool same = stat(dir, &st) == 0 && st.st_dev == own->dev && st.st_ino == own->ino;
    free(dir);
    return same;
}

static zt_status add_path(prep_files *f, const own_output *own, const char *path, int depth,
                          bool named);

static zt_status add_dir(prep_files *f, const own_output *own, const char *dir, int depth) {
    if (depth > 64)
        return zt_error(ZT_ERR_INVALID, "%s: directories nested more than 64 deep", dir);
    DIR *d = opendir(dir);
    if (!d)
        return zt_error(ZT_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    zt_status s = ZT_OK;
    struct dirent *e;
    while (s == ZT_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            names = p;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len)))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
        else
            snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (s == ZT_OK)
        qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        if (s == ZT_OK)
            s = add_path(f, own, names[i], depth + 1, false);
        free(names[i]);
    }
    free(names);
    return s;
}

/* named: the path was given as an input itself, not found in a directory or by a glob. */
static zt_status add_path(prep_files *f, const own_output *own, const char *path, int depth,
                          bool named) {
    struct stat st;
    if (stat(path, &st) != 0)
        return zt_error(ZT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return add_dir(f, own, path, depth);
    if (!S_ISREG(st.st_mode))
        return depth > 0 ? ZT_OK : zt_error(ZT_ERR_INVALID, "%s: not a regular file", path);
    /* A directory or glob that takes in --out finds the shards an earlier run wrote there; read
     * as text they would be encoded as garbage (and are replaced by this run anyway). */
    if (is_own_shard(own, path)) {
        if (!named)
            return ZT_OK;
        return zt_error(ZT_ERR_INVALID,
                        "%s: an input is one of the shards this run writes (--out %s); "
                        "token files are not text",
                        path, own->out_dir);
    }
    return add_file(f, path, (uint64_t)st.st_size);
}

zt_status prep_expand_inputs(const char *const *inputs, int n, const char *out_dir,
                             const char *name, prep_files *out) {
    memset(out, 0, sizeof *out);
    own_output own = {.out_dir = out_dir};
    struct stat ost;
    char *pattern = malloc(strlen(name) + 16);
    if (!pattern)
        return zt_error(ZT_ERR_NOMEM, "out of memory listing inputs");
    sprintf(pattern, "%s_*_[0-9]*.bin*", name);
    own.pattern = pattern;
    if (out_dir && stat(out_dir, &ost) == 0 && S_ISDIR(ost.st_mode)) {
        own.exists = true;
        own.dev = ost.st_dev;
        own.ino = ost.st_ino;
    }
    for (int i = 0; i < n; i++) {
        const char *in = inputs[i];
        zt_status s;
        if (zt_path_exists(in) || !strpbrk(in, "*?[")) {
            s = add_path(out, &own, in, 0, true);
        } else {
            glob_t g;
            int rc = glob(in, 0, NULL, &g);
            if (rc == GLOB_NOMATCH)
                s = zt_error(ZT_ERR_IO, "%s: no file matches the pattern", in);
            else if (rc != 0)
                s = zt_error(ZT_ERR_IO, "%s: cannot expand the pattern", in);
            else
                s = ZT_OK;
            for (size_t k = 0; rc == 0 && s == ZT_OK && k < g.gl_pathc; k++)
                s = add_path(out, &own, g.gl_pathv[k], 0, false);
            if (rc == 0)
                globfree(&g);
        }
        if (s != ZT_OK) {
            free(pattern);
            prep_files_free(out);
            return s;
        }
    }
    free(pattern);
    if (out->n == 0)
        return zt_error(ZT_ERR_INVALID, "the inputs hold no files");
    return ZT_OK;
}

void prep_files_free(prep_files *f) {
    for (size_t i = 0; i < f->n; i++)
        free(f->paths[i]);
    free(f->paths);
    memset(f, 0, sizeof *f);
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

zt_status prep_reader_open(prep_reader *r, const char *path, const char *field, bool lines,
                           bool skip_bad) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->field = field;
    r->jsonl = has_suffix(path, ".jsonl") || has_suffix(path, ".ndjson");
    r->lines = lines;
    r->skip_bad = skip_bad;
    void *map;
    ZT_TRY(zt_map_file(path, &map, &r->size));
    r->data = map;
    return ZT_OK;
}

void prep_reader_close(prep_reader *r) {
    zt_unmap_file(r->data, r->size);
    memset(r, 0, sizeof *r);
}

/* The next line, without its terminator, or false at the end of the file. A JSONL line ends at
 * '\n' (a '\r' before it is JSON whitespace). A text line (--lines) ends at "\n", "\r\n" or a
 * lone "\r", as Python's universal newlines read a file (open() in text mode, and so HF
 * datasets' "text" loader): a CRLF file gives the lines an LF file does. */
static bool next_line(prep_reader *r, const char **s, size_t *len) {
    if (r->pos >= r->size)
        return false;
    const char *start = r->data + r->pos, *end = r->data + r->size, *p = start;
    if (r->jsonl) {
        p = memchr(start, '\n', r->size - r->pos);
        if (!p)
            p = end;
    } else {
        while (p < end && *p != '\n' && *p != '\r')
            p++;
    }
    *s = start;
    *len = (size_t)(p - start);
    if (p < end)
        p += *p == '\r' && p + 1 < end && p[1] == '\n' ? 2 : 1;
    r->pos = (size_t)(p - r->data);
    r->line++;
    return true;
}

static bool blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* A bad line: an error, or counted and skipped under --skip-bad-lines. */
static zt_status bad_line(prep_reader *r, uint64_t *bad, const char *why) {
    if (r->skip_bad) {
        (*bad)++;
        return ZT_OK;
    }
    return zt_error(ZT_ERR_FORMAT, "%s:%zu: %s (--skip-bad-lines skips such lines)", r->path,
                    r->line, why);
}

/* How many members of the object `j` are named `key`: cJSON keeps every one, and its lookup finds
 * the first where Python's json.loads keeps the last. */
static int count_members(const cJSON *j, const char *key) {
    int n = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, j) {
        if (m->string && strcmp(m->string, key) == 0)
            n++;
    }
    return n;
}

zt_status prep_reader_next(prep_reader *r, const char **doc, size_t *len, bool *owned,
                           uint64_t *bad_lines, uint64_t *empty_docs) {
    *doc = NULL;
    *len = 0;
    *owned = false;
    if (!r->jsonl && !r->lines) {
        if (r->done)
            return ZT_OK;
        r->done = true;
        if (r->size == 0) {
            (*empty_docs)++;
            return ZT_OK;
        }
        *doc = r->data;
        *len = r->size;
        return ZT_OK;
    }
    const char *s;
    size_t n;
    while (next_line(r, &s, &n)) {
        if (!r->jsonl) {
            if (n == 0)
                continue;
            *doc = s;
            *len = n;
            return ZT_OK;
        }
        if (blank(s, n))
            continue;
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, false);
        if (j && !blank(end, n - (size_t)(end - s))) {
            cJSON_Delete(j);
            j = NULL;
        }
        if (!j) {
            ZT_TRY(bad_line(r, bad_lines, "not JSON"));
            continue;
        }
        if (cJSON_IsObject(j) && count_members(j, r->field) > 1) {
            cJSON_Delete(j);
            char why[160];
            snprintf(why, sizeof why, "the field \"%.100s\" is given twice", r->field);
            ZT_TRY(bad_line(r, bad_lines, why));
            continue;
        }
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, r->field);
        if (!cJSON_IsString(v)) {
            cJSON_Delete(j);
            char why[160];
            snprintf(why, sizeof why, "no string field \"%.100s\"", r->field);
            ZT_TRY(bad_line(r, bad_lines, why));
            continue;
        }
        size_t vl = strlen(v->valuestring);
        char *copy = malloc(vl + 1);
        if (!copy) {
            cJSON_Delete(j);
            return zt_error(ZT_ERR_NOMEM, "%s:%zu: out of memory", r->path, r->line);
        }
        memcpy(copy, v->valuestring, vl + 1);
        cJSON_Delete(j);
        if (vl == 0) {
            free(copy);
            (*empty_docs)++;
            continue;
        }
        *doc = copy;
        *len = vl;
        *owned = true;
        return ZT_OK;
    }
    return ZT_OK;
}
