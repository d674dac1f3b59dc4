/* ztraind's command line: "--flag=value" split in two, "--config FILE" read (daemon_args.h). */
#define _GNU_SOURCE
#include "daemon_args.h"
#include "oplog.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A config file larger than this is not a config file. */
#define MAX_CONFIG_BYTES (1 << 20)

typedef struct {
    char **words;
    char **origins; /* "FILE:LINE" of a word read from a config file, else NULL */
    int n, cap;
    char *origin;   /* the origin of the words pushed now */
} word_list;

/* The expanded list, kept for the life of the process (the parsed options point into it). */
static word_list kept;

static void free_words(word_list *w) {
    for (int i = 0; i < w->n; i++)
        free(w->words[i]);
    /* Origins are shared by a line's words: each line's string is freed with its first word. */
    for (int i = 0; i < w->n; i++)
        if (w->origins[i] && (i == 0 || w->origins[i] != w->origins[i - 1]))
            free(w->origins[i]);
    free(w->words);
    free(w->origins);
    free(w->origin);
    memset(w, 0, sizeof *w);
}

static int push(word_list *w, const char *s, size_t len) {
    if (w->n + 1 >= w->cap) {
        int cap = w->cap ? 2 * w->cap : 32;
        char **words = realloc(w->words, (size_t)cap * sizeof *words);
        if (words)
            w->words = words;
        char **origins = realloc(w->origins, (size_t)cap * sizeof *origins);
        if (origins)
            w->origins = origins;
        if (!words || !origins)
            return -1;
        w->cap = cap;
    }
    char *copy = strndup(s, len);
    if (!copy)
        return -1;
    w->origins[w->n] = w->origin;
    w->words[w->n++] = copy;
    w->words[w->n] = NULL;
    return 0;
}

static bool is_switch(const char *flag, size_t len, const char *const *switches) {
    for (; *switches; switches++)
        if (strlen(*switches) == len && strncmp(*switches, flag, len) == 0)
            return true;
    return false;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* One line of a config file: "name [=] value" or "name", as "--name" ["value"]. */
static int config_line(word_list *w, const char *path, int line_no, char *line,
                       const char *const *switches) {
    char *s = trim(line);
    if (!*s || *s == '#')
        return 0;
    size_t name_len = strcspn(s, " \t=");
    char *value = trim(s + name_len);
    if (*value == '=')
        value = trim(value + 1);
    s[name_len] = '\0';
    if (s[0] == '-') {
        zt_oplog(ZT_LOG_ERR, "%s:%d: write the flag without its dashes ('%s' -> '%s')\n",
                 path, line_no, s, s + strspn(s, "-"));
        return -1;
    }
    char flag[256];
    if (snprintf(flag, sizeof flag, "--%s", s) >= (int)sizeof flag) {
        zt_oplog(ZT_LOG_ERR, "%s:%d: flag name too long\n", path, line_no);
        return -1;
    }
    if (strcmp(flag, "--config") == 0) {
        zt_oplog(ZT_LOG_ERR, "%s:%d: config files do not nest (config = %s)\n", path,
                 line_no, value);
        return -1;
    }
    /* --help and --version would print and exit 0 instead of starting the daemon the file
     * configures: a supervisor would take that for a clean stop. */
    if (!strcmp(flag, "--help") || !strcmp(flag, "--version")) {
        zt_oplog(ZT_LOG_ERR, "%s:%d: '%s' is not a setting: a config file holds the flags that "
                             "configure the daemon (help and version are the command line's)\n",
                 path, line_no, s);
        return -1;
    }
    bool sw = is_switch(flag, strlen(flag), switches);
    if (sw && *value) {
        zt_oplog(ZT_LOG_ERR, "%s:%d: '%s' takes no value (got '%s')\n", path, line_no, s,
                 value);
        return -1;
    }
    if (!sw && !*value) {
        zt_oplog(ZT_LOG_ERR, "%s:%d: '%s' needs a value ('%s = VALUE')\n", path, line_no, s,
                 s);
        return -1;
    }
    if (asprintf(&w->origin, "%s:%d", path, line_no) < 0) {
        w->origin = NULL;
        return -1;
    }
    int n = w->n;
    int rc = push(w, flag, strlen(flag)) != 0 || (!sw && push(w, value, strlen(value)) != 0);
    if (w->n == n)
        free(w->origin); /* no word took it */
    w->origin = NULL;
    return rc ? -1 : 0;
}

static int read_config(word_list *w, const char *path, const char *const *switches) {
    FILE *f = fopen(path, "r");
    if (!f) {
        zt_oplog(ZT_LOG_ERR, "--config %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0, total = 0;
    ssize_t len;
    int line_no = 0, rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        line_no++;
        total += (size_t)len;
        if (total > MAX_CONFIG_BYTES) {
            zt_oplog(ZT_LOG_ERR, "%s: larger than %d bytes: not a config file\n", path,
                     MAX_CONFIG_BYTES);
            rc = -1;
        } else if (memchr(line, '\0', (size_t)len)) {
            zt_oplog(ZT_LOG_ERR, "%s:%d: a NUL byte: not a text file\n", path, line_no);
            rc = -1;
        } else {
            rc = config_line(w, path, line_no, line, switches);
        }
    }
    if (rc == 0 && ferror(f)) {
        zt_oplog(ZT_LOG_ERR, "--config %s: %s\n", path, strerror(errno));
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

int zt_daemon_args_expand(int argc, char **argv, const char *const *switches, int *out_argc,
                          char ***out_argv, char ***out_origins) {
    word_list w = {0};
    if (push(&w, argv[0], strlen(argv[0])) != 0)
        goto oom;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        size_t flag_len = eq ? (size_t)(eq - a) : strlen(a);
        const char *value = eq ? eq + 1 : NULL;
        if (eq && is_switch(a, flag_len, switches)) {
            zt_oplog(ZT_LOG_ERR, "%.*s takes no value (got '%s')\n", (int)flag_len, a, a);
            goto fail;
        }
        if (flag_len == 8 && strncmp(a, "--config", 8) == 0) {
            if (!value && i + 1 >= argc) {
                zt_oplog(ZT_LOG_ERR, "--config needs a file\n");
                goto fail;
            }
            if (read_config(&w, value ? value : argv[++i], switches) != 0)
                goto fail;
            continue;
        }
        if (push(&w, a, flag_len) != 0 || (value && push(&w, value, strlen(value)) != 0))
            goto oom;
    }
    free_words(&kept);
    kept = w;
    *out_argc = w.n;
    *out_argv = w.words;
    *out_origins = w.origins;
    return 0;
oom:
    zt_oplog(ZT_LOG_ERR, "out of memory reading the command line\n");
fail:
    free_words(&w);
    return -1;
}
