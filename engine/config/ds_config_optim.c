/* The DeepSpeed "optimizer" and "scheduler" sections: which optimizer and LR schedule ztrain runs,
 * with their parameters. A missing "type" is an error rather than DeepSpeed's "no optimizer".
 * torch.optim's argument checks (negative lr, betas outside [0, 1), ...) are applied to Adam too,
 * with torch's texts, although FusedAdam itself does not check them. The schedules' parameters
 * take the types and ranges DeepSpeed's lr_schedules.py constructors check, with their texts. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ds_config_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* Optimizer (engine.py::_configure_basic_optimizer)                                           */

static const char *const ds_builtin_optimizers[] = {
    "adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon", NULL};
/* The 1-bit family (OneBitAdam, ZeroOneAdam, OneBitLamb) left DeepSpeed with its compressed
 * communication before 0.19: optimizer_name() no longer knows them, torch.optim has no such class,
 * and deepspeed.initialize asserts "<type> is not a supported DeepSpeed Optimizer". Each is
 * refused by name, pointing at the optimizer whose math it ran uncompressed. */
static const struct {
    const char *lower, *instead;
} removed_optimizers[] = {
    {"onebitadam", "AdamW"}, {"zerooneadam", "AdamW"}, {"onebitlamb", "Lamb"}, {NULL, NULL}};
static const char *const torch_optimizers[] = {
    "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "LBFGS", "NAdam",
    "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam", NULL};

/* torch.optim's argument checks, with its texts, prefixed by where the value came from. */
static zt_status torch_check(const zt_json_obj *p, const char *key, bool bad, const char *fmt,
                             double v) {
    if (!bad)
        return ZT_OK;
    char msg[128];
    snprintf(msg, sizeof msg, fmt, v);
    return zt_ds_fail(ZT_ERR_INVALID, p, key, "%s: %s.%s: %s", p->source, p->path, key, msg);
}

/* "betas": a list of two numbers, as Adam and LAMB take it. */
static zt_status get_betas(zt_optimizer_config *o, const zt_json_obj *p) {
    const cJSON *betas = zt_json_item(p, "betas");
    if (!betas)
        return ZT_OK;
    const cJSON *b1 = cJSON_GetArrayItem(betas, 0), *b2 = cJSON_GetArrayItem(betas, 1);
    if (!cJSON_IsArray(betas) || cJSON_GetArraySize(betas) != 2 || !cJSON_IsNumber(b1) ||
        !cJSON_IsNumber(b2)) {
        char got[128];
        zt_json_repr(betas, got, sizeof got);
        return zt_json_key_error(ZT_ERR_INVALID, p, "betas", "must be a list of two numbers, got %s",
                                 got);
    }
    o->beta1 = b1->valuedouble;
    o->beta2 = b2->valuedouble;
    o->betas_given = true;
    return ZT_OK;
}

/* torch.optim's checks of lr, eps, betas and weight_decay, shared by Adam and LAMB. */
static zt_status check_adam_like(const zt_optimizer_config *o, const zt_json_obj *p) {
    ZT_TRY(torch_check(p, "lr", o->lr < 0, "Invalid learning rate: %g", o->lr));
    ZT_TRY(torch_check(p, "eps", o->eps < 0, "Invalid epsilon value: %g", o->eps));
    ZT_TRY(torch_check(p, "betas", o->beta1 < 0 || o->beta1 >= 1, "Invalid beta parameter at index 0: %g", o->beta1));
    ZT_TRY(torch_check(p, "betas", o->beta2 < 0 || o->beta2 >= 1, "Invalid beta parameter at index 1: %g", o->beta2));
    return torch_check(p, "weight_decay", o->weight_decay < 0, "Invalid weight_decay value: %g", o->weight_decay);
}

/* torch.optim's constructor checks of its implementation switches (Adam, AdamW, SGD), with its
 * texts; the switches themselves choose among torch's kernels and change no number. */
static zt_status check_torch_switches(const zt_json_obj *p) {
    bool fused = false, foreach = false, differentiable = false;
    ZT_TRY(zt_json_get_bool(p, "fused", &fused, NULL));
    ZT_TRY(zt_json_get_bool(p, "foreach", &foreach, NULL));
    ZT_TRY(zt_json_get_bool(p, "differentiable", &differentiable, NULL));
    if (fused && differentiable)
        return zt_ds_fail(ZT_ERR_INVALID, p, "fused", "%s: %s.fused: `fused` does not support "
                          "`differentiable`", p->source, p->path);
    if (fused && foreach)
        return zt_ds_fail(ZT_ERR_INVALID, p, "fused", "%s: %s.fused: `fused` and `foreach` cannot be "
                          "`True` together.", p->source, p->path);
    return ZT_OK;
}

