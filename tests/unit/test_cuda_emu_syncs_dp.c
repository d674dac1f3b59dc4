/* Host round trips and gradient bytes of a data-parallel step on the emulated CUDA device (issue
 * 28, items 5 and 3): two ranks, each a process of its own on the emulated device, joined by the
 * shm transport, which stages device buffers through host memory (as ranks sharing one GPU do).
 * GPT-2 trains four steps of two micro-batches each with gradient clipping at ZeRO 0-3, fp32 and
 * bf16, and with LAMB, the optimizer offloaded to the CPU, and Llama on loss-masked packed
 * documents; and the two ranks train as the two shards of one tensor-parallel replica (dp 1 ×
 * tp 2): GPT-2 and Llama with grouped-query attention, fp32 and bf16, ZeRO 0 and 1, Llama with
 * one kv head both shards hold, and Llama on packed documents. GPT-2 at ZeRO 0-3, fp32 and bf16,
 * also runs on the nccl transport (the emulated device's NCCL, each rank with an emulated GPU of
 * its own), which reads device memory itself and stages nothing, and so do five of the TP cases,
 * whose groups are then NCCL communicators of their own. Per step, from the second on,
 * every rank counts inside the emulated runtime (zt_emu_sync_counts) the host's waits, the
 * device-to-host copies and the uploads from pageable memory, and, apart, the staging copies the
 * transport made on every communicator the engine uses (zt_comm_dev_counts: one wait and one
 * read-back for each copy to host memory, one pageable upload for each copy back), which a
 * transport that reduces on the host cannot avoid. What is left is the step's own: at most the
 * case's allowance (one wait and one read-back: the losses and the norm, where nothing else is
 * known to wait; the allowances above one say which round trip remains, docs/gpu.md). Every
 * count is printed. The backend's stream order is counted too (zt_cuda_waits): no case may put
 * work on the compute stream from another thread than the training one (ZeRO's communication
 * thread orders its jobs by their own events, docs/gpu.md "The communication thread's
 * streams"; before, its collectives and adds did, 12 to 16 a step), and the compute stream's
 * waits for the communication stream are printed.
 *
 * The gradients' traffic: the bytes of a step's device reductions against the formula, in 4
 * bytes an element at fp32 and 2 at bf16 (communication_data_type's default), and all of a
 * step's device collectives at bf16 half those at fp32 (check_bytes). Every run's per-rank
 * losses match the same two-rank run on the CPU within the tolerance of another summation order
 * (fp32) or of roundings between (bf16). */
#include <math.h>
#include <sys/wait.h>

#include "check.h"
#include "emu_ranks.h"
#include "tiny_models.h"
#include "ztrain/backend.h"
#include "ztrain/comm.h"
#include "ztrain/data.h"
#include "ztrain/engine.h"
#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/tp.h"

enum { STEPS = 4, GAS = 2, WORLD = 2, NTOK = 8192 };

typedef void (*counts_fn)(unsigned long long out[3]);

/* Llama whose two TP shards share its one kv head. */
#define LLAMA_MQA                                                                             \
    "{\"type\": \"llama\", \"n_layer\": 2, \"n_head\": 4, \"n_kv_head\": 1, \"n_embd\": 32, "       \
    "\"intermediate_size\": 48, \"vocab_size\": 256, \"block_size\": 16, "                     \
    "\"tie_word_embeddings\": false}"
#define BF16 "\"bf16\": {\"enabled\": true}, "
/* ZeRO's communication thread reducing buckets of 4,096 elements as the backward goes. */
#define OVERLAP ", \"overlap_comm\": true, \"reduce_bucket_size\": 4096"
/* Stage 3's parameters in this rank's file, read by the communication thread's gathers. */
#define NVME_PARAM                                                                            \
    ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\", \"pin_memory\": true}, " \
    "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}"
