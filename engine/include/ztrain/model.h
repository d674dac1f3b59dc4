/* The model interface: one implementation per architecture under engine/models/.
 *
 * A model owns one flat fp32 buffer of parameters and one of gradients in its backend's device
 * memory; its tensors are views at fixed offsets, listed in `tensors` with their Hugging Face names
 * and shapes, so checkpoints, safetensors import/export and ZeRO partitions are plain offset
 * arithmetic. Activations are sized at creation for at most max_batch sequences of block_size
 * tokens; nothing is allocated after. Model code reaches that memory only through the backend
 * (backend.h) and computes only through its op table (ops.h). */
#ifndef ZTRAIN_MODEL_H
#define ZTRAIN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/job_spec.h"
#include "ztrain/backend.h"
#include "ztrain/status.h"

typedef struct {
    char name[64];     /* Hugging Face name, e.g. "h.0.attn.c_attn.weight" */
    size_t offset;     /* in elements, into params and grads */
    size_t numel;
    int ndim;
    int64_t shape[2];
    int layer;         /* transformer block index, or -1 for embeddings and the final norm */
    /* A pipeline stage's own copy of a tied tensor (the token embedding on the last stage of a
     * model whose LM head is tied to it, zt_model_create_stage): its gradient is the head's
     * share, which the caller sums with the first stage's before the data-parallel reduction.
     * false everywhere else. */
    bool tied_copy;
    /* Tensor parallelism (Megatron's sharded layers): how this tensor is this rank's shard of the
     * whole model's tensor of the same name, whose shape is full_shape. tp_dim -1: the whole
     * tensor (norms, row-parallel biases, GPT-2's positions), held alike by every TP rank. Else
     * dimension tp_dim of the whole tensor is cut into tp_groups equal groups (3 for GPT-2's packed
     * q|k|v, 1 otherwise), each group into tp_pieces equal pieces, and this tensor holds piece
     * tp_piece of every group, in group order. tp_shared: how many TP ranks hold this same shard
     * (the TP size for a whole tensor, TP / n_kv_head for Llama's k and v when there are fewer kv
     * heads than TP ranks, 1 for a proper split): their gradients are equal (whole tensors) or
     * partial sums (shared kv heads), and the gradient norm counts them once. Without tensor
     * parallelism tp_dim is -1, tp_shared 1 and full_shape the shape. */
    int tp_dim, tp_groups, tp_pieces, tp_piece, tp_shared;
    int64_t full_shape[2];
} zt_tensor_info;

typedef struct zt_model zt_model;

/* A pipeline stage's share of a model (DeepSpeed's PipelineModule partition): transformer blocks
 * [first_layer, last_layer), plus the embedding when `embed`, plus the final norm and LM head
 * when `head`. A full model is {0, n_layer, true, true, 1}. */
typedef struct {
    int first_layer, last_layer;
    bool embed, head;
    /* Activation sets: how many micro-batches may be between their forward and their backward at
     * once (DeepSpeed's pipe buffers). 1 for a model that is not pipelined. */
    int buffers;
    /* Tensor parallelism: this rank holds shard tp_rank of tp_size of every sharded layer
     * (zt_tensor_info.tp_dim). 0 or 1: no tensor parallelism. A model with tp_size > 1 computes
     * only once its TP group is attached (zt_model_set_tp_comm). */
    int tp_size, tp_rank;
} zt_model_stage;

/* The TP size of a stage: tp_size, or 1 when it is 0. */
static inline int zt_model_stage_tp(const zt_model_stage *s) {
    return s->tp_size > 1 ? s->tp_size : 1;
}

/* Called by the model around its use of parameters and as gradients become final, so ZeRO can
 * gather partitioned parameters just in time (stage 3) and reduce gradients while the backward
 * runs (stages 2 and 3). `layer` is a transformer block, or -1 for the outer tensors (embeddings
 * and final norm), which stay fetched from the start of a forward to the end of its backward (or
 * of the forward, without gradients). Every callback may be NULL. */
