/* The chat template's parts shared by its files (internal to engine/chat): the nodes a template
 * is cut into (chat_template.c), the values and renders that evaluate them (chat_value.c), the
 * methods (chat_method.c), json.dumps for tojson (chat_json.c) and the expressions' entry points
 * (chat_expr.c, which reads them, chat_ops.c and chat_filters.c, which compute them; their own
 * parts are in chat_expr_internal.h). */
#ifndef ZTRAIN_DATA_CHAT_TEMPLATE_INTERNAL_H
#define ZTRAIN_DATA_CHAT_TEMPLATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "ztrain/chat_template.h"
#include "ztrain/strbuf.h"

typedef enum {
    N_TEXT, N_OUT, N_SET, N_IF, N_ELIF, N_ELSE, N_ENDIF, N_FOR, N_ENDFOR, N_BREAK, N_CONTINUE,
    N_GEN, N_ENDGEN /* transformers' {% generation %} ... {% endgeneration %} */
} node_kind;

typedef struct {
    node_kind kind;
    const char *at;  /* text, or the expression's source */
    size_t len;
    char var[4][64]; /* the names a set or for binds: one, or a for's "a, b" to unpack */
    int n_var;
    bool attr;       /* set: the target is var[0].var[1], a namespace's attribute */
    size_t offset;   /* where the tag starts in the template, for messages */
    int match;       /* if/elif/else: the next branch tag or endif; for: its else or endfor;
                      * generation: its endgeneration */
    const char *test; /* for: the loop filter's source ("for x in y if TEST"), or NULL */
    size_t test_len;
} node;

struct zt_chat_template {
    char *src;       /* the text with jinja2's newlines: every \r\n and \r made \n */
    char source[512];
    /* The special tokens as transformers passes them ({"bos_token": "<s>", ...,
     * "additional_special_tokens": [...]}): a token it leaves out (missing, null, empty) is not
     * here, so its variable is undefined. */
    cJSON *tokens;
    const char *eos; /* eos_token's text in tokens, or "" */
    node *nodes;
    int n;
    size_t *cr_at;   /* where each \r of an \r\n was dropped from src, ascending */
    size_t n_cr;
    /* From a list of named templates: the one named "tool_use" (rendered when tools are given),
     * or NULL; no_default when none is named "default" (this one is then empty, and rendering
     * without tools fails naming the list's names, sorted as Python prints them). */
    struct zt_chat_template *tool_use;
    bool no_default;
    char names[256];
    bool generation; /* holds a {% generation %} block */
};

/* V_FLOAT: a conversation's number written with a fraction or an exponent (2.5, 5.0, 1e3:
 * zt_json_is_float_literal), compared, tested, printed and written by tojson as Python does;
 * arithmetic on it is refused by name (the subset has no floating-point arithmetic). An integer
 * past 64 bits is one too, with b set (Python's int, so its type is "int") and s, n its digits as
 * written (zt_json_int_digits; NULL when a tree not read by zt_json_parse held it as a double):
 * it is printed, written by tojson and kept in lists from them, compared exactly, and refused by
 * name in arithmetic, whose result jinja2 computes exactly. */
/* V_FUNC: a function apply_chat_template passes (raise_exception, strftime_now), named by s.
 * V_NS: a namespace() (its attributes are j's members, which `set ns.x = ...` changes). */
typedef enum {
    V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_LOOP, V_FUNC, V_NS
} vkind;

struct val;

/* A for loop's position; the items (after its filter) are kept for loop.previtem and
 * loop.nextitem. */
typedef struct {
    int index0, length;
    const struct val *items;
} loop_state;

typedef struct val {
    vkind k;
    bool b;
    long long i;
    double d;            /* V_FLOAT */
    const char *s;       /* V_STR: not NUL-terminated; V_UNDEF: why (jinja2's message), or NULL */
    size_t n;
    const cJSON *j;      /* V_LIST, V_DICT */
    /* V_LIST: its `count` items are j's lo, lo + step, ... (a slice; step 0 reads as 1) */
    int lo, count, step;
    const loop_state *loop;
} val;

typedef struct {
    char name[64];
    val v;
} binding;

