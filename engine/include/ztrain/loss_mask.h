/* The loss-mask stream: the companion of a token file that says which tokens are trained and
 * where the documents packed into it begin.
 *
 * Fine-tuning data (chat, prompt-completion) trains on some tokens only: the assistant's turns,
 * the completion. A token file X (llm.c format, ztrain/data.h) then has a companion X.mask:
 *
 *   header  256 int32, little-endian: [0] magic 20261204, [1] version 1, [2] token count (that
 *           of X), the rest 0;
 *   body    one byte per token of X: bit 0 set when the token is trained, that is, when the
 *           loss of predicting it from the tokens before it counts (Hugging Face's label is the
 *           token, not -100); bit 1 set when the token is the first of a document (an example
 *           packed after others). Bits 2 to 7 are reserved and must be 0 in version 1.
 *
 * A sample's target t is the token after input t, so it is trained when that token's bit 0 is
 * set and its bit 1 is not (a document's first token is not predicted from the document before
 * it: transformers' DataCollatorWithFlattening gives it the label -100); the loader writes -1
 * (ignored by the loss) for the others. Inside a sample, a token of bit 1 restarts the
 * positions and the attention (zt_loader_next_docs, zt_attn_shape.doc_pos). Every check names
 * the file and, for a bad byte, its position. */
#ifndef ZTRAIN_LOSS_MASK_H
#define ZTRAIN_LOSS_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

#define ZT_LOSS_MASK_MAGIC 20261204
#define ZT_LOSS_MASK_VERSION 1
#define ZT_LOSS_MASK_TRAINED 0x01u
#define ZT_LOSS_MASK_DOC_START 0x02u

struct zt_dataset;

/* The companion's path of a token file: path + ".mask", into buf. */
void zt_loss_mask_path(const char *token_path, char *buf, size_t n);

/* Maps the companion of every file of d (one file, or each file of a glob; a mixture's sources
 * each) and checks it against its token file: magic, version, token count, size, and that no
 * reserved bit is set. On failure nothing stays mapped. zt_dataset_close unmaps them. */
zt_status zt_loss_mask_attach(struct zt_dataset *d);

/* Writes a companion for n tokens from flags[n] (bit 0: trained), atomically. */
zt_status zt_loss_mask_write(const char *path, const uint8_t *flags, size_t n);

#endif
