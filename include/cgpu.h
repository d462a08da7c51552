/*
 * cgpu.h: the layout of a cgpu per-GPU ledger file (format version 3).
 *
 * One file per physical GPU, `<dir>/<uuid>.ledger` (dir: $CGPU_LEDGER_DIR,
 * else /run/cgpu; the live generation is the highest `<uuid>.g<n>.ledger`), exactly sizeof(struct cgpu_ledger)
 * bytes, little-endian, mapped MAP_SHARED by every process using the GPU.
 * Mirrors ledger/src/layout.rs and shared.rs; tests/ledger_header.rs checks
 * every offset.
 *
 * Concurrency: fields marked [atomic] are read and written by several
 * processes at once with atomic instructions (read them with
 * __atomic_load_n(&f, __ATOMIC_ACQUIRE), never cache them); the others are
 * written once, while a slot is being claimed under the table lock (or at
 * creation). Any process can rewrite the file: range-check what you read,
 * and expect it to be truncated under you (cgpu survives SIGBUS there). Slot
 * changes take an fcntl OFD write lock on bytes [0, 8) (the table lock); a
 * live process holds an OFD write lock on its own process slot's bytes.
 * See docs/ledger.md for the full protocol. Read-only tools need no lock.
 */
#ifndef CGPU_H
#define CGPU_H

#include <stddef.h>
#include <stdint.h>

#define CGPU_LEDGER_MAGIC 0x4744454c55504743ULL /* "CGPULEDG" as LE u64 */
#define CGPU_FORMAT_VERSION 3u
#define CGPU_MAX_CONTAINERS 128
#define CGPU_MAX_PROCESSES 1024
#define CGPU_ID_LEN 64
#define CGPU_UUID_LEN 96
#define CGPU_SCHED_GPU_WORDS 32
#define CGPU_SCHED_CONTAINER_WORDS 48
#define CGPU_MAX_SHARED 1024
#define CGPU_SHARED_BORNE (1ULL << 62)    /* the holder's slot counts the bytes */
#define CGPU_SHARED_RELEASED (1ULL << 63) /* the holder let go; free for the next claim */
#define CGPU_SHARED_BYTES (CGPU_SHARED_BORNE - 1)

/*
 * Additions to format version 3: fields in space older writers leave zero
 * (zero always means "unknown, derive it"). docs/ledger.md states the rule.
 */
#define CGPU_ADD_CONTAINER_KEY (1ULL << 0) /* cgpu_container.key */
#define CGPU_ADD_HOST_PID (1ULL << 1)      /* cgpu_process.host_pid */
#define CGPU_ADD_ID_SUM (1ULL << 2)        /* cgpu_container.id_sum */

/* Slot states (containers and processes). */
#define CGPU_SLOT_FREE 0u
#define CGPU_SLOT_CLAIMING 1u
#define CGPU_SLOT_LIVE 2u

/* Knob defaults at creation and ranges. */
#define CGPU_DEFAULT_POLICY 1u
#define CGPU_DEFAULT_MAX_INST 16u
#define CGPU_DEFAULT_PRIO_RATIO 80u
#define CGPU_POLICY_MAX 5u
#define CGPU_MAX_INST_MIN 1u
#define CGPU_MAX_INST_MAX 25u
#define CGPU_PRIO_RATIO_MIN 20u
#define CGPU_PRIO_RATIO_MAX 99u

/* Table lock: OFD write lock on [CGPU_TABLE_LOCK_START, +CGPU_TABLE_LOCK_LEN). */
#define CGPU_TABLE_LOCK_START 0
#define CGPU_TABLE_LOCK_LEN 8

struct cgpu_header {
    uint64_t magic;           /* CGPU_LEDGER_MAGIC */
    uint32_t version;         /* CGPU_FORMAT_VERSION */
    uint32_t header_size;     /* sizeof(struct cgpu_header) */
    uint64_t file_size;       /* sizeof(struct cgpu_ledger) */
    uint32_t ready;           /* [atomic] 1 once initialised (always 1 in a linked file) */
    uint32_t gpu_index;       /* host driver's index, informational */
    char uuid[CGPU_UUID_LEN]; /* "GPU-...", NUL-padded; copy it out, never keep a pointer */
    uint64_t physical_total;  /* bytes */
    uint64_t created_ns;      /* CLOCK_REALTIME */
    uint32_t policy;          /* [atomic] 0..5 */
    uint32_t policy_explicit; /* [atomic] 1 once set by an operator */
    uint32_t max_inst;        /* [atomic] 1..25 */
    uint32_t prio_ratio;      /* [atomic] 20..99 */
    uint64_t default_memsize; /* [atomic] bytes, 0 = pass-through */
    uint64_t knob_generation; /* [atomic] bumped on every knob write */
    uint64_t sched[CGPU_SCHED_GPU_WORDS]; /* [atomic] scheduler state */
    uint64_t last_reap_ns;    /* [atomic] CLOCK_MONOTONIC of the last rate-limited reap */
    uint64_t additions;       /* [atomic] CGPU_ADD_* bits its creator wrote (informational) */
    uint64_t required;        /* [atomic] CGPU_ADD_* bits every user must understand: refuse the file if one is unknown */
    uint64_t reserved[13];
};