/* The strings and item arrays a render makes, bump-allocated from blocks freed with it: a long
 * conversation makes one per printed value, which one malloc each made slow to create and free. */
typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) char data[];
} arena_block;

/* One render: the output, the variables (frames for loops), and the strings it made. */
typedef struct {
    const zt_chat_template *t;
    zt_strbuf out;
    binding vars[256];
    int n_vars;
    arena_block *arena;
    cJSON *made;     /* the lists, objects and namespaces a render builds, freed with it */
    int jump;        /* a break (1) or continue (2) leaving its loop's body */
    zt_status st;
    /* Whether anything was output yet (a text, a {{ }}, a generation block, even empty ones):
     * transformers' AssistantTracker records a generation block's span only then. */
    bool yielded;
    zt_chat_spans *spans; /* where the generation blocks' spans go, or NULL */
    /* The values() views made so far: each one's number is its identity (Python's `is`), kept by
     * the references a list, tuple or dict holding it makes, even when it is empty. */
    int values_made;
    /* The bytes of the strings, lists and objects made so far (the arena's and the lists' and
     * objects' nodes), and whether one more would have passed ZT_CHAT_MAX_MADE. */
    size_t bytes_made;
    bool over_budget;
} render;

/* The most a render may make, in strings, lists and objects together, and output: a template
 * that doubles a string or a list in a loop fails naming this bound, where it would take all
 * the memory the machine has (jinja2's own MemoryError comes only once the machine runs out). */
#define ZT_CHAT_MAX_MADE ((size_t)2 << 30)
/* Counts n more bytes made by r: false (and r->over_budget set) past ZT_CHAT_MAX_MADE. */
bool zt_chat_charge(render *r, size_t n);
/* What an allocation's failure in r says: "out of memory", or the bound it passed. */
const char *zt_chat_nomem(const render *r);

/* The deepest an expression nests: parentheses, brackets, calls' arguments, and chains of '-' or
 * 'not' each count one (jinja2 itself fails near 100 parentheses). */
#define ZT_CHAT_MAX_NESTING 64

/* Where offset `at` of t->src is in the template as given (before its \r\n became \n). */
size_t zt_chat_offset(const zt_chat_template *t, size_t at);

/* The bytes of Python's str.isspace() whitespace (ASCII's, U+0085, U+00A0, U+1680, U+2000..U+200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000) at the start or end of the UTF-8 text s[0..n), as
 * jinja2's strip, trim, "-" markers and lstrip_blocks remove it. */
size_t zt_chat_space_prefix(const char *s, size_t n);
size_t zt_chat_space_suffix(const char *s, size_t n);
/* The string v without that whitespace at its start (left) and its end (right): jinja2's trim,
 * Python's str.strip/lstrip/rstrip() without characters. */
val zt_chat_strip_space(val v, bool left, bool right);

/* The mark (a bit of a cJSON node's type above cJSON's own and ZT_JSON_FLOAT_LITERAL) of an
 * array a render made that Python holds as a tuple ((a, b), items()' pairs), a generator
 * (select, reject, map, the items filter) or a dict view (keys(), values(), items()), not a
 * list: a V_LIST read from it has b set. A tuple or dict view iterates and counts as a list (a
 * generator does not: ZT_CHAT_GENERATOR), but compares as Python's (ZT_CHAT_DICT_VIEW below),
 * and none is printed, where Python would write "(1, 2)" or "<generator object ...>". */
#define ZT_CHAT_NOT_LIST (1 << 13)
/* A generator (select, reject, selectattr, rejectattr, map, the items filter) is one of those
 * with this mark too, for where it is not a list: it is always true (even empty), has no len(),
 * no items by index or slice, is not reversible (|last) nor JSON, and equals only itself. It is
 * consumed by its first use (a for, |list, |join, |first, `in`, a filter that reads it): the
 * render makes it eagerly, so that first use gives jinja2's answer, and marks it
 * ZT_CHAT_CONSUMED then; a second use, where jinja2 gives only what is left, is refused by name
 * (zt_chat_consume), as is holding it in a list, dict or namespace, whose copy could not share
 * its consumption. Tuples and dict views keep a list's length, truth and repeated use. */
