/* The chat templates' expressions, in three files (internal to engine/chat): chat_expr.c reads
 * an expression (its scanner and jinja2's grammar, one recursive-descent parser) and calls
 * chat_ops.c (variables, attributes, subscripts and slices, the operators) and chat_filters.c
 * (filters, tests, functions) for what each construct computes on the values it has read. Calls
 * go one way, from the reader to the operations; chat_template.c reaches both through
 * zt_chat_eval and zt_chat_split_for (chat_template_internal.h). */
#ifndef ZTRAIN_DATA_CHAT_EXPR_INTERNAL_H
#define ZTRAIN_DATA_CHAT_EXPR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "chat_template_internal.h"

/* An expression being read: p moves over its source [base, end) in the template t. With a
 * render r the expression is evaluated; with r NULL it is only checked (at parse time, and on
 * the side of an and/or or a comparison chain that is not taken): every operation then returns
 * its left operand as it is and looks nothing up, but still refuses what the subset lacks by
 * name (a filter, a test, a loop attribute). */
typedef struct {
    const char *p, *end, *base;
    render *r;
    const zt_chat_template *t;
    size_t offset;   /* of the expression's source (base) in t->src */
    zt_status st;    /* the first failure; once set, every later one is ignored */
    int depth;       /* nesting, up to ZT_CHAT_MAX_NESTING */
} ex;

/* ---- the reader's pieces the operations use (chat_expr.c) -------------------------------- */

/* Records the first failure in e->st, naming the template and the offset p has reached, and
 * ends the reading (p moves to the end). Returns undefined, so an operation can return it. */
val zt_chat_fail(ex *e, zt_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Whether name[0..n) is the word w. */
bool zt_chat_is_name(const char *name, size_t n, const char *w);

/* ---- operations (chat_ops.c) ------------------------------------------------------------- */

/* Each takes its operands already evaluated, and fails through zt_chat_fail, which points the
 * message at where the reader is. New strings live in e->r's arena. */

/* An undefined value carrying jinja2's message for when it is used (printf-style). */
val zt_chat_undefined(ex *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Using the undefined v where jinja2's Undefined raises: fails with UndefinedError's message. */
val zt_chat_undefined_error(ex *e, val v);
/* The variable name[0..n), the innermost binding first; undefined when there is none. Only in a
 * render (e->r not NULL). */
val zt_chat_lookup(ex *e, const char *name, size_t n);
/* x.name: an object's key, or the loop variable's attribute (in a check, only whether the name
 * is one); anything else has no such attribute (undefined), and an attribute of undefined
 * raises, as in jinja2. */
val zt_chat_attribute(ex *e, val v, const char *name, size_t n);
/* x[key] as jinja2's getitem: an object's key, a list's item, a string's code point (a negative
 * index counts from the end). Anything else is undefined with jinja2's message (its getitem
 * swallows Python's TypeError and LookupError); only a subscript of undefined raises. */
val zt_chat_subscript(ex *e, val v, val key);
/* x[a:b:c] as Python slices a list, or a string by code points; an omitted part is none. A
 * bound that is not an integer or none, or a value that is neither, gives jinja2's undefined; a
 * step of 0 raises. */
val zt_chat_slice(ex *e, val v, val a, val b, val c);
/* One argument of a call: positional (kw NULL) or kw=v. */
typedef struct {
    val v;
    const char *kw;
    size_t kw_len;
} zt_chat_arg;

/* The most arguments a call may pass. */
#define ZT_CHAT_MAX_ARGS 8

/* The filters and tests (chat_filters.c). */

/* v|name(args), as jinja2's filter (transformers' own for tojson): trim, length, string, list,
 * items, join, first, last, upper, lower, capitalize, title, map, select, reject, selectattr,
 * rejectattr, tojson. An unknown filter, an unknown keyword or too many
 * arguments is refused by name, in a check too. */
val zt_chat_filter(ex *e, val v, const char *name, size_t n, const zt_chat_arg *args,
                   int nargs);
/* v is [not] name(args), as jinja2's test: defined, undefined, none, string, mapping, iterable,
 * sequence, number, integer, float, boolean, true, false, equalto (eq, ==), ne (!=), in. */
val zt_chat_test(ex *e, val v, const char *name, size_t n, const zt_chat_arg *args, int nargs,
                 bool negated);
/* Whether the test name exists and takes nargs arguments; false after zt_chat_fail. */
bool zt_chat_test_check(ex *e, const char *name, size_t n, int nargs);
/* name(args), a function apply_chat_template passes: strftime_now(format), the local time as
 * Python's datetime.now().strftime gives it, and jinja2's namespace(name=value, ...). */
val zt_chat_call(ex *e, const char *name, size_t n, const zt_chat_arg *args, int nargs);

/* Unary '-' and '+' (o) of a number, as Python's; anything else raises TypeError. */
val zt_chat_sign(ex *e, char o, val v);
/* Integer arithmetic o ("+", "-", "*", "//", "%") with Python's floor division and modulo (bools
 * are 1 and 0); a result beyond 64 bits is refused by name. */
val zt_chat_arith(ex *e, const char *o, val a, val b);
/* '*': integers multiply, and a string times an integer repeats, as in Python. */
val zt_chat_times(ex *e, val a, val b);
/* '+': integers add, strings and lists join, as in Python. */
val zt_chat_plus(ex *e, val a, val b);
/* '~': both sides as text (zt_chat_text), undefined as nothing. */
val zt_chat_tilde(ex *e, val a, val b);
/* a o b for one comparison o of a chain: "==", "!=" (Python's ==), "<", "<=", ">", ">=" (two
 * numbers, or two strings in code point order), "in", "not in" (a substring, a list's item, an
 * object's key). */
bool zt_chat_compare(ex *e, const char *o, val a, val b);

#endif
