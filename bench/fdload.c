/* fdload: a process load for the scan benchmark.
 *
 * fdload NPROCS TOTAL_FDS DIR
 *   Opens a pool of descriptors (regular files under DIR, pipes, unix socket pairs,
 *   /dev/null, eventfds), then forks NPROCS children; child i keeps its own share of the
 *   pool (a skewed distribution: most processes hold a few dozen fds, a few hold hundreds,
 *   as on an inference host) and sleeps. Total open fds across children ~= TOTAL_FDS.
 *   Prints "ready PID_COUNT FD_COUNT" on stdout once every child is asleep.
 *   Every child dies with its parent (PR_SET_PDEATHSIG), and the parent dies with whoever
 *   started it, so no load outlives the benchmark. All share one process group.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define POOL_MAX 4000

static int pool[POOL_MAX];
static int pool_n;

static void add(int fd)
{
    if (fd >= 0 && pool_n < POOL_MAX)
        pool[pool_n++] = fd;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: fdload NPROCS TOTAL_FDS DIR\n");
        return 2;
    }
    int nprocs = atoi(argv[1]);
    long total = atol(argv[2]);
    const char *dir = argv[3];
    if (nprocs < 1 || nprocs > 30000 || total < nprocs) {
        fprintf(stderr, "fdload: bad NPROCS/TOTAL_FDS\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        return 1;
    struct rlimit rl = {POOL_MAX + 64, POOL_MAX + 64};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < POOL_MAX + 64) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
    }

    /* Per-process quotas: 97% of processes share 55% of the fds (a few dozen each),
     * 3% share the rest (hundreds each). */
    long *quota = calloc(nprocs, sizeof(long));
    int heavy = nprocs / 33 > 0 ? nprocs / 33 : 1;
    long light_total = total * 55 / 100, heavy_total = total - light_total;
    int light = nprocs - heavy;
    long sum = 0, maxq = 0;
    for (int i = 0; i < nprocs; i++) {
        int is_heavy = (i % 33) == 32 && heavy > 0;
        long q;
        if (light <= 0 || is_heavy)
            q = heavy_total / heavy;
        else {
            long avg = light_total / light;       /* spread avg/2 .. 3avg/2 */
            q = avg / 2 + (i * 7919L) % (avg + 1);
        }
        if (q < 4) q = 4;
        quota[i] = q;
        sum += q;
    }
    for (int i = 0; i < nprocs; i++) if (quota[i] > maxq) maxq = quota[i];
    if (maxq + 3 > POOL_MAX) maxq = POOL_MAX - 3;

    /* The pool: a mix of the kinds of descriptors servers hold. */
    char path[4096];
    int files = 0;
    while (pool_n + 3 < maxq) {
        int kind = pool_n % 5;
        if (kind == 0) {
            snprintf(path, sizeof(path), "%s/f%04d.dat", dir, files++ % 200);
            add(open(path, O_RDWR | O_CREAT, 0600));
        } else if (kind == 1) {
            int p[2];
            if (pipe(p) == 0) { add(p[0]); add(p[1]); }
        } else if (kind == 2) {
            int s[2];
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0) { add(s[0]); add(s[1]); }
        } else if (kind == 3) {
            add(open("/dev/null", O_RDONLY));
        } else {
            add(eventfd(0, 0));
        }
        if (pool_n == 0 && errno) { perror("fdload: open"); return 1; }
    }

    int null = open("/dev/null", O_RDWR);
    long fds = 0;
    int started = 0;
    for (int i = 0; i < nprocs; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fdload: fork");
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
            long keep = quota[i] - 3;
            for (int k = keep; k < pool_n; k++)
                close(pool[k]);
            if (null > 2)
                close(null);
            for (;;)
                pause();
        }
        started++;
        fds += 3 + (quota[i] - 3 < pool_n ? quota[i] - 3 : pool_n);
    }
    printf("ready %d %ld\n", started, fds);
    fflush(stdout);
    /* Parent: close the pool (it is not part of the load), then wait to be killed. */
    for (int k = 0; k < pool_n; k++)
        close(pool[k]);
    for (;;) {
        int st;
        if (waitpid(-1, &st, 0) < 0 && errno == ECHILD)
            pause();
    }
}
