/* The Jinja subset of chat templates (ztrain/chat_template.h).
 *
 * A template is cut once into nodes (text, {{ }}, and the statements), with jinja2's whitespace
 * rules as transformers configures them applied to the text: trim_blocks (the newline after a
 * block tag goes), lstrip_blocks (whitespace before a block tag at a line's start goes), "-"
 * markers (all of Python's whitespace), CRLF and CR read as newlines, and the template's one
 * trailing newline dropped. Expressions stay as source text and are
 * parsed each time they are evaluated by one recursive-descent parser that can also run without
 * evaluating, which is how parse time checks every expression of every branch. */
#define _POSIX_C_SOURCE 200809L
#include "ztrain/chat_template.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h"
#include "ztrain/json_util.h"
#include "ztrain/tokenizer.h"

/* ---- newlines ----------------------------------------------------------------------------- */

/* jinja2 reads every \r\n and lone \r as \n (its newline_sequence, which transformers leaves
 * at "\n") before anything else, in text and string literals alike. The offsets in messages stay
 * those of the text as given. */
static zt_status normalize_newlines(zt_chat_template *t) {
    size_t n_cr = 0, k = 0;
    for (const char *p = t->src; *p; p++)
        n_cr += p[0] == '\r' && p[1] == '\n';
    if (n_cr && !(t->cr_at = malloc(n_cr * sizeof *t->cr_at)))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    for (const char *p = t->src; *p; p++) {
        if (p[0] == '\r' && p[1] == '\n') {
            t->cr_at[t->n_cr++] = k;
            continue;
        }
        t->src[k++] = *p == '\r' ? '\n' : *p;
    }
    t->src[k] = '\0';
    return ZT_OK;
}

size_t zt_chat_offset(const zt_chat_template *t, size_t at) {
    size_t dropped = 0;
    while (dropped < t->n_cr && t->cr_at[dropped] <= at)
        dropped++;
    return at + dropped;
}

/* ---- statements --------------------------------------------------------------------------- */

static zt_status tag_error(const zt_chat_template *t, size_t at, const char *fmt, const char *a,
                           int n) {
    return zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: %s '%.*s'", t->source,
                    zt_chat_offset(t, at), fmt, n, a);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A statement tag's content into node d: its keyword, and the name and expression it holds. */
static zt_status statement(zt_chat_template *t, node *d, const char *s, const char *end) {
    while (s < end && is_space(*s))
        s++;
    while (end > s && is_space(end[-1]))
        end--;
    const char *w = s;
    while (s < end && zt_chat_is_ident(*s, s == w))
        s++;
    size_t n = (size_t)(s - w);
    static const struct {
        const char *word;
        node_kind kind;
    } words[] = {{"set", N_SET}, {"if", N_IF},       {"elif", N_ELIF}, {"else", N_ELSE},
                 {"endif", N_ENDIF}, {"for", N_FOR}, {"endfor", N_ENDFOR},
                 {"break", N_BREAK}, {"continue", N_CONTINUE},
                 {"generation", N_GEN}, {"endgeneration", N_ENDGEN}};
    size_t k = 0;
    while (k < sizeof words / sizeof words[0] &&
           !(strlen(words[k].word) == n && memcmp(words[k].word, w, n) == 0))
        k++;
    if (k == sizeof words / sizeof words[0])
        return tag_error(t, d->offset, "statement", w, (int)n);
    d->kind = words[k].kind;
    while (s < end && is_space(*s))
        s++;
    if (d->kind == N_ELSE || d->kind == N_ENDIF || d->kind == N_ENDFOR || d->kind == N_BREAK ||
        d->kind == N_CONTINUE || d->kind == N_GEN || d->kind == N_ENDGEN) {
        if (s != end)
            return tag_error(t, d->offset, "unexpected text after the statement:", s,
                             (int)(end - s));
        return ZT_OK;
    }
    if (d->kind == N_SET || d->kind == N_FOR) {
        /* a name, or for a for names split by ',' that each item unpacks into */
        do {
            while (d->n_var && s < end && is_space(*s))
                s++;
            const char *v = s;
            while (s < end && zt_chat_is_ident(*s, s == v))
                s++;
            if (s == v || (size_t)(s - v) >= sizeof d->var[0])
                return tag_error(t, d->offset, "expected a variable name after", w, (int)n);
            if (d->n_var == 4)
                return tag_error(t, d->offset, "unpacking into more than 4 names is not "
                                 "supported:", w, (int)(end - w));
            snprintf(d->var[d->n_var++], sizeof d->var[0], "%.*s", (int)(s - v), v);
            while (s < end && is_space(*s))
                s++;
        } while (d->kind == N_FOR && s < end && *s == ',' && s++);
        /* set ns.name = ...: a namespace's attribute */
        if (d->kind == N_SET && s < end && *s == '.') {
            const char *v = ++s;
            while (s < end && zt_chat_is_ident(*s, s == v))
                s++;
            if (s == v || (size_t)(s - v) >= sizeof d->var[0])
                return tag_error(t, d->offset, "expected an attribute's name in", w,
                                 (int)(end - w));
            snprintf(d->var[d->n_var++], sizeof d->var[0], "%.*s", (int)(s - v), v);
            d->attr = true;
            while (s < end && is_space(*s))
                s++;
        }
        if (d->kind == N_SET && (s == end || *s != '='))
            return tag_error(t, d->offset, "only 'set NAME = expression' and 'set NAME.ATTR = expression' "
                             "are supported, not",
                             w, (int)(end - w));
        if (d->kind == N_FOR && !(end - s > 3 && !memcmp(s, "in", 2) && is_space(s[2])))
            return tag_error(t, d->offset, "only 'for NAME in expression' is supported, not",
                             w, (int)(end - w));
        s += d->kind == N_SET ? 1 : 2;
    }
    d->at = s;
    d->len = (size_t)(end - s);
    return d->kind == N_FOR ? zt_chat_split_for(t, d) : ZT_OK;
}

