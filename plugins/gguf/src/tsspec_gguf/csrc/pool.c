#include "kernels.h"

/* ---- thread pool ------------------------------------------------------------------------ */


#define MAX_WORKERS 63
#define SPIN_NS 200000    /* a worker spins this long after its last chunk before sleeping */
#define WAIT_SPIN_NS 20000 /* the caller spins this long on chunks in flight, then yields */
#define FIELD 20           /* ticket = generation << 40 | chunks << 20 | next chunk */
#define FIELD_MASK ((UINT64_C(1) << FIELD) - 1)

static struct {
    pthread_mutex_t busy;        /* one job at a time; a second caller runs inline */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    _Alignas(64) _Atomic uint64_t ticket; /* own cache lines: workers poll it while others count */
    _Alignas(64) _Atomic int64_t done;
    _Alignas(64) _Atomic int sleepers;
    _Atomic int active; /* workers 0 .. active-1 may take chunks of the current job */
    _Atomic(chunk_fn) fn;
    _Atomic(void *) arg;
    _Atomic int kind;            /* the current job's region kind (pool statistics) */
    _Atomic int64_t first_take;  /* when a worker took the job's first chunk (pool statistics) */
    int started;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

/* Pool statistics (off unless a measuring script turns them on: set_pool_stats): per kind of
 * region, how long the caller's regions took on the wall, how long the caller and the workers
 * spent inside chunks, how long the caller waited for chunks a worker still held after it ran
 * out of chunks to take, and how late the first worker joined. Kinds are set by the region's
 * caller (a thread-local tag), so they describe what the pool ran, never how. */
static const char *const kind_names[KINDS] = {"other", "qkv", "attention", "o", "gate_up", "down", "gemm", "blocks"};


KindStats pool_stats[KINDS];
_Atomic int stats_on = 0;
__thread int region_kind = KIND_OTHER; /* the kind of the regions this thread starts next */

void set_region_kind(int kind) { region_kind = kind; }

int pool_started(void) { return pool.started; }

int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void relax(void) {
#ifdef QG_X86
    _mm_pause();
#endif
}

/* take one chunk of the job the ticket shows; -1 when none is left */
static int64_t take_chunk(uint64_t *seen) {
    uint64_t v = atomic_load(&pool.ticket);
    for (;;) {
        *seen = v;
        uint64_t chunks = (v >> FIELD) & FIELD_MASK, next = v & FIELD_MASK;
        if (next >= chunks) return -1;
        if (atomic_compare_exchange_weak(&pool.ticket, &v, v + 1)) return (int64_t)next;
    }
}

static void *worker_main(void *index_ptr) {
    const int index = (int)(intptr_t)index_ptr;
    int64_t idle_since = now_ns();
    uint64_t seen = atomic_load(&pool.ticket);
    for (;;) {
        if (index < atomic_load(&pool.active)) {
            int64_t c = take_chunk(&seen);
            if (c >= 0) { /* the job cannot finish (nor fn/arg change) before this chunk is done */
                chunk_fn fn = atomic_load(&pool.fn);
                if (atomic_load_explicit(&stats_on, memory_order_relaxed)) {
                    const int64_t t0 = now_ns();
                    int64_t zero = 0;
                    atomic_compare_exchange_strong(&pool.first_take, &zero, t0);
                    fn(atomic_load(&pool.arg), c);
                    atomic_fetch_add(&pool_stats[atomic_load(&pool.kind)].worker_busy_ns, now_ns() - t0);
                } else
                    fn(atomic_load(&pool.arg), c);
                atomic_fetch_add(&pool.done, 1);
                idle_since = now_ns();
                continue;
            }
        }
        /* nothing to take: spin a while for the next job, then sleep until the ticket moves */
        uint64_t v = atomic_load(&pool.ticket);
        int spins = 0;
        while (v == seen) {
            relax();
            if (++spins % 64 == 0 && now_ns() - idle_since > SPIN_NS) {
                pthread_mutex_lock(&pool.sleep_lock);
                atomic_fetch_add(&pool.sleepers, 1);
                while (atomic_load(&pool.ticket) == seen) pthread_cond_wait(&pool.wake, &pool.sleep_lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.sleep_lock);
                idle_since = now_ns();
            }
            v = atomic_load(&pool.ticket);
        }
        seen = v;
    }
    return NULL;
}

static void pool_after_fork(void) { /* the child has none of the parent's workers */
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.active, 0);
    pool.started = 0;
}