/* The class DeepSpeed builds for "Adam"/"AdamW" (engine.py get_optimizer_configuration): with
 * torch_adam, torch.optim.AdamW in the decoupled mode and torch.optim.Adam otherwise; without it,
 * DeepSpeedCPUAdam when offload_optimizer is on cpu or nvme (at any stage), and FusedAdam
 * otherwise. engine.py pops torch_adam, adam_w_mode and fp32_optimizer_states and passes every
 * other key to the class, so a key the class does not take is Python's TypeError there. */
typedef enum { ADAM_FUSED, ADAM_CPU, ADAM_TORCH, ADAM_TORCH_W } adam_class;

static const char *const adam_class_name[] = {"FusedAdam", "DeepSpeedCPUAdam", "torch.optim.Adam",
                                              "torch.optim.AdamW"};
static const char *const adam_class_why[] = {
    "without torch_adam or offload_optimizer", "with zero_optimization.offload_optimizer",
    "with torch_adam: true and adam_w_mode: false", "with torch_adam: true"};

/* Each class's keyword arguments, then the keys engine.py pops; every key of every class, so
 * that a key of another class is refused as that (not as unknown). */
static const char *const adam_keys_fused[] = {"lr", "betas", "eps", "weight_decay",
                                              "bias_correction", "amsgrad", "set_grad_none", NULL};
static const char *const adam_keys_cpu[] = {"lr", "betas", "eps", "weight_decay",
                                            "bias_correction", "amsgrad", NULL};
static const char *const adam_keys_torch[] = {
    "lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "maximize", "capturable",
    "differentiable", "fused", "decoupled_weight_decay", NULL};
static const char *const adam_keys_torch_w[] = {"lr", "betas", "eps", "weight_decay", "amsgrad",
                                                "foreach", "maximize", "capturable",
                                                "differentiable", "fused", NULL};
static const char *const adam_keys_popped[] = {"torch_adam", "adam_w_mode",
                                               "fp32_optimizer_states", NULL};
static const char *const adam_keys_any[] = {
    "bias_correction", "set_grad_none", "foreach", "maximize", "capturable", "differentiable",
    "fused", "decoupled_weight_decay", NULL};

static adam_class adam_class_of(const zt_ds_config *cfg, bool torch_adam, bool adam_w_mode) {
    if (torch_adam)
        return adam_w_mode ? ADAM_TORCH_W : ADAM_TORCH;
    return cfg->zero.offload_optimizer.device != ZT_OFFLOAD_NONE ? ADAM_CPU : ADAM_FUSED;
}

