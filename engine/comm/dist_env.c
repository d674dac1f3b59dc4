/* Who this process is in a distributed job, read from the launcher's environment.
 *
 * Two conventions are understood: torchrun / Kubeflow PyTorchJob (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and Slurm (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID, ...). Every value is checked; a bad one is reported by the variable's name. */
#define _POSIX_C_SOURCE 200809L /* before any header */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/comm.h"

/* torchrun's default rendezvous port; used when a launcher does not name one. */
enum { DEFAULT_MASTER_PORT = 29500 };
/* Under Slurm without MASTER_PORT, port = 20000 + (job id + STRIDE * step id) mod 10000: step 0
 * keeps the job's old port, and a prime stride keeps the steps of one job apart from each other
 * and from the steps of the jobs numbered just after it. */
enum { SLURM_STEP_STRIDE = 997 };

/* Every variable is read as launchers mean it: set to "" is not set. */
const char *zt_dist_env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

zt_dist_launcher zt_dist_launcher_from_env(void) {
    /* torchrun is checked first: it may itself run inside a Slurm allocation, and then its
     * variables, not Slurm's, describe the ranks. */
    if (zt_dist_env("RANK") || zt_dist_env("WORLD_SIZE"))
        return ZT_DIST_TORCHRUN;
    if (zt_dist_env("SLURM_PROCID"))
        return ZT_DIST_SLURM;
    return ZT_DIST_NONE;
}

/* A non-negative decimal integer that fits an int, with nothing around it: launchers write plain
 * numbers, so a sign, a space or a suffix means the variable was set by something else. */
static bool parse_int(const char *s, long max, int *out) {
    if (!s || !*s)
        return false;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (*p - '0');
        if (v > max)
            return false;
    }
    *out = (int)v;
    return true;
}

/* Reads an optional non-negative integer variable; *present says whether it was set. */
static zt_status env_int(const char *name, bool *present, int *out) {
    const char *v = zt_dist_env(name);
    *present = v != NULL;
    if (!v)
        return ZT_OK;
    if (!parse_int(v, INT_MAX, out))
        return zt_error(ZT_ERR_INVALID, "%s='%s' is not a non-negative integer", name, v);
    return ZT_OK;
}

static zt_status env_port(const char *name, int *port) {
    const char *v = zt_dist_env(name);
    if (!v)
        return ZT_OK;
    if (!parse_int(v, 65535, port) || *port == 0)
        return zt_error(ZT_ERR_INVALID, "%s='%s' is not a port number", name, v);
    return ZT_OK;
}

/* The task count on node `node` from Slurm's compressed SLURM_TASKS_PER_NODE ("4(x2),3" means
 * 4, 4, 3). With node < 0 (SLURM_NODEID unknown) the count is returned only when every node has
 * the same one. Returns -1 when the string cannot be used. */
static int slurm_tasks_on_node(const char *s, int node) {
    int seen = 0, uniform = -1;
    bool mixed = false;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long count = strtol(p, &end, 10);
        if (end == p || errno || count <= 0 || count > INT_MAX)
            return -1;
        long reps = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x')
                return -1;
            reps = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || reps <= 0 || reps > INT_MAX)
                return -1;
            p = end + 1;
        }
        if (node >= 0 && node < seen + reps)
            return (int)count;
        seen = reps > INT_MAX - seen ? INT_MAX : seen + (int)reps;
        if (uniform >= 0 && uniform != count)
            mixed = true;
        uniform = (int)count;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return node < 0 && !mixed ? uniform : -1;
}

/* The first host of a Slurm host list: Slurm starts task 0 of a step on the first node of its
 * list, so that host is where rank 0 listens. Each bracketed range of the first name gives its
 * first value, and what follows a range stays part of the name, as Slurm's hostlist expands it:
 * "gpu[003-005,007],cpu1" -> "gpu003", "n[1-4]-ib" -> "n1-ib", "rack[0-1]_blade[07-09]" ->
 * "rack0_blade07". */