/* fn(arg, c) for c in 0..chunks-1 on up to `threads` threads (the caller included) */
void run_chunks(chunk_fn fn, void *arg, int64_t chunks, int threads) {
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    const int stats = atomic_load_explicit(&stats_on, memory_order_relaxed);
    const int kind = region_kind;
    const int64_t t_start = stats ? now_ns() : 0, cpu_start = stats ? thread_cpu_ns() : 0;
    if (threads <= 1 || chunks <= 1 || chunks > (int64_t)FIELD_MASK || pthread_mutex_trylock(&pool.busy) != 0) {
        for (int64_t c = 0; c < chunks; c++) fn(arg, c);
        if (stats) {
            KindStats *K = &pool_stats[kind];
            const int64_t wall = now_ns() - t_start;
            atomic_fetch_add(&K->inline_regions, 1);
            atomic_fetch_add(&K->chunks, chunks);
            atomic_fetch_add(&K->caller_chunks, chunks);
            atomic_fetch_add(&K->wall_ns, wall);
            atomic_fetch_add(&K->caller_busy_ns, wall);
            atomic_fetch_add(&K->caller_cpu_ns, thread_cpu_ns() - cpu_start);
        }
        return;
    }
    static int fork_hook = 0;
    if (!fork_hook) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        fork_hook = 1;
    }
    while (pool.started < threads - 1) {
        pthread_t tid;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&tid, &attr, worker_main, (void *)(intptr_t)pool.started);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.started++;
    }
    atomic_store(&pool.fn, fn);
    atomic_store(&pool.arg, arg);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.kind, kind);
    atomic_store(&pool.first_take, 0);
    atomic_store(&pool.active, threads - 1);
    uint64_t generation = (atomic_load(&pool.ticket) >> (2 * FIELD)) + 1;
    atomic_store(&pool.ticket, (generation << (2 * FIELD)) | ((uint64_t)chunks << FIELD));
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    uint64_t seen;
    int64_t c, mine = 0;
    while ((c = take_chunk(&seen)) >= 0) {
        fn(arg, c);
        atomic_fetch_add(&pool.done, 1);
        mine++;
    }
    const int64_t t_out = stats ? now_ns() : 0;
    const int waited = atomic_load(&pool.done) < chunks;
    int64_t waiting_since = 0;
    int spins = 0, yielded = 0;
    while (atomic_load(&pool.done) < chunks) { /* chunks a worker took and is still doing */
        relax();
        if (++spins % 64 == 0) {
            if (!waiting_since) waiting_since = now_ns();
            else if (now_ns() - waiting_since > WAIT_SPIN_NS) {
                sched_yield();
                yielded = 1;
            }
        }
    }
    if (stats) {
        KindStats *K = &pool_stats[kind];
        const int64_t t_end = now_ns(), first = atomic_load(&pool.first_take);
        atomic_fetch_add(&K->regions, 1);
        atomic_fetch_add(&K->chunks, chunks);
        atomic_fetch_add(&K->caller_chunks, mine);
        atomic_fetch_add(&K->wall_ns, t_end - t_start);
        atomic_fetch_add(&K->caller_busy_ns, t_out - t_start);
        atomic_fetch_add(&K->wait_ns, t_end - t_out);
        atomic_fetch_add(&K->waits, waited);
        atomic_fetch_add(&K->long_waits, yielded);
        atomic_fetch_add(&K->caller_cpu_ns, thread_cpu_ns() - cpu_start);
        if (first) {
            atomic_fetch_add(&K->join_ns, first - t_start);
            atomic_fetch_add(&K->joined, 1);
        }
    }
    pthread_mutex_unlock(&pool.busy);
}

/* per-thread scratch memory (grown, never shrunk), in two slots: slot 0 for a chunk's own use,
 * slot 1 for what a caller shares with the chunks of its region (attention's per-segment partial
 * results), so that the caller's chunks growing slot 0 never move it */
/* a thread's buffers go when the thread ends (the keys' destructors): a server runs each
 * sequence in a thread of its own, and its drafter's kernel calls run there */
#define SCRATCH_SLOTS 2
static pthread_key_t scratch_keys[SCRATCH_SLOTS];
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_make_key(void) {
    for (int i = 0; i < SCRATCH_SLOTS; i++) pthread_key_create(&scratch_keys[i], free);
}

