/* Runs one forward and backward of the model a job file describes, for the reference parity
 * tests of any family (tests/reference/test_llama_parity.py).
 *
 *   zt_model_check JOB.json BATCH.i32 OUT_DIR B T [f32|bf16|f16]
 *
 * The job's model section gives the architecture and model.init_from the weights (a safetensors
 * file with the family's Hugging Face names). BATCH.i32 holds B*T int32 inputs then B*T int32
 * targets. Activations are held at the precision given (default f32). Writes OUT_DIR/logits.f32
 * ([B,T,V] fp32, from a forward without targets at f32 only), OUT_DIR/loss.txt and
 * OUT_DIR/grads.safetensors (d mean-loss / d parameter, with the parameters' Hugging Face
 * names). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/safetensors.h"

static int die(const char *what) {
    fprintf(stderr, "zt_model_check: %s%s\n", what, zt_last_error());
    return 1;
}

static zt_dtype parse_act(const char *s) {
    if (strcmp(s, "bf16") == 0)
        return ZT_BF16;
    if (strcmp(s, "f16") == 0)
        return ZT_F16;
    return ZT_F32;
}

/* Every failure leaves through one exit that frees what was made, so that a sanitizer build's
 * leak report never joins the message a test compares. */
int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: zt_model_check JOB.json BATCH.i32 OUT_DIR B T [f32|bf16|f16]\n");
        return 2;
    }
    zt_job_spec job;
    if (zt_job_spec_load(&job, argv[1]) != ZT_OK)
        return die("");
    int B = atoi(argv[4]), T = atoi(argv[5]);
    zt_dtype act = argc == 7 ? parse_act(argv[6]) : ZT_F32;
    zt_backend *be = NULL;
    zt_model *m = NULL;
    int32_t *batch = NULL;
    float *logits = NULL, *grads = NULL;
    zt_st_entry *e = NULL;
    FILE *f = NULL;
    int rc = 1;
    if (zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        be = NULL;
        rc = die("");
        goto out;
    }
    if (zt_model_create(&m, &job.model, be, act, B, 1) != ZT_OK) {
        m = NULL;
        rc = die("");
        goto out;
    }
    if (!job.model.init_from) {
        rc = die("the job has no model.init_from");
        goto out;
    }
    if (zt_model_load_safetensors(m, job.model.init_from) != ZT_OK) {
        rc = die("");
        goto out;
    }
    const int V = job.model.vocab_size;
    size_t n = (size_t)B * T;
    batch = malloc(2 * n * sizeof(int32_t));
    f = fopen(argv[2], "rb");
    if (!batch || !f || fread(batch, sizeof(int32_t), 2 * n, f) != 2 * n) {
        fprintf(stderr, "zt_model_check: cannot read %s\n", argv[2]);
        goto out;
    }
    fclose(f);
    f = NULL;
    char path[4096];

    if (act == ZT_F32) {
        m->ops->forward(m, batch, NULL, B, T, 0.0f);
        logits = malloc(n * V * sizeof(float));
        snprintf(path, sizeof path, "%s/logits.f32", argv[3]);
        f = fopen(path, "wb");
        if (!logits || !f) {
            rc = die("cannot write the logits ");
            goto out;
        }
        m->ops->logits(m, 0, n, logits);
        fwrite(logits, sizeof(float), n * V, f);
        fclose(f);
        f = NULL;
    }

    float loss = m->ops->forward(m, batch, batch + n, B, T, 1.0f / (float)n);
    m->ops->backward(m);
    snprintf(path, sizeof path, "%s/loss.txt", argv[3]);
    f = fopen(path, "w");
    if (!f) {
        rc = die("cannot write the loss ");
        goto out;
    }
    fprintf(f, "%.9g\n", loss);
    fclose(f);
    f = NULL;

    grads = malloc(m->n_params * sizeof(float));
    e = calloc((size_t)m->n_tensors, sizeof *e);
    if (!grads || !e) {
        rc = die("out of memory ");
        goto out;
    }
    zt_backend_copy(be, grads, m->grads, m->n_params * sizeof(float), ZT_COPY_D2H,
                    ZT_STREAM_COMPUTE);
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        e[i] = (zt_st_entry){t->name, grads + t->offset, t->ndim, {t->shape[0], t->shape[1]}};
    }
    snprintf(path, sizeof path, "%s/grads.safetensors", argv[3]);
    rc = zt_st_write(path, e, m->n_tensors, NULL, NULL, 0) == ZT_OK ? 0 : die("");
out:
    if (f)
        fclose(f);
    free(e);
    free(grads);
    free(logits);
    free(batch);
    if (m)
        zt_model_destroy(m);
    if (be)
        zt_backend_destroy(be);
    zt_job_spec_free(&job);
    return rc;
}