/* Tensor parallelism over both ranks (dp 1 × tp 2): the ranks are one model's two shards. */
#define TP2 "\"tensor_parallel\": {\"autotp_size\": 2}, "
#define ADAMW "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1, \"eps\": 1e-4}}"
/* LAMB is not among ZeRO's tested optimizers: every job opts in (AdamW is unaffected). */
#define LAMB "{\"type\": \"Lamb\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}"

typedef struct {
    const char *name;
    const char *model, *precision, *optimizer;
    int stage;
    const char *zero_extra; /* more of zero_optimization, or "" */
    bool masked;            /* the loss-masked packed documents of train.bin */
    int waits;              /* the step's own waits and read-backs allowed */
    int tp;                 /* the TP size: 1, or 2 (both ranks one model's shards) */
    const char *comm;       /* the device run's transport: "nccl", or NULL for shm */
} run_case;

/* The read-backs a case allows: as many as its waits, but the fp32 offloaded update reads each
 * tile's parameters back with its gradients under the tile's one wait (waits = 1 + tiles,
 * read-backs = 1 + 2 · tiles). */
static int reads_allowed(const run_case *c) {
    bool fp32_offload = strstr(c->zero_extra, "offload_optimizer") && !c->precision[0];
    return fp32_offload ? 2 * c->waits - 1 : c->waits;
}

/* The offloaded update's tiles a step (0 without offload): the waits a case allows past the
 * step's one are the tiles'. Not with offload_param, whose gathers wait too (below). */
static int offload_tiles(const run_case *c) {
    return strstr(c->zero_extra, "offload_optimizer") && !strstr(c->zero_extra, "offload_param")
               ? c->waits - 1
               : 0;
}

