#include "fg_json.h"

#include <stdlib.h>
#include <string.h>

struct parser { const char *p; int depth; };

static struct fg_json *parse_value(struct parser *ps);

static void skip_ws(struct parser *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

static struct fg_json *new_node(enum fg_json_type type)
{
    struct fg_json *n = calloc(1, sizeof(*n));
    if (n)
        n->type = type;
    return n;
}

/* Strings in our config are ASCII; \uXXXX beyond ASCII is kept as '?'. */
static char *parse_string(struct parser *ps)
{
    if (*ps->p != '"')
        return NULL;
    ps->p++;
    size_t cap = 32, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    while (*ps->p && *ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\') {
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *ps->p++;
                    v <<= 4;
                    if (h >= '0' && h <= '9') v |= (unsigned)(h - '0');
                    else if (h >= 'a' && h <= 'f') v |= (unsigned)(h - 'a' + 10);
                    else if (h >= 'A' && h <= 'F') v |= (unsigned)(h - 'A' + 10);
                    else { free(out); return NULL; }
                }
                c = v < 128 ? (char)v : '?';
                break;
            }
            case '"': case '\\': case '/': c = e; break;
            default: free(out); return NULL;
            }
        }
        if (len + 2 > cap) {
            cap *= 2;
            char *bigger = realloc(out, cap);
            if (!bigger) { free(out); return NULL; }
            out = bigger;
        }
        out[len++] = c;
    }
    if (*ps->p != '"') { free(out); return NULL; }
    ps->p++;
    out[len] = '\0';
    return out;
}

static struct fg_json *parse_container(struct parser *ps, int is_obj)
{
    struct fg_json *node = new_node(is_obj ? FG_JOBJ : FG_JARR);
    struct fg_json **tail = node ? &node->child : NULL;
    char close = is_obj ? '}' : ']';
    if (!node || ++ps->depth > 32)
        goto fail;
    ps->p++;
    skip_ws(ps);
    if (*ps->p == close) { ps->p++; ps->depth--; return node; }
    for (;;) {
        char *key = NULL;
        skip_ws(ps);
        if (is_obj) {
            key = parse_string(ps);
            if (!key) goto fail;
            skip_ws(ps);
            if (*ps->p != ':') { free(key); goto fail; }
            ps->p++;
        }
        struct fg_json *item = parse_value(ps);
        if (!item) { free(key); goto fail; }
        item->key = key;
        *tail = item;
        tail = &item->next;
        skip_ws(ps);
        if (*ps->p == ',') { ps->p++; continue; }
        if (*ps->p == close) { ps->p++; ps->depth--; return node; }
        goto fail;
    }
fail:
    fg_json_free(node);
    return NULL;
}

static struct fg_json *parse_value(struct parser *ps)
{
    skip_ws(ps);
    char c = *ps->p;
    if (c == '{' || c == '[')
        return parse_container(ps, c == '{');
    if (c == '"') {
        char *s = parse_string(ps);
        struct fg_json *n = s ? new_node(FG_JSTR) : NULL;
        if (!n) { free(s); return NULL; }
        n->str = s;
        return n;
    }
    if (!strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
        struct fg_json *n = new_node(FG_JBOOL);
        if (!n) return NULL;
        n->num = (c == 't');
        ps->p += (c == 't') ? 4 : 5;
        return n;
    }
    if (!strncmp(ps->p, "null", 4)) {
        ps->p += 4;
        return new_node(FG_JNULL);
    }
    char *end;
    double v = strtod(ps->p, &end);
    if (end == ps->p)
        return NULL;
    ps->p = end;
    struct fg_json *n = new_node(FG_JNUM);
    if (n) n->num = v;
    return n;
}

struct fg_json *fg_json_parse(const char *text)
{
    struct parser ps = { text, 0 };
    struct fg_json *root = parse_value(&ps);
    skip_ws(&ps);
    if (root && *ps.p) {
        fg_json_free(root);
        return NULL;
    }
    return root;
}

void fg_json_free(struct fg_json *node)
{
    while (node) {
        struct fg_json *next = node->next;
        fg_json_free(node->child);
        free(node->str);
        free(node->key);
        free(node);
        node = next;
    }
}

const struct fg_json *fg_json_get(const struct fg_json *obj, const char *key)
{
    if (!obj || obj->type != FG_JOBJ)
        return NULL;
    for (const struct fg_json *m = obj->child; m; m = m->next)
        if (m->key && !strcmp(m->key, key))
            return m;
    return NULL;
}