static void slurm_first_host(const char *list, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = list; *p && *p != ',' && n + 1 < cap; p++) {
        if (*p != '[') {
            out[n++] = *p;
            continue;
        }
        for (p++; *p && *p != '-' && *p != ',' && *p != ']' && n + 1 < cap; p++)
            out[n++] = *p;
        while (*p && *p != ']')
            p++;
        if (!*p)
            break;
    }
    out[n] = '\0';
}

/* Keeps only [A-Za-z0-9_-]: the run id becomes part of a shared-memory name and of file names. */
static void set_run_id(zt_dist_info *d, const char *src) {
    size_t n = 0;
    for (const char *p = src; *p && n + 1 < sizeof d->run_id; p++) {
        unsigned char ch = (unsigned char)*p;
        d->run_id[n++] = isalnum(ch) || ch == '_' || ch == '-' ? (char)ch : '_';
    }
    d->run_id[n] = '\0';
}

/* The step of a Slurm job (SLURM_STEP_ID, or the older SLURM_STEPID): each srun in one
 * allocation is a step of its own, which PyTorch Lightning and torch users treat as a job of its
 * own, so two steps running at once must not share a run id or a port. *name is NULL (and *step
 * 0) when neither is set. */
static zt_status slurm_step(const char **name, unsigned long long *step) {
    *name = "SLURM_STEP_ID";
    const char *v = zt_dist_env(*name);
    if (!v) {
        *name = "SLURM_STEPID";
        v = zt_dist_env(*name);
    }
    *step = 0;
    if (!v) {
        *name = NULL;
        return ZT_OK;
    }
    char *end;
    errno = 0;
    *step = strtoull(v, &end, 10);
    if (!isdigit((unsigned char)v[0]) || errno || *end)
        return zt_error(ZT_ERR_INVALID, "%s='%s' is not a non-negative integer", *name, v);
    return ZT_OK;
}

static zt_status read_torchrun(zt_dist_info *d) {
    bool has_rank, has_world, has_lrank, has_lworld;
    ZT_TRY(env_int("RANK", &has_rank, &d->rank));
    ZT_TRY(env_int("WORLD_SIZE", &has_world, &d->world_size));
    ZT_TRY(env_int("LOCAL_RANK", &has_lrank, &d->local_rank));
    ZT_TRY(env_int("LOCAL_WORLD_SIZE", &has_lworld, &d->local_world_size));
    if (has_rank != has_world)
        return zt_error(ZT_ERR_INVALID, "%s is set but %s is not", has_rank ? "RANK" : "WORLD_SIZE",
                        has_rank ? "WORLD_SIZE" : "RANK");
    if (d->world_size < 1)
        return zt_error(ZT_ERR_INVALID, "WORLD_SIZE=%d must be at least 1", d->world_size);
    if (d->rank >= d->world_size)
        return zt_error(ZT_ERR_INVALID, "RANK=%d is not below WORLD_SIZE=%d", d->rank,
                        d->world_size);
    /* Kubeflow's PyTorchJob runs one process per pod and sets no LOCAL_* variables; the older
     * torch.distributed.launch sets LOCAL_RANK alone, for ranks that all share one host. */
    if (!has_lrank)
        d->local_rank = 0;
    if (!has_lworld)
        d->local_world_size = has_lrank ? d->world_size : 1;
    if (has_lworld && d->local_world_size < 1)
        return zt_error(ZT_ERR_INVALID, "LOCAL_WORLD_SIZE=%d must be at least 1",
                        d->local_world_size);
    if (d->local_rank >= d->local_world_size)
        return zt_error(ZT_ERR_INVALID, "LOCAL_RANK=%d is not below %s=%d", d->local_rank,
                        has_lworld ? "LOCAL_WORLD_SIZE" : "WORLD_SIZE", d->local_world_size);
    if (d->local_world_size > d->world_size)
        return zt_error(ZT_ERR_INVALID, "LOCAL_WORLD_SIZE=%d is larger than WORLD_SIZE=%d",
                        d->local_world_size, d->world_size);
    return ZT_OK;
}