/* Where a {{ }} or {% %} tag closes: the first close ("}}" or "%}") outside a string literal
 * and outside brackets, as jinja2's lexer reads the tag (`{{ "}}" }}` prints "}}",
 * `{{ {'a': {}}|length }}` prints 1); NULL when none. */
static const char *tag_close(const char *p, const char *close) {
    int depth = 0;
    for (; *p; p++) {
        if (*p == '\'' || *p == '"') {
            char q = *p;
            const char *s = p + 1;
            while (*s && *s != q)
                s += s[0] == '\\' && s[1] ? 2 : 1;
            if (*s) { /* an unterminated quote is left to the expression's reader */
                p = s;
                continue;
            }
        }
        if (depth == 0 && p[0] == close[0] && p[1] == close[1])
            return p;
        if (*p == '(' || *p == '[' || *p == '{')
            depth++;
        else if ((*p == ')' || *p == ']' || *p == '}') && depth > 0)
            depth--;
    }
    return NULL;
}

/* Cuts the template into nodes, applying the whitespace rules, and pairs the block tags. */
static zt_status cut(zt_chat_template *t) {
    size_t len = strlen(t->src);
    if (len && t->src[len - 1] == '\n') /* jinja2 drops one trailing newline */
        t->src[--len] = '\0';
    t->nodes = calloc(len + 1, sizeof *t->nodes);
    if (!t->nodes)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    const char *src = t->src, *p = src, *end = src + len;
    bool lstrip_next = false, trim_newline = false;
    while (p < end) {
        const char *open = p;
        while (open + 1 < end && !(open[0] == '{' && strchr("{%#", open[1])))
            open++;
        if (open + 1 >= end)
            open = end;
        /* the text before the tag */
        const char *a = p, *b = open;
        if (lstrip_next) /* after "-": Python's \s*, Unicode whitespace included */
            a += zt_chat_space_prefix(a, (size_t)(b - a));
        else if (trim_newline && a < b && *a == '\n')
            a++;
        lstrip_next = trim_newline = false;
        if (open < end) {
            char kind = open[1];
            bool minus = open + 2 < end && open[2] == '-', plus = open + 2 < end && open[2] == '+';
            if (minus) /* Python's str.rstrip() */
                b -= zt_chat_space_suffix(a, (size_t)(b - a));
            else if (kind != '{' && !plus) {
                /* lstrip_blocks: whitespace (Python's \s) from a line's start to a block tag */
                const char *q = b - zt_chat_space_suffix(a, (size_t)(b - a));
                for (const char *z = q; z < b; z++) /* the line starts after its newline */
                    if (*z == '\n')
                        q = z + 1;
                if ((q == src) || (q > src && q[-1] == '\n'))
                    b = q;
            }
        }
        if (b > a)
            t->nodes[t->n++] = (node){.kind = N_TEXT, .at = a, .len = (size_t)(b - a)};
        if (open >= end)
            break;
        char kind = open[1];
        const char *close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        const char *inner = open + 2 + (open + 2 < end && (open[2] == '-' || open[2] == '+'));
        const char *c = kind == '#' ? strstr(inner, close) : tag_close(inner, close);
        if (!c)
            return zt_error(ZT_ERR_FORMAT, "%s: chat_template at offset %zu: the tag is not "
                            "closed with '%s'", t->source,
                            zt_chat_offset(t, (size_t)(open - src)), close);
        const char *inner_end = c;
        if (inner_end > inner && inner_end[-1] == '-')
            inner_end--, lstrip_next = true;
        else if (kind != '{' && inner_end > inner && inner_end[-1] == '+')
            inner_end--; /* "+%}" and "+#}" keep the newline trim_blocks would take */
        else if (kind != '{')
            trim_newline = true;
        p = c + 2;
        if (kind == '#')
            continue;
        node d = {.offset = (size_t)(open - src)};
        if (kind == '{') {
            d.kind = N_OUT, d.at = inner, d.len = (size_t)(inner_end - inner);
        } else {
            ZT_TRY(statement(t, &d, inner, inner_end));
        }
        t->nodes[t->n++] = d;
    }
    /* Pair the blocks: each if/elif/else points at its next branch or endif, a for at its
     * endfor, a generation at its endgeneration. */
    int stack[64], depth = 0;
    for (int i = 0; i < t->n; i++) {
        node *d = &t->nodes[i];
        /* loopcontrols: break and continue only inside a for, and one inside the generation
         * block they are in (jinja2 compiles its body into a function, where Python refuses a
         * break of the loop outside) */
        bool in_for = false, in_gen = false;
        for (int k = 0; k < depth; k++) {
            node_kind open = t->nodes[stack[k]].kind;
            in_for = open == N_FOR || (in_for && open != N_GEN);
            in_gen |= open == N_GEN;
        }
        if ((d->kind == N_BREAK || d->kind == N_CONTINUE) && !in_for)
            return zt_error(ZT_ERR_FORMAT, "%s: chat_template at offset %zu: '%s' outside a "
                            "loop%s", t->source, zt_chat_offset(t, d->offset),
                            d->kind == N_BREAK ? "break" : "continue",
                            in_gen ? " of its own generation block" : "");
        if (d->kind == N_GEN && in_gen)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: a "
                            "'generation' block inside another is not supported (transformers "
                            "tracks only the outer one)", t->source,
                            zt_chat_offset(t, d->offset));
        t->generation |= d->kind == N_GEN;
        if (d->kind == N_IF || d->kind == N_FOR || d->kind == N_GEN) {
            if (depth == 64)
                return zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: blocks "
                                "nest deeper than 64", t->source, zt_chat_offset(t, d->offset));
            stack[depth++] = i;
            continue;
        }
        if (d->kind != N_ELIF && d->kind != N_ELSE && d->kind != N_ENDIF &&
            d->kind != N_ENDFOR && d->kind != N_ENDGEN)
            continue;
        node *open = depth ? &t->nodes[stack[depth - 1]] : NULL;
        /* an else closes an if's branches or a for's body (run when it iterates no item) */
        node_kind want = d->kind == N_ENDGEN ? N_GEN
                         : d->kind == N_ENDFOR || (d->kind == N_ELSE && open && open->kind == N_FOR)
                             ? N_FOR : N_IF;
        /* the innermost open block's current branch */
        int at = depth ? stack[depth - 1] : -1;
        while (at >= 0 && t->nodes[at].match > 0)
            at = t->nodes[at].match;
        if (!open || open->kind != want || (at >= 0 && t->nodes[at].kind == N_ELSE &&
                                             d->kind != N_ENDIF && d->kind != N_ENDFOR))
            return zt_error(ZT_ERR_FORMAT, "%s: chat_template at offset %zu: a misplaced "
                            "'%s'", t->source, zt_chat_offset(t, d->offset),
                            d->kind == N_ELIF ? "elif" : d->kind == N_ELSE ? "else"
                            : d->kind == N_ENDIF ? "endif" : d->kind == N_ENDFOR ? "endfor"
                            : "endgeneration");
        t->nodes[at].match = i;
        if (d->kind == N_ENDIF || d->kind == N_ENDFOR || d->kind == N_ENDGEN)
            depth--;
    }
    if (depth)
        return zt_error(ZT_ERR_FORMAT, "%s: chat_template at offset %zu: the block is never "
                        "closed", t->source,
                        zt_chat_offset(t, t->nodes[stack[depth - 1]].offset));
    /* Check every expression, taken branch or not. */
    for (int i = 0; i < t->n; i++) {
        const node *d = &t->nodes[i];
        if (d->kind == N_OUT || d->kind == N_SET || d->kind == N_IF || d->kind == N_ELIF ||
            d->kind == N_FOR) {
            zt_status st;
            zt_chat_eval(t, NULL, d, &st);
            ZT_TRY(st);
            if (d->test) {
                node filter = {.at = d->test, .len = d->test_len};
                zt_chat_eval(t, NULL, &filter, &st);
                ZT_TRY(st);
            }
        }
    }
    return ZT_OK;
}

