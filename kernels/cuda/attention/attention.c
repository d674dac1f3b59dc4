/* The CUDA backend's attention op: which implementation runs a call, and the one line that says
 * so. cuDNN's fused attention (cudnn_sdpa.c) where the module was built with it, the library
 * loads and the shape and precision are ones it is asked to run; otherwise ztrain's own
 * flash-style kernel (flash_attention.cu), which takes every shape. Both keep each row's
 * log-sum-exp in att (zt_backend.attn_lse), so the forward of one feeds the backward of the other
 * (cuDNN's forward with the flash backward for grouped-query heads).
 *
 * ZTRAIN_ATTENTION (cuda_backend.h, read when the backend is created) can force either, so
 * scripts/gpu-check.sh can check each against the CPU on the same GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#ifdef ZT_HAVE_CUDNN
#include "cudnn_sdpa.h"
#endif

zt_status zt_cuda_attention_policy_of_env(zt_cuda_attention_policy *out) {
    const char *e = getenv("ZTRAIN_ATTENTION");
    *out = ZT_CUDA_ATTN_AUTO;
    if (!e || !*e || strcmp(e, "auto") == 0)
        return ZT_OK;
    if (strcmp(e, "flash") == 0)
        *out = ZT_CUDA_ATTN_FLASH;
    else if (strcmp(e, "cudnn") == 0)
        *out = ZT_CUDA_ATTN_CUDNN;
    else
        return zt_error(ZT_ERR_INVALID, "ZTRAIN_ATTENTION=\"%s\": expected \"auto\", \"flash\" "
                        "or \"cudnn\"", e);
    return ZT_OK;
}

static zt_cuda_attention_policy policy_of(const zt_ctx *x) {
    return ((const zt_cuda_state *)x->be->impl)->attention;
}

/* The first choice made in this process, reported once on stderr and to
 * zt_cuda_attention_choice. The choice is a function of the shape and precision, so a model's
 * layers all make the same one. */
static pthread_once_t said_once = PTHREAD_ONCE_INIT;
static char said[16];
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

/* Whether a call that cuDNN did not take may go to the flash kernel; with ZTRAIN_ATTENTION=cudnn
 * it is the backend's error instead. */
static bool flash_allowed(const zt_ctx *x, zt_cuda_attention_policy p, const char *why) {
    if (p == ZT_CUDA_ATTN_CUDNN) {
        zt_cuda_fail(x->be, "cuDNN", "ZTRAIN_ATTENTION=cudnn", why, __FILE__, __LINE__);
        return false;
    }
    return true;
}

void zt_cuda_attention_forward(const zt_ctx *x, const zt_attn_shape *s, void *out, float *att,
                               const void *q, const void *k, const void *v) {
    const zt_cuda_attention_policy p = policy_of(x);
    const char *why = "ZTRAIN_ATTENTION=flash";
#ifdef ZT_HAVE_CUDNN
    if (p != ZT_CUDA_ATTN_FLASH && zt_cudnn_sdpa_forward(x, s, out, att, q, k, v, &why)) {
        choose(x, s, "cudnn", why);
        return;
    }
#else
    if (p != ZT_CUDA_ATTN_FLASH)
        why = "this CUDA module was built without cuDNN";
#endif
    if (!flash_allowed(x, p, why))
        return;
    choose(x, s, "flash", why);
    zt_cuda_flash_attention_forward(x, s, out, att, q, k, v);
}

void zt_cuda_attention_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk,
                                void *dv, float *scratch, const void *dout, const void *out,
                                const void *q, const void *k, const void *v, const float *att) {
    const zt_cuda_attention_policy p = policy_of(x);
    const char *why = "ZTRAIN_ATTENTION=flash";
#ifdef ZT_HAVE_CUDNN
    if (p != ZT_CUDA_ATTN_FLASH &&
        zt_cudnn_sdpa_backward(x, s, dq, dk, dv, scratch, dout, out, q, k, v, att, &why))
        return;
#else
    if (p != ZT_CUDA_ATTN_FLASH)
        why = "this CUDA module was built without cuDNN";
#endif
    if (!flash_allowed(x, p, why))
        return;
    zt_cuda_flash_attention_backward(x, s, dq, dk, dv, scratch, dout, out, q, k, v, att);
}