typedef struct {
    void *ctx;
    /* `backward`: the pass runs from the last layer to the first (so the next one to prefetch
     * is layer - 1 rather than layer + 1). */
    void (*fetch)(void *ctx, int layer, bool backward);
    void (*release)(void *ctx, int layer);
    /* Before a backward first writes the outer tensors' gradients (layer -1; a block's come
     * with its backward fetch): ZeRO commits the memory, which a gradient reduction may have let
     * go since this micro-batch's forward (a pipeline runs another micro-batch's backward in
     * between). */
    void (*grads_write)(void *ctx, int layer);
    void (*grads_ready)(void *ctx, int layer);
} zt_model_hooks;

typedef struct {
    /* Initialises the weights from a seed, as the architecture's reference does (GPT-2: normal
     * std 0.02, residual projections scaled by 1/sqrt(2 n_layer), zero biases, unit norms). */
    zt_status (*init_weights)(zt_model *m, uint64_t seed);
    /* Runs the forward over B ≤ max_batch sequences of T ≤ block_size tokens. With targets,
     * returns the mean cross-entropy over targets ≥ 0 and, when grad_scale != 0, prepares the
     * backward of grad_scale · Σ losses (the caller passes 1/(tokens · accumulation steps)).
     * Without targets it returns 0 and leaves the logits readable through logits(). */
    float (*forward)(zt_model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float grad_scale);
    /* Accumulates the parameter gradients of the last forward into m->grads. */
    void (*backward)(zt_model *m);
    /* Copies rows [row, row + rows) of the logits [B·T, vocab] of the last forward without
     * targets (a stage's: of buffer 0, on a stage with the head) into host memory
     * dst[rows · vocab]. Under tensor parallelism vocab is the shard's vocabulary slice,
     * vocab_size / tp_size wide: zt_model_logits gives whole rows. */
    void (*logits)(const zt_model *m, size_t row, size_t rows, float *dst);
    /* Forward+backward FLOPs per token, the figure TFLOPS metrics use: DeepSpeedExamples' count
     * with the coefficient 3, or 4 when the model checkpoints activations (spec
     * checkpoint_interval > 0); a stage counts its own parameters and blocks. */
    double (*flops_per_token)(const zt_model *m);
    void (*destroy)(zt_model *m);
    /* One micro-batch through the stage, keeping its activations in set `buffer`
     * (0 <= buffer < stage.buffers). The first stage (embed) reads tokens[B,T]; any other reads
     * in_act[B,T,n_embd] (held at ctx.act precision in backend device memory: the previous
     * stage's output). The last stage (head) computes the loss against targets as forward does
     * (returns the mean loss and prepares the backward of grad_scale · Σ losses); any other
     * writes out_act[B,T,n_embd] (same precision and memory) and returns 0. Pointers are
     * borrowed for the call; tokens are copied, in_act is not needed after it. */
    float (*stage_forward)(zt_model *m, int buffer, const int32_t *tokens, const void *in_act,
                           const int32_t *targets, void *out_act, int B, int T, float grad_scale);
    /* The backward of set `buffer`'s forward: the last stage from its loss, any other from
     * dout[B,T,n_embd] (the next stage's gradient w.r.t. this stage's output). Accumulates the
     * stage's parameter gradients and, unless the stage has `embed`, overwrites
     * din[B,T,n_embd] (the gradient to send to the previous stage). Both at ctx.act precision
     * in backend device memory. */
    void (*stage_backward)(zt_model *m, int buffer, const void *dout, void *din);
    /* Packed documents (a whole model only): pos[B·T] (host memory, read during the call) gives
     * each token's position inside its document, as zt_loader_next_docs writes it; the forwards
     * and backwards that follow, until the next call, restart the attention (a block-diagonal
     * causal mask, zt_attn_shape.doc_pos) and the position embeddings (rotary angles, GPT-2's
     * learned positions) at each document's first token. pos NULL: one document per row, as
     * before the first call. A position that is neither 0 nor one past the token before is
     * ZT_ERR_INVALID. */
    zt_status (*set_doc_pos)(zt_model *m, const int32_t *pos, int B, int T);
} zt_model_ops;

