/* Fuzz target: the "alerts" section of a job spec (service/daemon/webhook_spec.c) under an
 * operator's policy (webhook_policy.c), which ztraind runs on every submitted spec and again at
 * every job end and event. The input is the spec's JSON text. An accepted list must hold at most
 * 16 hooks, each an http(s) URL the policy passes again on its own, a secret only from a granted
 * variable (never the operator's), and "on" bits within the three kinds; its URLs shown without
 * query or user info (and, for the operator's, without path). A refusal must name the source. */
#include "daemon/webhooks.h"
#include "fuzz_util.h"

static const zt_webhook_policy policy = {
    .allow = {"hooks.example.com", "*.example.org:8443", "127.0.0.1"},
    .n_allow = 3,
    .secret_prefix = "ZT_FUZZ_HOOK_",
    .operator_secret_env = "ZT_FUZZ_HOOK_OPERATOR",
};

static void check_display(const char *url) {
    char shown[512];
    zt_webhook_url_for_display(url, true, shown, sizeof shown);
    FUZZ_CHECK(!strchr(shown, '?') && !strchr(shown, '#'), "'%s' shown with a query: '%s'", url,
               shown);
    const char *host = strstr(shown, "://");
    host = host ? host + 3 : shown;
    FUZZ_CHECK(!memchr(host, '@', strcspn(host, "/")), "'%s' shown with user info: '%s'", url,
               shown);
    zt_webhook_url_for_display(url, false, shown, sizeof shown);
    host = strstr(shown, "://");
    host = host ? host + 3 : shown;
    FUZZ_CHECK(!strchr(host, '/') && !strchr(host, '?') && !memchr(host, '@', strlen(host)),
               "the operator's '%s' shown with more than its host: '%s'", url, shown);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setenv("ZT_FUZZ_HOOK_A", "secret-a", 1);
    setenv("ZT_FUZZ_HOOK_OPERATOR", "operator-secret", 1);
    setenv("ZT_FUZZ_OTHER", "not-granted", 1);
    char *text = fuzz_cstr(data, size);
    zt_webhook_list l;
    zt_status s = zt_webhook_list_from_spec(&l, text, "fuzz", &policy);
    if (s == ZT_OK) {
        FUZZ_CHECK(l.n >= 0 && l.n <= 16, "%d hooks accepted", l.n);
        for (int i = 0; i < l.n; i++) {
            const zt_webhook_target *t = &l.t[i];
            FUZZ_CHECK(t->url && (!strncmp(t->url, "http://", 7) ||
                                  !strncmp(t->url, "https://", 8)), "url '%s' taken",
                       t->url ? t->url : "(null)");
            FUZZ_CHECK(zt_webhook_policy_url(&policy, t->url, "again") == ZT_OK,
                       "'%s' accepted in the list but refused alone: %s", t->url,
                       zt_last_error());
            FUZZ_CHECK(!t->secret || !strcmp(t->secret, "secret-a"),
                       "a secret from a variable not granted: '%s'", t->secret);
            FUZZ_CHECK(t->on && !(t->on & ~(unsigned)ZT_HOOK_ALL), "on bits %u", t->on);
            check_display(t->url);
        }
        zt_webhook_list_free(&l);
    } else {
        FUZZ_CHECK(!strncmp(zt_last_error(), "fuzz", 4) || s == ZT_ERR_NOMEM,
                   "a refusal that does not name the source: %s", zt_last_error());
        FUZZ_CHECK(l.t == NULL && l.n == 0, "a refused list left %d hooks", l.n);
    }
    free(text);
    return 0;
}
