/* What the tests that run ranks as processes on the emulated CUDA device share
 * (test_cuda_emu_syncs_dp.c, _pipe.c, _trainer.c): the emulated devices, free TCP ports for the
 * nccl transport's rendezvous, forking the ranks with their launcher environment, a rank's communicator, the wait
 * for the ranks, and their training data. */
#ifndef ZT_TEST_EMU_RANKS_H
#define ZT_TEST_EMU_RANKS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ports.h"
#include "ztrain/backend.h"
#include "ztrain/comm.h"
#include "ztrain/data.h"
#include "ztrain/loss_mask.h"

/* Points the CUDA backend at the emulated device (unless the environment names a module) with
 * `devices` emulated GPUs. False, after printing that `test` is skipped, in a build without the
 * emulator's counters: one with a real CUDA module but no emulated one (the sanitizers' build)
 * has the backend but not zt_emu_sync_counts. */
static inline bool emu_devices(const char *test, int devices) {
    if (!getenv("ZTRAIN_CUDA_EMU") && !getenv("ZTRAIN_CUDA_MODULE"))
        setenv("ZTRAIN_CUDA_EMU", "1", 1);
    char v[16];
    snprintf(v, sizeof v, "%d", devices);
    setenv("ZTRAIN_CUDA_EMU_DEVICES", v, 1);
    if (zt_backend_available(ZT_DEVICE_CUDA) && zt_backend_cuda_symbol("zt_emu_sync_counts"))
        return true;
    printf("%s: SKIPPED: no emulated CUDA device in this build\n", test);
    return false;
}

/* A forked rank's launcher environment: each rank on an emulated GPU of its own (the engine
 * takes its LOCAL_RANK's), as the nccl transport needs. */
static inline void emu_rank_env(int rank, int world) {
    char v[16];
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", world);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
}

/* Waits for the n forked ranks, each checked to have exited with status 0. */
static inline void emu_wait_ranks(const pid_t *pids, int n) {
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d ended with %s %d", r,
              WIFSIGNALED(st) ? "signal" : "status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
}

/* Forks `world` ranks, each on an emulated GPU of its own (the engine takes its LOCAL_RANK's),
 * as the nccl transport needs, each living rank_main(rank, world) and exiting with what it
 * returns, and waits for them (emu_wait_ranks). */
static inline void emu_run_ranks(int world, int (*rank_main)(int rank, int world)) {
    pid_t pids[world];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            emu_rank_env(r, world);
            _exit(rank_main(r, world));
        }
    }
    emu_wait_ranks(pids, world);
}

/* Rank `rank` of `world` joining the transport's communicator on 127.0.0.1:port, under a run id
 * made of the test's name, the parent's pid and `what` (a case); NULL after a failed check. */
static inline zt_comm *emu_join(const char *test, const char *what, int rank, int world,
                                const char *transport, int port) {
    zt_dist_info d = {.rank = rank, .world_size = world, .local_rank = rank,
                      .local_world_size = world, .master_port = port};
    snprintf(d.master_addr, sizeof d.master_addr, "127.0.0.1");
    snprintf(d.run_id, sizeof d.run_id, "%s-%d-%s", test, (int)getppid(), what);
    zt_comm *c = NULL;
    if (zt_comm_create(&c, transport, &d, 60) != ZT_OK) {
        CHECK(false, "rank %d: %s", rank, zt_last_error());
        return NULL;
    }
    return c;
}

/* In the test's temporary directory: train.txt, n bytes of a simple pattern, and train.bin, the
 * same bytes as tokens with a loss mask training 60% of the targets and a document starting every
 * 2 to 11 tokens (the loss-masked packed documents). Exits on a write error. */
static inline void emu_write_data(size_t n) {
    char *text = malloc(n);
    uint16_t *tokens = malloc(n * sizeof *tokens);
    uint8_t *flags = malloc(n);
    if (!text || !tokens || !flags) {
        fprintf(stderr, "out of memory for %zu tokens of data\n", n);
        exit(2);
    }
    unsigned rng = 7, next_doc = 0;
    for (size_t i = 0; i < n; i++) {
        text[i] = (char)((i * 7 + i / 13) % 251);
        tokens[i] = (uint16_t)(unsigned char)text[i];
        rng = rng * 1103515245u + 12345u;
        flags[i] = (uint8_t)(((rng >> 16) % 10 < 6 ? ZT_LOSS_MASK_TRAINED : 0) |
                             (i == next_doc ? ZT_LOSS_MASK_DOC_START : 0));
        if (i == next_doc)
            next_doc += 2 + (rng >> 8) % 10;
    }
    check_write_file(check_tmp_path("train.txt"), text, n);
    if (zt_dataset_write_tokens(check_tmp_path("train.bin"), tokens, n) != ZT_OK ||
        zt_loss_mask_write(check_tmp_path("train.bin.mask"), flags, n) != ZT_OK) {
        fprintf(stderr, "cannot write the masked data: %s\n", zt_last_error());
        exit(2);
    }
    free(text);
    free(tokens);
    free(flags);
}

#endif
