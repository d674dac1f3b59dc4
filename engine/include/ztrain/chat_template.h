/* Chat templates: a conversation rendered into a model's prompt text with the Jinja template of
 * its tokenizer_config.json, as transformers' apply_chat_template renders it (jinja2 with
 * trim_blocks and lstrip_blocks; see docs/fine-tuning.md for the subset).
 *
 * The subset is what the published Llama 2, Llama 3, Llama 3.1/3.2/3.3, Mistral v0.2 and v0.3,
 * Mistral Small 3.1, Qwen2, Qwen2.5, Qwen3, Gemma 2 and 3, Phi-3, DeepSeek-R1-Distill and Zephyr
 * templates use: text,
 * {{ expression }}, {% set x = ... %}, {% set ns.x = ... %} on a namespace(...),
 * {% if %}/{% elif %}/{% else %}, transformers' {% generation %} ... {% endgeneration %} (see
 * zt_chat_template_render; one may not hold another, nor a break or continue outside a for
 * of its own, as jinja2 compiles its body into a function),
 * {% for x in y [if filter] %} (or "for a, b in", unpacking) ... [{% else %}] over a list, an
 * object's keys or a string's code points, {% break %} and {% continue %}, with loop.index0,
 * loop.index, loop.revindex(0), loop.first, loop.last, loop.length, loop.depth(0),
 * loop.previtem, loop.nextitem and loop.cycle(...), comments, whitespace control ("-", "+");
 * expressions over strings, integers, booleans, none, lists and objects: literals (strings with
 * Python's escapes, [lists], (tuples, as lists), {"dicts": ...}), variables, x.attr, x['key'],
 * x[i] and slices x[a:b:c] of lists and strings, + - * // % ~, unary - and +, chained
 * comparisons, in, and/or/not, inline "a if c else b"; jinja2's tests (defined, none, string,
 * mapping, iterable, sequence, number, boolean, equalto, ...) and the filters trim, length,
 * string, list, items, first, last, upper, lower, capitalize, title (Python's str methods with
 * full Unicode case mapping; title as jinja2's do_title), join, map, select, reject, selectattr,
 * rejectattr and transformers' tojson,
 * with positional and keyword arguments; the methods strip, lstrip and rstrip (chars optional),
 * startswith, endswith, replace, split, upper, lower, capitalize and title (Python's str
 * methods), and dict.get, items, keys and values; raise_exception(message),
 * which fails the render with that message, strftime_now(format) and namespace(name=value).
 * Operators bind as in jinja2's parser (-x|length is (-x)|length). Anything else (macros, other
 * filters, tests or methods, a filter's unknown keyword, "/", \N{} escapes, nesting deeper than
 * 64, ...) is refused when the template is parsed, naming the construct and its offset, even in
 * a branch the conversation would not take.
 *
 * Within the subset a render is jinja2's (transformers' ImmutableSandboxedEnvironment): values
 * compare by value, lengths, subscripts and slices of strings count code points, "~" joins
 * values as text, strip and trim and the whitespace controls remove Python's Unicode whitespace,
 * CRLF and CR read as "\n", and an undefined variable or key prints as nothing but fails the
 * render with jinja2's message when used (an attribute of it, "+", "-"). Integers are 64-bit: a
 * result past that, and division by zero, fail the render by name, as does arithmetic on a
 * conversation's float (a number written with a fraction or an exponent, as Python's json reads
 * it when the tree comes from zt_json_parse or is marked by zt_json_mark_floats; it prints, and
 * tojson writes it, as Python's repr) and on a conversation's integer past 64 bits (exact from
 * the same trees' digits, zt_json_int_digits: it prints, goes through tojson and compares as in
 * Python). Offsets in messages count bytes of the text as given.
 *
 * Variables, as apply_chat_template(messages, tools=tools, documents=documents, **kwargs) passes
 * them (kwargs: zt_chat_args):
 * messages (the conversation: a list of objects, each passed as it is, nested objects, numbers,
 * booleans and nulls included, so `message.tool_calls is defined`, `message.content is none` and
 * `tool_call.arguments | tojson` read as in jinja2), add_generation_prompt, tools and documents
 * (lists of objects, or none), the functions raise_exception and strftime_now, and the special
 * tokens (zt_chat_template_parse). */
#ifndef ZTRAIN_CHAT_TEMPLATE_H
#define ZTRAIN_CHAT_TEMPLATE_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "ztrain/status.h"

typedef struct zt_chat_template zt_chat_template;

/* Parses and checks template text. source names it in messages ("tokenizer_config.json").
 * specials (NULL: none) is an object whose special tokens become variables as transformers'
 * special_tokens_map passes them: bos_token, eos_token, unk_token, sep_token, pad_token,
 * cls_token and mask_token as text (each a string or an AddedToken object {"content": ...}),
 * additional_special_tokens as a list of them; a token that is missing, null or "" (or an empty
 * list) leaves its variable undefined. It is taken as it is: zt_tokenizer_special_tokens_map
 * gives the object a directory's tokenizer resolves (class defaults and special_tokens_map.json
 * included), which zt_chat_template_load passes; a tokenizer_config.json object alone lacks
 * them. The template keeps no pointer into specials. *out is the caller's to destroy. */