static zt_status parse_adam(zt_ds_config *cfg, const zt_json_obj *p, bool type_is_adamw) {
    zt_optimizer_config *o = &cfg->optimizer;
    bool adam_w_mode = true, amsgrad = false, maximize = false, decoupled = false, b;
    ZT_TRY(zt_json_get_bool(p, "torch_adam", &o->torch_adam, NULL));
    ZT_TRY(zt_json_get_bool(p, "adam_w_mode", &adam_w_mode, NULL));
    o->type = ZT_OPTIM_ADAM;
    o->adam_w_mode = type_is_adamw || adam_w_mode;
    adam_class cls = adam_class_of(cfg, o->torch_adam, o->adam_w_mode);
    const char *const *own = cls == ADAM_FUSED ? adam_keys_fused
                             : cls == ADAM_CPU ? adam_keys_cpu
                             : cls == ADAM_TORCH ? adam_keys_torch
                                                 : adam_keys_torch_w;
    for (const char *const *k = adam_keys_any; *k; k++)
        if (zt_json_item(p, *k) && !zt_ds_name_in(*k, own))
            return zt_json_key_error(ZT_ERR_INVALID, p, *k, "is not a parameter of %s, which "
                                     "DeepSpeed builds %s (TypeError: unexpected keyword argument "
                                     "'%s')", adam_class_name[cls], adam_class_why[cls], *k);
    const char *all[24];
    size_t n = 0;
    for (const char *const *k = own; *k; k++)
        all[n++] = *k;
    for (const char *const *k = adam_keys_popped; *k; k++)
        all[n++] = *k;
    all[n] = NULL;
    ZT_TRY(zt_json_check_keys(p, all));

    /* torch.optim.AdamW's default weight_decay is 0.01; FusedAdam's, DeepSpeedCPUAdam's and
     * torch.optim.Adam's is 0. */
    o->weight_decay = cls == ADAM_TORCH_W ? 0.01 : 0.0;
    ZT_TRY(zt_json_get_double(p, "lr", &o->lr, NULL));
    ZT_TRY(zt_json_get_double(p, "eps", &o->eps, NULL));
    ZT_TRY(zt_json_get_double(p, "weight_decay", &o->weight_decay, NULL));
    ZT_TRY(zt_json_get_bool(p, "bias_correction", &o->bias_correction, NULL));
    ZT_TRY(zt_json_get_bool(p, "amsgrad", &amsgrad, NULL));
    ZT_TRY(zt_json_get_bool(p, "maximize", &maximize, NULL));
    ZT_TRY(zt_json_get_bool(p, "decoupled_weight_decay", &decoupled, NULL));
    /* Only DeepSpeedCPUAdam reads it, for moments in the dtype of the parameters it is given:
     * the fp32 masters in every combination ztrain runs, so fp32 either way (ds_config.h). */
    ZT_TRY(zt_json_get_bool(p, "fp32_optimizer_states", &b, NULL));
    ZT_TRY(zt_json_get_bool(p, "set_grad_none", &b, NULL));
    ZT_TRY(zt_json_get_bool(p, "capturable", &b, NULL));
    ZT_TRY(check_torch_switches(p));
    ZT_TRY(get_betas(o, p));
    ZT_TRY(check_adam_like(o, p));
    /* torch.optim.Adam with decoupled_weight_decay is AdamW's update. */
    if (decoupled)
        o->adam_w_mode = true;
    if (amsgrad && (cls == ADAM_FUSED || cls == ADAM_CPU))
        return zt_ds_fail(ZT_ERR_INVALID, p, "amsgrad", "%s: %s.amsgrad: %s does not support the "
                          "AMSGrad variant.", p->source, p->path, adam_class_name[cls]);
    if (amsgrad)
        return zt_ds_fail(ZT_ERR_UNSUPPORTED, p, "amsgrad", "%s: %s.amsgrad: true is not supported: "
                          "DeepSpeed builds %s here, which has the AMSGrad variant, and ztrain's "
                          "Adam does not implement it", p->source, p->path, adam_class_name[cls]);
    /* Only torch.optim.Adam/AdamW take it (the key check above): the gradient negated first. */
    o->maximize = maximize;
    return ZT_OK;
}

/* FusedLamb (deepspeed/ops/lamb/fused_lamb.py): lr, bias_correction, betas, eps,
 * eps_inside_sqrt, weight_decay, max_coeff, min_coeff. max_grad_norm never gets here (refused for
 * every type, as DeepSpeed does). */
static zt_status parse_lamb(zt_optimizer_config *o, const zt_json_obj *p) {
    static const char *const keys[] = {"lr", "betas", "eps", "weight_decay", "bias_correction",
                                       "eps_inside_sqrt", "max_coeff", "min_coeff", "amsgrad",
                                       NULL};
    ZT_TRY(zt_json_check_keys(p, keys));
    bool amsgrad = false;
    o->type = ZT_OPTIM_LAMB;
    o->adam_w_mode = false; /* LAMB adds weight_decay * p to its update, before the trust ratio */
    o->weight_decay = 0;
    ZT_TRY(zt_json_get_double(p, "lr", &o->lr, NULL));
    ZT_TRY(zt_json_get_double(p, "eps", &o->eps, NULL));
    ZT_TRY(zt_json_get_double(p, "weight_decay", &o->weight_decay, NULL));
    ZT_TRY(zt_json_get_bool(p, "bias_correction", &o->bias_correction, NULL));
    ZT_TRY(zt_json_get_bool(p, "eps_inside_sqrt", &o->eps_inside_sqrt, NULL));
    ZT_TRY(zt_json_get_double(p, "max_coeff", &o->max_coeff, NULL));
    ZT_TRY(zt_json_get_double(p, "min_coeff", &o->min_coeff, NULL));
    ZT_TRY(zt_json_get_bool(p, "amsgrad", &amsgrad, NULL));
    ZT_TRY(get_betas(o, p));
    if (amsgrad)
        return zt_ds_fail(ZT_ERR_INVALID, p, "amsgrad", "%s: %s.amsgrad: FusedLamb does not "
                          "support the AMSGrad variant.", p->source, p->path);
    return check_adam_like(o, p);
}

/* torch.optim.SGD: its keyword arguments; maximize steps along the gradient, as torch does by
 * negating it first. */
