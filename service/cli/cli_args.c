/* "--opt=value" as "--opt" "value" for every ztrain program (cli_args.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"

/* Whether opt (n bytes) is one of the options that take no value of their own (listed without
 * '='): its "=value" is an optional argument, which stays attached. */
static bool is_flag(const char *options, const char *opt, size_t n) {
    for (const char *w = options; w && *w;) {
        size_t len = strcspn(w, " ");
        if (len == n && strncmp(w, opt, n) == 0)
            return true;
        w += len;
        w += strspn(w, " ");
    }
    return false;
}

char **zt_cli_split_equals(const char *options, int argc, char **argv, int *out_argc) {
    static char dash_o[] = "-o";
    char **v = calloc((size_t)argc * 2 + 1, sizeof *v);
    if (!v)
        return NULL;
    int n = 0;
    bool opts = true;
    bool has_o = options && strstr(options, "-o=") != NULL;
    for (int i = 0; i < argc; i++) {
        char *a = argv[i];
        if (opts && strcmp(a, "--") == 0)
            opts = false;
        /* "-ojson" is "-o" "json", as getopt and kubectl take a short option's attached value. */
        if (opts && has_o && a[0] == '-' && a[1] == 'o' && a[2] && a[2] != '=') {
            v[n++] = dash_o;
            v[n++] = a + 2;
            continue;
        }
        /* "--opt=value", and "-o=json" as kubectl takes it. */
        char *eq = !opts || a[0] != '-' ? NULL
                   : a[1] == '-'        ? strchr(a, '=')
                   : a[1] && a[2] == '=' ? a + 2
                                         : NULL;
        if (eq && eq > a + 1 && !(a[1] == '-' && eq == a + 2) &&
            !is_flag(options, a, (size_t)(eq - a))) {
            *eq = '\0';
            v[n++] = a;
            v[n++] = eq + 1;
        } else {
            v[n++] = a;
        }
    }
    *out_argc = n;
    return v;
}

int zt_cli_profile_arg(const char *who, int argc, char **argv, int i) {
    const char *a = argv[i];
    if (strncmp(a, "--profile", 9) != 0 || (a[9] && a[9] != '='))
        return 0;
    if (a[9] && strcmp(a + 10, "ops") != 0) {
        fprintf(stderr, "%s: --profile=%s: unknown profile (known: ops, the per-op timings of "
                        "every step)\n", who, a + 10);
        return -1;
    }
    return !a[9] && i + 1 < argc && strcmp(argv[i + 1], "ops") == 0 ? 2 : 1;
}

bool zt_cli_set_form_ok(const char *v) {
    return v[0] != '=' && strchr(v, '=') != NULL;
}
