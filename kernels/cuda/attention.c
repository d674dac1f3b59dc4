/* The CUDA backend's attention op: which implementation runs a call, and the one line that says
 * so. cuDNN's fused attention (cudnn_sdpa.c) where the module was built with it, the library
 * loads and the shape and precision are ones it takes; otherwise ztrain's own flash-style kernel
 * (flash_attention.cu), which takes every shape. Both keep each row's log-sum-exp in att
 * (zt_backend.attn_lse), so the forward of one may feed the backward of the other. */
#include <stdio.h>
#include <string.h>

#include "cuda_backend.h"

/* The first choice made in this process, reported once on stderr and to
 * zt_cuda_attention_choice. The choice is a function of the shape and precision, so a model's
 * layers all make the same one. */
static pthread_once_t said_once = PTHREAD_ONCE_INIT;
static char said[160];
static const zt_attn_shape *said_shape;
static const char *said_name, *said_why;
static zt_dtype said_act;

static void say(void) {
    snprintf(said, sizeof said, "%s", said_name);
    fprintf(stderr, "[ztrain] attention: %s (%s; %d heads, %d kv heads, head_dim %d, %s)\n",
            said_name, said_why, said_shape->n_head, said_shape->n_kv_head,
            said_shape->head_dim, zt_dtype_name(said_act));
    fflush(stderr);
}

static void choose(const zt_ctx *x, const zt_attn_shape *s, const char *name, const char *why) {
    said_shape = s, said_name = name, said_why = why, said_act = x->act;
    pthread_once(&said_once, say);
}

const char *zt_cuda_attention_choice(void) { return said[0] ? said : NULL; }

void zt_cuda_attention_forward(const zt_ctx *x, const zt_attn_shape *s, void *out, float *att,
                               const void *q, const void *k, const void *v) {
    choose(x, s, "flash", "ztrain's kernel; this module has no cuDNN attention");
    zt_cuda_flash_attention_forward(x, s, out, att, q, k, v);
}

void zt_cuda_attention_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk,
                                void *dv, float *scratch, const void *dout, const void *out,
                                const void *q, const void *k, const void *v, const float *att) {
    zt_cuda_flash_attention_backward(x, s, dq, dk, dv, scratch, dout, out, q, k, v, att);
}