static zt_status parse_sgd(zt_optimizer_config *o, const zt_json_obj *p) {
    static const char *const keys[] = {"lr", "momentum", "dampening", "weight_decay", "nesterov",
                                       "maximize", "foreach", "differentiable", "fused", NULL};
    ZT_TRY(zt_json_check_keys(p, keys));
    o->type = ZT_OPTIM_SGD;
    o->adam_w_mode = false; /* SGD's weight decay is L2, added to the gradient */
    o->weight_decay = 0;
    ZT_TRY(zt_json_get_double(p, "lr", &o->lr, NULL));
    ZT_TRY(zt_json_get_double(p, "momentum", &o->momentum, NULL));
    ZT_TRY(zt_json_get_double(p, "dampening", &o->dampening, NULL));
    ZT_TRY(zt_json_get_double(p, "weight_decay", &o->weight_decay, NULL));
    ZT_TRY(zt_json_get_bool(p, "nesterov", &o->nesterov, NULL));
    ZT_TRY(zt_json_get_bool(p, "maximize", &o->maximize, NULL));
    ZT_TRY(torch_check(p, "lr", o->lr < 0, "Invalid learning rate: %g", o->lr));
    ZT_TRY(torch_check(p, "momentum", o->momentum < 0, "Invalid momentum value: %g", o->momentum));
    ZT_TRY(torch_check(p, "weight_decay", o->weight_decay < 0, "Invalid weight_decay value: %g", o->weight_decay));
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return zt_ds_fail(ZT_ERR_INVALID, p, "nesterov", "%s: %s.nesterov: Nesterov momentum requires a momentum and zero dampening",
                        p->source, p->path);
    return check_torch_switches(p);
}

/* ZeRO's tested optimizers are Adam, AdamW, Adagrad and DeepSpeed's own (zero/utils.py); with
 * any other (FusedLamb, torch.optim.SGD) at stage >= 1 DeepSpeed asserts unless the config opts in,
 * and then warns. `note` adds what ztrain does differently (may be ""). */
static zt_status check_untested_with_zero(const zt_ds_config *cfg, const char *src,
                                          const char *note) {
    if (cfg->zero.stage == 0)
        return ZT_OK;
    if (!cfg->zero_allow_untested_optimizer)
        return zt_error_field(zt_error(ZT_ERR_INVALID, "%s: You are using an untested ZeRO "
                                       "Optimizer. Please add <\"zero_allow_untested_optimizer\": "
                                       "true> in the configuration file to use it.", src),
                              "zero_allow_untested_optimizer");
    zt_ds_warn(src, "**** You are using ZeRO with an untested optimizer, proceed with caution "
               "*****%s", note);
    return ZT_OK;
}

/* LAMB, with the assertions DeepSpeed makes when it builds it (engine.py: _do_args_sanity_check,
 * _configure_basic_optimizer, _do_optimizer_sanity_check), named by optimizer_name(), the
 * lower-cased type. */
static zt_status parse_fused_lamb(zt_ds_config *cfg, const zt_json_obj *params, const char *lower,
                                  const char *src) {
    zt_optimizer_config *o = &cfg->optimizer;
    ZT_TRY(parse_lamb(o, params));
    if (cfg->fp16.loss_scale != 0)
        return zt_error_field(zt_error(ZT_ERR_INVALID, "%s: DeepSpeed %s optimizer requires "
                                       "dynamic loss scaling (fp16.loss_scale must be 0)", src,
                                       lower), "fp16.loss_scale");
    if (cfg->zero.stage == 0)
        return ZT_OK;
    ZT_TRY(check_untested_with_zero(cfg, src, " (ztrain takes LAMB's trust ratios per parameter "
                                    "tensor across the ranks' partitions, as without ZeRO; "
                                    "DeepSpeed takes one per rank's flat partition)"));
    if (cfg->zero.offload_optimizer.device != ZT_OFFLOAD_NONE)
        return zt_error_field(zt_error(ZT_ERR_UNSUPPORTED, "%s: optimizer %s with "
                                       "zero_optimization.offload_optimizer is not supported "
                                       "(DeepSpeed's FusedLamb is a GPU kernel, with no CPU "
                                       "optimizer for offload)", src, o->name),
                              "zero_optimization.offload_optimizer");
    return ZT_OK;
}

