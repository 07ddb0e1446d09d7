#include "threads.h"

#include <new>

#if KVP_THREADS
#include <signal.h>
#include <time.h>
#endif

namespace kvp {

#if KVP_THREADS
namespace {

constexpr uint64_t kOpen = uint64_t(1) << 31;

inline uint32_t st_gen(uint64_t s) { return uint32_t(s >> 32); }
inline uint32_t st_k(uint64_t s) { return uint32_t(s >> 16) & 0x7fffu; }
inline uint32_t st_next(uint64_t s) { return uint32_t(s) & 0xffffu; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || (defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7)
    __asm__ __volatile__("yield");
#endif
}

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// A participant returned: count it and wake the caller if it sleeps (see pool_run).
void finish(ThreadPool *p) {
    p->finished.fetch_add(1, std::memory_order_seq_cst);
    if (p->caller_waiting.load(std::memory_order_seq_cst)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

void *worker_main(void *arg) {
    ThreadPool *p = static_cast<ThreadPool *>(arg);
    uint32_t seen = 0;  // jobs are numbered from 1: a worker that starts late still joins job 1
    for (;;) {
        uint64_t s = p->state.load(std::memory_order_acquire);
        if (st_gen(s) != seen) {
            const uint32_t gen = st_gen(s);
            // Claim a participant id while this job is open and has one left.
            while (st_gen(s) == gen && (s & kOpen) && st_next(s) < st_k(s)) {
                if (p->state.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
                    // Claimed: the caller cannot finish this job before finish(p), so fn and
                    // arg (written before the job was published) are this job's.
                    p->fn(p->arg, st_next(s));
                    finish(p);
                    break;
                }
            }
            seen = gen;
            continue;  // a newer job may have been published meanwhile
        }
        pthread_mutex_lock(&p->mu);
        while (!p->stop && st_gen(p->state.load(std::memory_order_acquire)) == seen) pthread_cond_wait(&p->wake, &p->mu);
        const bool stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (stop) return nullptr;
    }
}

}  // namespace

size_t pool_bytes(uint32_t threads, bool host) {
    if (threads <= 1) return 0;
    const size_t head = (sizeof(ThreadPool) + 63) / 64 * 64;
    return host ? head : head + sizeof(pthread_t) * (threads - 1);
}

ThreadPool *pool_start(uint32_t threads, bool host, void *mem, int *err) {
    *err = 0;
    if (threads <= 1) return nullptr;
    ThreadPool *tp = new (mem) ThreadPool;
    pthread_mutex_init(&tp->mu, nullptr);
    pthread_cond_init(&tp->wake, nullptr);
    pthread_cond_init(&tp->done, nullptr);
    tp->state.store(0, std::memory_order_relaxed);
    tp->finished.store(0, std::memory_order_relaxed);
    tp->caller_waiting.store(0, std::memory_order_relaxed);
    tp->fn = nullptr;
    tp->arg = nullptr;
    tp->stop = false;
    tp->nworkers = 0;
    tp->host_fn = nullptr;
    tp->host_user = nullptr;
    tp->host_par_work = 0;
    tp->handles = nullptr;
    if (host) return tp;  // the host's threads, once kvp_set_parallel gives them
    tp->handles = reinterpret_cast<pthread_t *>(static_cast<char *>(mem) + (sizeof(ThreadPool) + 63) / 64 * 64);
    // Workers block every signal (the host's handlers run on its own threads); they inherit
    // the mask in force at pthread_create.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (uint32_t i = 0; i + 1 < threads; ++i) {
        *err = pthread_create(&tp->handles[i], nullptr, worker_main, tp);
        if (*err) break;
        ++tp->nworkers;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (*err) {
        pool_stop(tp);
        return nullptr;
    }
    return tp;
}

void pool_stop(ThreadPool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->nworkers; ++i) pthread_join(p->handles[i], nullptr);
    p->nworkers = 0;
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    p->~ThreadPool();
}

double pool_run(ThreadPool *p, uint32_t k, pool_fn fn, void *arg) {
    if (p && k > 1 && p->host_fn) {
        p->host_fn(p->host_user, k, fn, arg);
        return 0.0;  // the host's scheduling: no lateness to learn from
    }
    if (!p || k <= 1 || p->nworkers == 0) {
        fn(arg, 0);
        return 0.0;
    }
    if (k > p->nworkers + 1) k = p->nworkers + 1;
    const uint64_t t_start = now_ns();
    // No participant of the previous job is left (it was joined), so these plain writes race
    // with nothing; a worker reads them only after claiming an id of the job published below.
    p->fn = fn;
    p->arg = arg;
    p->finished.store(0, std::memory_order_relaxed);
    const uint32_t gen = st_gen(p->state.load(std::memory_order_relaxed)) + 1;
    pthread_mutex_lock(&p->mu);
    p->state.store(uint64_t(gen) << 32 | kOpen | uint64_t(k) << 16 | 1u, std::memory_order_release);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < k; ++i) pthread_cond_signal(&p->wake);

    fn(arg, 0);

    // Close the job: no claims from now on; wait for those who claimed.
    const uint64_t s = p->state.fetch_and(~kOpen, std::memory_order_acq_rel);
    const uint32_t parts = st_next(s) - 1;
    if (p->finished.load(std::memory_order_acquire) >= parts) return 0.0;
    const uint64_t t0 = now_ns();
    for (uint32_t i = 1; p->finished.load(std::memory_order_acquire) < parts; ++i) {
        cpu_relax();
        if ((i & 63) == 0 && now_ns() - t0 > kJoinSpinNs) break;
    }
    if (p->finished.load(std::memory_order_acquire) < parts) {
        pthread_mutex_lock(&p->mu);
        // A read-modify-write, not a store: with finish()'s fetch_add it is a Dekker pair (either
        // the caller sees the count or the participant sees the flag and signals), which needs the
        // flag's write ordered before the count's read. A seq_cst store gives that in C++, but
        // qemu-aarch64 on an x86 host runs stlr + ldar as plain moves that TSO may reorder: the
        // aarch64 suite under qemu hung once at this wait (2026-11-29, Ada.LetheThreadsAndState).
        // An exchange is a locked instruction there, a full barrier everywhere.
        p->caller_waiting.exchange(1, std::memory_order_seq_cst);
        while (p->finished.load(std::memory_order_seq_cst) < parts) pthread_cond_wait(&p->done, &p->mu);
        p->caller_waiting.store(0, std::memory_order_relaxed);
        pthread_mutex_unlock(&p->mu);
    }
    const uint64_t t1 = now_ns();
    return t1 > t_start ? double(t1 - t0) / double(t1 - t_start) : 0.0;
}

#else  // no thread support: the caller does everything

size_t pool_bytes(uint32_t, bool) { return 0; }
ThreadPool *pool_start(uint32_t, bool, void *, int *err) {
    *err = 0;
    return nullptr;
}
void pool_stop(ThreadPool *) {}
double pool_run(ThreadPool *, uint32_t, pool_fn fn, void *arg) {
    fn(arg, 0);
    return 0.0;
}

#endif

}  // namespace kvp