float *scratch_slot(int slot, size_t floats) {
    static __thread float *buf[SCRATCH_SLOTS];
    static __thread size_t cap[SCRATCH_SLOTS];
    if (floats > cap[slot]) {
        float *grown = (float *)realloc(buf[slot], sizeof(float) * floats);
        if (grown == NULL) return NULL;
        pthread_once(&scratch_once, scratch_make_key);
        pthread_setspecific(scratch_keys[slot], grown);
        buf[slot] = grown;
        cap[slot] = floats;
    }
    return buf[slot];
}

float *scratch(size_t floats) { return scratch_slot(0, floats); }

/* a chunk that cannot get its scratch memory sets its job's `failed` flag (each call has its
 * own: two callers running at once, e.g. a target and a draft head's view, never reset or read
 * each other's), and the call then reports out of memory */


/* set_pool_stats(on): zero the pool statistics and start (True) or stop (False) counting */
PyObject *py_set_pool_stats(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    atomic_store(&stats_on, 0);
    for (int k = 0; k < KINDS; k++) {
        _Atomic int64_t *f = &pool_stats[k].regions;
        for (size_t i = 0; i < sizeof(KindStats) / sizeof(int64_t); i++) atomic_store(&f[i], 0);
    }
    atomic_store(&stats_on, on);
    Py_RETURN_NONE;
}

/* pool_stats(): {kind: {field: count or nanoseconds}} for the kinds that ran since set_pool_stats */
PyObject *py_pool_stats(PyObject *self, PyObject *noargs) {
    static const char *const fields[] = {"regions",        "inline_regions", "chunks",  "caller_chunks", "wall_ns",
                                         "caller_busy_ns", "worker_busy_ns", "wait_ns", "waits",         "long_waits",
                                         "join_ns",        "joined",         "caller_cpu_ns"};
    _Static_assert(sizeof(fields) / sizeof(fields[0]) == sizeof(KindStats) / sizeof(int64_t), "one name a field");
    PyObject *all = PyDict_New();
    if (all == NULL) return NULL;
    for (int k = 0; k < KINDS; k++) {
        _Atomic int64_t *f = &pool_stats[k].regions;
        if (atomic_load(&f[0]) == 0 && atomic_load(&f[1]) == 0) continue;
        PyObject *one = PyDict_New();
        if (one == NULL || PyDict_SetItemString(all, kind_names[k], one) != 0) {
            Py_XDECREF(one);
            Py_DECREF(all);
            return NULL;
        }
        Py_DECREF(one);
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
            PyObject *v = PyLong_FromLongLong((long long)atomic_load(&f[i]));
            if (v == NULL || PyDict_SetItemString(one, fields[i], v) != 0) {
                Py_XDECREF(v);
                Py_DECREF(all);
                return NULL;
            }
            Py_DECREF(v);
        }
    }
    return all;
}

#define PING_TIMEOUT_NS 1000000

typedef struct {
    _Atomic int64_t arrived;
    int64_t chunks, deadline;
} PingJob;

/* a chunk that waits (at most PING_TIMEOUT_NS) until every chunk of its region has started */
static void ping_chunk(void *arg, int64_t c) {
    PingJob *J = (PingJob *)arg;
    (void)c;
    atomic_fetch_add(&J->arrived, 1);
    while (atomic_load(&J->arrived) < J->chunks && now_ns() < J->deadline) relax();
}

/* probe_handshake(regions, threads): the wall nanoseconds of each of `regions` pool regions of
 * `threads` chunks that each wait until all have started: what it costs to bring every thread
 * into a region and back out (a region whose workers did not come within 1 ms reads >= 1 ms) */
PyObject *py_probe_handshake(PyObject *self, PyObject *args) {
    long long regions;
    int threads;
    if (!PyArg_ParseTuple(args, "Li", &regions, &threads)) return NULL;
    if (regions < 1 || regions > 1000000 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "bad probe_handshake operands");
        return NULL;
    }
    int64_t *ns = (int64_t *)malloc(sizeof(int64_t) * (size_t)regions);
    if (ns == NULL) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    for (long long i = 0; i < regions; i++) {
        const int64_t t0 = now_ns();
        PingJob J = {0, threads, t0 + PING_TIMEOUT_NS};
        run_chunks(ping_chunk, &J, threads, threads);
        ns[i] = now_ns() - t0;
    }
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New((Py_ssize_t)regions);
    for (long long i = 0; list != NULL && i < regions; i++) {
        PyObject *v = PyLong_FromLongLong((long long)ns[i]);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    free(ns);
    return list;
}