zt_status zt_ds_parse_optimizer(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj opt, params;
    ZT_TRY(zt_json_child(top, "optimizer", &opt));
    if (!opt.obj)
        return ZT_OK;
    static const char *const keys[] = {"type", "params", "legacy_fusion", NULL};
    ZT_TRY(zt_json_check_keys(&opt, keys));
    bool legacy_fusion;
    ZT_TRY(zt_json_get_bool(&opt, "legacy_fusion", &legacy_fusion, NULL));
    const char *type = NULL;
    ZT_TRY(zt_json_get_string(&opt, "type", &type, NULL));
    if (!type)
        return zt_json_key_error(ZT_ERR_INVALID, &opt, "type", "is required");
    ZT_TRY(zt_json_child(&opt, "params", &params));
    /* DeepSpeed checks the key's presence, whatever its value, before looking at the type. */
    if (params.obj && cJSON_GetObjectItemCaseSensitive(params.obj, "max_grad_norm"))
        return zt_ds_fail(ZT_ERR_INVALID, &params, "max_grad_norm", "%s: 'max_grad_norm' is not supported as an optimizer parameter, "
                        "please switch to using the deepspeed parameter 'gradient_clipping' see: "
                        "https://www.deepspeed.ai/docs/config-json/#gradient-clipping for more details",
                        top->source);

    char lower[32] = "";
    for (size_t i = 0; type[i] && i + 1 < sizeof lower; i++)
        lower[i] = (char)((type[i] >= 'A' && type[i] <= 'Z') ? type[i] + 32 : type[i]);
    bool builtin = strlen(type) < sizeof lower && zt_ds_name_in(lower, ds_builtin_optimizers);
    cfg->has_optimizer = true;
    snprintf(cfg->optimizer.name, sizeof cfg->optimizer.name, "%s", type);
    if (builtin && (strcmp(lower, "adam") == 0 || strcmp(lower, "adamw") == 0))
        return parse_adam(cfg, &params, strcmp(lower, "adamw") == 0);
    if (!builtin && strcmp(type, "SGD") == 0) {
        ZT_TRY(parse_sgd(&cfg->optimizer, &params));
        return check_untested_with_zero(cfg, top->source, "");
    }
    if (builtin && strcmp(lower, "lamb") == 0)
        return parse_fused_lamb(cfg, &params, lower, top->source);
    if (builtin || zt_ds_name_in(type, torch_optimizers))
        return zt_ds_fail(ZT_ERR_UNSUPPORTED, &opt, "type", "%s: optimizer type '%s' is not supported by ztrain "
                        "(supported: Adam, AdamW, SGD, Lamb)", top->source, type);
    for (size_t i = 0; removed_optimizers[i].lower; i++)
        if (strcmp(lower, removed_optimizers[i].lower) == 0)
            return zt_ds_fail(ZT_ERR_INVALID, &opt, "type", "%s: optimizer.type '%s' was removed "
                              "from DeepSpeed 0.19 with the 1-bit optimizers' compressed "
                              "communication, and DeepSpeed fails on it (\"%s is not a supported "
                              "DeepSpeed Optimizer\"); use \"%s\", the same math uncompressed",
                              top->source, type, type, removed_optimizers[i].instead);
    const char *near = zt_json_suggest(type, torch_optimizers);
    char hint[96] = "";
    if (near)
        snprintf(hint, sizeof hint, "; did you mean '%s'?", near);
    return zt_ds_fail(ZT_ERR_INVALID, &opt, "type", "%s: unknown optimizer type '%s' (DeepSpeed's own types such as "
                    "Adam are case-insensitive, torch.optim names such as SGD are case-sensitive)%s",
                    top->source, type, hint);
}

/* ------------------------------------------------------------------------------------------ */
/* Scheduler (deepspeed/runtime/lr_schedules.py)                                               */

static const char *const ds_schedulers[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                            "OneCycle", "LRRangeTest", NULL};
static const char *const torch_schedulers[] = {
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
    "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau",
    "CyclicLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR", NULL};

/* A JSON number holds every integer only up to 2^53; DeepSpeed's Python ints go further, but no
 * schedule counts that many steps. */
#define STEP_COUNT_MAX 9007199254740992.0

/* The keys DeepSpeed's schedules check with `isinstance(v, int) and v > 0` (warmup_num_steps,
 * lr_range_test_step_size): a JSON number written as an int ("3", not "3.0" or "3e0", which
 * json.load makes floats), or true (Python's bool is an int: 1), with DeepSpeed's ValueError text
 * otherwise. */
