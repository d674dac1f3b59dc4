/* The tokenizer's hash tables: the vocabulary (bytes -> id), the merges ((id, id) -> rank and
 * merged id) and the pre-token cache. Open addressing with linear probing, sized once from the
 * number of keys, so a lookup on the encoding path never allocates. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* FNV-1a: short keys (tokens and pre-tokens are a few bytes) make a simple byte hash the fastest. */
uint32_t tok_hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static size_t table_size(size_t capacity) {
    size_t size = 16;
    while (size < 2 * capacity + 1)
        size *= 2;
    return size;
}

bool tok_strmap_init(tok_strmap *m, size_t capacity) {
    size_t size = table_size(capacity);
    m->slots = calloc(size, sizeof *m->slots);
    m->mask = size - 1;
    m->n = 0;
    return m->slots != NULL;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

bool tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t val) {
    uint32_t h = tok_hash_bytes(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        tok_slot *s = &m->slots[i];
        if (!s->key) {
            if (2 * (m->n + 1) > m->mask + 1)
                return false;
            *s = (tok_slot){key, len, h, val};
            m->n++;
            return true;
        }
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return true;
        }
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, uint32_t len) {
    uint32_t h = tok_hash_bytes(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const tok_slot *s = &m->slots[i];
        if (!s->key)
            return -1;
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0)
            return s->val;
    }
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static size_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}

bool tok_pairmap_init(tok_pairmap *m, size_t capacity) {
    size_t size = table_size(capacity);
    m->slots = calloc(size, sizeof *m->slots);
    m->mask = size - 1;
    return m->slots != NULL;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t k = pair_key(a, b);
    for (size_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == k) {
            m->slots[i].rank = rank;
            m->slots[i].id = id;
            return;
        }
        if (m->slots[i].key == 0) {
            m->slots[i] = (tok_pair){k, rank, id};
            return;
        }
    }
}

const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    for (size_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == k)
            return &m->slots[i];
        if (m->slots[i].key == 0)
            return NULL;
    }
}
