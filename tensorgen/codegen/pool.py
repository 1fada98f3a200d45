"""The thread pool a compiled model runs its parallel loops on (C source, prepended to a model's module).

Under another process's load, OpenMP's fork-join costs a model dearly: every parallel loop ends at a barrier
that all threads of the team must reach, so a thread that the competing process keeps off its core for a
time slice holds up every kernel, while the waiting thread spins on a core it could have given up
(bench/results/under_load_pool.md). The pool removes both:

- a loop is `tensorgen_parallel_for(body, ctx, n)`: `body(ctx, begin, end)` over [0, n) on the calling thread
  and the pool's workers. Thread t owns the share of iterations OpenMP's `schedule(static)` gives thread t
  (so a kernel reads what the one before it wrote on the same core, as tuning measured), cut into a few
  chunks; a thread done with its own share takes the unclaimed chunks of the others;
- a loop is over when its chunks are done, not when every thread has arrived: a worker kept off its core
  delays the loop only by the chunk it holds, and the caller takes over every chunk it has not started;
- a waiting thread (a worker between loops, the caller at a loop's end) spins briefly and then sleeps on a
  futex, so it gives its core back to the thread it waits for.

One caller at a time uses the pool; a second concurrent caller runs its loops alone. Workers start at the first
parallel loop, after fork() again in the child, and block every signal (they are the Python process's too).
"""

from __future__ import annotations

