/* "--opt=value" as "--opt" "value" for every ztrain program (cli_args.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"

/* Whether opt (n bytes) is one of the options that take no value of their own (listed without
 * '='): its "=value" is an optional argument, which stays attached. */
static bool is_flag(const char *options, const char *opt, size_t n) {
    /* Every command's --help and -h: "--help=x" stays whole, for the caller to refuse. */
    if ((n == 6 && strncmp(opt, "--help", 6) == 0) || (n == 2 && strncmp(opt, "-h", 2) == 0))
        return true;
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

bool zt_cli_takes_value(const char *options, const char *opt) {
    size_t n = strlen(opt);
    for (const char *w = options; w && *w;) {
        size_t len = strcspn(w, " ");
        if (len == n + 1 && w[n] == '=' && strncmp(w, opt, n) == 0)
            return true;
        w += len;
        w += strspn(w, " ");
    }
    return false;
}

int zt_cli_word_kind(const char *a, bool *operands) {
    if (*operands)
        return 1;
    if (strcmp(a, "--") == 0) {
        *operands = true;
        return -1;
    }
    return a[0] == '-' && a[1] != '\0' ? 0 : 1;
}

int zt_cli_wants_help(const char *who, const char *options, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            return 0;
        if (strncmp(a, "--help=", 7) == 0 || strncmp(a, "-h=", 3) == 0) {
            fprintf(stderr, "%s: %.*s takes no value (got '%s')\n", who,
                    (int)strcspn(a, "="), a, a);
            return -1;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        /* The word after an option that takes a value is that value, whatever it looks like
         * (sample --prompt -h), as getopt takes it. */
        if (zt_cli_takes_value(options, a))
            i++;
    }
    return 0;
}
