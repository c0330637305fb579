#define _GNU_SOURCE
#include "fg_alloc.h"
#include "fg_config.h"
#include "fg_dev.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct entry {
    char nonce[64];
    long long offset;
    struct fg_alloc a;
};

/* Parsed registry, reused while the directory is unchanged: a burst of queries over
 * 8 GPUs then costs one stat plus one lock test per allocation, and never a /proc scan. */
static struct entry *cache;
static int cache_len, cache_cap, cache_valid;
static struct timespec cache_mtime;
static char cache_dir[4096];

static long long now_ms(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

unsigned long long fg_self_pidns(void)
{
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
    if (n <= 0)
        return 0;
    link[n] = '\0';
    unsigned long long ino = 0;
    return sscanf(link, "pid:[%llu]", &ino) == 1 ? ino : 0;
}

static int parse_entry(const char *dir, const char *name, struct entry *e)
{
    char path[4096], buf[512];
    if (strlen(name) >= sizeof(e->nonce))
        return -1;
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (got <= 0)
        return -1;
    buf[got] = '\0';
    int have = 0;
    memset(e, 0, sizeof(*e));
    memcpy(e->nonce, name, strlen(name) + 1);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        unsigned long long v;
        long long off;
        if (sscanf(line, "minor=%llu", &v) == 1) { e->a.minor = (unsigned)v; have |= 1; }
        else if (sscanf(line, "offset=%lld", &off) == 1) { e->offset = off; have |= 2; }
        else if (sscanf(line, "mib=%llu", &v) == 1) { e->a.mib = v; have |= 4; }
        else if (sscanf(line, "pid=%llu", &v) == 1) { e->a.pid = (unsigned)v; have |= 8; }
        else if (sscanf(line, "pidns=%llu", &v) == 1) { e->a.pidns = v; have |= 16; }
        else if (sscanf(line, "peer=%llu", &v) == 1) { e->a.peer = v != 0; }
    }
    return have == 31 ? 0 : -1;
}

static int reload_cache(const char *dir)
{
    struct stat st;
    if (stat(dir, &st))
        return errno == ENOENT ? (cache_len = 0, cache_valid = 0, 0) : -1;
    if (cache_valid && !strcmp(dir, cache_dir) &&
        st.st_mtim.tv_sec == cache_mtime.tv_sec && st.st_mtim.tv_nsec == cache_mtime.tv_nsec)
        return 0;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    cache_len = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')            /* ".", "..", and ".tmp-*" being written */
            continue;
        if (cache_len == cache_cap) {
            int cap = cache_cap ? cache_cap * 2 : 64;
            struct entry *bigger = realloc(cache, (size_t)cap * sizeof(*cache));
            if (!bigger) { closedir(d); cache_valid = 0; return -1; }
            cache = bigger;
            cache_cap = cap;
        }
        if (parse_entry(dir, de->d_name, &cache[cache_len]) == 0)
            cache_len++;
    }
    closedir(d);
    snprintf(cache_dir, sizeof(cache_dir), "%s", dir);
    cache_mtime = st.st_mtim;
    /* A change within the same clock tick keeps the mtime; trust the cache only when the
     * directory was already older than that when we read it. */
    cache_valid = now_ms(CLOCK_REALTIME) -
                  ((long long)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000) > 50;
    return 0;
}

static int lock_alive(const struct entry *e)
{
    int fd = fg_dev_fd(e->a.minor);
    if (fd < 0)
        return 1;                            /* cannot tell: keep the memory counted */
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = e->offset,
                        .l_len = 1, .l_pid = 0 };
    if (fcntl(fd, F_OFD_GETLK, &fl))
        return 1;                            /* cannot tell: keep the memory counted */
    return fl.l_type != F_UNLCK;
}

/* When did this allocation first look dead? Recorded once, by whichever reader saw it
 * first: link() of a fully written file is atomic and fails if another reader won. */
static long long dead_since(const char *nonce, long long now)
{
    char path[4096], tmp[4096], buf[32];
    if (fg_path(path, sizeof(path), "var/lib/fakegpu/dead/%s", nonce))
        return now;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (fg_path(tmp, sizeof(tmp), "var/lib/fakegpu/dead/.tmp-%s-%d", nonce, getpid()))
            return now;
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            return now;
        int len = snprintf(buf, sizeof(buf), "%lld\n", now);
        int ok = write(fd, buf, (size_t)len) == len;
        close(fd);
        if (ok && link(tmp, path) == 0) {
            unlink(tmp);
            return now;
        }
        unlink(tmp);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return now;
    }
    ssize_t got = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    long long t = now;
    if (got > 0) {
        buf[got] = '\0';
        sscanf(buf, "%lld", &t);
    }
    return t;
}

static void forget(const char *dir, const char *nonce)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/%s", dir, nonce) < (int)sizeof(path))
        unlink(path);
    if (!fg_path(path, sizeof(path), "var/lib/fakegpu/dead/%s", nonce))
        unlink(path);
}

int fg_alloc_collect(long long lag_ms, struct fg_alloc *out, int max)
{
    char dir[4096];
    if (fg_path(dir, sizeof(dir), "var/lib/fakegpu/alloc") || reload_cache(dir))
        return -1;
    int n = 0;
    long long now = -1;
    for (int i = 0; i < cache_len; i++) {
        const struct entry *e = &cache[i];
        if (!lock_alive(e)) {
            if (now < 0)
                now = now_ms(CLOCK_MONOTONIC);   /* one clock for all processes on a host */
            if (lag_ms <= 0 || now - dead_since(e->nonce, now) >= lag_ms) {
                forget(dir, e->nonce);
                continue;
            }
        }
        if (n < max)
            out[n] = e->a;
        n++;
    }
    return n;
}