static const run_case cases[] = {
    {"gpt2 fp32 ZeRO 0", TINY_GPT2, "", ADAMW, 0, "", false, 1, 1, NULL},
    {"gpt2 fp32 ZeRO 1", TINY_GPT2, "", ADAMW, 1, "", false, 1, 1, NULL},
    {"gpt2 fp32 ZeRO 2", TINY_GPT2, "", ADAMW, 2, "", false, 1, 1, NULL},
    {"gpt2 fp32 ZeRO 3", TINY_GPT2, "", ADAMW, 3, "", false, 1, 1, NULL},
    {"gpt2 bf16 ZeRO 0", TINY_GPT2, BF16, ADAMW, 0, "", false, 1, 1, NULL},
    {"gpt2 bf16 ZeRO 1", TINY_GPT2, BF16, ADAMW, 1, "", false, 1, 1, NULL},
    {"gpt2 bf16 ZeRO 2", TINY_GPT2, BF16, ADAMW, 2, "", false, 1, 1, NULL},
    {"gpt2 bf16 ZeRO 3", TINY_GPT2, BF16, ADAMW, 3, "", false, 1, 1, NULL},
    /* LAMB's trust ratios stay on the device: the sums of squares are all-reduced there (one
     * more staged collective) and each tensor's step computed there (lamb_steps), so no wait
     * of its own (before: a second one, reading the sums back). */
    {"gpt2 fp32 ZeRO 1 LAMB", TINY_GPT2, "", LAMB, 1, "", false, 1, 1, NULL},
    /* The host runs the offloaded update: it waits for each tile's gradients (one tile here;
     * with sub_group_size 4096, the 17,088 elements of a rank's slice are five tiles, so one
     * wait of the step and five of the tiles; at fp32 each tile reads its gradients and its
     * parameters back, 1 + 2 · 5 read-backs). Each tile's wait is for an event after its own
     * copies, and every tile but the last finds the next tile's copies issued behind it
     * (zt_emu_waits_ahead): they run while the host updates this one (before: a whole-device
     * sync a tile, which left nothing queued). */
    {"gpt2 bf16 ZeRO 2 offload cpu", TINY_GPT2, BF16, ADAMW, 2,
     ", \"offload_optimizer\": {\"device\": \"cpu\"}", false, 2, 1, NULL},
    {"gpt2 fp32 ZeRO 1 offload, 5 tiles", TINY_GPT2, "", ADAMW, 1,
     ", \"offload_optimizer\": {\"device\": \"cpu\"}, \"sub_group_size\": 4096", false, 6, 1,
     NULL},
    {"gpt2 bf16 ZeRO 2 offload, 5 tiles", TINY_GPT2, BF16, ADAMW, 2,
     ", \"offload_optimizer\": {\"device\": \"cpu\"}, \"sub_group_size\": 4096", false, 6, 1,
     NULL},
    {"llama fp32 ZeRO 2 masked docs", TINY_LLAMA, "", ADAMW, 2, "", true, 1, 1, NULL},
    /* ZeRO 2 with overlap_comm: gradient buckets (of 4,096 elements, so several a micro-batch)
     * reduced on ZeRO's communication thread while the backward goes on. */
    {"gpt2 fp32 ZeRO 2 overlap", TINY_GPT2, "", ADAMW, 2, OVERLAP, false, 1, 1, NULL},
    {"gpt2 bf16 ZeRO 2 overlap", TINY_GPT2, BF16, ADAMW, 2, OVERLAP, false, 1, 1, NULL},
    /* Stage 3 with this rank's parameters in a file: each gather, on the communication
     * thread, reads the rank's piece through the pinned bounce buffer and waits for its copy
     * there, an event on the communication stream (before: on the compute stream with a wait
     * for the whole device), besides the update's tile and the step's: 8 and 12 waits a step
     * on the two ranks, whose pieces span different windows of the file. */
    {"gpt2 bf16 ZeRO 3 offload_param nvme", TINY_GPT2, BF16, ADAMW, 3, NVME_PARAM, false, 12, 1,
     NULL},
    /* Tensor parallelism over both ranks (dp 1 × tp 2), at the ZeRO stages TP trains with
     * the pipeline too (here ZeRO partitions over the one replica). Llama's four query heads
     * share two kv heads (GQA), one a shard; with one kv head both shards hold it and sum its
     * gradients (tp_share_comm). */
    {"gpt2 fp32 tp 2 ZeRO 0", TINY_GPT2, "", ADAMW, 0, "", false, 1, 2, NULL},
    {"gpt2 fp32 tp 2 ZeRO 1", TINY_GPT2, "", ADAMW, 1, "", false, 1, 2, NULL},
    {"gpt2 bf16 tp 2 ZeRO 0", TINY_GPT2, BF16, ADAMW, 0, "", false, 1, 2, NULL},
    {"gpt2 bf16 tp 2 ZeRO 1", TINY_GPT2, BF16, ADAMW, 1, "", false, 1, 2, NULL},
    {"llama fp32 tp 2 ZeRO 0", TINY_LLAMA, "", ADAMW, 0, "", false, 1, 2, NULL},
    {"llama fp32 tp 2 ZeRO 1", TINY_LLAMA, "", ADAMW, 1, "", false, 1, 2, NULL},
    {"llama bf16 tp 2 ZeRO 0", TINY_LLAMA, BF16, ADAMW, 0, "", false, 1, 2, NULL},
    {"llama bf16 tp 2 ZeRO 1", TINY_LLAMA, BF16, ADAMW, 1, "", false, 1, 2, NULL},
    {"llama fp32 tp 2 ZeRO 1 one kv head", LLAMA_MQA, "", ADAMW, 1, "", false, 1, 2, NULL},
    {"llama fp32 tp 2 ZeRO 1 masked docs", TINY_LLAMA, "", ADAMW, 1, "", true, 1, 2, NULL},
    /* NCCL (the emulated device's) reads device memory itself: nothing is staged, and its
     * device collectives are posted on the stream without a host wait (before: one each, 2, 4,
     * 9 and 48 per step at ZeRO 0-3 fp32, 20 at ZeRO 3 bf16). ZeRO 1-3's norm is summed over
     * the ranks on the device too, before the step's read (before: a host all-reduce after it,
     * which NCCL staged through device memory with a wait and a read-back of its own, 2 / 2 per
     * step, LAMB's too). */
    {"nccl gpt2 fp32 ZeRO 0", TINY_GPT2, "", ADAMW, 0, "", false, 1, 1, "nccl"},
    {"nccl gpt2 fp32 ZeRO 1", TINY_GPT2, "", ADAMW, 1, "", false, 1, 1, "nccl"},
    {"nccl gpt2 fp32 ZeRO 2", TINY_GPT2, "", ADAMW, 2, "", false, 1, 1, "nccl"},
    {"nccl gpt2 fp32 ZeRO 3", TINY_GPT2, "", ADAMW, 3, "", false, 1, 1, "nccl"},
    {"nccl gpt2 bf16 ZeRO 0", TINY_GPT2, BF16, ADAMW, 0, "", false, 1, 1, "nccl"},
    {"nccl gpt2 bf16 ZeRO 1", TINY_GPT2, BF16, ADAMW, 1, "", false, 1, 1, "nccl"},
    {"nccl gpt2 bf16 ZeRO 2", TINY_GPT2, BF16, ADAMW, 2, "", false, 1, 1, "nccl"},
    {"nccl gpt2 bf16 ZeRO 3", TINY_GPT2, BF16, ADAMW, 3, "", false, 1, 1, "nccl"},
    {"nccl gpt2 fp32 ZeRO 1 LAMB", TINY_GPT2, "", LAMB, 1, "", false, 1, 1, "nccl"},
    {"nccl gpt2 fp32 ZeRO 2 overlap", TINY_GPT2, "", ADAMW, 2, OVERLAP, false, 1, 1, "nccl"},
    {"nccl gpt2 bf16 ZeRO 2 overlap", TINY_GPT2, BF16, ADAMW, 2, OVERLAP, false, 1, 1, "nccl"},
    /* Loss-masked data on nccl: each rank's count of trained targets (the global batch's,
     * transformers' num_items_in_batch, by which the first forward's gradient scale divides:
     * loss_norm.h) is summed over the ranks for the next step, drawn ahead, on the device under
     * the step's one wait. Before, it was summed for the step itself at its first micro-batch,
     * a host all-reduce that NCCL staged through device memory: two waits a step. */
    {"nccl llama fp32 ZeRO 2 masked docs", TINY_LLAMA, "", ADAMW, 2, "", true, 1, 1, "nccl"},
    /* Tensor parallelism on nccl: the TP group (and the group of the shards sharing a kv head)
     * is an NCCL communicator of its own, its device collectives posted on the stream like the
     * job's, nothing staged (before: a group of the job communicator's host messages, each
     * collective staged through the host and each message a host wait of NCCL's: 70 waits and
     * 47 read-backs a step + 22 staged, 82 / 55 + 26 with the shared kv head). The norm's
     * pieces are summed over the TP group on the device too, the group being device-native. */
    {"nccl gpt2 fp32 tp 2 ZeRO 0", TINY_GPT2, "", ADAMW, 0, "", false, 1, 2, "nccl"},
    {"nccl gpt2 bf16 tp 2 ZeRO 1", TINY_GPT2, BF16, ADAMW, 1, "", false, 1, 2, "nccl"},
    {"nccl llama fp32 tp 2 ZeRO 1", TINY_LLAMA, "", ADAMW, 1, "", false, 1, 2, "nccl"},
    {"nccl llama bf16 tp 2 ZeRO 0", TINY_LLAMA, BF16, ADAMW, 0, "", false, 1, 2, "nccl"},
    {"nccl llama fp32 tp 2 ZeRO 1 one kv head", LLAMA_MQA, "", ADAMW, 1, "", false, 1, 2,
     "nccl"},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* What one rank measured of one case on the device: per step the runtime's waits, read-backs
 * and pageable uploads less the transport's staging, the staging's waits, and the payload. */
typedef struct {
    unsigned long long own[STEPS][3], staged[STEPS], bytes[STEPS], reduced[STEPS];
    unsigned long long ahead[STEPS]; /* event waits that left reads queued (zt_emu_waits_ahead) */
    /* The backend's stream order (zt_cuda_waits): work other threads put on the compute
     * stream, and the compute stream's waits for the communication stream. */
    unsigned long long elsewhere[STEPS], on_comm[STEPS];
    size_t n_padded;
} measured;

/* The emulator's event waits that returned with device-to-host copies still queued behind. */
static unsigned long long (*waits_ahead)(void);

/* The TCP ports of the nccl cases' rendezvous, one a case, found free by the parent. */
static int nccl_ports[64];

static zt_comm *join(const char *what, int rank, const char *transport, int port) {
    return emu_join("syncs-dp", what, rank, WORLD, transport, port);
}

/* The device collectives' counts of the communicators a rank's engine uses, added up. */
static zt_comm_dev_stats dev_counts(zt_comm *const used[3]) {
    return zt_comm_dev_counts_sum(used, 3);
}

/* Trains the case on one rank and fills losses[STEPS] (the mean of the step's micro-batches);
 * with counts, what it measured. */
static bool train(const run_case *c, int rank, zt_device device, counts_fn counts,
                  double *losses, measured *out) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"name\": \"syncs\", \"world_size\": %d, \"model\": %s, \"data\": {\"train\": "
             "\"%s\"%s}, \"train\": {\"max_steps\": %d}, \"deepspeed\": "
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": %d, "
             "%s%s\"gradient_clipping\": 1.0, \"zero_allow_untested_optimizer\": true, "
             "\"zero_optimization\": {\"stage\": %d%s}, "
             "\"optimizer\": %s}}",
             WORLD, c->model, c->masked ? "train.bin" : "train.txt",
             c->masked ? ", \"format\": \"masked\"" : "", STEPS, GAS, c->precision,
             c->tp > 1 ? TP2 : "", c->stage, c->zero_extra, c->optimizer);
    char tag[64];
    snprintf(tag, sizeof tag, "%td-%s", c - cases, device == ZT_DEVICE_CPU ? "cpu" : "cuda");
    const bool nccl = device == ZT_DEVICE_CUDA && c->comm;
    zt_comm *comm = join(tag, rank, nccl ? c->comm : "shm", nccl_ports[c - cases]);
    if (!comm)
        return false;
    zt_job_spec job;
    zt_dataset data;
    zt_engine *e = NULL;
    zt_engine_options opts = {.seed = 5, .shuffle = true, .threads = 1, .device = device,
                              .rank = rank, .job_rank = rank, .comm = comm, .job_name = tag};
    /* With TP both ranks are the shards of one replica, as the trainer sets them up: the TP
     * group is every rank, and there is no data-parallel group. */
    zt_tp_groups groups = {0};
    zt_grid grid;
    if (c->tp > 1) {
        if (zt_grid_of(rank, WORLD, 1, c->tp, &grid) != ZT_OK ||
            zt_tp_groups_create(&groups, comm, &grid) != ZT_OK) {
            CHECK(false, "rank %d, the TP groups of %s: %s", rank, c->name, zt_last_error());
            zt_comm_destroy(comm);
            return false;
        }
        opts.comm = groups.dp;
        opts.rank = grid.replica;
        opts.tp_size = c->tp;
        opts.tp_rank = grid.tp_rank;
        opts.tp_comm = groups.tp;
    }
    /* The communicators whose device collectives the step's counts set apart: the data-parallel
     * one, the TP group, and the group of the shards sharing a kv head (the model's). */
    zt_comm *used[3] = {opts.comm, opts.tp_comm, NULL};
    if (zt_job_spec_parse(&job, json, "job", check_tmpdir) != ZT_OK ||
        zt_dataset_open_train(&data, &job.data, job.model.vocab_size) != ZT_OK ||
        zt_engine_create(&e, &job.ds, &job.model, &data, &opts) != ZT_OK) {
        CHECK(false, "rank %d, setup of %s: %s", rank, json, zt_last_error());
        zt_tp_groups_destroy(&groups);
        zt_comm_destroy(comm);
        return false;
    }
    bool ok = true;
    used[2] = zt_engine_model(e)->tp_share_comm;
    if (out)
        out->n_padded = zt_engine_model(e)->n_padded;
    zt_backend *be = zt_engine_model(e)->ctx.be;
    for (int s = 0; s < STEPS && ok; s++) {
        unsigned long long before[3] = {0}, after[3] = {0}, ahead0 = 0;
        zt_comm_dev_stats cb = dev_counts(used);
        zt_cuda_waits wb = {0}, wa = {0};
        if (out)
            zt_backend_cuda_waits(be, &wb);
        if (counts) {
            counts(before);
            ahead0 = waits_ahead();
        }
        for (int m = 0; m < GAS && ok; m++) {
            zt_batch b;
            ok = check_at(__FILE__, __LINE__, zt_engine_next_batch(e, &b) == ZT_OK &&
                           zt_engine_forward(e, &b, NULL) == ZT_OK &&
                           zt_engine_backward(e) == ZT_OK && zt_engine_step(e) == ZT_OK,
                       "%s, rank %d step %d micro %d: %s", c->name, rank, s + 1, m,
                       zt_last_error());
        }
        if (counts) {
            counts(after);
            if (out)
                out->ahead[s] = waits_ahead() - ahead0;
        }
        zt_comm_dev_stats ca = dev_counts(used);
        if (out) {
            zt_backend_cuda_waits(be, &wa);
            out->elsewhere[s] = wa.compute_issued_elsewhere - wb.compute_issued_elsewhere;
            out->on_comm[s] = wa.compute_waits_on_comm - wb.compute_waits_on_comm;
        }
        const float *l = zt_engine_step_losses(e);
        losses[s] = ((double)l[0] + l[1]) / 2;
        if (!out)
            continue;
        unsigned long long waits = ca.staged_waits - cb.staged_waits,
                           uploads = ca.staged_uploads - cb.staged_uploads;
        /* A staging copy to the host is one wait and one read-back; its copy back one upload. */
        out->own[s][0] = after[0] - before[0] - waits;
        out->own[s][1] = after[1] - before[1] - waits;
        out->own[s][2] = after[2] - before[2] - uploads;
        out->staged[s] = waits;
        out->bytes[s] = ca.payload_bytes - cb.payload_bytes;
        out->reduced[s] = ca.reduced_bytes - cb.reduced_bytes;
    }
    ok = check_at(__FILE__, __LINE__, zt_engine_sync(e) == ZT_OK, "%s", zt_last_error()) && ok;
    zt_engine_destroy(e);
    zt_dataset_close(&data);
    zt_job_spec_free(&job);
    zt_tp_groups_destroy(&groups);
    zt_comm_destroy(comm);
    return ok;
}

