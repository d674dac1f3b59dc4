/* Opening a job's data as its spec names it (data.train, data.val): a file, a glob or the
 * checked list of its files, or a mixture; with data.format "masked", every file's loss mask
 * too (see ztrain/data.h). */
#include <string.h>

#include "ztrain/data.h"
#include "ztrain/job_spec.h"
#include "ztrain/loss_mask.h"

/* data.format "masked": every file's loss mask, mapped beside it. */
static zt_status with_masks(zt_dataset *d, const zt_data_spec *spec, zt_status opened) {
    if (opened != ZT_OK || spec->format != ZT_DATA_FORMAT_MASKED)
        return opened;
    zt_status s = zt_loss_mask_attach(d);
    if (s == ZT_OK && spec->packing == ZT_DATA_PADDED)
        s = zt_dataset_set_padded(d);
    if (s != ZT_OK)
        zt_dataset_close(d);
    return s;
}

static zt_status open_train(zt_dataset *d, const zt_data_spec *spec, int vocab_size) {
    if (!spec->train_mix && spec->train_files)
        return zt_dataset_open_files(d, spec->train, spec->train_files, spec->n_train_files,
                                     vocab_size);
    if (!spec->train_mix)
        return zt_dataset_open(d, spec->train, vocab_size);
    const char *paths[ZT_MAX_MIX_SOURCES];
    double weights[ZT_MAX_MIX_SOURCES];
    memset(d, 0, sizeof *d);
    if (spec->n_train_mix > ZT_MAX_MIX_SOURCES)
        return zt_error(ZT_ERR_INVALID, "data.train: %d mixture sources, at most %d",
                        spec->n_train_mix, ZT_MAX_MIX_SOURCES);
    for (int i = 0; i < spec->n_train_mix; i++) {
        paths[i] = spec->train_mix[i].path;
        weights[i] = spec->train_mix[i].weight;
    }
    return zt_dataset_open_mixture(d, paths, weights, spec->n_train_mix, vocab_size);
}

zt_status zt_dataset_open_train(zt_dataset *d, const zt_data_spec *spec, int vocab_size) {
    return with_masks(d, spec, open_train(d, spec, vocab_size));
}

/* The checked list of files (train_files/val_files, expanded once when the job was admitted)
 * when there is one, else the path as it is. */
zt_status zt_dataset_open_val(zt_dataset *d, const zt_data_spec *spec, int vocab_size) {
    return with_masks(d, spec,
                      spec->val_files ? zt_dataset_open_files(d, spec->val, spec->val_files,
                                                              spec->n_val_files, vocab_size)
                                      : zt_dataset_open(d, spec->val, vocab_size));
}