#define ZT_CHAT_GENERATOR (1 << 14)
#define ZT_CHAT_CONSUMED (1 << 15)
/* A dict view (keys(), values(), items()) is one of those with one of these marks too, for where
 * it is neither a list nor a tuple: it equals only another view (keys and items as sets, values
 * only itself), is not a sequence, has no items by index (undefined, as jinja2 makes Python's
 * TypeError) nor slice, is not JSON, and adds to nothing. Its length, truth, |first, |last,
 * `in` and repeated iteration are a list's. What has ZT_CHAT_NOT_LIST and none of the other
 * marks is a tuple: it equals only a tuple, and adds only to a tuple. */
#define ZT_CHAT_DICT_KEYS (1 << 16)
#define ZT_CHAT_DICT_VALUES (1 << 17)
#define ZT_CHAT_DICT_ITEMS (1 << 18)
#define ZT_CHAT_DICT_VIEW (ZT_CHAT_DICT_KEYS | ZT_CHAT_DICT_VALUES | ZT_CHAT_DICT_ITEMS)

/* Values (chat_value.c; zt_chat_is_ident is chat_expr.c's). */
val zt_chat_str(const char *s, size_t n);
val zt_chat_bool(bool b);
val zt_chat_int(long long i);
val zt_chat_from_json(const cJSON *j);
bool zt_chat_truthy(val v);
/* Item k (0 <= k < count) of the list v. */
val zt_chat_list_item(val v, int k);
/* What `for` iterates over in v, as Python does: a list's items, a dict's keys, a string's code
 * points (each a string pointing into v). Fills out[0..] when out is not NULL; returns the count,
 * or -1 when v is not iterable. */
int zt_chat_items(val v, val *out);
/* The byte length of the UTF-8 code point whose first byte is c (1 for a stray byte). */
size_t zt_chat_cp_len(unsigned char c);
bool zt_chat_is_ident(char c, bool first);
/* v as jinja2 prints it (and '~' joins it): strings as they are, integers in decimal, floats
 * as Python's repr (2.5, 1e-05), True, False, None, undefined as nothing; *s points into v or
 * num. False for lists and objects. */
bool zt_chat_text(val v, char num[32], const char **s, size_t *n);
/* v as jinja2 prints it ({{ v }}, '~', the string filter: Python's str(v)): zt_chat_text's text,
 * and a list or dict as Python's repr writes it ([1, 'a', None], {'k': [True, 2.5]}: strings
 * quoted and escaped as repr does, by str.isprintable, floats as repr, nested). *s points into
 * v, num or r's arena. False with why for what the subset does not print: a namespace, a loop,
 * a function, an integer beyond 64 bits without its digits, a ZT_CHAT_NOT_LIST array. */
bool zt_chat_print(render *r, val v, char num[32], const char **s, size_t *n, char why[256]);
/* Marks v, a list the render made (never the conversation's), as ZT_CHAT_NOT_LIST. */
val zt_chat_not_list(val v);
/* Marks v, a list the render made, as a generator (ZT_CHAT_NOT_LIST and ZT_CHAT_GENERATOR). */
val zt_chat_generator(val v);
/* Whether v is a generator (a V_LIST whose array has ZT_CHAT_GENERATOR). */
bool zt_chat_is_generator(val v);
/* Marks v, a list the render made, as a dict view: view is ZT_CHAT_DICT_KEYS, _VALUES or _ITEMS. */
val zt_chat_dict_view(val v, int view);
/* v's ZT_CHAT_DICT_* mark when it is a dict view, else 0. */
int zt_chat_view_of(val v);
/* Whether v is a tuple (ZT_CHAT_NOT_LIST, neither a generator nor a dict view). */
bool zt_chat_is_tuple(val v);
/* One iteration of v (for, in, a filter that reads it): true for what is not a generator and for
 * a generator's first use, which marks it consumed; false with why naming the second use. */
bool zt_chat_consume(val v, char why[256]);
/* Python's name of v's type, for messages ("str", "int", "dict", "tuple", "dict_keys", ...). */
const char *zt_chat_type_name(val v);
/* Python's ==: 1 or 0; numbers (bools are 1 and 0) by value, lists and tuples item by item (a
 * tuple never equals a list), objects key by key, dict views as Python's (keys and items as
 * sets). -1 with Python's TypeError in why where Python raises one: items() == keys() hashes
 * items()' first pair to look it up among the keys ("unhashable type: 'list'"). */
