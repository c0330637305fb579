/* Minimal JSON reader for the stand-in's own config file (no external deps). */
#ifndef FG_JSON_H
#define FG_JSON_H

enum fg_json_type { FG_JNULL, FG_JBOOL, FG_JNUM, FG_JSTR, FG_JARR, FG_JOBJ };

struct fg_json {
    enum fg_json_type type;
    double num;                 /* FG_JNUM, FG_JBOOL (0/1) */
    char *str;                  /* FG_JSTR */
    char *key;                  /* set when this node is an object member */
    struct fg_json *child;      /* first element / member */
    struct fg_json *next;       /* next sibling */
};

/* Parses text; returns NULL on malformed input. Free with fg_json_free. */
struct fg_json *fg_json_parse(const char *text);
void fg_json_free(struct fg_json *node);
const struct fg_json *fg_json_get(const struct fg_json *obj, const char *key);

#endif