POOL_C = r"""
/* ---- thread pool: tensorgen_parallel_for (see tensorgen/codegen/pool.py) ---- */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#include <sched.h>
#endif

#define POOL_MAX_THREADS 256
#define POOL_CHUNKS_PER_SHARE 4
static double pool_spin_ns = 30000; /* a waiting thread sleeps after spinning this long (TENSORGEN_POOL_SPIN_US) */

typedef void (*pool_body)(void* ctx, int64_t begin, int64_t end);

/* a share's claim word: loop tag (32 bits) | chunks in the share (16) | next unclaimed chunk (16) */
typedef struct { _Alignas(64) _Atomic uint64_t word; } pool_share;

static struct {
  pthread_mutex_t lock;          /* held by the caller of the loop in flight */
  _Atomic int threads;           /* team size asked for (0: omp_get_max_threads()) */
  int started;                   /* workers running */
  _Alignas(64) _Atomic uint32_t tag;     /* the loop in flight; workers wait for it to change */
  _Atomic int sleepers;                  /* workers asleep on `tag` */
  _Alignas(64) _Atomic int64_t remaining;  /* chunks of the loop in flight not finished */
  _Atomic uint32_t finished;             /* counts finished loops; the caller sleeps on it */
  _Atomic int caller_asleep;
  _Alignas(64) pool_body body;
  void* ctx;
  int64_t n;
  _Atomic int team;
  pool_share share[POOL_MAX_THREADS];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static double pool_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void pool_futex_wait(_Atomic uint32_t* word, uint32_t old) {
#ifdef __linux__
  syscall(SYS_futex, (uint32_t*)word, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
#else
  (void)word; (void)old;
  sched_yield();
#endif
}

static void pool_futex_wake(_Atomic uint32_t* word) {
#ifdef __linux__
  syscall(SYS_futex, (uint32_t*)word, FUTEX_WAKE_PRIVATE, POOL_MAX_THREADS, NULL, NULL, 0);
#else
  (void)word;
#endif
}

/* whether `word` left `old` within pool_spin_ns */
static int pool_spin(_Atomic uint32_t* word, uint32_t old) {
  double until = pool_now() + pool_spin_ns;
  for (int i = 1;; ++i) {
    if (atomic_load_explicit(word, memory_order_acquire) != old) return 1;
    pool_relax();
    if (i % 256 == 0 && pool_now() > until) return 0;
  }
}

/* share `s` of n iterations over team (OpenMP's static split): its first iteration, length and chunks */
static void pool_share_of(int64_t n, int team, int s, int64_t* start, int64_t* len, int64_t* chunks) {
  int64_t q = n / team, r = n % team;
  *start = s * q + (s < r ? s : r);
  *len = q + (s < r);
  *chunks = *len < POOL_CHUNKS_PER_SHARE ? *len : POOL_CHUNKS_PER_SHARE;
}

/* the first and one-past-last iteration of chunk `j` of share `s` */
static void pool_chunk(int64_t n, int team, int s, int64_t j, int64_t* begin, int64_t* end) {
  int64_t start, len, chunks;
  pool_share_of(n, team, s, &start, &len, &chunks);
  *begin = start + j * len / chunks;
  *end = start + (j + 1) * len / chunks;
}

/* the next unclaimed chunk of share `s` of loop `tag`, or -1 */
static int64_t pool_claim(int s, uint32_t tag) {
  uint64_t w = atomic_load_explicit(&pool.share[s].word, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(w >> 32) != tag || (w & 0xffff) >= ((w >> 16) & 0xffff)) return -1;
    if (atomic_compare_exchange_weak(&pool.share[s].word, &w, w + 1)) return (int64_t)(w & 0xffff);
  }
}

/* run chunks of loop `tag`, those of share `first` first, then whatever the others left */
static void pool_work(uint32_t tag, int first) {
  int team = atomic_load_explicit(&pool.team, memory_order_relaxed);
  for (int k = 0; k < team; ++k) {
    int s = (first + k) % team;
    for (int64_t j; (j = pool_claim(s, tag)) >= 0;) {
      /* the loop cannot end before this chunk does: what describes it stays put until then */
      int64_t begin, end;
      pool_chunk(pool.n, atomic_load_explicit(&pool.team, memory_order_relaxed), s, j, &begin, &end);
      pool.body(pool.ctx, begin, end);
      if (atomic_fetch_sub(&pool.remaining, 1) == 1) {
        atomic_fetch_add(&pool.finished, 1);
        if (atomic_load(&pool.caller_asleep)) pool_futex_wake(&pool.finished);
      }
    }
  }
}

static void* pool_worker(void* arg) {
  int id = (int)(intptr_t)arg;
  uint32_t seen = atomic_load(&pool.tag);
  for (;;) {
    if (!pool_spin(&pool.tag, seen)) {
      atomic_fetch_add(&pool.sleepers, 1);
      while (atomic_load(&pool.tag) == seen) pool_futex_wait(&pool.tag, seen);
      atomic_fetch_sub(&pool.sleepers, 1);
    }
    seen = atomic_load(&pool.tag);
    if (id < atomic_load_explicit(&pool.team, memory_order_relaxed)) pool_work(seen, id);
  }
  return NULL;
}

static void pool_after_fork(void) {  /* the child has no workers */
  pthread_mutex_init(&pool.lock, NULL);
  pool.started = 0;
  atomic_store(&pool.sleepers, 0);
}

/* workers 1 .. want-1 running (fewer if the system refuses threads); the team size that can run */
static int pool_start(int want) {
  static int forks_handled;
  if (!forks_handled) {
    forks_handled = !pthread_atfork(NULL, NULL, pool_after_fork);
    const char* spin = getenv("TENSORGEN_POOL_SPIN_US");
    if (spin && atof(spin) >= 0) pool_spin_ns = atof(spin) * 1e3;
  }
  if (want > POOL_MAX_THREADS) want = POOL_MAX_THREADS;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  while (pool.started + 1 < want) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, pool_worker, (void*)(intptr_t)(pool.started + 1))) break;
    pthread_detach(thread);
    pool.started++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return pool.started + 1 < want ? pool.started + 1 : want;
}

static void tensorgen_parallel_for(pool_body body, void* ctx, int64_t n) {
  int team = atomic_load(&pool.threads);
  if (team <= 0) team = omp_get_max_threads();
  if (team > n) team = (int)n;
  if (team <= 1 || pthread_mutex_trylock(&pool.lock)) {
    if (n > 0) body(ctx, 0, n);
    return;
  }
  team = pool_start(team);
  uint32_t tag = atomic_load(&pool.tag) + 1;
  pool.body = body;
  pool.ctx = ctx;
  pool.n = n;
  atomic_store(&pool.team, team);
  int64_t chunks = 0;
  for (int s = 0; s < team; ++s) {
    int64_t start, len, c;
    pool_share_of(n, team, s, &start, &len, &c);
    atomic_store(&pool.share[s].word, ((uint64_t)tag << 32) | ((uint64_t)c << 16));
    chunks += c;
  }
  atomic_store(&pool.remaining, chunks);
  atomic_store(&pool.tag, tag);
  if (atomic_load(&pool.sleepers)) pool_futex_wake(&pool.tag);
  pool_work(tag, 0);
  /* wait for the chunks others hold: `finished` moves when the last one ends (or, late, an earlier loop's) */
  for (uint32_t finished; (finished = atomic_load(&pool.finished), atomic_load(&pool.remaining));) {
    if (pool_spin(&pool.finished, finished)) continue;
    atomic_store(&pool.caller_asleep, 1);
    if (atomic_load(&pool.remaining)) pool_futex_wait(&pool.finished, finished);
    atomic_store(&pool.caller_asleep, 0);
  }
  pthread_mutex_unlock(&pool.lock);
}

void tensorgen_set_num_threads(int n) { atomic_store(&pool.threads, n); omp_set_num_threads(n); }
int tensorgen_get_max_threads(void) { int n = atomic_load(&pool.threads); return n > 0 ? n : omp_get_max_threads(); }
"""