struct zt_model {
    const zt_model_ops *ops;
    /* The stack of blocks of a family built on engine/models/blocks.h, whose forward, backward
     * and logits ops it shares (zt_blocks_model_*); owned by the family's model. */
    struct zt_blocks *blocks;
    /* The backend the model computes on, and the precision its activations are held at: in mixed
     * precision activations and their gradients are held at 16 bits (ops.h says how the CPU does
     * it); ZT_F32 otherwise. Fixed at creation: the activation buffers are sized for it. */
    zt_ctx ctx;
    zt_model_spec spec;   /* a copy; spec.init_from is not owned */
    zt_model_stage stage; /* the share of the model this one holds; the whole for zt_model_create */
    int max_batch;
    int n_layer;          /* the whole model's blocks, also on a stage */
    size_t n_params;
    size_t n_padded;      /* n_params rounded up to the pad_to given at creation */
    float *params;        /* [n_padded] device memory, owned; the padding is 0 */
    /* [n_padded], likewise, but allocated released (zt_backend_alloc_released; in mixed
     * precision on a backend that writes 16-bit gradients, zt_backend_reserve, which holds
     * nothing at any size): committed by ZeRO (zt_zero_init, its hooks) or, in a model without
     * hooks, by its first backward. */
    float *grads;
    zt_model_hooks hooks;
    int n_tensors;
    zt_tensor_info *tensors;
    /* Tensor parallelism (stage.tp_size > 1): the TP group, whose rank i holds shard i (not
     * owned), and the first failure of a collective the forward or backward ran over it (the ops
     * return no status: the caller checks zt_model_tp_status after each pass). */
    struct zt_comm *tp_comm;
    zt_status tp_error;
    /* The TP ranks that hold the same piece of a shard several ranks share (Llama's kv heads
     * when there are fewer than TP ranks; zt_tensor_info.tp_shared), in which the gradients of
     * that piece are summed: a group of tp_comm made by zt_model_set_tp_comm (owned). NULL when
     * no tensor is shared so. */
    struct zt_comm *tp_share_comm;
    /* zt_model_logits' host buffer under tensor parallelism (owned): every shard's slice of the
     * rows asked, side by side, tp_logits_n floats; grown to the most rows asked, then reused,
     * since sampling asks for one row a token. */
    float *tp_logits;
    size_t tp_logits_n;
    /* When not NULL (the engine sets it around a training forward whose loss it reads back
     * later, at the step's one synchronisation): one double of device memory into which the
     * forward sums its token losses (ignored targets add 0) instead of reading them back, and
     * forward() then returns NAN. A TP forward too: its shards' losses are combined on the
     * device (every TP rank holds the same sum). */
    double *loss_out;
    /* How many micro-batches may be queued on the device at once with host tables of their own
     * (packed documents' positions, Llama's rotary rows for them): the engine's micro-batches
     * between two waits for the device. 0 or 1: one, and the caller waits between forwards.
     * Read when the tables are first made. */
    int upload_slots;
};

/* Attaches the TP group to a model built with stage.tp_size > 1 (its size must be tp_size and
 * its rank tp_rank: ZT_ERR_INVALID otherwise), and makes tp_share_comm from it where the model
 * shares pieces. The communicator must outlive the model's use. */
zt_status zt_model_set_tp_comm(zt_model *m, struct zt_comm *tp_comm);

/* ZT_OK, or the first TP collective's failure since the last call (which clears it), with its
 * message set again. */
zt_status zt_model_tp_status(zt_model *m);

/* Rows [row, row + rows) of the logits of the last forward without targets, over the whole
 * vocabulary, into host dst[rows · vocab_size]. Under tensor parallelism a collective of the TP
 * group (every shard calls it alike, after the forward all of them ran): each shard's
 * vocabulary slice is gathered, so every shard gets the same whole rows. */
zt_status zt_model_logits(zt_model *m, size_t row, size_t rows, float *dst);

/* Copies this rank's shard `t` out of the whole tensor `full` (host memory, full_shape), into
 * host shard[t->numel]; and the reverse, writing the shard's elements into their places in the
 * whole tensor. Whole tensors (tp_dim -1) are a plain copy. */
void zt_tensor_shard_from_full(const zt_tensor_info *t, const float *full, float *shard);
void zt_tensor_shard_to_full(const zt_tensor_info *t, const float *shard, float *full);
/* Elements of the whole tensor. */
size_t zt_tensor_full_numel(const zt_tensor_info *t);
/* The index in the whole tensor of element j of this rank's shard `t` (j itself for a whole
 * tensor), in the order zt_tensor_shard_from_full copies them. */
