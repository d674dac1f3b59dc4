/* Chat templates: a conversation rendered into a model's prompt text with the Jinja template of
 * its tokenizer_config.json, as transformers' apply_chat_template renders it (jinja2 with
 * trim_blocks and lstrip_blocks; see docs/fine-tuning.md for the subset).
 *
 * The subset is what the published Llama 2, Llama 3, Mistral and Qwen2 templates use: text,
 * {{ expression }}, {% set %}, {% if %}/{% elif %}/{% else %}, {% for x in list %} with loop.index0,
 * loop.index, loop.revindex(0), loop.first, loop.last, loop.length, loop.depth(0),
 * loop.previtem and loop.nextitem, comments, whitespace control ("-", "+"); expressions over
 * strings, integers, booleans, none, lists and objects: literals (strings with Python's
 * escapes), variables, x.attr, x['key'], x[i], slices x[a:b], + - * // % ~, comparisons, in,
 * and/or/not, the tests "is [not] defined/none/string", the filters trim and length, the methods
 * strip, lstrip and rstrip, and raise_exception(message), which fails the render with that
 * message. Anything else (macros, other filters, inline if, namespaces, "/", \N{} escapes,
 * nesting deeper than 64, ...) is refused when the template is parsed, naming
 * the construct and its offset, even in a branch the conversation would not take.
 *
 * Within the subset a render is jinja2's (transformers' ImmutableSandboxedEnvironment): values
 * compare by value, lengths count code points, "~" joins values as text, strip and trim and the
 * whitespace controls remove Python's Unicode whitespace, CRLF and CR read as "\n", and an
 * undefined variable or key prints as nothing but fails the render with jinja2's message when
 * used (an attribute of it, "+", "-"). Integers are 64-bit: a result past that, and division by
 * zero, fail the render by name, as does printing or computing with a conversation's
 * non-integral number. Offsets in messages count bytes of the text as given.
 *
 * Variables: messages (the conversation, a list of {"role", "content"} objects), bos_token,
 * eos_token (each undefined when the tokenizer has none, as in transformers) and
 * add_generation_prompt. */
#ifndef ZTRAIN_CHAT_TEMPLATE_H
#define ZTRAIN_CHAT_TEMPLATE_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "ztrain/status.h"

typedef struct zt_chat_template zt_chat_template;

/* Parses and checks template text. source names it in messages ("tokenizer_config.json");
 * bos and eos are the bos_token and eos_token strings (NULL: the variable is undefined, as
 * transformers leaves a token the tokenizer lacks). *out is the caller's to destroy. */
zt_status zt_chat_template_parse(const char *text, const char *source, const char *bos,
                                 const char *eos, zt_chat_template **out);

/* Reads tokenizer_config.json: "chat_template" (a string; a list of named templates is refused
 * unless it has one named "default", which is taken), "bos_token" and "eos_token" (strings or
 * {"content": ...} objects). */
zt_status zt_chat_template_load(const char *tokenizer_config, zt_chat_template **out);
void zt_chat_template_destroy(zt_chat_template *t);

/* The eos_token the template was given ("" when none), which ends an assistant's reply. */
const char *zt_chat_template_eos(const zt_chat_template *t);

/* Renders messages (a JSON array of objects) into a heap string the caller frees. An error names
 * the source and what failed (a raise_exception's message, a missing key, a type). */
zt_status zt_chat_template_render(const zt_chat_template *t, const cJSON *messages,
                                  bool add_generation_prompt, char **out);

#endif