static zt_status get_py_positive_int(const zt_json_obj *p, const char *key, int64_t *out) {
    const cJSON *v = zt_json_item(p, key);
    if (!v)
        return ZT_OK;
    bool is_int = (cJSON_IsNumber(v) && !zt_json_is_float_literal(v) &&
                   v->valuedouble == floor(v->valuedouble)) || cJSON_IsBool(v);
    double d = cJSON_IsBool(v) ? (cJSON_IsTrue(v) ? 1 : 0) : v->valuedouble;
    char got[64];
    zt_ds_py_str(v, got, sizeof got);
    if (!is_int || d <= 0)
        return zt_ds_fail(ZT_ERR_INVALID, p, key, "%s: %s: %s must be a positive integer, got %s",
                          p->source, p->path, key, got);
    if (d > STEP_COUNT_MAX)
        return zt_ds_fail(ZT_ERR_INVALID, p, key, "%s: %s: %s must be at most 2^53 "
                          "(9007199254740992), got %s", p->source, p->path, key, got);
    *out = (int64_t)d;
    return ZT_OK;
}

/* The keys DeepSpeed reads as numbers without a type check (OneCycle's float() of its step
 * sizes, the arithmetic on total_num_steps): any finite JSON number, or a bool as Python's
 * arithmetic takes it. */
static zt_status get_py_number(const zt_json_obj *p, const char *key, double *out, bool *found) {
    const cJSON *v = zt_json_item(p, key);
    if (found)
        *found = false;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v) ? 1 : 0;
        if (found)
            *found = true;
        return ZT_OK;
    }
    return zt_json_get_double(p, key, out, found);
}

static zt_status get_nonneg_int(const zt_json_obj *p, const char *key, int64_t *out,
                                bool *found) {
    bool f;
    ZT_TRY(zt_json_get_int64(p, key, out, &f));
    if (found)
        *found = f;
    if (f && *out < 0)
        return zt_json_key_error(ZT_ERR_INVALID, p, key, "must be >= 0, got %lld",
                                 (long long)*out);
    return ZT_OK;
}

/* warmup_num_steps and warmup_type, shared by the three Warmup* schedules. */
static zt_status parse_warmup(zt_schedule_config *s, const zt_json_obj *p) {
    ZT_TRY(get_py_positive_int(p, "warmup_num_steps", &s->warmup_num_steps));
    const char *type = NULL;
    ZT_TRY(zt_json_get_string(p, "warmup_type", &type, NULL));
    bool type_null = cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(p->obj, "warmup_type"));
    if ((type && strcmp(type, "log") != 0 && strcmp(type, "linear") != 0) || type_null)
        zt_ds_warn(p->source, "Using unknown warmup_type: %s. The increasing function is set to default (log)",
                   type ? type : "None");
    s->warmup_linear = type && strcmp(type, "linear") == 0;
    return ZT_OK;
}

/* total_num_steps only enters DeepSpeed's arithmetic (WarmupDecayLR's linear decay, the cosine's
 * progress), so any number runs there: 6.5 ends the decay half-way between two steps, and a value
 * at or below the warmup leaves no decay window (the lr drops to the floor after the warmup). */
static zt_status parse_total_steps(zt_schedule_config *s, const zt_json_obj *p) {
    ZT_TRY(zt_json_require(p, "total_num_steps"));
    ZT_TRY(get_py_number(p, "total_num_steps", &s->total_num_steps, NULL));
    int64_t n = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
    if (s->total_num_steps < (double)n) {
        char got[64];
        zt_ds_py_str(zt_json_item(p, "total_num_steps"), got, sizeof got);
        zt_ds_warn(p->source, "total_num_steps %s is less than warmup_num_steps %lld", got,
                   (long long)s->warmup_num_steps);
    }
    return ZT_OK;
}

/* OneCycle's step sizes, as _initialize_cycle reads them: float() of each (so 2.5 is a valid
 * half cycle), the first > 0, the second >= 0 (0: no descending half) and the first when absent. */
static zt_status parse_cycle_sizes(zt_schedule_config *s, const zt_json_obj *p) {
    bool second_given = false;
    ZT_TRY(get_py_number(p, "cycle_first_step_size", &s->cycle_first_step_size, NULL));
    ZT_TRY(get_py_number(p, "cycle_second_step_size", &s->cycle_second_step_size, &second_given));
    if (!second_given)
        s->cycle_second_step_size = s->cycle_first_step_size;
    char got[64];
    if (s->cycle_first_step_size <= 0) {
        zt_ds_py_float(s->cycle_first_step_size, got, sizeof got);
        return zt_ds_fail(ZT_ERR_INVALID, p, "cycle_first_step_size", "%s: %s: cycle_first_step_size "
                          "must be positive, got %s", p->source, p->path, got);
    }
    if (s->cycle_second_step_size < 0) {
        zt_ds_py_float(s->cycle_second_step_size, got, sizeof got);
        return zt_ds_fail(ZT_ERR_INVALID, p, "cycle_second_step_size", "%s: %s: "
                          "cycle_second_step_size must be non-negative, got %s", p->source,
                          p->path, got);
    }
    return ZT_OK;
}

