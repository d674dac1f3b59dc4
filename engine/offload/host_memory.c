/* The host's memory for admission (ztrain/admission.h): /proc/meminfo, lowered to the limits of
 * the process's memory cgroup, v2 or v1, at its own level and every level above (a container's
 * limit may sit on a parent, and a cgroup namespace may hide the path above its root). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/host_memory.h"

/* The value in kB of `key` in a meminfo file, in bytes; false when absent. */
static bool meminfo_value(const char *path, const char *key, uint64_t *out) {
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    char line[256];
    size_t n = strlen(key);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (strncmp(line, key, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%llu", &kb) == 1) {
            *out = (uint64_t)kb * 1024;
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* A file holding one number ("max" and anything else that is not a number: false). */
static bool file_number(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    unsigned long long v;
    bool ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (ok)
        *out = v;
    return ok;
}

/* The value of `key` in a memory.stat (bytes), or 0. */
static uint64_t stat_value(const char *path, const char *key) {
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char name[128];
    unsigned long long v, found = 0;
    while (fscanf(f, "%127s %llu", name, &v) == 2)
        if (strcmp(name, key) == 0)
            found = v;
    fclose(f);
    return found;
}

typedef struct {
    const char *limit, *usage, *inactive; /* file names, and memory.stat's key */
} cgroup_files;

static const cgroup_files v2 = {"memory.max", "memory.current", "inactive_file"};
static const cgroup_files v1 = {"memory.limit_in_bytes", "memory.usage_in_bytes",
                                "total_inactive_file"};

/* A number from the file `name` in directory dir. */
static bool number_at(const char *dir, const char *name, uint64_t *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return file_number(path, out);
}

/* Lowers out by the limit of base + rel and of every directory above it up to base: the total
 * to the limit, what is available to the limit less the usage that is not reclaimable page
 * cache. A level without a limit file (or with "max") limits nothing. */
static void apply_limits(const char *base, const char *rel, const cgroup_files *cf,
                         zt_host_memory *out) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s", base, strcmp(rel, "/") == 0 ? "" : rel);
    const size_t base_len = strlen(base);
    for (;;) {
        uint64_t limit, usage;
        if (number_at(dir, cf->limit, &limit)) {
            if (limit < out->total) {
                out->total = limit;
                out->cgroup_limited = true;
            }
            if (number_at(dir, cf->usage, &usage)) {
                char stat[4200];
                snprintf(stat, sizeof stat, "%s/memory.stat", dir);
                uint64_t inactive = stat_value(stat, cf->inactive);
                uint64_t used = usage > inactive ? usage - inactive : 0;
                uint64_t left = limit > used ? limit - used : 0;
                if (left < out->available)
                    out->available = left;
            }
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= base_len || !slash || (size_t)(slash - dir) < base_len)
            break;
        *slash = '\0';
    }
}

zt_status zt_host_memory_read_from(const char *meminfo, const char *proc_cgroup,
                                   const char *cgroup_root, zt_host_memory *out) {
    memset(out, 0, sizeof *out);
    if (!meminfo_value(meminfo, "MemTotal", &out->total))
        return zt_error(ZT_ERR_IO, "%s: cannot read MemTotal", meminfo);
    /* Kernels before 3.14 have no MemAvailable: MemFree is the nearest. */
    if (!meminfo_value(meminfo, "MemAvailable", &out->available) &&
        !meminfo_value(meminfo, "MemFree", &out->available))
        out->available = out->total;
    FILE *f = proc_cgroup ? fopen(proc_cgroup, "re") : NULL;
    if (!f)
        return ZT_OK;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        /* "ID:CONTROLLERS:PATH": v2's ID is 0 with no controllers; v1 lists "memory". */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/')
            continue;
        *c1 = *c2 = '\0';
        const char *controllers = c1 + 1, *rel = c2 + 1;
        char base[4096];
        if (strcmp(line, "0") == 0 && !*controllers) {
            apply_limits(cgroup_root, rel, &v2, out);
        } else {
            bool memory = false;
            for (char *save, *t = strtok_r((char *)controllers, ",", &save); t;
                 t = strtok_r(NULL, ",", &save))
                memory |= strcmp(t, "memory") == 0;
            snprintf(base, sizeof base, "%s/memory", cgroup_root);
            if (memory)
                apply_limits(base, rel, &v1, out);
        }
    }
    fclose(f);
    if (out->available > out->total)
        out->available = out->total;
    return ZT_OK;
}

zt_status zt_host_memory_read(zt_host_memory *out) {
    return zt_host_memory_read_from("/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup", out);
}