/* ---- running ------------------------------------------------------------------------------ */

static void emit(render *r, const char *s, size_t n) {
    if (r->st != ZT_OK)
        return;
    r->yielded = true;
    if (n > ZT_CHAT_MAX_MADE - r->out.len) {
        r->st = zt_error(ZT_ERR_UNSUPPORTED, "%s: the rendered text passes 2 GiB",
                         r->t->source);
        return;
    }
    zt_strbuf_append(&r->out, s, n);
    if (r->out.oom)
        r->st = zt_error(ZT_ERR_NOMEM, "%s: out of memory", r->t->source);
}

static void bind(render *r, const char *name, val v, int frame) {
    for (int i = r->n_vars - 1; i >= frame; i--)
        if (strcmp(r->vars[i].name, name) == 0) {
            r->vars[i].v = v;
            return;
        }
    if (r->n_vars == (int)(sizeof r->vars / sizeof r->vars[0])) {
        r->st = zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template sets more than %d variables",
                         r->t->source, r->n_vars);
        return;
    }
    snprintf(r->vars[r->n_vars].name, sizeof r->vars[0].name, "%s", name);
    r->vars[r->n_vars++].v = v;
}

/* Binds a for's item to its name, or unpacks it into its names as Python does (a list's items,
 * an object's keys, a string's characters: as many as there are names), failing with Python's
 * message otherwise. */