/* One rank: every case on the CPU and on the emulated device. Rank 0 prints the counts and
 * writes what it measured to results.bin for the byte checks across cases. */
static int rank_main(int rank, counts_fn counts) {
    measured all[NCASES] = {0};
    for (int i = 0; i < NCASES; i++) {
        const run_case *c = &cases[i];
        double cpu[STEPS], cuda[STEPS];
        measured *m = &all[i];
        if (!train(c, rank, ZT_DEVICE_CPU, NULL, cpu, NULL) ||
            !train(c, rank, ZT_DEVICE_CUDA, counts, cuda, m))
            continue;
        if (rank == 0) {
            printf("%-30s rank 0, per step: own waits/D2H/pageable H2D + staged waits, bytes "
                   "reduced/all:", c->name);
            for (int s = 0; s < STEPS; s++)
                printf(" %llu/%llu/%llu+%llu %llu/%llu", m->own[s][0], m->own[s][1],
                       m->own[s][2], m->staged[s], m->reduced[s], m->bytes[s]);
            if (offload_tiles(c))
                printf("; waits with the next tile's copies queued:");
            for (int s = 0; offload_tiles(c) && s < STEPS; s++)
                printf(" %llu", m->ahead[s]);
            printf("; compute stream: waits for the communication stream / work issued by "
                   "another thread:");
            for (int s = 0; s < STEPS; s++)
                printf(" %llu/%llu", m->on_comm[s], m->elsewhere[s]);
            printf("\n");
            fflush(stdout);
        }
        const int reads = reads_allowed(c);
        for (int s = 1; s < STEPS; s++)
            CHECK(m->own[s][0] <= (unsigned)c->waits && m->own[s][1] <= (unsigned)reads &&
                      m->own[s][2] == 0,
                  "%s, rank %d step %d: %llu host waits, %llu device-to-host copies and %llu "
                  "pageable uploads besides the transport's staging; at most %d, %d and 0 "
                  "allowed", c->name, rank, s + 1, m->own[s][0], m->own[s][1], m->own[s][2],
                  c->waits, reads);
        /* The offloaded update: exactly one wait a tile besides the step's, and when the host
         * waits for a tile (but the last), the next tile's copies already issued behind it. */
        const int tiles = offload_tiles(c);
        for (int s = 1; tiles && s < STEPS; s++)
            CHECK(m->own[s][0] == (unsigned)c->waits,
                  "%s, rank %d step %d: %llu host waits, not one of the step's and one for each "
                  "of %d tiles", c->name, rank, s + 1, m->own[s][0], tiles);
        for (int s = 0; tiles && s < STEPS; s++)
            CHECK(m->ahead[s] >= (unsigned)tiles - 1,
                  "%s, rank %d step %d: the host waited for %llu of %d tiles with the next "
                  "tile's copies issued behind them: the copies do not overlap the host's update",
                  c->name, rank, s + 1, m->ahead[s], tiles - 1);
        /* ZeRO's communication thread (stage 3, overlap_comm) orders its jobs by their events
         * and issues nothing on the compute stream, so a collective's wait never lands
         * wherever the training thread has got to (docs/gpu.md). */
        for (int s = 0; s < STEPS; s++)
            CHECK(m->elsewhere[s] == 0, "%s, rank %d step %d: %llu pieces of work put on the "
                  "compute stream by another thread than the training one", c->name, rank,
                  s + 1, m->elsewhere[s]);
        /* NCCL reads device memory itself, the TP groups' included: nothing is staged. */
        for (int s = 0; c->comm && s < STEPS; s++)
            CHECK(m->staged[s] == 0, "%s, rank %d step %d: %llu collectives staged through the "
                  "host on nccl", c->name, rank, s + 1, m->staged[s]);
        const double tol = c->precision[0] ? 2e-3 : 1e-4;
        for (int s = 0; s < STEPS; s++)
            CHECK(isfinite(cuda[s]) && fabs(cuda[s] - cpu[s]) <= tol * fabs(cpu[s]),
                  "%s, rank %d step %d: loss %.7g on cuda, %.7g on cpu", c->name, rank, s + 1,
                  cuda[s], cpu[s]);
    }
    if (rank == 0)
        check_write_file(check_tmp_path("results.bin"), all, sizeof all);
    return check_summary(rank ? "test_cuda_emu_syncs_dp rank 1" : "test_cuda_emu_syncs_dp rank 0");
}