struct cgpu_container {
    uint32_t state;           /* [atomic] CGPU_SLOT_* */
    uint32_t highprio;        /* [atomic] 0/1 */
    char id[CGPU_ID_LEN];     /* container id, NUL-padded (may fill all 64); rewritten when the slot is claimed again: copy it out, then re-check state */
    uint64_t quota;           /* [atomic] bytes, 0 = not limited */
    uint64_t used;            /* [atomic] bytes held by all its processes */
    uint64_t peak;            /* [atomic] highest used */
    uint32_t weight;          /* [atomic] 0 = no compute */
    uint32_t nprocs;          /* [atomic] live processes */
    uint64_t oom_count;       /* [atomic] allocations refused for quota */
    uint64_t created_ns;      /* [atomic] CLOCK_REALTIME at claim */
    uint32_t enforce_off;     /* [atomic] 1 = record only (CGPU_DISABLE) */
    uint32_t ops;             /* [atomic] bumped by every reserve/release (wraps) */
    uint64_t sched[CGPU_SCHED_CONTAINER_WORDS]; /* [atomic] scheduler state */
    uint64_t suspect;         /* [atomic] bytes possibly held for processes that died mid-operation */
    uint64_t recounts;        /* [atomic] times reap recounted used after such a death */
    uint64_t key;             /* identity key (CGPU_ADD_CONTAINER_KEY), written while claiming; 0 = unknown: match by id */
    uint64_t key_created;     /* created_ns written with key; differs: key is stale (claimed since by an older writer), as 0 */
    uint64_t id_sum;          /* CGPU_ADD_ID_SUM, written while claiming: FNV-1a 64 over id[64], key, key_created (LE), 0 mapped to 1.
                                 0, or key_created != created_ns: unknown. Any other mismatch: the slot is damaged (rebuild) */
    uint64_t reserved[3];
};

struct cgpu_process {
    uint32_t state;           /* [atomic] CGPU_SLOT_* */
    uint32_t container;       /* [atomic] container slot index */
    int32_t pid;              /* [atomic] in its own PID namespace (display only) */
    uint32_t _pad;
    uint64_t pidns;           /* [atomic] inode of /proc/<pid>/ns/pid */
    uint64_t start_time;      /* [atomic] /proc/<pid>/stat field 22 */
    uint64_t used;            /* [atomic] bytes held */
    uint64_t pending;         /* [atomic] bytes of reservations in flight */
    uint64_t gpu_time_ns;     /* [atomic] GPU time charged */
    uint64_t launches;        /* [atomic] kernel launches admitted */
    uint64_t sched_beat_ns;   /* [atomic] CLOCK_MONOTONIC ns of the scheduler's last sign of life, 0: none */
    uint64_t sched_in_sync;   /* [atomic] threads inside a synchronise call */
    uint64_t host_pid;        /* [atomic] (start_time & 0xffffffff) << 32 | pid as the host and NVML number it (CGPU_ADD_HOST_PID); 0, or a stamp that is not this start_time: unknown */
    uint64_t reserved[1];
};

/*
 * Memory a process exported (cuMemExportToShareableHandle) and another
 * process of the same container imported: one entry per import. While the
 * exporter lives it pays; when its slot is reaped (or it leaves), bytes are
 * added to the holder's slot and the container, then CGPU_SHARED_BORNE is
 * set; the holder sets CGPU_SHARED_RELEASED when it lets go (giving back
 * the bytes if borne). Entries are claimed and freed under the table lock.
 */
struct cgpu_shared {
    uint32_t state;           /* [atomic] CGPU_SLOT_FREE / CGPU_SLOT_LIVE */
    uint32_t container;       /* [atomic] container slot of both processes */
    uint32_t exporter;        /* [atomic] process slot of the exporter */
    uint32_t holder;          /* [atomic] process slot of the importer */
    int32_t exporter_pid;     /* [atomic] display only */
    int32_t holder_pid;       /* [atomic] display only */
    uint64_t bytes;           /* [atomic] extent mapped (CGPU_SHARED_BYTES) | flags */
};

struct cgpu_ledger {
    struct cgpu_header header;
    struct cgpu_container containers[CGPU_MAX_CONTAINERS];
    struct cgpu_process processes[CGPU_MAX_PROCESSES];
    struct cgpu_shared shared[CGPU_MAX_SHARED];
};

/* Liveness lock of process slot i: OFD write lock on this range. */
#define CGPU_PROCESS_LOCK_START(i) \
    (offsetof(struct cgpu_ledger, processes) + (i) * sizeof(struct cgpu_process))
#define CGPU_PROCESS_LOCK_LEN sizeof(struct cgpu_process)

#endif /* CGPU_H */