static void unpack(render *r, const node *d, val item, int frame) {
    if (d->n_var == 1) {
        bind(r, d->var[0], item, frame);
        return;
    }
    val parts[4];
    int n = zt_chat_items(item, NULL);
    if (n < 0) {
        r->st = zt_error(ZT_ERR_INVALID, "%s: chat_template at offset %zu: cannot unpack "
                         "non-iterable %s object", r->t->source,
                         zt_chat_offset(r->t, d->offset), zt_chat_type_name(item));
        return;
    }
    if (n != d->n_var) {
        r->st = zt_error(ZT_ERR_INVALID, n < d->n_var
                         ? "%s: chat_template at offset %zu: not enough values to unpack "
                           "(expected %d, got %d)"
                         : "%s: chat_template at offset %zu: too many values to unpack "
                           "(expected %d)", r->t->source, zt_chat_offset(r->t, d->offset),
                         d->n_var, n);
        return;
    }
    zt_chat_items(item, parts);
    for (int k = 0; k < n; k++)
        bind(r, d->var[k], parts[k], frame);
}

/* What the for node d iterates over, after its loop filter: a list's items, a dict's keys, a
 * string's code points, nothing for undefined (as jinja2's Undefined iterates). *items is the
 * caller's to free; the count, 0 after a failure (*st). */
static int for_items(render *r, const node *d, val **items, zt_status *st) {
    const zt_chat_template *t = r->t;
    val seq = zt_chat_eval(t, r, d, st);
    int n = *st != ZT_OK || seq.k == V_UNDEF ? 0 : zt_chat_items(seq, NULL);
    if (n < 0) {
        *st = zt_error(ZT_ERR_INVALID, "%s: chat_template at offset %zu: 'for' over a %s, which "
                       "is not iterable", t->source, zt_chat_offset(t, d->offset),
                       zt_chat_type_name(seq));
        return 0;
    }
    char why[256];
    if (*st == ZT_OK && !zt_chat_consume(seq, why)) { /* a generator's first use */
        *st = zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: 'for': %s",
                       t->source, zt_chat_offset(t, d->offset), why);
        return 0;
    }
    if (n == 0)
        return 0;
    if (!(*items = malloc((size_t)n * sizeof **items))) {
        *st = zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
        return 0;
    }
    zt_chat_items(seq, *items);
    if (!d->test)
        return n;
    /* the filter sees the loop's variable (and any outer loop), as jinja2's does */
    node filter = {.at = d->test, .len = d->test_len};
    int kept = 0;
    for (int k = 0; k < n && *st == ZT_OK; k++) {
        int inner = r->n_vars;
        unpack(r, d, (*items)[k], inner);
        bool keep = zt_chat_truthy(zt_chat_eval(t, r, &filter, st));
        r->n_vars = inner;
        if (keep)
            (*items)[kept++] = (*items)[k];
    }
    return *st == ZT_OK ? kept : 0;
}

