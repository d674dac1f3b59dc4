/* The "alerts" section of a job spec (webhooks.h): its webhooks, checked and with their secrets
 * read from ztraind's environment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ztrain/json_util.h"
#include "webhooks.h"

void zt_webhook_list_free(zt_webhook_list *l) {
    for (int i = 0; i < l->n; i++) {
        free(l->t[i].url);
        free(l->t[i].secret);
    }
    free(l->t);
    l->t = NULL;
    l->n = 0;
}

void zt_webhook_url_for_display(const char *url, bool whole_path, char *buf, size_t size) {
    const char *scheme = strstr(url, "://");
    const char *host = scheme ? scheme + 3 : url;
    const char *end = host + strcspn(host, "/?#");
    const char *at = memchr(host, '@', (size_t)(end - host));
    if (at)
        host = at + 1;
    size_t path = whole_path ? strcspn(host, "?#") : (size_t)(end - host);
    snprintf(buf, size, "%.*s%.*s", scheme ? (int)(scheme + 3 - url) : 0, url, (int)path, host);
}

static zt_status parse_on(const zt_json_obj *o, unsigned *on) {
    const cJSON *list = zt_json_item(o, "on");
    if (!list)
        return ZT_OK;
    static const char *const names[] = {"end", "failure", "event"};
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return zt_json_key_error(ZT_ERR_INVALID, o, "on", "must be a non-empty list of \"end\", "
                                 "\"failure\" and \"event\"");
    *on = 0;
    for (const cJSON *e = list->child; e; e = e->next) {
        int k = -1;
        for (int i = 0; i < 3 && cJSON_IsString(e); i++)
            if (strcmp(e->valuestring, names[i]) == 0)
                k = i;
        if (k < 0) {
            char got[64];
            zt_json_repr(e, got, sizeof got);
            return zt_json_key_error(ZT_ERR_INVALID, o, "on", "holds %s: each must be \"end\", "
                                     "\"failure\" or \"event\"", got);
        }
        *on |= 1u << k;
    }
    return ZT_OK;
}

static zt_status parse_target(const zt_json_obj *o, zt_webhook_target *t,
                              const zt_webhook_policy *policy) {
    static const char *const keys[] = {"url", "secret_env", "on", "secret", NULL};
    ZT_TRY(zt_json_check_keys(o, keys));
    if (zt_json_item(o, "secret"))
        return zt_json_key_error(ZT_ERR_INVALID, o, "secret", "is not accepted: the job spec can "
                                 "be read through the API; name an environment variable of "
                                 "ztraind with \"secret_env\" instead");
    const char *url = NULL, *env = NULL;
    ZT_TRY(zt_json_require(o, "url"));
    ZT_TRY(zt_json_get_string(o, "url", &url, NULL));
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return zt_json_key_error(ZT_ERR_INVALID, o, "url", "must be an http:// or https:// URL, "
                                 "got \"%.100s\"", url);
    if (strlen(url) > 2048 || strpbrk(url, " \t\r\n"))
        return zt_json_key_error(ZT_ERR_INVALID, o, "url", "must be a URL of at most 2048 "
                                 "characters without white space");
    char field[320];
    snprintf(field, sizeof field, "%s: key '%s.url'", o->source, o->path);
    ZT_TRY(zt_webhook_policy_url(policy, url, field));
    ZT_TRY(zt_json_get_string(o, "secret_env", &env, NULL));
    snprintf(field, sizeof field, "%s: key '%s.secret_env'", o->source, o->path);
    if (env)
        ZT_TRY(zt_webhook_policy_secret(policy, env, field));
    t->on = ZT_HOOK_ALL;
    ZT_TRY(parse_on(o, &t->on));
    t->url = strdup(url);
    if (!t->url)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    if (env) {
        const char *v = getenv(env);
        if (!v || !*v)
            return zt_json_key_error(ZT_ERR_INVALID, o, "secret_env", "names \"%.64s\", which "
                                     "is not set in ztraind's environment", env);
        t->secret = strdup(v);
        if (!t->secret)
            return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    return ZT_OK;
}

static zt_status parse_alerts(zt_webhook_list *out, const cJSON *alerts, const char *source,
                              const zt_webhook_policy *policy) {
    zt_json_obj o;
    zt_json_obj_init(&o, alerts, source, "alerts");
    static const char *const keys[] = {"webhooks", NULL};
    ZT_TRY(zt_json_check_keys(&o, keys));
    const cJSON *list = zt_json_item(&o, "webhooks");
    if (!list)
        return ZT_OK;
    if (!cJSON_IsArray(list))
        return zt_json_key_error(ZT_ERR_INVALID, &o, "webhooks", "must be a list of objects");
    int n = cJSON_GetArraySize(list);
    if (n > 16)
        return zt_json_key_error(ZT_ERR_INVALID, &o, "webhooks", "has %d entries; at most 16", n);
    out->t = calloc((size_t)n + 1, sizeof *out->t);
    if (!out->t)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char path[64];
        snprintf(path, sizeof path, "alerts.webhooks[%d]", i);
        if (!cJSON_IsObject(e))
            return zt_error(ZT_ERR_INVALID, "%s: key '%s' must be an object {\"url\", "
                            "\"secret_env\", \"on\"}", source, path);
        zt_json_obj t;
        zt_json_obj_init(&t, e, source, path);
        out->n++;
        ZT_TRY(parse_target(&t, &out->t[i], policy));
    }
    return ZT_OK;
}

zt_status zt_webhook_list_from_spec(zt_webhook_list *out, const char *spec_json,
                                    const char *source, const zt_webhook_policy *policy) {
    memset(out, 0, sizeof *out);
    cJSON *top = cJSON_Parse(spec_json);
    const cJSON *alerts = cJSON_GetObjectItemCaseSensitive(top, "alerts");
    zt_status s = ZT_OK;
    if (alerts && !cJSON_IsObject(alerts))
        s = zt_error(ZT_ERR_INVALID, "%s: key 'alerts' must be an object", source);
    else if (alerts)
        s = parse_alerts(out, alerts, source, policy);
    cJSON_Delete(top);
    if (s != ZT_OK)
        zt_webhook_list_free(out);
    return s;
}
