// The worker threads of one cache (DESIGN.md "Threads"; docs/DECISIONS.md "Threads and
// allocation"). Replaces OpenMP, whose runtime keeps a thread pool per *host* thread and
// allocates when a call comes from another host thread or after the host ran its own team.
//
// A cache with threads=N > 1 owns N-1 worker threads: pool_start (kvp_create) starts them and
// pool_stop (kvp_destroy) joins them. Everything they touch lives in the arena (this object,
// the thread handles, the per-thread scratch), so a call allocates nothing, whichever host
// thread makes it: the calling thread is participant 0 and needs no thread-local state.
//
// Sleep and wake: between calls every worker blocks on a condition variable; nothing spins.
// A call that the work pays for (cache.cpp chooses k per call) runs pool_run(k, fn, arg): it
// publishes the job, signals k-1 workers and runs fn(arg, 0) itself at once. A worker that wakes
// claims the next participant id (1..k-1) while the job is open and runs fn(arg, id). fn hands
// out its work items from an atomic counter, so a worker that wakes late (a busy machine) finds
// fewer items or none, and the caller never waits for a worker that has not started: when its
// own fn returns it closes the job (no later claims) and waits only for the participants that
// claimed an id, spinning at most kJoinSpinNs before it blocks on a second condition variable.
// The spin is inside the call and short (those participants are finishing their last item).
//
// Without thread support (KVP_THREADS=0: Cortex-M, no pthreads) pool_start starts nothing and
// pool_run runs fn(arg, 0) alone: every item is done by the caller, with the same bits.
//
// The host's threads (thread_pool=host, kvp_set_parallel; DECISIONS "kvprune on a host's thread
// pool"): with a host function set, pool_run hands the job to it instead of the workers, which
// the host calls fn(arg, t) for every t < k on its own threads. The same fn and the same work
// items: any set of participants that runs every tid gives the same bits. thread_pool=host starts
// no workers, so until a function is set every call runs on the caller alone.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kvprune/kvprune.h"

#if KVP_THREADS
#include <pthread.h>

#include <atomic>
#endif

namespace kvp {

typedef void (*pool_fn)(void *arg, uint32_t tid);

// How long the caller spins for participants at the end of a call before it blocks (ns).
constexpr uint64_t kJoinSpinNs = 20000;

struct ThreadPool {
#if KVP_THREADS
    pthread_mutex_t mu;
    pthread_cond_t wake;   // workers: a new job (or stop)
    pthread_cond_t done;   // caller: the last participant finished
    // gen (bits 63..32) | open (bit 31) | k (bits 30..16) | next participant id (bits 15..0)
    std::atomic<uint64_t> state;
    std::atomic<uint32_t> finished;        // participants of the current job that returned
    std::atomic<uint32_t> caller_waiting;  // the caller is blocked on `done`
    pool_fn fn;
    void *arg;
    bool stop;             // under mu
    uint32_t nworkers;     // started
    pthread_t *handles;    // [threads - 1], in the arena
#else
    uint32_t nworkers;
#endif
    kvp_parallel_fn host_fn;  // kvp_set_parallel: the host's parallel-for (NULL: the workers, if any)
    void *host_user;
    uint64_t host_par_work;   // cache.cpp par_work while host_fn is set: 0 (KVP_PAR_WORK overrides)
};

// Bytes of the arena region for a pool of `threads` participants (0 when threads <= 1 or
// without thread support): the ThreadPool object and the thread handles.
// With `host` (thread_pool=host) the ThreadPool object only: no workers, no handles.
size_t pool_bytes(uint32_t threads, bool host);
// Starts threads-1 workers in `mem` (pool_bytes(threads, host) bytes, 64-aligned) and returns
// the pool; with `host`, the pool without workers (a host function comes later). NULL when
// threads <= 1 or without thread support (*err = 0), or when pthread_create failed (*err = its
// error; nothing is left running). Worker threads block every signal.
ThreadPool *pool_start(uint32_t threads, bool host, void *mem, int *err);
// Whether a call can have more than one participant: workers, or a host function.
inline bool pool_parallel(const ThreadPool *p) { return p && (p->nworkers > 0 || p->host_fn); }
// Joins the workers (they are asleep: calls on a cache are serialised). NULL is a no-op.
void pool_stop(ThreadPool *p);
// Runs fn(arg, tid) on the caller (tid 0) and on up to k-1 workers (tids 1..k-1, each at most
// once), returns when every participant returned. p may be NULL (or k <= 1): fn(arg, 0) only.
// With a host function: host_fn(host_user, k, fn, arg), which runs every tid < k (returns 0).
// Returns the share of the call (0..1) the caller spent waiting, after its own fn returned, for
// participants still running (0 when it ran alone): a worker preempted while it holds an item
// makes it large (cache.cpp backs off then).
double pool_run(ThreadPool *p, uint32_t k, pool_fn fn, void *arg);

}  // namespace kvp