/* set ns.name = v: the variable must be a namespace, as jinja2 requires. */
static zt_status set_attribute(render *r, const node *d, val v) {
    const zt_chat_template *t = r->t;
    int k = r->n_vars - 1;
    while (k >= 0 && strcmp(r->vars[k].name, d->var[0]) != 0)
        k--;
    if (k < 0 || r->vars[k].v.k != V_NS)
        return zt_error(ZT_ERR_INVALID, "%s: chat_template at offset %zu: cannot assign "
                        "attribute on non-namespace object", t->source,
                        zt_chat_offset(t, d->offset));
    char why[256];
    if (!zt_chat_ns_set(r, r->vars[k].v, d->var[1], v, why))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: %s", t->source,
                        zt_chat_offset(t, d->offset), why);
    return ZT_OK;
}

/* A generation block's span [start, end) of the output, kept as AssistantTracker keeps it. */
static void add_span(render *r, size_t start, size_t end) {
    zt_chat_spans *sp = r->spans;
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? 2 * sp->cap : 16;
        size_t *a = realloc(sp->start, cap * sizeof *a);
        if (a)
            sp->start = a;
        size_t *b = a ? realloc(sp->end, cap * sizeof *b) : NULL;
        if (!b) {
            r->st = zt_error(ZT_ERR_NOMEM, "%s: out of memory", r->t->source);
            return;
        }
        sp->end = b;
        sp->cap = cap;
    }
    sp->start[sp->n] = start;
    sp->end[sp->n++] = end;
}

static void run(render *r, int i, int stop, int frame);

/* {% generation %}: its body renders in place, with its own scope (jinja2 renders it as a
 * call block's caller, so a variable it sets ends with it); transformers records the span it
 * wrote once the template has output something before it. */
static void run_generation(render *r, const node *d, int i) {
    bool active = r->yielded;
    size_t start = r->out.len;
    int inner = r->n_vars;
    run(r, i + 1, d->match, inner);
    r->n_vars = inner;
    if (r->st == ZT_OK && active && r->spans)
        add_span(r, start, r->out.len);
    r->yielded = true;
}

/* Runs nodes [i, stop) with variables set from `frame` on. */
static void run(render *r, int i, int stop, int frame) {
    const zt_chat_template *t = r->t;
    while (i < stop && r->st == ZT_OK && !r->jump) {
        const node *d = &t->nodes[i];
        zt_status st = ZT_OK;
        switch (d->kind) {
        case N_TEXT:
            emit(r, d->at, d->len);
            i++;
            break;
        case N_OUT: {
            val v = zt_chat_eval(t, r, d, &st);
            char num[32], why[256];
            const char *s;
            size_t n;
            if (st == ZT_OK && zt_chat_print(r, v, num, &s, &n, why))
                emit(r, s, n);
            else if (st == ZT_OK)
                st = zt_error(ZT_ERR_UNSUPPORTED, "%s: chat_template at offset %zu: %s",
                              t->source, zt_chat_offset(t, d->offset), why);
            i++;
            break;
        }
        case N_SET: {
            val v = zt_chat_eval(t, r, d, &st);
            if (st == ZT_OK && d->attr)
                st = set_attribute(r, d, v);
            else if (st == ZT_OK)
                bind(r, d->var[0], v, frame);
            i++;
            break;
        }
        case N_BREAK:
        case N_CONTINUE:
            r->jump = d->kind == N_BREAK ? 1 : 2;
            i++;
            break;
        case N_GEN:
            run_generation(r, d, i);
            i = d->match + 1;
            break;
        case N_IF: {
            int branch = i, taken = -1;
            while (taken < 0 && t->nodes[branch].kind != N_ENDIF && st == ZT_OK) {
                const node *b = &t->nodes[branch];
                if (b->kind == N_ELSE || zt_chat_truthy(zt_chat_eval(t, r, b, &st)))
                    taken = branch;
                else
                    branch = b->match;
            }
            int end = i;
            while (t->nodes[end].kind != N_ENDIF)
                end = t->nodes[end].match;
            if (st == ZT_OK && taken >= 0)
                run(r, taken + 1, t->nodes[taken].match, frame);
            i = end + 1;
            break;
        }
        case N_FOR: {
            int end = d->match, else_at = -1;
            if (t->nodes[end].kind == N_ELSE)
                else_at = end, end = t->nodes[end].match;
            val *items = NULL;
            int n = for_items(r, d, &items, &st);
            loop_state ls = {0, n, items};
            bool iterated = false;
            for (int k = 0; st == ZT_OK && r->st == ZT_OK && k < n; k++) {
                int inner = r->n_vars;
                ls.index0 = k;
                unpack(r, d, items[k], inner);
                bind(r, "loop", (val){.k = V_LOOP, .loop = &ls}, inner);
                run(r, i + 1, else_at >= 0 ? else_at : end, inner);
                r->n_vars = inner; /* a loop's variables end with its iteration */
                /* jinja2 marks the loop iterated at the end of a body: a break or continue
                 * before that leaves it unmarked, so the else still runs */
                iterated |= !r->jump;
                bool stop_loop = r->jump == 1;
                r->jump = 0;
                if (stop_loop)
                    break;
            }
            if (st == ZT_OK && !iterated && else_at >= 0)
                run(r, else_at + 1, end, frame);
            free(items);
            i = end + 1;
            break;
        }
        default: /* elif, else, endif, endfor, endgeneration are consumed by their block */
            i++;
            break;
        }
        if (st != ZT_OK && r->st == ZT_OK)
            r->st = st;
    }
}

