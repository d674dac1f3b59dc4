/* Runs one GPT-2 forward and backward for the PyTorch parity test.
 *
 *   zt_gpt2_check WEIGHTS.safetensors BATCH.i32 OUT_DIR n_layer n_head n_embd vocab block B T
 *
 * BATCH.i32 holds B*T int32 inputs then B*T int32 targets. Writes OUT_DIR/logits.f32 ([B,T,V]
 * fp32), OUT_DIR/loss.txt and OUT_DIR/grads.safetensors (d mean-loss / d parameter, with the
 * parameters' Hugging Face names). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/model.h"
#include "ztrain/safetensors.h"

static int die(const char *what) {
    fprintf(stderr, "zt_gpt2_check: %s%s\n", what, zt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: zt_gpt2_check WEIGHTS BATCH OUT n_layer n_head n_embd vocab block B T\n");
        return 2;
    }
    zt_model_spec spec = {.type = "gpt2"};
    spec.n_layer = atoi(argv[4]);
    spec.n_head = atoi(argv[5]);
    spec.n_embd = atoi(argv[6]);
    spec.vocab_size = atoi(argv[7]);
    spec.block_size = atoi(argv[8]);
    int B = atoi(argv[9]), T = atoi(argv[10]);
    zt_backend *be;
    zt_model *m;
    if (zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK ||
        zt_model_create(&m, &spec, be, ZT_F32, B, 1) != ZT_OK)
        return die("");
    if (zt_model_load_safetensors(m, argv[1]) != ZT_OK)
        return die("");
    size_t n = (size_t)B * T;
    int32_t *batch = malloc(2 * n * sizeof(int32_t));
    FILE *f = fopen(argv[2], "rb");
    if (!f || fread(batch, sizeof(int32_t), 2 * n, f) != 2 * n) {
        fprintf(stderr, "zt_gpt2_check: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    char path[4096];

    m->ops->forward(m, batch, NULL, B, T, 0.0f);
    snprintf(path, sizeof path, "%s/logits.f32", argv[3]);
    f = fopen(path, "wb");
    float *logits = malloc(n * spec.vocab_size * sizeof(float));
    m->ops->logits(m, 0, n, logits);
    fwrite(logits, sizeof(float), n * spec.vocab_size, f);
    fclose(f);
    free(logits);

    float loss = m->ops->forward(m, batch, batch + n, B, T, 1.0f / (float)n);
    m->ops->backward(m);
    snprintf(path, sizeof path, "%s/loss.txt", argv[3]);
    f = fopen(path, "w");
    fprintf(f, "%.9g\n", loss);
    fclose(f);

    float *grads = malloc(m->n_params * sizeof(float));
    zt_backend_copy(be, grads, m->grads, m->n_params * sizeof(float), ZT_COPY_D2H,
                    ZT_STREAM_COMPUTE);
    zt_st_entry *e = calloc((size_t)m->n_tensors, sizeof *e);
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        e[i] = (zt_st_entry){t->name, grads + t->offset, t->ndim, {t->shape[0], t->shape[1]}};
    }
    snprintf(path, sizeof path, "%s/grads.safetensors", argv[3]);
    if (zt_st_write(path, e, m->n_tensors, NULL, NULL, 0) != ZT_OK)
        return die("");
    free(e);
    free(grads);
    free(batch);
    zt_model_destroy(m);
    zt_backend_destroy(be);
    return 0;
}