size_t zt_tensor_shard_index(const zt_tensor_info *t, size_t j);

/* Creates the model that spec->type names on backend be (which must outlive it), holding its
 * activations at precision act (ZT_F32, or the 16-bit type of mixed precision), with zeroed
 * parameters and gradients whose flat buffers are padded to a multiple of pad_to elements (ZeRO
 * splits them into equal slices). Ranges a rank does not hold can be released through the backend
 * (zt_backend_release) and read as zeros afterwards. */
zt_status zt_model_create(zt_model **out, const zt_model_spec *spec, zt_backend *be, zt_dtype act,
                          int max_batch, size_t pad_to);
void zt_model_destroy(zt_model *m);

/* Like zt_model_create, but the model holds only the stage's tensors (same Hugging Face names,
 * same order, offsets packed from 0, so the flat buffer is the stage's only) and activations for
 * stage->buffers micro-batches of its own layers. A stage with `head` on a model with a tied LM
 * head (GPT-2; Llama with tie_word_embeddings) and without `embed` holds its own copy of the
 * token embedding under the embedding's name, last in its table, marked tied_copy. Its
 * zt_tensor_info.layer numbers stay the full model's. The forward and backward ops are for a
 * whole model only; a stage computes through stage_forward and stage_backward. A stage outside
 * [0, n_layer], an empty one (no layers, no embedding, no head) or buffers < 1 is
 * ZT_ERR_INVALID. */
zt_status zt_model_create_stage(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                                zt_dtype act, int max_batch, size_t pad_to,
                                const zt_model_stage *stage);

/* The stage that is the whole model of n_layer blocks. */
zt_model_stage zt_model_full_stage(int n_layer);

/* The tensor with this Hugging Face name, or NULL. */
const zt_tensor_info *zt_model_find_tensor(const zt_model *m, const char *name);

/* Loads weights with the Hugging Face names and layouts of the model's family from `path`: a
 * safetensors file, or a set of shards (a Hugging Face directory or its
 * model.safetensors.index.json; see zt_st_set_open). They are read through the family's
 * zt_hf_map: its prefix is dropped, the tensors it ignores are skipped, a tied tensor must equal
 * the one it is tied to, and a croppable tensor may be longer along dim 0. F32, F16 and BF16
 * (and F64) data are converted to fp32. A missing tensor, a shape mismatch, an unexpected tensor
 * or a dtype that is not a float is an error naming the file (the shard), the tensor, and both
 * shapes or the dtype. A pipeline stage (zt_model_create_stage) loads the tensors it holds, its
 * tied copy from the tensor it copies, and skips the file's others. */
zt_status zt_model_load_safetensors(zt_model *m, const char *path);

/* Writes the parameters as fp32 safetensors with Hugging Face names and layouts. The metadata
 * holds "format": "pt", "model_type": spec.type and every architecture field of the family's
 * table (see zt_model_field) as text. */
zt_status zt_model_save_safetensors(const zt_model *m, const char *path);


/* ---- The registry of model families -------------------------------------------------------
 *
 * A family (GPT-2, Llama, ...) is one file under engine/models/ that defines a zt_model_family,
 * and an entry in engine/models/model_registry.c's list; its fields are members of zt_model_spec and
 * of proto/ztrain.proto's ModelSpec. Its table of spec fields is the one
 * place the model section of a job spec is declared: the job-spec parser (allowed keys, required
 * keys, types, defaults, bounds), zt_model_spec_validate, checkpoints' meta.json (written, read
 * and compared), safetensors export metadata, the service's JSON <-> proto mapping and the CLI's
 * description of a model all walk it. proto/ztrain.proto's ModelSpec must hold a field of the
 * same name and a matching type for every entry (tests/unit/test_model_registry.c checks). */