zt_status zt_chat_template_parse(const char *text, const char *source, const cJSON *specials,
                                 zt_chat_template **out);

/* Reads tokenizer_config.json: "chat_template" (a string, or a list of {"name", "template"}
 * objects of which "default" and "tool_use" are read, as get_chat_template picks them: see
 * zt_chat_template_render), and gives the templates the special tokens that
 * AutoTokenizer.from_pretrained of its directory holds (zt_tokenizer_special_tokens_map: the
 * config's keys, special_tokens_map.json's where the config has no "added_tokens_decoder", and
 * the defaults of the tokenizer class the config or the config.json beside it names, so a
 * Llama directory without "bos_token" renders {{ bos_token }} as "<s>"). A tokenizer class
 * ztrain does not know is refused by name, as zt_tokenizer_load refuses it. */
zt_status zt_chat_template_load(const char *tokenizer_config, zt_chat_template **out);
void zt_chat_template_destroy(zt_chat_template *t);

/* The eos_token the template was given ("" when none), which ends an assistant's reply. */
const char *zt_chat_template_eos(const zt_chat_template *t);

/* The byte spans of a render that its {% generation %} blocks wrote, [start[k], end[k]) in
 * the order the blocks ended. Zero it before the render; zt_chat_spans_free frees it. */
typedef struct {
    size_t *start, *end;
    size_t n, cap;
} zt_chat_spans;
void zt_chat_spans_free(zt_chat_spans *s);

/* What apply_chat_template is given beside the messages: tools and documents (JSON lists of
 * objects, or NULL or a JSON null for none), add_generation_prompt, and kwargs (NULL, a JSON
 * null, or an object): its extra keyword arguments, each key a variable of the template, as
 * apply_chat_template(messages, tools=..., documents=..., add_generation_prompt=..., **kwargs)
 * passes them (a key overrides a special token's variable and the functions raise_exception and
 * strftime_now, as a render's arguments shadow jinja2's globals). kwargs' "tools" and
 * "documents" replace the fields above, as TRL merges a dataset row's chat_template_kwargs over
 * the row's tools; "messages" and "add_generation_prompt" are refused by name (Python raises
 * "got multiple values for keyword argument"), as is each of apply_chat_template's own arguments
 * (conversation, chat_template, continue_final_message, tokenize, padding, truncation,
 * max_length, return_tensors, return_dict, return_assistant_tokens_mask, tokenizer_kwargs), which
 * would change the call instead of reaching the template. */
typedef struct {
    const cJSON *tools, *documents;
    bool add_generation_prompt;
    const cJSON *kwargs;
} zt_chat_args;

/* Renders messages (a JSON array of objects) with a's arguments into a heap string the caller
 * frees. The tools and documents it is given (a's kwargs over its fields) must be lists of
 * objects, or none; anything else is refused with apply_chat_template's message. From a list of
 * named templates the "tool_use" one renders when tools are given (an empty list counts), else
 * "default"; with neither the render fails with transformers' message, naming the templates. An
 * error names the source and what failed (a raise_exception's message, a missing key, a type).
 *
 * When spans is not NULL, the spans the {% generation %} blocks wrote are appended to it as
 * transformers' AssistantTracker records them for apply_chat_template(...,
 * return_assistant_tokens_mask=True): each block's whole output, empty ones included, except a
 * block reached before the template output anything (the tracker is not yet active then:
 * transformers 4.46 records no span for it). */
zt_status zt_chat_template_render(const zt_chat_template *t, const cJSON *messages,
                                  const zt_chat_args *a, char **out, zt_chat_spans *spans);

/* Whether the template a render with a's arguments picks holds a {% generation %} block; with a
 * NULL, whether any of a list of named templates does. */
bool zt_chat_template_has_generation(const zt_chat_template *t, const zt_chat_args *a);

/* A conversation as a line of chat data holds it (TRL's format): its messages, and the tools,
 * documents and chat_template_kwargs that go beside them (add_generation_prompt is the
 * caller's). Pointers into the JSON it was split from. */
typedef struct {
    const cJSON *messages;
    zt_chat_args args;
} zt_chat_conversation;

/* Splits v: a list of messages, or an object holding one under key (NULL: "messages") beside
 * "tools", "documents" and "chat_template_kwargs". Checks nothing: a render refuses what
 * apply_chat_template refuses (zt_chat_template_render), zt_chat_conversation_check what chat
 * data may not hold. */
void zt_chat_conversation_split(const cJSON *v, const char *key, zt_chat_conversation *out);

/* The rules of chat data, which a render alone would let through or fail on later with a
 * message that does not name the line: messages a non-empty list of objects, each with a string
 * "role" and a "content" that is a string or a list of text parts ({"type": "text", "text":
 * "..."}; an image, video or audio part is refused: a text model has no tokens for it), which
 * an assistant message with a non-empty "tool_calls" list of objects may leave null or out;
 * "tools" and "documents" lists of objects (or null or absent); "chat_template_kwargs" an object
 * (or null or absent) whose tools and documents follow the same rule. Every other key goes to
 * the template as it is. where ("FILE:LINE", or a file) and key (the messages' key) name the
 * place in messages. */
zt_status zt_chat_conversation_check(const zt_chat_conversation *c, const char *key,
                                     const char *where);

#endif
