/* `ztrain config-keys`: the DeepSpeed key table (engine/config/ds_config_keys.c) as markdown or
 * as JSON (see cli_config_keys.h). */
#include "cli_config_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli_args.h"
#include "cli_commands.h"
#include "ztrain/ds_config.h"

static const char *const fate_names[] = {"honoured", "warned", "refused"};

static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "ztrain: config-keys: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    zt_cli_print_short_usage(stderr, "config-keys");
    return 2;
}

static void print_markdown(const zt_ds_key *keys, size_t n) {
    printf("| key | fate | what ztrain does |\n|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const zt_ds_key *k = &keys[i];
        char fate[48];
        snprintf(fate, sizeof fate, "%s", fate_names[zt_ds_key_fate_of(k)]);
        if (zt_ds_key_fate_of(k) == ZT_DS_KEY_HONOURED && k->stages) {
            char list[16] = "";
            for (int s = 0; s < 4; s++)
                if (k->stages & (1u << s))
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d",
                             list[0] ? "," : "", s);
            snprintf(fate, sizeof fate, "honoured at stage %s", list);
        }
        printf("| `%s`%s | %s | %s |\n", k->path,
               (k->flags & ZT_DS_KEY_OPAQUE) ? " (contents not listed)" : "", fate, k->note);
    }
}

static int print_json(const zt_ds_key *keys, size_t n) {
    cJSON *rows = cJSON_CreateArray();
    for (size_t i = 0; rows && i < n; i++) {
        const zt_ds_key *k = &keys[i];
        cJSON *row = cJSON_CreateObject(), *stages = cJSON_CreateArray();
        cJSON *dflt = k->dflt ? cJSON_Parse(k->dflt) : NULL;
        for (int s = 0; stages && s < 4; s++)
            if (zt_ds_key_fate_of(k) == ZT_DS_KEY_HONOURED && (k->stages & (1u << s)))
                cJSON_AddItemToArray(stages, cJSON_CreateNumber(s));
        cJSON_AddItemToArray(rows, row);
        cJSON_AddStringToObject(row, "key", k->path);
        cJSON_AddStringToObject(row, "fate", fate_names[zt_ds_key_fate_of(k)]);
        cJSON_AddItemToObject(row, "stages", stages);
        cJSON_AddItemToObject(row, "default", dflt ? dflt : cJSON_CreateNull());
        cJSON_AddBoolToObject(row, "section", (k->flags & ZT_DS_KEY_SECTION) != 0);
        cJSON_AddBoolToObject(row, "contents_listed", !(k->flags & ZT_DS_KEY_OPAQUE));
        cJSON_AddStringToObject(row, "note", k->note);
    }
    char *text = rows ? cJSON_Print(rows) : NULL;
    cJSON_Delete(rows);
    if (!text) {
        fprintf(stderr, "ztrain: config-keys: out of memory\n");
        return 1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

int zt_cli_config_keys(int argc, char **argv) {
    bool json = false, operands = false;
    for (int i = 0; i < argc; i++) {
        int kind = zt_cli_word_kind(argv[i], &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            return usage("unexpected argument '%s'", argv[i]);
        } else if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) {
            if (i + 1 >= argc)
                return usage("%s needs a value (json)", argv[i]);
            if (strcmp(argv[++i], "json") != 0)
                return usage("-o expects json, got '%s'", argv[i]);
            json = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            return zt_cli_unknown_option("config-keys", argv[i]);
        }
    }
    size_t n;
    const zt_ds_key *keys = zt_ds_keys(&n);
    if (json)
        return print_json(keys, n);
    print_markdown(keys, n);
    return 0;
}