/* What a spec field holds, which is the zt_model_spec member's C type. */
typedef enum {
    ZT_FIELD_INT,    /* int; proto int32 */
    ZT_FIELD_FLOAT,  /* double; proto double */
    ZT_FIELD_BOOL,   /* bool; proto bool */
    ZT_FIELD_STRING, /* char[size], inline and NUL-terminated; proto string */
    /* char *, a heap path resolved against the job file's directory; proto string. A path says
     * where weights come from, not what the model is, so it is the one kind that checkpoints,
     * export metadata and comparisons leave out: every other field is an architecture field. */
    ZT_FIELD_PATH,
} zt_field_kind;

/* The lower bound a numeric field's value must respect. */
typedef enum {
    ZT_BOUND_NONE,
    ZT_BOUND_POSITIVE,    /* > 0 */
    ZT_BOUND_NONNEGATIVE, /* >= 0 */
} zt_field_bound;

/* One key of a job spec's "model" section. The key is the JSON key, the proto ModelSpec field
 * name, the meta.json key and the zt_model_spec member's name; write entries with
 * ZT_MODEL_FIELD(member), which fills key, offset, size and kind from the member itself, so they
 * cannot disagree:
 *     {ZT_MODEL_FIELD(n_head), .required = true, .bound = ZT_BOUND_POSITIVE,
 *      .meaning = "attention heads"}
 * A field that is not required takes `def` (numbers and bools) or `def_str` (strings) when the
 * job leaves it out, and so does a field missing from an older checkpoint. A default that is not
 * zero, on a field whose bound allows zero, needs a proto field with presence (a oneof), because
 * the proto reads a zero as "unset". */
typedef struct {
    const char *key;
    zt_field_kind kind;
    size_t offset;        /* offsetof(zt_model_spec, member) */
    size_t size;          /* sizeof the member: for STRING, the longest value plus its NUL */
    bool required;
    double def;
    const char *def_str;
    zt_field_bound bound;
    const char *meaning;  /* one line for documentation and messages */
} zt_model_field;

/* The most fields a family's table may hold. */
#define ZT_MODEL_MAX_FIELDS 64

/* Key, offset, size and kind of a zt_model_spec member that is an int, a double, a bool or a
 * char * path; any other type does not compile. */
#define ZT_MODEL_FIELD(member)                                                               \
    .key = #member, .offset = offsetof(zt_model_spec, member),                               \
    .size = sizeof(((zt_model_spec *)0)->member),                                            \
    .kind = _Generic(&((zt_model_spec *)0)->member, int *: ZT_FIELD_INT,                     \
                     double *: ZT_FIELD_FLOAT, bool *: ZT_FIELD_BOOL, char **: ZT_FIELD_PATH)
/* The same for an inline char array member. */
#define ZT_MODEL_STRING_FIELD(member)                                                        \
    .key = #member, .offset = offsetof(zt_model_spec, member),                               \
    .size = sizeof(((zt_model_spec *)0)->member), .kind = ZT_FIELD_STRING

/* How the tensor names of a Hugging Face safetensors file map to a family's parameters, whose
 * own names (zt_tensor_info.name) are what export writes. Every member may be NULL. */
typedef struct {
    /* Dropped from the front of a file's name when present ("transformer."); a file that holds
     * a name both with and without it is refused as ambiguous. */
    const char *strip_prefix;
    /* Name endings of tensors that are not parameters (causal-mask buffers): skipped.
     * NULL-terminated. */
    const char *const *ignore_suffixes;
    /* A tensor the file may carry although the model keeps no parameter of that name, because
     * it is tied to `tied_to` (GPT-2's lm_head.weight to wte.weight): it must have the same
     * shape and values, else the load fails rather than drop it. A family whose model does have
     * a parameter of that name (an untied head) loads it like any other. */
    const char *tied;
    const char *tied_to;
    /* A parameter the file may hold more rows of (dim 0) than the model needs: the first rows
     * are loaded (a position table longer than block_size, as nanoGPT crops GPT-2's 1024). */
    const char *croppable;
} zt_hf_map;

/* What a family's estimate is asked about: the shape of one forward and what the caller will
 * keep whole. */