static zt_status read_slurm(zt_dist_info *d) {
    bool has_rank, has_world, has_lrank, has_x;
    ZT_TRY(env_int("SLURM_PROCID", &has_rank, &d->rank));
    ZT_TRY(env_int("SLURM_NTASKS", &has_world, &d->world_size));
    ZT_TRY(env_int("SLURM_LOCALID", &has_lrank, &d->local_rank));
    if (!has_world)
        return zt_error(ZT_ERR_INVALID, "SLURM_PROCID is set but SLURM_NTASKS is not");
    if (d->world_size < 1)
        return zt_error(ZT_ERR_INVALID, "SLURM_NTASKS=%d must be at least 1", d->world_size);
    if (d->rank >= d->world_size)
        return zt_error(ZT_ERR_INVALID, "SLURM_PROCID=%d is not below SLURM_NTASKS=%d", d->rank,
                        d->world_size);
    if (!has_lrank)
        d->local_rank = 0;

    /* The local world: an explicit --ntasks-per-node, else this node's entry in the per-node
     * list, else an even split over the nodes. */
    int per_node = 0, node = -1, nnodes = 0;
    ZT_TRY(env_int("SLURM_NTASKS_PER_NODE", &has_x, &per_node));
    if (has_x && per_node < 1)
        return zt_error(ZT_ERR_INVALID, "SLURM_NTASKS_PER_NODE=%d must be at least 1", per_node);
    if (!has_x) {
        ZT_TRY(env_int("SLURM_NODEID", &has_x, &node));
        if (!has_x)
            node = -1;
        /* The step's own list is exact under srun; the job's one describes the allocation. */
        const char *tpn_name = "SLURM_STEP_TASKS_PER_NODE";
        const char *tpn = zt_dist_env(tpn_name);
        if (!tpn) {
            tpn_name = "SLURM_TASKS_PER_NODE";
            tpn = zt_dist_env(tpn_name);
        }
        if (tpn) {
            per_node = slurm_tasks_on_node(tpn, node);
            if (per_node < 0 && node >= 0)
                return zt_error(ZT_ERR_INVALID, "%s='%s' has no entry for SLURM_NODEID=%d",
                                tpn_name, tpn, node);
            if (per_node < 0)
                per_node = 0;
        }
    }
    if (per_node == 0) {
        ZT_TRY(env_int("SLURM_NNODES", &has_x, &nnodes));
        if (!has_x || nnodes < 1)
            nnodes = 1;
        per_node = (d->world_size + nnodes - 1) / nnodes;
    }
    d->local_world_size = per_node < d->world_size ? per_node : d->world_size;
    if (d->local_rank >= d->local_world_size)
        return zt_error(ZT_ERR_INVALID,
                        "SLURM_LOCALID=%d is not below the %d task(s) on this node", d->local_rank,
                        d->local_world_size);

    /* Slurm names no rendezvous address: rank 0 runs on the first node of the step. Its port is
     * derived from the job and step ids so that two jobs, or two steps of one job, sharing a
     * node do not collide. */
    static const char *const node_lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                             "SLURM_NODELIST"};
    for (size_t i = 0; i < sizeof node_lists / sizeof *node_lists && !zt_dist_env("MASTER_ADDR"); i++) {
        const char *list = zt_dist_env(node_lists[i]);
        if (!list)
            continue;
        slurm_first_host(list, d->master_addr, sizeof d->master_addr);
        snprintf(d->addr_origin, sizeof d->addr_origin, "the first node of %s", node_lists[i]);
        break;
    }
    if (!d->master_addr[0]) {
        strcpy(d->master_addr, "127.0.0.1");
        snprintf(d->addr_origin, sizeof d->addr_origin, "not set: the default");
    }
    const char *job = zt_dist_env("SLURM_JOB_ID");
    if (job && isdigit((unsigned char)job[0])) {
        unsigned long long step = 0;
        const char *step_name;
        ZT_TRY(slurm_step(&step_name, &step));
        unsigned long long id = strtoull(job, NULL, 10);
        d->master_port = 20000 + (int)((id % 10000 + SLURM_STEP_STRIDE * (step % 10000)) % 10000);
        snprintf(d->port_origin, sizeof d->port_origin, "derived from SLURM_JOB_ID%s%s",
                 step_name ? " and " : "", step_name ? step_name : "");
    }
    return ZT_OK;
}

