/* Reading the host's memory from files whose paths are given, so tests can hand it a made-up
 * /proc and cgroup tree (internal to libztrain; zt_host_memory_read in ztrain/admission.h reads
 * the real ones). */
#ifndef ZTRAIN_HOST_MEMORY_H
#define ZTRAIN_HOST_MEMORY_H

#include "ztrain/admission.h"

/* meminfo: a /proc/meminfo; proc_cgroup: a /proc/self/cgroup (NULL or missing: no cgroup);
 * cgroup_root: where the cgroup filesystems are mounted (/sys/fs/cgroup: v2 there, v1's memory
 * controller under memory/). */
zt_status zt_host_memory_read_from(const char *meminfo, const char *proc_cgroup,
                                   const char *cgroup_root, zt_host_memory *out);

#endif