/* tools and documents as apply_chat_template takes them: None, or a list of objects (it
 * refuses anything else in a list with these messages). */
static zt_status check_list(const zt_chat_template *t, const cJSON *v, const char *what,
                            const char *why) {
    if (!v || cJSON_IsNull(v))
        return ZT_OK;
    if (!cJSON_IsArray(v))
        return zt_error(ZT_ERR_INVALID, "%s: %s must be a list, not a JSON %s", t->source, what,
                        cJSON_IsObject(v) ? "object" : cJSON_IsString(v) ? "string" : "value");
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsObject(e))
            return zt_error(ZT_ERR_INVALID, "%s: %s[%d]: %s", t->source, what, k, why);
        k++;
    }
    return ZT_OK;
}

/* The extra keyword arguments: an object whose keys reach the template, less the ones
 * apply_chat_template takes itself (zt_chat_args says which are refused and why). */
static zt_status check_kwargs(const zt_chat_template *t, const cJSON *kwargs) {
    static const char *const taken[] = {"messages", "add_generation_prompt"};
    static const char *const own[] = {
        "conversation", "chat_template", "continue_final_message", "tokenize", "padding",
        "truncation", "max_length", "return_tensors", "return_dict",
        "return_assistant_tokens_mask", "tokenizer_kwargs"};
    if (!kwargs || cJSON_IsNull(kwargs))
        return ZT_OK;
    if (!cJSON_IsObject(kwargs))
        return zt_error(ZT_ERR_INVALID, "%s: the template's keyword arguments must be an object "
                        "of names to values", t->source);
    const cJSON *e;
    cJSON_ArrayForEach(e, kwargs) {
        for (size_t k = 0; k < sizeof taken / sizeof taken[0]; k++)
            if (strcmp(e->string, taken[k]) == 0)
                return zt_error(ZT_ERR_INVALID, "%s: keyword argument '%s': apply_chat_template "
                                "got multiple values for keyword argument '%s' (it is set by "
                                "the call itself)", t->source, e->string, e->string);
        if (strlen(e->string) >= sizeof ((binding *)0)->name)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: keyword argument '%.40s...' is longer than "
                            "the %zu bytes a variable's name may have", t->source, e->string,
                            sizeof ((binding *)0)->name - 1);
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
            if (strcmp(e->string, own[k]) == 0)
                return zt_error(ZT_ERR_INVALID, "%s: keyword argument '%s' is one of "
                                "apply_chat_template's own arguments, which changes the call "
                                "rather than reaching the template; remove it", t->source,
                                e->string);
    }
    return ZT_OK;
}

/* A render's tools or documents (key): the keyword arguments' over the field, as TRL merges a
 * row's chat_template_kwargs over its tools; NULL for none (absent or a JSON null). */
static const cJSON *given(const cJSON *field, const cJSON *kwargs, const char *key) {
    if (cJSON_IsObject(kwargs) && cJSON_HasObjectItem(kwargs, key))
        field = cJSON_GetObjectItemCaseSensitive(kwargs, key);
    return field && !cJSON_IsNull(field) ? field : NULL;
}

bool zt_chat_template_has_generation(const zt_chat_template *t, const zt_chat_args *a) {
    if (!a)
        return t->generation || (t->tool_use && t->tool_use->generation);
    bool tools = given(a->tools, a->kwargs, "tools") != NULL;
    return tools && t->tool_use ? t->tool_use->generation : t->generation;
}

