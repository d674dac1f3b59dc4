/* The inputs of `ztrain prepare` (internal): expanding files, directories and globs into a file
 * list, and reading documents from text and JSONL files. */
#ifndef ZTRAIN_PREPARE_INTERNAL_H
#define ZTRAIN_PREPARE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

typedef struct {
    char **paths;
    size_t n, cap;
    uint64_t total_bytes;
} prep_files;

/* Appends the files that the inputs name: a file as is, a directory's regular files recursively
 * in name order (names starting with '.' left out), a glob's matches in name order. A path that
 * does not exist and matches nothing is an error naming it. The run's own shards (out_dir's
 * NAME_*_N.bin files, their masks and temporaries) are left out of directories and globs, and
 * an error naming the file when given as an input. Free with prep_files_free. */
zt_status prep_expand_inputs(const char *const *inputs, int n, const char *out_dir,
                             const char *name, prep_files *out);
void prep_files_free(prep_files *f);

typedef struct {
    const char *path;
    const char *field;
    bool jsonl, lines, skip_bad;
    char *data;        /* the mapped file */
    size_t size, pos;
    size_t line;       /* 1-based number of the line last read */
    bool done;
} prep_reader;

zt_status prep_reader_open(prep_reader *r, const char *path, const char *field, bool lines,
                           bool skip_bad);
void prep_reader_close(prep_reader *r);

/* The next document: *doc is either inside the file's mapping (*owned false) or a heap string the
 * caller frees (*owned true); *doc NULL when the file has no more. Bad JSONL lines are counted in
 * *bad_lines when skip_bad, else an error "PATH:LINE: ...". Empty documents (an empty text file,
 * a JSONL field "") are skipped and counted in *empty_docs; blank lines are skipped. */
zt_status prep_reader_next(prep_reader *r, const char **doc, size_t *len, bool *owned,
                           uint64_t *bad_lines, uint64_t *empty_docs);

#endif