/* With cycle_momentum DeepSpeed writes (mom, 0.99) into Adam's betas, so beta2 becomes 0.99; with
 * SGD (no betas) it turns cycle_momentum off with a warning. Both are mirrored in the parsed
 * config, so the engine needs no special case. */
static zt_status parse_one_cycle(zt_ds_config *cfg, const zt_json_obj *p) {
    zt_schedule_config *s = &cfg->scheduler;
    bool stair_given = false;
    ZT_TRY(zt_json_require(p, "cycle_min_lr"));
    ZT_TRY(zt_json_require(p, "cycle_max_lr"));
    ZT_TRY(zt_json_get_double(p, "cycle_min_lr", &s->cycle_min_lr, NULL));
    ZT_TRY(zt_json_get_double(p, "cycle_max_lr", &s->cycle_max_lr, NULL));
    ZT_TRY(zt_json_get_double(p, "decay_lr_rate", &s->decay_lr_rate, NULL));
    ZT_TRY(parse_cycle_sizes(s, p));
    ZT_TRY(get_nonneg_int(p, "cycle_first_stair_count", &s->cycle_first_stair_count, NULL));
    ZT_TRY(get_nonneg_int(p, "cycle_second_stair_count", &s->cycle_second_stair_count, &stair_given));
    ZT_TRY(get_nonneg_int(p, "decay_step_size", &s->decay_step_size, NULL));
    ZT_TRY(zt_json_get_bool(p, "cycle_momentum", &s->cycle_momentum, NULL));
    /* DeepSpeed tests it for truth: None turns the momentum cycle off. */
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(p->obj, "cycle_momentum")))
        s->cycle_momentum = false;
    ZT_TRY(zt_json_get_double(p, "cycle_min_mom", &s->cycle_min_mom, NULL));
    ZT_TRY(zt_json_get_double(p, "cycle_max_mom", &s->cycle_max_mom, NULL));
    ZT_TRY(zt_json_get_double(p, "decay_mom_rate", &s->decay_mom_rate, NULL));
    if (!stair_given)
        s->cycle_second_stair_count = s->cycle_first_stair_count;
    if (s->cycle_momentum && cfg->has_optimizer) {
        if (cfg->optimizer.type == ZT_OPTIM_SGD) {
            zt_ds_warn(p->source, "cycle_momentum is disabled because optimizer SGD does not support "
                                  "momentum, no betas attribute in defaults");
            s->cycle_momentum = false;
        } else {
            cfg->optimizer.beta2 = 0.99;
        }
    }
    return ZT_OK;
}