void zt_chat_spans_free(zt_chat_spans *s) {
    free(s->start);
    free(s->end);
    memset(s, 0, sizeof *s);
}

zt_status zt_chat_template_render(const zt_chat_template *t, const cJSON *messages,
                                  const zt_chat_args *a, char **out, zt_chat_spans *spans) {
    *out = NULL;
    if (!cJSON_IsArray(messages))
        return zt_error(ZT_ERR_INVALID, "%s: messages must be a list", t->source);
    ZT_TRY(check_kwargs(t, a->kwargs));
    const cJSON *kwargs = cJSON_IsObject(a->kwargs) ? a->kwargs : NULL;
    const cJSON *tools = given(a->tools, kwargs, "tools");
    const cJSON *documents = given(a->documents, kwargs, "documents");
    bool add_generation_prompt = a->add_generation_prompt;
    /* get_chat_template's choice among named templates: "tool_use" when tools are given (even
     * an empty list), else "default" */
    if (tools && t->tool_use)
        t = t->tool_use;
    else if (t->no_default)
        return zt_error(ZT_ERR_INVALID, "%s: This model has multiple chat templates with no "
                        "default specified! Please either pass a chat template or the name of "
                        "the template you wish to use to the `chat_template` argument. Available "
                        "template names are %s.", t->source, t->names);
    ZT_TRY(check_list(t, tools, "tools", "Tools should either be a JSON schema, or a callable "
                      "function with type hints and a docstring suitable for auto-conversion to "
                      "a schema."));
    ZT_TRY(check_list(t, documents, "documents", "Documents should be a list of dicts with "
                      "'title' and 'text' keys!"));
    render *r = calloc(1, sizeof *r);
    if (!r)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    r->t = t;
    r->spans = spans;
    /* what apply_chat_template passes: the conversation's dicts as they are, tools and
     * documents (None when not given), and its special_tokens_map */
    bind(r, "messages", zt_chat_from_json(messages), 0);
    bind(r, "tools", tools ? zt_chat_from_json(tools) : (val){.k = V_NONE}, 0);
    bind(r, "documents", documents ? zt_chat_from_json(documents) : (val){.k = V_NONE}, 0);
    const cJSON *tok;
    cJSON_ArrayForEach(tok, t->tokens)
        bind(r, tok->string, zt_chat_from_json(tok), 0);
    bind(r, "add_generation_prompt", zt_chat_bool(add_generation_prompt), 0);
    /* and its functions, so `strftime_now is defined` holds as there */
    bind(r, "raise_exception", (val){.k = V_FUNC, .s = "raise_exception"}, 0);
    bind(r, "strftime_now", (val){.k = V_FUNC, .s = "strftime_now"}, 0);
    /* and the extra keyword arguments, over all of these but the call's own */
    const cJSON *kw;
    cJSON_ArrayForEach(kw, kwargs)
        if (strcmp(kw->string, "tools") != 0 && strcmp(kw->string, "documents") != 0)
            bind(r, kw->string, zt_chat_from_json(kw), 0);
    run(r, 0, t->n, 0);
    zt_status s = r->st;
    cJSON_Delete(r->made);
    zt_chat_arena_free(r);
    /* "" when the template wrote nothing */
    *out = s == ZT_OK ? zt_strbuf_take(&r->out, NULL) : NULL;
    if (s == ZT_OK && !*out)
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    zt_strbuf_free(&r->out);
    free(r);
    return s;
}

/* The special tokens apply_chat_template passes (its special_tokens_map): each that specials
 * gives as non-empty text, additional_special_tokens as a list when it holds any. */
static zt_status special_tokens(zt_chat_template *t, const cJSON *specials) {
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
    if (!(t->tokens = cJSON_CreateObject()))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *text;
        ZT_TRY(zt_json_token_text(cJSON_GetObjectItemCaseSensitive(specials, keys[k]), t->source,
                                  keys[k], &text));
        if (text && text[0] && !cJSON_AddStringToObject(t->tokens, keys[k], text))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
    }
    const char *key = "additional_special_tokens";
    const cJSON *more = cJSON_GetObjectItemCaseSensitive(specials, key), *e;
    if (more && !cJSON_IsNull(more) && !cJSON_IsArray(more))
        return zt_error(ZT_ERR_FORMAT, "%s: key '%s' must be a list of tokens", t->source, key);
    if (cJSON_GetArraySize(more) > 0) {
        cJSON *list = cJSON_AddArrayToObject(t->tokens, key);
        if (!list)
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
        cJSON_ArrayForEach(e, more) {
            const char *text;
            ZT_TRY(zt_json_token_text(e, t->source, key, &text));
            if (!text)
                return zt_error(ZT_ERR_FORMAT, "%s: key '%s' holds a null", t->source, key);
            if (!cJSON_AddItemToArray(list, cJSON_CreateString(text)))
                return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->source);
        }
    }
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(t->tokens, "eos_token");
    t->eos = eos ? eos->valuestring : "";
    return ZT_OK;
}

