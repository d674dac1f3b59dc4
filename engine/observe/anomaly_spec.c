/* The job spec's "events" section (ztrain/anomaly.h): which anomaly kinds are watched, with what
 * thresholds, and the policy of each. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ztrain/json_util.h"
#include "ztrain/anomaly.h"

static const char *const kind_names[ZT_ANOMALY_KINDS] = {
    "nonfinite", "loss_spike", "grad_norm_spike", "loss_scale_collapse", "slow_rank", "stall"};
static const char *const kind_keys_allowed[ZT_ANOMALY_KINDS + 1] = {
    "nonfinite", "loss_spike", "grad_norm_spike", "loss_scale_collapse", "slow_rank", "stall", NULL};
static const char *const policy_names[] = {"record", "skip", "checkpoint_and_stop"};

const char *zt_anomaly_kind_name(zt_anomaly_kind k) {
    return k >= 0 && k < ZT_ANOMALY_KINDS ? kind_names[k] : "unknown";
}

const char *zt_anomaly_policy_name(zt_anomaly_policy p) {
    return p >= ZT_POLICY_RECORD && p <= ZT_POLICY_STOP ? policy_names[p] : "unknown";
}

void zt_events_spec_default(zt_events_spec *ev) {
    memset(ev, 0, sizeof *ev);
    for (int k = 0; k < ZT_ANOMALY_KINDS; k++)
        ev->rule[k] = (zt_anomaly_rule){.policy = ZT_POLICY_RECORD, .zscore = 5.0, .window = 64,
                                        .overflows = 5, .factor = 2.0, .seconds = 300.0};
    ev->rule[ZT_ANOMALY_NONFINITE].enabled = true;
}

/* The keys each kind takes besides "policy", and the policies it allows: skipping needs a
 * decision before the update (a collapse is already a skipped step; a slow rank is known only
 * after the step), and a stall is seen by ztraind, which can only record it. */
static const char *const *kind_keys(zt_anomaly_kind k) {
    static const char *const none[] = {"policy", NULL};
    static const char *const spike[] = {"policy", "zscore", "window", NULL};
    static const char *const scale[] = {"policy", "overflows", NULL};
    static const char *const slow[] = {"policy", "factor", NULL};
    static const char *const stall[] = {"policy", "seconds", NULL};
    switch (k) {
    case ZT_ANOMALY_LOSS_SPIKE:
    case ZT_ANOMALY_GRAD_SPIKE: return spike;
    case ZT_ANOMALY_LOSS_SCALE: return scale;
    case ZT_ANOMALY_SLOW_RANK: return slow;
    case ZT_ANOMALY_STALL: return stall;
    default: return none;
    }
}

static bool policy_allowed(zt_anomaly_kind k, zt_anomaly_policy p) {
    if (k == ZT_ANOMALY_STALL)
        return p == ZT_POLICY_RECORD;
    if (k == ZT_ANOMALY_LOSS_SCALE || k == ZT_ANOMALY_SLOW_RANK)
        return p != ZT_POLICY_SKIP;
    return true;
}

static zt_status get_positive(const zt_json_obj *o, const char *key, double min_excl, double *out) {
    bool found;
    double v = *out;
    ZT_TRY(zt_json_get_double(o, key, &v, &found));
    if (found && !(isfinite(v) && v > min_excl))
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be a number above %g, got %g",
                                 min_excl, v);
    *out = v;
    return ZT_OK;
}

static zt_status parse_rule(zt_anomaly_kind k, const zt_json_obj *o, zt_anomaly_rule *r) {
    ZT_TRY(zt_json_check_keys(o, kind_keys(k)));
    r->enabled = true;
    const char *policy = NULL;
    ZT_TRY(zt_json_get_string(o, "policy", &policy, NULL));
    if (policy) {
        int p = -1;
        for (int i = 0; i <= ZT_POLICY_STOP; i++)
            if (strcmp(policy, policy_names[i]) == 0)
                p = i;
        if (p < 0)
            return zt_json_key_error(ZT_ERR_INVALID, o, "policy", "must be \"record\", \"skip\" "
                                     "or \"checkpoint_and_stop\", got \"%s\"", policy);
        if (!policy_allowed(k, (zt_anomaly_policy)p))
            return zt_json_key_error(ZT_ERR_INVALID, o, "policy", "\"%s\" is not possible for %s "
                                     "(%s)", policy, kind_names[k],
                                     k == ZT_ANOMALY_STALL
                                         ? "ztraind sees a stall, the job cannot act on it: only "
                                           "\"record\""
                                         : "it is known only once the update is decided: "
                                           "\"record\" or \"checkpoint_and_stop\"");
        r->policy = (zt_anomaly_policy)p;
    }
    ZT_TRY(get_positive(o, "zscore", 0.0, &r->zscore));
    ZT_TRY(get_positive(o, "factor", 1.0, &r->factor));
    ZT_TRY(get_positive(o, "seconds", 0.0, &r->seconds));
    bool found;
    ZT_TRY(zt_json_get_int(o, "window", &r->window, &found));
    if (found && (r->window < 2 || r->window > ZT_ANOMALY_MAX_WINDOW))
        return zt_json_key_error(ZT_ERR_INVALID, o, "window", "must be between 2 and %d, got %d",
                                 ZT_ANOMALY_MAX_WINDOW, r->window);
    ZT_TRY(zt_json_get_int(o, "overflows", &r->overflows, &found));
    if (found && r->overflows < 1)
        return zt_json_key_error(ZT_ERR_INVALID, o, "overflows", "must be >= 1, got %d",
                                 r->overflows);
    return ZT_OK;
}

static zt_status parse_tree(zt_events_spec *ev, const cJSON *root, const char *source) {
    zt_json_obj top;
    zt_json_obj_init(&top, root, source, "events");
    if (!cJSON_IsObject(root)) {
        char got[64];
        zt_json_repr(root, got, sizeof got);
        return zt_error(ZT_ERR_INVALID, "%s: key 'events' must be an object, got %s", source, got);
    }
    ZT_TRY(zt_json_check_keys(&top, kind_keys_allowed));
    for (int k = 0; k < ZT_ANOMALY_KINDS; k++) {
        zt_json_obj o;
        ZT_TRY(zt_json_child(&top, kind_names[k], &o));
        if (o.obj)
            ZT_TRY(parse_rule((zt_anomaly_kind)k, &o, &ev->rule[k]));
    }
    return ZT_OK;
}

zt_status zt_events_spec_parse(zt_events_spec *ev, const char *json_text, const char *source) {
    zt_events_spec_default(ev);
    if (!json_text)
        return ZT_OK;
    cJSON *root;
    ZT_TRY(zt_json_parse(json_text, source, &root));
    zt_status s = parse_tree(ev, root, source);
    cJSON_Delete(root);
    return s;
}