static const measured *find(const measured *all, const char *name) {
    for (int i = 0; i < NCASES; i++)
        if (strcmp(cases[i].name, name) == 0)
            return &all[i];
    return NULL;
}

/* Per step, the gradients' reduction against the formula (ZeRO 0 and 1 reduce the accumulated
 * gradient once, 2 and 3 every micro-batch's, n_padded elements each time) in 4 bytes at fp32
 * and 2 at bf16; and all the traffic at ZeRO 0-2 (the reduction and, at 1 and 2, the all-gather
 * of the updated parameters) half at bf16. ZeRO 3's gathers follow the layers' use, and at fp32
 * the tensors kept whole are gathered again after the step, so there only the reduction is
 * compared. NCCL carries shm's bytes, and at ZeRO 1-3 the norm's total besides (one double,
 * summed on the device, where shm sums it on the host). */
static void check_bytes(const measured *all) {
    for (int stage = 0; stage <= 3; stage++) {
        char n32[64], n16[64];
        snprintf(n32, sizeof n32, "gpt2 fp32 ZeRO %d", stage);
        snprintf(n16, sizeof n16, "gpt2 bf16 ZeRO %d", stage);
        const measured *a = find(all, n32), *b = find(all, n16);
        for (int s = 0; s < STEPS; s++) {
            unsigned long long n = a->n_padded, each = stage < 2 ? n : GAS * n;
            CHECK(a->reduced[s] == 4 * each && b->reduced[s] == 2 * each,
                  "ZeRO %d step %d: %llu bytes of gradients reduced at fp32 and %llu at bf16; "
                  "%llu and %llu expected (%llu elements, 4 and 2 bytes each)", stage, s + 1,
                  a->reduced[s], b->reduced[s], 4 * each, 2 * each, each);
            for (int p = 0; p < 2; p++) {
                char nn[80];
                snprintf(nn, sizeof nn, "nccl %s", p ? n16 : n32);
                const measured *x = find(all, nn), *y = p ? b : a;
                unsigned long long norm = stage > 0 ? sizeof(double) : 0;
                if (x)
                    CHECK(x->reduced[s] == y->reduced[s] + norm &&
                              x->bytes[s] == y->bytes[s] + norm,
                          "%s step %d: %llu bytes reduced of %llu on nccl, %llu of %llu on shm "
                          "and %llu of the norm", nn, s + 1, x->reduced[s], x->bytes[s],
                          y->reduced[s], y->bytes[s], norm);
            }
            if (stage < 3)
                CHECK(a->bytes[s] > 0 && 2 * b->bytes[s] == a->bytes[s],
                      "ZeRO %d step %d: %llu bytes through the device collectives at bf16, not "
                      "half of fp32's %llu", stage, s + 1, b->bytes[s], a->bytes[s]);
        }
    }
}