void zt_dist_endpoint(const char *host, int port, char *out, size_t cap) {
    bool ipv6 = strchr(host, ':') != NULL;
    snprintf(out, cap, "%s%s%s:%d", ipv6 ? "[" : "", host, ipv6 ? "]" : "", port);
}

zt_status zt_dist_from_env(zt_dist_info *d) {
    memset(d, 0, sizeof *d);
    d->world_size = 1;
    d->local_world_size = 1;
    strcpy(d->master_addr, "127.0.0.1");
    snprintf(d->addr_origin, sizeof d->addr_origin, "not set: the default");
    d->master_port = DEFAULT_MASTER_PORT;

    d->launcher = zt_dist_launcher_from_env();
    snprintf(d->port_origin, sizeof d->port_origin, "MASTER_PORT");
    if (d->launcher == ZT_DIST_TORCHRUN) {
        ZT_TRY(read_torchrun(d));
    } else if (d->launcher == ZT_DIST_SLURM) {
        ZT_TRY(read_slurm(d));
    }

    const char *addr = zt_dist_env("MASTER_ADDR");
    if (addr) {
        size_t len = strlen(addr);
        bool bracketed = len >= 2 && addr[0] == '[' && addr[len - 1] == ']';
        if (bracketed) {
            addr++;
            len -= 2;
        }
        if (len >= sizeof d->master_addr)
            return zt_error(ZT_ERR_INVALID, "MASTER_ADDR is longer than %zu characters",
                            sizeof d->master_addr - 1);
        memcpy(d->master_addr, addr, len);
        d->master_addr[len] = '\0';
        snprintf(d->addr_origin, sizeof d->addr_origin, "MASTER_ADDR");
    }
    if (zt_dist_env("MASTER_PORT"))
        snprintf(d->port_origin, sizeof d->port_origin, "MASTER_PORT");
    ZT_TRY(env_port("MASTER_PORT", &d->master_port));
    /* torchrun's static rendezvous (--master-addr/--master-port/--node-rank; torch 2.x's c10d
     * one too) keeps its agent's own TCPStore listening at MASTER_PORT and tells the ranks to use
     * it. ztrain's store speaks its own protocol, so rank 0 serves it one port higher, which
     * every rank computes alike. */
    const char *agent = zt_dist_env("TORCHELASTIC_USE_AGENT_STORE");
    if (agent && (strcmp(agent, "True") == 0 || strcmp(agent, "true") == 0 ||
                  strcmp(agent, "1") == 0)) {
        if (d->master_port >= 65535)
            return zt_error(ZT_ERR_INVALID,
                            "MASTER_PORT=%d: with TORCHELASTIC_USE_AGENT_STORE=%s ztrain's "
                            "rendezvous uses MASTER_PORT+1, which is not a port",
                            d->master_port, agent);
        snprintf(d->port_origin, sizeof d->port_origin,
                 "MASTER_PORT+1: torchrun's agent store holds MASTER_PORT=%d", d->master_port);
        d->master_port++;
    }

    /* torchrun without --rdzv-id (or --standalone) exports TORCHELASTIC_RUN_ID=none for every job,
     * which would make concurrent jobs share a name; such an id is skipped. */
    const char *id = zt_dist_env("ZTRAIN_RUN_ID");
    if (!id) {
        id = zt_dist_env("TORCHELASTIC_RUN_ID");
        if (id && strcmp(id, "none") == 0)
            id = NULL;
    }
    char slurm_id[96];
    if (!id && (id = zt_dist_env("SLURM_JOB_ID"))) {
        const char *step_name;
        unsigned long long step;
        ZT_TRY(slurm_step(&step_name, &step));
        if (step_name) {
            snprintf(slurm_id, sizeof slurm_id, "%.64s.%llu", id, step);
            id = slurm_id;
        }
    }
    if (id) {
        set_run_id(d, id);
    } else {
        snprintf(d->run_id, sizeof d->run_id, "port%d", d->master_port);
    }
    return ZT_OK;
}
