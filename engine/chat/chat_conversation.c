/* Chat data's conversations (ztrain/chat_template.h): a line split into its messages and what
 * goes beside them, and the rules TRL's format holds them to, checked before any render so that
 * a bad line is refused naming the line, the message and the field. */
#include <string.h>

#include "ztrain/chat_template.h"

void zt_chat_conversation_split(const cJSON *v, const char *key, zt_chat_conversation *out) {
    memset(out, 0, sizeof *out);
    out->messages = v;
    if (!cJSON_IsObject(v))
        return;
    out->messages = cJSON_GetObjectItemCaseSensitive(v, key ? key : "messages");
    out->args.tools = cJSON_GetObjectItemCaseSensitive(v, "tools");
    out->args.documents = cJSON_GetObjectItemCaseSensitive(v, "documents");
    /* apply_chat_template's extra keyword arguments (Qwen3's enable_thinking, ...), TRL's
     * column of them */
    out->args.kwargs = cJSON_GetObjectItemCaseSensitive(v, "chat_template_kwargs");
}

static const char *json_type(const cJSON *v) {
    return cJSON_IsNull(v) ? "null" : cJSON_IsBool(v) ? "a boolean" : cJSON_IsNumber(v)
           ? "a number" : cJSON_IsString(v) ? "a string" : cJSON_IsArray(v) ? "a list"
           : "an object";
}

/* "tools" or "documents" of a line: absent, null, or a list of objects. */
static zt_status check_objects(const cJSON *v, const char *key, const char *where) {
    const cJSON *e;
    if (!v || cJSON_IsNull(v))
        return ZT_OK;
    if (!cJSON_IsArray(v))
        return zt_error(ZT_ERR_FORMAT, "%s: \"%s\" is %s, not a list of objects", where, key,
                        json_type(v));
    int k = 0;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsObject(e))
            return zt_error(ZT_ERR_FORMAT, "%s: \"%s\"[%d] is %s, not an object (a tool is "
                            "the JSON schema of a function; a document an object with \"title\" "
                            "and \"text\")", where, key, k, json_type(e));
        k++;
    }
    return ZT_OK;
}

/* Part i of message k's content list, as transformers and TRL pass one: an object whose "type"
 * is "text" with a string "text" (any other key it holds goes to the template with it). ztrain
 * trains text models, so an image, video or audio part is refused: the template would write its
 * placeholder (Gemma 3's <start_of_image>, Mistral's [IMG]) with nothing behind it. */
static zt_status check_part(const cJSON *part, int k, int i, const char *role,
                            const char *where) {
    if (!cJSON_IsObject(part))
        return zt_error(ZT_ERR_FORMAT, "%s: message %d (%.40s): \"content\"[%d] is %s, not a "
                        "part object ({\"type\": \"text\", \"text\": \"...\"})", where, k, role,
                        i, json_type(part));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    if (!cJSON_IsString(type))
        return zt_error(ZT_ERR_FORMAT, "%s: message %d (%.40s): \"content\"[%d]: \"type\" is "
                        "%s, not a string (a text part is {\"type\": \"text\", \"text\": "
                        "\"...\"})", where, k, role, i, type ? json_type(type) : "missing");
    const char *t = type->valuestring;
    if (strcmp(t, "text") == 0) {
        if (cJSON_IsString(text))
            return ZT_OK;
        return zt_error(ZT_ERR_FORMAT, "%s: message %d (%.40s): \"content\"[%d] is a text part "
                        "whose \"text\" is %s, not a string", where, k, role, i,
                        text ? json_type(text) : "missing");
    }
    /* "image", "image_url", "input_audio", "video_url", ... */
    static const char *const media[] = {"an image", "a video", "an audio"};
    for (size_t m = 0; m < sizeof media / sizeof media[0]; m++)
        if (strstr(t, strchr(media[m], ' ') + 1))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: message %d (%.40s): \"content\"[%d] is "
                            "%s part (\"type\": \"%.40s\"): ztrain trains text models, which "
                            "have no tokens for it (the template would write its placeholder "
                            "with nothing behind it); keep the text parts only", where, k, role,
                            i, media[m], t);
    return zt_error(ZT_ERR_FORMAT, "%s: message %d (%.40s): \"content\"[%d] has \"type\": "
                    "\"%.40s\", not \"text\" (the only kind of part a text model trains on)",
                    where, k, role, i, t);
}