/* A forked rank (emu_run_ranks): the emulator's counters, then every case. */
static int rank_start(int rank, int world) {
    (void)world;
    counts_fn counts = (counts_fn)zt_backend_cuda_symbol("zt_emu_sync_counts");
    waits_ahead = (unsigned long long (*)(void))zt_backend_cuda_symbol("zt_emu_waits_ahead");
    if (!counts || !waits_ahead) {
        fprintf(stderr, "rank %d: the emulated module has no zt_emu_sync_counts or "
                "zt_emu_waits_ahead\n", rank);
        return 2;
    }
    return rank_main(rank, counts);
}

int main(void) {
    if (!emu_devices("test_cuda_emu_syncs_dp", 2))
        return 0;
    /* Free ports for the nccl cases' rendezvous (rank 0 serves each case's store on its own,
     * so a rank that moves on first never meets the previous case's store). */
    if (!free_ports(nccl_ports, NCASES))
        return 2;
    check_tmpdir_create("zt_syncs_dp");
    emu_write_data(NTOK);
    emu_run_ranks(WORLD, rank_start);
    static measured all[NCASES];
    FILE *f = fopen(check_tmp_path("results.bin"), "rb");
    CHECK(f && fread(all, sizeof all, 1, f) == 1, "rank 0 wrote no results");
    if (f) {
        fclose(f);
        check_bytes(all);
    }
    check_tmpdir_remove();
    return check_summary("test_cuda_emu_syncs_dp");
}
