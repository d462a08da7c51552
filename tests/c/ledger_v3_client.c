/*
 * ledger_v3_client: a process that speaks only the previous release's
 * ledger format (compiled against tests/c/cgpu-previous/cgpu.h, format 3
 * before its additions), keeping books as that release's library does:
 * join under the table lock (find the live container slot by id, or claim
 * a free one with a quota; claim a process slot and hold its liveness
 * lock), then reserve CHUNK bytes with the CAS on the container's `used`
 * against its quota until one is refused.
 *
 * Usage: ledger_v3_client LEDGER ID QUOTA_BYTES CHUNK_BYTES
 * Prints "joined container=C process=P created=0|1", then
 * "reserved granted=B refused_at_used=U quota=Q nprocs=N", then "holding",
 * and waits until killed (at most 60 s). A dead client's slot is reaped by
 * the others (its liveness lock goes with it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cgpu.h"

static int ofd_lock(int fd, off_t start, off_t len, int wait) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    return fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
}

static void ofd_unlock(int fd, off_t start, off_t len) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    fcntl(fd, F_OFD_SETLK, &fl);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

#define LOAD(p) __atomic_load_n(&(p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELEASE)
#define ADD(p, v) __atomic_fetch_add(&(p), (v), __ATOMIC_ACQ_REL)
#define SUB(p, v) __atomic_fetch_sub(&(p), (v), __ATOMIC_ACQ_REL)

static int same_id(const struct cgpu_container *c, const char *id) {
    size_t n = strlen(id);
    char b[CGPU_ID_LEN];
    for (size_t i = 0; i < CGPU_ID_LEN; i++) b[i] = __atomic_load_n(&c->id[i], __ATOMIC_RELAXED);
    return memcmp(b, id, n) == 0 && (n == CGPU_ID_LEN || b[n] == 0);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s LEDGER ID QUOTA_BYTES CHUNK_BYTES\n", argv[0]);
        return 2;
    }
    const char *id = argv[2];
    uint64_t quota = strtoull(argv[3], NULL, 10), chunk = strtoull(argv[4], NULL, 10);
    /* Two descriptions, as the library: one holds the locks, one maps. */
    int fd = open(argv[1], O_RDWR | O_CLOEXEC);
    int mfd = open(argv[1], O_RDWR | O_CLOEXEC);
    if (fd < 0 || mfd < 0) { perror("open"); return 1; }
    struct cgpu_ledger *l = mmap(NULL, sizeof *l, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (l == MAP_FAILED) { perror("mmap"); return 1; }
    if (l->header.magic != CGPU_LEDGER_MAGIC || l->header.version != CGPU_FORMAT_VERSION ||
        l->header.file_size != sizeof *l) {
        fprintf(stderr, "not a format %u ledger\n", CGPU_FORMAT_VERSION);
        return 1;
    }
    if (ofd_lock(fd, CGPU_TABLE_LOCK_START, CGPU_TABLE_LOCK_LEN, 1) != 0) { perror("table lock"); return 1; }
    int c = -1, created = 0;
    for (int i = 0; i < CGPU_MAX_CONTAINERS; i++)
        if (LOAD(l->containers[i].state) == CGPU_SLOT_LIVE && same_id(&l->containers[i], id)) { c = i; break; }
    if (c < 0) {
        for (int i = 0; i < CGPU_MAX_CONTAINERS; i++)
            if (LOAD(l->containers[i].state) == CGPU_SLOT_FREE) { c = i; break; }
        if (c < 0) { fprintf(stderr, "no free container slot\n"); return 1; }
        struct cgpu_container *s = &l->containers[c];
        STORE(s->state, CGPU_SLOT_CLAIMING);
        for (size_t i = 0; i < CGPU_ID_LEN; i++)
            __atomic_store_n(&s->id[i], i < strlen(id) ? id[i] : 0, __ATOMIC_RELAXED);
        STORE(s->created_ns, now_ns());
        STORE(s->quota, quota);
        STORE(s->used, 0);
        STORE(s->peak, 0);
        STORE(s->weight, 1);
        STORE(s->nprocs, 0);
        STORE(s->oom_count, 0);
        STORE(s->suspect, 0);
        STORE(s->recounts, 0);
        STORE(s->highprio, 0);
        STORE(s->enforce_off, 0);
        for (int w = 0; w < CGPU_SCHED_CONTAINER_WORDS; w++) STORE(s->sched[w], 0);
        STORE(s->state, CGPU_SLOT_LIVE);
        created = 1;
    }
    int p = -1;
    for (int i = 0; i < CGPU_MAX_PROCESSES; i++) {
        if (LOAD(l->processes[i].state) != CGPU_SLOT_FREE) continue;
        if (ofd_lock(fd, CGPU_PROCESS_LOCK_START(i), CGPU_PROCESS_LOCK_LEN, 0) != 0) continue;
        struct cgpu_process *s = &l->processes[i];
        STORE(s->state, CGPU_SLOT_CLAIMING);
        STORE(s->container, (uint32_t)c);
        STORE(s->pid, (int32_t)getpid());
        STORE(s->pidns, 0);
        STORE(s->start_time, 0);
        STORE(s->used, 0);
        STORE(s->pending, 0);
        STORE(s->gpu_time_ns, 0);
        STORE(s->launches, 0);
        STORE(s->sched_beat_ns, 0);
        STORE(s->sched_in_sync, 0);
        STORE(s->state, CGPU_SLOT_LIVE);
        p = i;
        break;
    }
    if (p < 0) { fprintf(stderr, "no free process slot\n"); return 1; }
    ADD(l->containers[c].nprocs, 1);
    ofd_unlock(fd, CGPU_TABLE_LOCK_START, CGPU_TABLE_LOCK_LEN);
    printf("joined container=%d process=%d created=%d\n", c, p, created);
    fflush(stdout);

    struct cgpu_container *ct = &l->containers[c];
    struct cgpu_process *ps = &l->processes[p];
    uint64_t granted = 0, at = 0;
    for (;;) {
        ADD(ps->pending, chunk);
        ADD(ct->ops, 1);
        uint64_t cur = LOAD(ct->used);
        int ok = 0;
        for (;;) {
            uint64_t q = LOAD(ct->quota);
            int enforce = q != 0 && LOAD(ct->enforce_off) == 0;
            if (enforce && cur + chunk > q) break;
            if (__atomic_compare_exchange_n(&ct->used, &cur, cur + chunk, 1, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                ok = 1;
                break;
            }
        }
        if (!ok) {
            SUB(ps->pending, chunk);
            ADD(ct->oom_count, 1);
            at = cur;
            break;
        }
        ADD(ps->used, chunk);
        SUB(ps->pending, chunk);
        granted += chunk;
    }
    printf("reserved granted=%llu refused_at_used=%llu quota=%llu nprocs=%u\n",
           (unsigned long long)granted, (unsigned long long)at,
           (unsigned long long)LOAD(ct->quota), LOAD(ct->nprocs));
    printf("holding\n");
    fflush(stdout);
    sleep(60);
    return 0;
}
