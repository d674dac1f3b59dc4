/* The shapes of a Llama-family model, computed from its spec alone: its dimensions (whole, and a
 * tensor-parallel shard's), each layer tensor's shape and Hugging Face name, and the carving of
 * its activation memory. The model (llama.c) and the registry entry (llama_family.c) both build on
 * these; this file calls neither. */
#include "llama.h"
#include "carve.h"
#include "ztrain/size_math.h"

llama_dims zt_llama_dims(const zt_model_spec *s) {
    llama_dims d = {
        .L = (uint64_t)s->n_layer,
        .C = (uint64_t)s->n_embd,
        .NH = (uint64_t)s->n_head,
        .KV = (uint64_t)(s->n_kv_head ? s->n_kv_head : s->n_head),
        .HD = (uint64_t)(s->head_dim ? s->head_dim : s->n_embd / s->n_head),
        .I = (uint64_t)s->intermediate_size,
        .V = (uint64_t)s->vocab_size,
        .T = (uint64_t)s->block_size,
        .qkv_bias = s->qkv_bias,
        .o_bias = s->o_bias,
        .tied = s->tie_word_embeddings,
    };
    d.Q = d.NH * d.HD;
    d.KVD = d.KV * d.HD;
    d.QKV = d.Q + 2 * d.KVD;
    return d;
}

llama_dims zt_llama_shard_dims(const llama_dims *d, int tp) {
    llama_dims s = *d;
    const uint64_t t = (uint64_t)tp;
    s.NH /= t;
    /* Fewer kv heads than ranks: each rank holds one, shared with tp / KV ranks. */
    s.KV = s.KV >= t ? s.KV / t : 1;
    s.I /= t;
    s.V /= t;
    s.Q = s.NH * s.HD;
    s.KVD = s.KV * s.HD;
    s.QKV = s.Q + 2 * s.KVD;
    return s;
}

const char *const zt_llama_layer_names[LLAMA_N_LAYER_TENSORS] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
    "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.o_proj.bias",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

int zt_llama_layer_shape(const llama_dims *d, int i, int64_t shape[2]) {
    const uint64_t rows[LLAMA_N_LAYER_TENSORS] = {
        [LLAMA_IN_NORM] = d->C, [LLAMA_Q_W] = d->Q, [LLAMA_K_W] = d->KVD, [LLAMA_V_W] = d->KVD,
        [LLAMA_Q_B] = d->qkv_bias ? d->Q : 0, [LLAMA_K_B] = d->qkv_bias ? d->KVD : 0,
        [LLAMA_V_B] = d->qkv_bias ? d->KVD : 0, [LLAMA_O_W] = d->C,
        [LLAMA_O_B] = d->o_bias ? d->C : 0, [LLAMA_POST_NORM] = d->C, [LLAMA_GATE_W] = d->I,
        [LLAMA_UP_W] = d->I, [LLAMA_DOWN_W] = d->C,
    };
    const uint64_t cols[LLAMA_N_LAYER_TENSORS] = {
        [LLAMA_Q_W] = d->C, [LLAMA_K_W] = d->C, [LLAMA_V_W] = d->C, [LLAMA_O_W] = d->Q,
        [LLAMA_GATE_W] = d->C, [LLAMA_UP_W] = d->C, [LLAMA_DOWN_W] = d->I,
    };
    shape[0] = (int64_t)rows[i];
    shape[1] = (int64_t)cols[i];
    return cols[i] ? 2 : 1;
}

/* Each factor is at most INT_MAX (llama_validate bounds Q, KVD and QKV), so a product of two
 * fits 64 bits. */
uint64_t zt_llama_layer_numel(const llama_dims *d, int i) {
    int64_t shape[2];
    int ndim = zt_llama_layer_shape(d, i, shape);
    return (uint64_t)shape[0] * (ndim == 2 ? (uint64_t)shape[1] : 1);
}

void zt_llama_carve_layer(zt_carver *c, const void *dims, void *acts) {
    const llama_carve_dims *cd = dims;
    const llama_dims *d = cd->d;
    llama_layer_acts *a = acts;
    bool *ov = &c->overflow;
    const uint64_t F32 = sizeof(float), es = cd->es, BT = zt_u64_mul(cd->batch, d->T, ov);
    const uint64_t BTC = zt_u64_mul(BT, d->C, ov), BTI = zt_u64_mul(BT, d->I, ov);
    const uint64_t att = zt_attn_state_floats(cd->attn_lse, cd->batch, d->NH, d->T, ov);
    a->ln1 = zt_carve(c, BTC, es);
    a->ln1_rstd = zt_carve(c, BT, F32);
    a->qkv = zt_carve(c, zt_u64_mul(BT, d->QKV, ov), es);
    a->atty = zt_carve(c, zt_u64_mul(BT, d->Q, ov), es);
    a->att = zt_carve(c, att, F32);
    a->res2 = zt_carve(c, BTC, es);
    a->ln2 = zt_carve(c, BTC, es);
    a->ln2_rstd = zt_carve(c, BT, F32);
    a->gate = zt_carve(c, BTI, es);
    a->up = zt_carve(c, BTI, es);
    a->hmul = zt_carve(c, BTI, es);
    a->res3 = zt_carve(c, BTC, es);
}

zt_blocks_shape zt_llama_blocks_shape(const zt_model_spec *s, const zt_model_stage *st,
                                      uint64_t batch, uint64_t es) {
    zt_blocks_shape b = {
        .B = batch, .T = (uint64_t)s->block_size, .C = (uint64_t)s->n_embd,
        .V = (uint64_t)s->vocab_size / (uint64_t)zt_model_stage_tp(st), .es = es,
        .layers = (uint64_t)(st->last_layer - st->first_layer), .buffers = (uint64_t)st->buffers,
        .head = st->head, .norm_mean = false,
    };
    zt_blocks_checkpointing(s, &b);
    return b;
}

uint64_t zt_llama_carve(const llama_dims *d, const zt_blocks_shape *s, unsigned char *base,
                        unsigned char *pinned, zt_blocks *k, llama_outer_acts *o,
                        uint64_t *pinned_bytes, bool *overflow) {
    zt_carver c = {.base = base}, host = {.base = pinned};
    bool *ov = &c.overflow;
    const uint64_t F32 = sizeof(float), es = s->es;
    const uint64_t BT = zt_u64_mul(s->B, d->T, ov), BTC = zt_u64_mul(BT, d->C, ov),
                   BTI = zt_u64_mul(BT, d->I, ov);
    const uint64_t att = zt_attn_state_floats(s->attn_lse, s->B, d->NH, d->T, ov);
    const uint64_t rope = zt_u64_mul(d->T, d->HD / 2, ov);
    const llama_carve_dims cd = {d, s->B, es, s->attn_lse};
    llama_outer_acts none;
    if (!k)
        o = &none;
    zt_blocks_carve(k, s, &zt_llama_block_ops, &cd, &c, &host);
    o->rope_cos = zt_carve(&c, rope, F32);
    o->rope_sin = zt_carve(&c, rope, F32);
    o->dln = zt_carve(&c, BTC, es);
    o->datty = zt_carve(&c, zt_u64_mul(BT, d->Q, ov), es);
    o->dqkv = zt_carve(&c, zt_u64_mul(BT, d->QKV, ov), es);
    o->dh = zt_carve(&c, BTI, es);
    o->dup = zt_carve(&c, BTI, es);
    o->datt = zt_carve(&c, att, F32);
    *overflow |= c.overflow || host.overflow;
    *pinned_bytes = host.off;
    return c.off;
}