typedef struct {
    int micro_batch;                /* sequences per forward, >= 1 (max_batch of zt_model_create) */
    size_t act_size;                /* bytes per activation element (zt_backend_act_size) */
    uint64_t persistence_threshold; /* persistent_params counts the tensors with fewer elements */
    /* Tensor parallelism: the sizes of one shard of tp_size (a TP rank's tensors, activations
     * and the vocabulary-parallel loss's buffers), the largest where shards differ. 0 or 1: the
     * whole model. */
    int tp_size;
    /* The backend's attention keeps a statistic per row, not the T×T probabilities
     * (zt_backend.attn_lse); false counts the probabilities, the larger. */
    bool attn_lse;
    /* A pipeline stage's share (its blocks, the embedding or the head, its activation buffers;
     * tp_size above overrides the stage's); NULL: the whole model. */
    const zt_model_stage *stage;
} zt_model_estimate_args;

/* The sizes of the model zt_model_create would build for a spec, computed from the spec alone in
 * 64 bits: the counts are exact (params is what zt_model.n_params will be, activation_bytes what
 * the model will allocate), so ZeRO's and the admission's arithmetic can start from them. */
typedef struct {
    uint64_t params;            /* every parameter: the flat buffer before padding (Ψ) */
    uint64_t layer_params;      /* the largest block's parameters: what ZeRO-3 gathers at once */
    uint64_t outer_params;      /* those outside the blocks (embeddings, final norm), which stay
                                   gathered from the start of a forward to the end of its backward */
    uint64_t persistent_params; /* those in tensors of fewer than persistence_threshold elements */
    uint64_t n_tensors;         /* entries of zt_model.tensors */
    int n_layer;                /* blocks (a pipeline stage's own) */
    /* The activations, their gradients and the backward's scratch for micro_batch sequences of
     * the longest length, as carved at act_size bytes per element (statistics at 4). */
    uint64_t activation_bytes;
    /* The widest per-channel gradient sum of a backward, in floats: a norm's or a bias's
     * channels times the sums it takes at once (2 · n_embd for a LayerNorm's weight and bias);
     * a GPU backend reduces it over row tiles into partials of this width (admission.h). */
    uint64_t channel_sum_floats;
    /* Of those, a norm's (2 · n_embd for LayerNorm, n_embd for RMSNorm): a GPU backend takes
     * them in the norm's backward kernel, over row tiles of fewer rows than the others' (32 at
     * least, against 64: backend.h, ZT_CUDA_CHANNEL_FUSED_MIN_ROWS), so their partials may have
     * more rows than the others' (admission.h). */
    uint64_t norm_sum_floats;
    /* Host memory the model keeps besides its buffers: its tensor table, per-layer views and the
     * per-token losses read back from a forward. */
    uint64_t host_bytes;
} zt_model_estimate;

typedef struct {
    const char *name;   /* model.type: "gpt2" */
    const char *title;  /* for people: "GPT-2" */
    /* The spec fields after "type" (which names the family and is every family's), in the order
     * messages list them; terminated by an entry whose key is NULL. */
    const zt_model_field *fields;
    /* Checks what involves several fields, once every field is known to be in bounds; the
     * message starts with `source` ("job.json: model.n_embd (250) must be divisible by
     * model.n_head (4)"). NULL when there is nothing to check. */
    zt_status (*validate)(const zt_model_spec *spec, const char *source);
    /* Sizes the model, once validate has passed: every count in 64 bits, any that would
     * overflow (or any dimension above what the kernels index, which take them as int) an
     * ZT_ERR_INVALID naming the field, with `source` first, like validate's. Required: it is
     * how a job is judged before any memory is taken (ztrain/admission.h). */
    zt_status (*estimate)(const zt_model_spec *spec, const zt_model_estimate_args *args,
                          const char *source, zt_model_estimate *out);
    /* Gives the fields whose 0 stands for a value derived from others ("head_dim 0: n_embd /
     * n_head") that value, as the model is built with it, so that a description names what
     * runs. NULL when no field has such a default. */
    void (*effective)(zt_model_spec *spec);
    /* Builds the model or a stage of it; zt_model_create_stage's contract, with pad_to >= 1 and
     * a stage already checked against spec->n_layer. */
    zt_status (*create)(zt_model **out, const zt_model_spec *spec, zt_backend *be, zt_dtype act,
                        int max_batch, size_t pad_to, const zt_model_stage *stage);
    zt_hf_map hf;
} zt_model_family;

