/* zt_chat_render: renders conversations with a tokenizer_config.json's chat template, for
 * tests/reference/test_chat_template.py.
 *
 *   zt_chat_render TOKENIZER_CONFIG.json CONVERSATIONS.json OUT_DIR [--generation-prompt]
 *
 * CONVERSATIONS.json is a list of conversations, each a message list or an object {"messages":
 * [...], "tools": [...], "documents": [...], "chat_template_kwargs": {...}} (all but messages
 * optional, as apply_chat_template takes them, the last its extra keyword arguments); conversation
 * i is written to OUT_DIR/i.txt, or its error message to OUT_DIR/i.err, and when the template has
 * a {% generation %} block, its spans to OUT_DIR/i.spans as a JSON list of [start, end] byte
 * offsets. Exit status: 0 when every conversation was handled, 1 when
 * the template was refused (the message on stderr), 2 usage or I/O. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/chat_template.h"
#include "ztrain/json_util.h"

static int write_text(const char *dir, int i, const char *ext, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.%s", dir, i, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text) || fclose(f) != 0) {
        fprintf(stderr, "zt_chat_render: cannot write %s\n", path);
        return 2;
    }
    return 0;
}

static int write_spans(const char *dir, int i, const zt_chat_spans *sp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.spans", dir, i);
    FILE *f = fopen(path, "w");
    if (!f)
        return 2;
    fputc('[', f);
    for (size_t k = 0; k < sp->n; k++)
        fprintf(f, "%s[%zu, %zu]", k ? ", " : "", sp->start[k], sp->end[k]);
    fputc(']', f);
    return fclose(f) == 0 ? 0 : 2;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: zt_chat_render TOKENIZER_CONFIG.json CONVERSATIONS.json OUT_DIR "
                        "[--generation-prompt]\n");
        return 2;
    }
    bool gen = argc > 4 && strcmp(argv[4], "--generation-prompt") == 0;
    zt_chat_template *t;
    if (zt_chat_template_load(argv[1], &t) != ZT_OK) {
        fprintf(stderr, "%s\n", zt_last_error());
        return 1;
    }
    cJSON *convs;
    if (zt_json_load_file(argv[2], &convs) != ZT_OK) {
        fprintf(stderr, "%s\n", zt_last_error());
        zt_chat_template_destroy(t);
        return 2;
    }
    int rc = 0, i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, convs) {
        char *text = NULL;
        zt_chat_conversation cv;
        zt_chat_conversation_split(c, NULL, &cv);
        cv.args.add_generation_prompt = gen;
        zt_chat_spans spans = {0};
        if (zt_chat_template_render(t, cv.messages, &cv.args, &text, &spans) == ZT_OK) {
            rc |= write_text(argv[3], i, "txt", text);
            if (zt_chat_template_has_generation(t, &cv.args))
                rc |= write_spans(argv[3], i, &spans);
        } else {
            rc |= write_text(argv[3], i, "err", zt_last_error());
        }
        zt_chat_spans_free(&spans);
        free(text);
        i++;
    }
    cJSON_Delete(convs);
    zt_chat_template_destroy(t);
    return rc;
}
