/* Which transport a job's ranks use (ztrain/comm.h: zt_comm_choose): shared memory when every
 * rank runs on this host, Gloo over TCP when they do not, decided from what the launcher says
 * about the ranks' placement, unless the job or the environment names one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/comm.h"

bool zt_comm_choice_parse(const char *s, zt_comm_choice *out) {
    static const struct {
        const char *name;
        zt_comm_choice choice;
    } names[] = {{"auto", ZT_COMM_AUTO},
                 {"shm", ZT_COMM_SHM},
                 {"gloo", ZT_COMM_GLOO},
                 {"nccl", ZT_COMM_NCCL}};
    for (size_t i = 0; s && i < sizeof names / sizeof *names; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].choice;
            return true;
        }
    }
    return false;
}

/* The name of a choice other than auto. */
static const char *named(zt_comm_choice c) {
    return c == ZT_COMM_SHM ? "shm" : c == ZT_COMM_GLOO ? "gloo" : "nccl";
}

const char *zt_comm_for_nodes(zt_comm_choice choice, int nodes) {
    if (choice == ZT_COMM_SHM || choice == ZT_COMM_NCCL)
        return named(choice);
    if (choice == ZT_COMM_GLOO || nodes > 1)
        return "gloo";
    return "shm";
}

static void say(char *why, size_t cap, const char *text) {
    if (why && cap)
        snprintf(why, cap, "%s", text);
}

zt_status zt_comm_choose(const zt_dist_info *d, zt_comm_choice job, const char **name, char *why,
                         size_t cap) {
    return zt_comm_choose_on(d, job, false, 0, name, why, cap);
}

zt_status zt_comm_choose_on(const zt_dist_info *d, zt_comm_choice job, bool cuda, int gpus,
                            const char **name, char *why, size_t cap) {
    char text[256];
    const char *env = zt_dist_env("ZTRAIN_COMM");
    zt_comm_choice choice = job;
    if (env) {
        if (!zt_comm_choice_parse(env, &choice))
            return zt_error(ZT_ERR_INVALID,
                            "ZTRAIN_COMM='%s' must be \"auto\", \"shm\", \"gloo\" or \"nccl\"",
                            env);
        if (choice != ZT_COMM_AUTO) {
            *name = named(choice);
            say(why, cap, "ZTRAIN_COMM names it");
            return ZT_OK;
        }
    } else if (choice != ZT_COMM_AUTO) {
        *name = named(choice);
        say(why, cap, "the job's \"comm\" names it");
        return ZT_OK;
    }
    if (cuda && gpus >= d->local_world_size) {
        *name = "nccl";
        snprintf(text, sizeof text,
                 "device cuda: %d GPU(s) visible for the %d rank(s) of this host", gpus,
                 d->local_world_size);
        say(why, cap, text);
        return ZT_OK;
    }
    /* SLURM_NNODES counts only when Slurm's variables are the ones in use
     * (zt_dist_launcher_from_env: torchrun's win when both are set). */
    const char *nnodes = zt_dist_env("SLURM_NNODES");
    bool slurm = zt_dist_launcher_from_env() == ZT_DIST_SLURM;
    if (d->local_world_size < d->world_size) {
        *name = "gloo";
        snprintf(text, sizeof text, "%d of the %d ranks run on this host: ranks on several hosts",
                 d->local_world_size, d->world_size);
    } else if (slurm && nnodes && atoi(nnodes) > 1) {
        *name = "gloo";
        snprintf(text, sizeof text, "SLURM_NNODES=%s: ranks on several hosts", nnodes);
    } else {
        *name = "shm";
        snprintf(text, sizeof text, "all %d ranks run on this host", d->world_size);
    }
    if (cuda) {
        /* Ranks share GPUs: NCCL would refuse them, so a host transport stages device buffers. */
        size_t len = strlen(text);
        snprintf(text + len, sizeof text - len,
                 "; %d rank(s) share %d GPU(s), which NCCL refuses: staged through host memory",
                 d->local_world_size, gpus);
    }
    say(why, cap, text);
    return ZT_OK;
}