/* Message k as chat data holds it: an object with a string "role"; a "content" that is a string
 * or a list of text parts (check_part), which an assistant message with "tool_calls" (a list of
 * objects) may leave null or out. Anything else it holds goes to the template as it is, and a
 * content list goes as it is too, for the template to iterate. */
static zt_status check_message(const cJSON *m, int k, const char *key, const char *where) {
    if (!cJSON_IsObject(m))
        return zt_error(ZT_ERR_FORMAT, "%s: \"%s\"[%d] is %s, not a message object", where,
                        key, k, json_type(m));
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *e;
    if (!cJSON_IsString(role))
        return zt_error(ZT_ERR_FORMAT, "%s: message %d: \"role\" is %s, not a string", where,
                        k, role ? json_type(role) : "missing");
    if (calls && !cJSON_IsNull(calls)) {
        if (!cJSON_IsArray(calls))
            return zt_error(ZT_ERR_FORMAT, "%s: message %d: \"tool_calls\" is %s, not a list",
                            where, k, json_type(calls));
        int i = 0;
        cJSON_ArrayForEach(e, calls) {
            if (!cJSON_IsObject(e))
                return zt_error(ZT_ERR_FORMAT, "%s: message %d: \"tool_calls\"[%d] is %s, not "
                                "an object", where, k, i, json_type(e));
            i++;
        }
    }
    if (cJSON_IsArray(content)) {
        int i = 0;
        cJSON_ArrayForEach(e, content)
            ZT_TRY(check_part(e, k, i++, role->valuestring, where));
        return ZT_OK;
    }
    bool may_omit = strcmp(role->valuestring, "assistant") == 0 && cJSON_IsArray(calls) &&
                    cJSON_GetArraySize(calls) > 0;
    if (cJSON_IsString(content) || (may_omit && (!content || cJSON_IsNull(content))))
        return ZT_OK;
    return zt_error(ZT_ERR_FORMAT, "%s: message %d (%.40s): \"content\" is %s, not a string "
                    "or a list of text parts%s", where, k, role->valuestring,
                    content ? json_type(content) : "missing",
                    may_omit ? " or null" : strcmp(role->valuestring, "assistant") == 0
                    ? " (only an assistant message with \"tool_calls\" may leave it null or out)"
                    : "");
}

zt_status zt_chat_conversation_check(const zt_chat_conversation *c, const char *key,
                                     const char *where) {
    key = key ? key : "messages";
    if (!cJSON_IsArray(c->messages))
        return zt_error(ZT_ERR_FORMAT, "%s: no \"%.100s\" list", where, key);
    if (cJSON_GetArraySize(c->messages) == 0)
        return zt_error(ZT_ERR_FORMAT, "%s: \"%.100s\" is an empty list (a conversation needs "
                        "a message)", where, key);
    const cJSON *m;
    int k = 0;
    cJSON_ArrayForEach(m, c->messages)
        ZT_TRY(check_message(m, k++, key, where));
    ZT_TRY(check_objects(c->args.tools, "tools", where));
    ZT_TRY(check_objects(c->args.documents, "documents", where));
    const char *kw_key = "chat_template_kwargs";
    const cJSON *kwargs = c->args.kwargs;
    if (kwargs && !cJSON_IsNull(kwargs) && !cJSON_IsObject(kwargs))
        return zt_error(ZT_ERR_FORMAT, "%s: \"%s\" is %s, not an object of the template's "
                        "keyword arguments", where, kw_key, json_type(kwargs));
    ZT_TRY(check_objects(cJSON_GetObjectItemCaseSensitive(kwargs, "tools"), "tools", where));
    return check_objects(cJSON_GetObjectItemCaseSensitive(kwargs, "documents"), "documents",
                         where);
}