zt_status zt_chat_template_parse(const char *text, const char *source, const cJSON *specials,
                                 zt_chat_template **out) {
    *out = NULL;
    zt_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
    snprintf(t->source, sizeof t->source, "%s", source);
    t->eos = "";
    t->src = strdup(text);
    zt_status s = t->src ? special_tokens(t, specials)
                         : zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
    if (s == ZT_OK)
        s = normalize_newlines(t);
    if (s == ZT_OK)
        s = cut(t);
    if (s != ZT_OK) {
        zt_chat_template_destroy(t);
        return s;
    }
    *out = t;
    return ZT_OK;
}

const char *zt_chat_template_eos(const zt_chat_template *t) { return t->eos; }

void zt_chat_template_destroy(zt_chat_template *t) {
    if (!t)
        return;
    free(t->src);
    cJSON_Delete(t->tokens);
    free(t->nodes);
    free(t->cr_at);
    zt_chat_template_destroy(t->tool_use);
    free(t);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names of a list of templates as Python prints sorted(names): ['a', 'b']. */
static void list_names(const cJSON *list, char *out, size_t cap) {
    const char *names[64];
    size_t n = 0, len = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
        if (n < 64)
            names[n++] = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
    qsort(names, n, sizeof names[0], by_name);
    len += (size_t)snprintf(out, cap, "[");
    for (size_t k = 0; k < n && len < cap; k++)
        len += (size_t)snprintf(out + len, cap - len, "%s'%s'", k ? ", " : "", names[k]);
    if (len < cap)
        snprintf(out + len, cap - len, "]");
}

/* A "chat_template" list of {"name", "template"} objects, as transformers reads it into a dict
 * of named templates: the "default" one (and "tool_use", which get_chat_template takes when
 * tools are given) parsed; a list without "default" loads, and renders only with tools. */
static zt_status load_named(const char *path, const cJSON *list, const cJSON *specials,
                            zt_chat_template **out) {
    const char *text = NULL, *tool_use = NULL;
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, list) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(name) || !cJSON_IsString(tmpl))
            return zt_error(ZT_ERR_FORMAT, "%s: chat_template[%d] is not a {\"name\": ..., "
                            "\"template\": ...} object of strings", path, k);
        if (strcmp(name->valuestring, "default") == 0)
            text = tmpl->valuestring;
        else if (strcmp(name->valuestring, "tool_use") == 0)
            tool_use = tmpl->valuestring;
        k++;
    }
    if (k == 0)
        return zt_error(ZT_ERR_FORMAT, "%s: \"chat_template\" is an empty list", path);
    ZT_TRY(zt_chat_template_parse(text ? text : "", path, specials, out));
    (*out)->no_default = !text;
    list_names(list, (*out)->names, sizeof (*out)->names);
    if (!tool_use)
        return ZT_OK;
    char source[600];
    snprintf(source, sizeof source, "%s (chat_template \"tool_use\")", path);
    zt_status s = zt_chat_template_parse(tool_use, source, specials, &(*out)->tool_use);
    if (s != ZT_OK) {
        zt_chat_template_destroy(*out);
        *out = NULL;
    }
    return s;
}

zt_status zt_chat_template_load(const char *path, zt_chat_template **out) {
    *out = NULL;
    cJSON *root, *specials = NULL;
    ZT_TRY(zt_json_load_file(path, &root));
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    zt_status s = ZT_OK;
    if (!cJSON_IsArray(ct) && !cJSON_IsString(ct))
        s = zt_error(ZT_ERR_FORMAT, "%s: no \"chat_template\" (a string, or a list of named "
                     "templates)", path);
    /* the special tokens as the tokenizer resolves them, class defaults and
     * special_tokens_map.json included, not the config's keys alone */
    if (s == ZT_OK)
        s = zt_tokenizer_special_tokens_map(path, root, &specials);
    if (s == ZT_OK && cJSON_IsArray(ct))
        s = load_named(path, ct, specials, out);
    else if (s == ZT_OK)
        s = zt_chat_template_parse(ct->valuestring, path, specials, out);
    cJSON_Delete(specials);
    cJSON_Delete(root);
    return s;
}