zt_status zt_ds_parse_scheduler(zt_ds_config *cfg, const zt_json_obj *top) {
    zt_json_obj sch, p;
    ZT_TRY(zt_json_child(top, "scheduler", &sch));
    if (!sch.obj)
        return ZT_OK;
    static const char *const keys[] = {"type", "params", NULL};
    ZT_TRY(zt_json_check_keys(&sch, keys));
    const char *type = NULL;
    ZT_TRY(zt_json_get_string(&sch, "type", &type, NULL));
    /* "type": null is DeepSpeed's "no scheduler" (get_scheduler_name returns None). */
    if (!type && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(sch.obj, "type")))
        return ZT_OK;
    if (!type)
        return zt_json_key_error(ZT_ERR_INVALID, &sch, "type", "is required");
    ZT_TRY(zt_json_child(&sch, "params", &p));
    zt_schedule_config *s = &cfg->scheduler;
    /* DeepSpeed builds its schedule as Class(optimizer, **params): without params, or with null,
     * that is a TypeError before training starts. */
    if (!p.obj && zt_ds_name_in(type, ds_schedulers))
        return zt_ds_fail(ZT_ERR_INVALID, &sch, "params", "%s: key 'scheduler.params' is required "
                          "for scheduler %s: DeepSpeed builds it as %s(optimizer, **params), which "
                          "fails without them (argument after ** must be a mapping, not NoneType); "
                          "give {} for the defaults", top->source, type, type);

    if (strcmp(type, "WarmupLR") == 0 || strcmp(type, "WarmupDecayLR") == 0) {
        bool decay = type[6] == 'D';
        static const char *const warm_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                                "warmup_type", "last_batch_iteration", NULL};
        static const char *const decay_keys[] = {"total_num_steps", "warmup_min_lr", "warmup_max_lr",
                                                 "warmup_num_steps", "warmup_type",
                                                 "last_batch_iteration", NULL};
        ZT_TRY(zt_json_check_keys(&p, decay ? decay_keys : warm_keys));
        s->type = decay ? ZT_SCHED_WARMUP_DECAY_LR : ZT_SCHED_WARMUP_LR;
        /* WarmupLR's max defaults to the optimizer's lr; WarmupDecayLR's signature says 0.001,
         * but a null it hands on to WarmupLR, which takes the optimizer's lr then. */
        bool max_null = cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(p.obj, "warmup_max_lr"));
        s->warmup_max_lr = (!decay || max_null) && cfg->has_optimizer ? cfg->optimizer.lr : 1e-3;
        ZT_TRY(zt_json_get_double(&p, "warmup_min_lr", &s->warmup_min_lr, NULL));
        ZT_TRY(zt_json_get_double(&p, "warmup_max_lr", &s->warmup_max_lr, NULL));
        ZT_TRY(parse_warmup(s, &p));
        if (decay)
            ZT_TRY(parse_total_steps(s, &p));
    } else if (strcmp(type, "WarmupCosineLR") == 0) {
        static const char *const cos_keys[] = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                               "cos_min_ratio", "warmup_type", "last_batch_iteration",
                                               NULL};
        ZT_TRY(zt_json_check_keys(&p, cos_keys));
        s->type = ZT_SCHED_WARMUP_COSINE_LR;
        ZT_TRY(zt_json_get_double(&p, "warmup_min_ratio", &s->warmup_min_ratio, NULL));
        ZT_TRY(zt_json_get_double(&p, "cos_min_ratio", &s->cos_min_ratio, NULL));
        ZT_TRY(parse_warmup(s, &p));
        ZT_TRY(parse_total_steps(s, &p));
    } else if (strcmp(type, "OneCycle") == 0) {
        static const char *const oc_keys[] = {
            "cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
            "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
            "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
            "last_batch_iteration", NULL};
        ZT_TRY(zt_json_check_keys(&p, oc_keys));
        s->type = ZT_SCHED_ONE_CYCLE;
        ZT_TRY(parse_one_cycle(cfg, &p));
    } else if (strcmp(type, "LRRangeTest") == 0) {
        static const char *const lrrt_keys[] = {"lr_range_test_min_lr", "lr_range_test_step_size",
                                                "lr_range_test_step_rate", "lr_range_test_staircase",
                                                "last_batch_iteration", NULL};
        ZT_TRY(zt_json_check_keys(&p, lrrt_keys));
        s->type = ZT_SCHED_LR_RANGE_TEST;
        ZT_TRY(zt_json_get_double(&p, "lr_range_test_min_lr", &s->lr_range_test_min_lr, NULL));
        ZT_TRY(get_py_positive_int(&p, "lr_range_test_step_size", &s->lr_range_test_step_size));
        ZT_TRY(zt_json_get_double(&p, "lr_range_test_step_rate", &s->lr_range_test_step_rate, NULL));
        ZT_TRY(zt_json_get_bool(&p, "lr_range_test_staircase", &s->lr_range_test_staircase, NULL));
    } else if (zt_ds_name_in(type, torch_schedulers)) {
        return zt_ds_fail(ZT_ERR_UNSUPPORTED, &sch, "type", "%s: scheduler type '%s' (torch.optim.lr_scheduler) is not "
                        "supported by ztrain (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                        "OneCycle, LRRangeTest)", top->source, type);
    } else {
        const char *near = zt_json_suggest(type, ds_schedulers);
        char hint[96] = "";
        if (near)
            snprintf(hint, sizeof hint, "; did you mean '%s'? (names are case-sensitive)", near);
        return zt_ds_fail(ZT_ERR_INVALID, &sch, "type", "%s: unknown scheduler type '%s'%s",
                          top->source, type, hint);
    }

    /* The starting iteration of a resumed run comes from ztrain's own checkpoint. */
    int last = -1;
    ZT_TRY(zt_json_get_int(&p, "last_batch_iteration", &last, NULL));
    if (last != -1)
        return zt_json_key_error(ZT_ERR_UNSUPPORTED, &p, "last_batch_iteration",
                                 "%d is not supported (only -1; resume from a checkpoint instead)", last);
    return ZT_OK;
}