int zt_chat_equal(val a, val b, char why[256]);
/* NULL when Python can hash v (a dict view's `in` looks a key up by its hash), else the type
 * that it cannot: a list, dict, keys() or items(), or the first such in a tuple. */
const char *zt_chat_unhashable(val v);
/* Whether a and b are integers (bools as 1 and 0, one past 64 bits by its digits), with *c
 * their order, -1, 0 or 1, exact as Python's. */
bool zt_chat_int_order(val a, val b, int *c);

/* n bytes (and a NUL after them), 16-byte aligned, that live until the render ends; NULL when
 * out of memory. */
char *zt_chat_alloc(render *r, size_t n);
void zt_chat_arena_free(render *r);
/* A list of items[0..n) that lives until the render ends (its strings copied, its lists and
 * objects referenced, not copied); false when out of memory or when an item cannot be held in
 * a list (undefined, loop, a function), with why naming it. */
bool zt_chat_make_list(render *r, const val *items, int n, val *out, char why[256]);
/* The same for an object of keys[k] (strings) to items[k], or, with ns, a namespace. */
bool zt_chat_make_dict(render *r, const val *keys, const val *items, int n, bool ns, val *out,
                       char why[256]);
/* ns.name = v on the namespace ns; what it held stays alive until the render ends. */
bool zt_chat_ns_set(render *r, val ns, const char *name, val v, char why[256]);

/* json.dumps's options as transformers' tojson filter passes them (ensure_ascii defaults to
 * false there, not json's true). indent: NULL for none, else the text one level indents by;
 * item_sep and key_sep: NULL for json.dumps's defaults. */
typedef struct {
    bool ensure_ascii, sort_keys;
    const char *indent, *item_sep, *key_sep;
    size_t indent_n, item_sep_n, key_sep_n;
} zt_chat_json_opts;
/* v as Python's json.dumps writes it, into *out (a string in r's arena). False with Python's
 * TypeError in why for what JSON cannot hold (undefined, a loop). */
bool zt_chat_json_dump(render *r, val v, const zt_chat_json_opts *o, val *out, char why[256]);

/* How zt_chat_case changes a string's case: Python's str.upper(), lower(), capitalize() and
 * title(), and jinja2's title filter (do_title), which splits words its own way and is not
 * str.title ("they're".title() is "They'Re", its filter "They're"). */
typedef enum {
    ZT_CASE_UPPER, ZT_CASE_LOWER, ZT_CASE_CAPITALIZE, ZT_CASE_TITLE, ZT_CASE_JINJA_TITLE
} zt_chat_case_kind;
/* The string t in that case (chat_filters.c), as Python 3.11 maps each code point (Unicode 14's
 * full mappings and Final_Sigma), into *out (a string in r's arena). False with why for text
 * that is not UTF-8 or out of memory. */
bool zt_chat_case(render *r, val t, zt_chat_case_kind kind, val *out, char why[256]);

/* A method templates may call (chat_method.c): its name and how many arguments it takes. */
typedef struct {
    const char *name;
    int min_args, max_args;
} zt_chat_method;

/* The method called name[0..n), or NULL when the subset has none by that name. */
const zt_chat_method *zt_chat_method_find(const char *name, size_t n);
/* v.name(args) as Python computes it, into *out (new strings in r's arena). False on failure,
 * with Python's or jinja2's message in why ("'list object' has no attribute 'strip'", ...). */
bool zt_chat_method_call(render *r, const zt_chat_method *m, val v, const val *args, int nargs,
                         val *out, char why[256]);

/* Evaluates the expression of node d in render r, or only checks it when r is NULL (every
 * construct is parsed, nothing is looked up); *st is the outcome, naming the template and the
 * offset. */
val zt_chat_eval(const zt_chat_template *t, render *r, const node *d, zt_status *st);

/* A for tag's source is "ITER [if TEST]", as jinja2 reads it (ITER stops before an "if", which
 * starts the loop filter): cuts d's expression to ITER and points d->test at TEST. A "recursive"
 * loop is refused by name. */
zt_status zt_chat_split_for(const zt_chat_template *t, node *d);

#endif