/* "type": the one field every spec has, which names its family (default "gpt2"). It is no
 * family's table entry, but reads, prints and compares like one. */
extern const zt_model_field zt_model_type_field;

/* The family named `name`, or NULL. */
const zt_model_family *zt_model_family_find(const char *name);

/* The i-th registered family (from 0), or NULL past the last. */
const zt_model_family *zt_model_family_at(int i);

/* Writes the registered names, comma-separated ("gpt2"), for "known types" messages. */
void zt_model_family_names(char *buf, size_t size);

/* The family's field with this key, or NULL (also for "type"). */
const zt_model_field *zt_model_family_field(const zt_model_family *fam, const char *key);

/* Validates the spec (zt_model_spec_validate) and sizes it through its family's estimate:
 * ZT_ERR_INVALID, naming the field, for a spec whose sizes do not fit 64 bits or the kernels'
 * int dimensions ("job.json: model.n_layer 1000000000000 ..."). */
zt_status zt_model_estimate_spec(const zt_model_spec *spec, const zt_model_estimate_args *args,
                                 const char *source, zt_model_estimate *out);

/* Writes a person's description of the spec: the family's title and its architecture fields,
 * "GPT-2 (n_layer 2, n_head 2, n_embd 32, vocab_size 256, block_size 32)", each with the value
 * the model is built with (a Llama's head_dim 0 is described as n_embd / n_head, the family's
 * effective). An unknown type is described by its name alone. */
void zt_model_spec_describe(const zt_model_spec *spec, char *buf, size_t size);

/* The first field in which a and b differ, or NULL when they describe the same model:
 * &zt_model_type_field when their types differ, else the first architecture field of their
 * family that does (paths are not compared). A spec of an unknown type compares by type alone. */
const zt_model_field *zt_model_spec_difference(const zt_model_spec *a, const zt_model_spec *b);

/* Writes a field's value in spec as text: "32", "10000", "true", "llama3", or "(none)" for an
 * unset path. */
void zt_model_field_format(const zt_model_field *f, const zt_model_spec *spec, char *buf,
                           size_t size);

/* For architectures: allocates m->params and m->grads in device memory for m->n_params rounded
 * up to pad_to (m->ctx.be must be set), the gradients released until committed, and frees
 * them. A size that does not fit size_t is ZT_ERR_NOMEM like an allocation that fails. */
zt_status zt_model_alloc_flat(zt_model *m, size_t pad_to);
void zt_model_free_flat(zt_model *m);

/* For architectures and loaders: copies n host floats into the parameters at element offset
 * `at`, committing the range first, since ZeRO may have released it (zt_backend_commit; a
 * device that maps memory back can fail: ZT_ERR_NOMEM naming it). */
zt_status zt_model_set_params(zt_model *m, size_t at, const float *src, size_t n);

/* For architectures, first in their create: a positive max_batch, and the family's estimate of
 * the spec (out) as the proof that every size the creation computes fits, the activations
 * included in this machine's address space. Messages start with spec->type. */
zt_status zt_model_check_create(const zt_model_spec *spec, zt_backend *be, zt_dtype act,
                                int max_batch, zt_model_estimate *out);

/* For architectures' logits op: copies rows [row, row + rows) of logits[·, vocab] (device
 * memory, fp32: sampling runs with fp32 activations; vocab the shard's slice under tensor
 * parallelism) into host dst. */
void zt_model_copy_logits(const zt_model *m, const float *logits, size_t row, size_t rows,
                          float *dst);

/* The string metadata zt_model_save_safetensors writes for a spec ("format", "model_type", the
 * architecture fields), for writers that stream a model's tensors from elsewhere (a ZeRO-3
 * checkpoint's shards): keys[i] -> values[i] for i < the count returned; values point into out. */
typedef struct {
    const char *keys[ZT_MODEL_MAX_FIELDS + 2];
    const char *values[ZT_MODEL_MAX_FIELDS + 2];
    char text[ZT_MODEL_MAX_FIELDS][64];
} zt_model_st_metadata;
int zt_model_st_metadata_of(const zt_model_spec *spec, zt_model_st_metadata *out);

#endif
