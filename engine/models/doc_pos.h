/* Documents packed in a micro-batch's rows, as a model family sees them (internal to
 * engine/models): each token's position inside its document (zt_loader_next_docs), in host
 * memory for the embedding ops, which read their indices from the host, and in device memory
 * for the attention (zt_attn_shape.doc_pos). */
#ifndef ZTRAIN_MODELS_DOC_POS_H
#define ZTRAIN_MODELS_DOC_POS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/backend.h"
#include "ztrain/status.h"

typedef struct {
    bool on;       /* the last set gave documents; off: one document per row */
    size_t cap;    /* tokens a micro-batch holds (max_batch · block_size) */
    /* The host copies: one slot of cap per micro-batch whose upload may still be queued (the
     * model's upload_slots, fixed at the first set), taken in turn; host is the last set's. */
    int slots, slot;
    int32_t *ring; /* [slots · cap] pinned */
    int32_t *host; /* ring + slot · cap */
    int32_t *dev;  /* [cap] device */
} zt_doc_pos;

/* Sets the positions of the next forward's B·T tokens, or turns documents off (pos NULL). The
 * buffers are allocated on the first set with documents, once, with max(slots, 1) host slots:
 * the device copies from a slot without a wait, so a slot is written again only `slots` sets
 * later, by which time the caller must have waited for the device (the engine waits once per
 * step of that many micro-batches). A position outside [0, t] or that does not follow the token
 * before it (0 or one more) is ZT_ERR_INVALID naming the token. */
zt_status zt_doc_pos_set(zt_doc_pos *d, zt_backend *be, size_t cap, int slots,
                         const int32_t *pos, int B, int T);
void zt_doc_pos_free(zt_doc_pos *d, zt_backend *be);

/* The device positions for zt_attn_shape.doc_pos: NULL when off. */
static inline const int32_t *zt_doc_pos_dev(const zt_doc_pos *d) { return d->on ? d->dev : NULL; }

#endif
