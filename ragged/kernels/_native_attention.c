/* Tiled (flash-attention 2 style) attention over packed variable-length sequences, for
   ragged.kernels._native_attention (the Python side: the why, the contract and the calls).

   Rows are packed [T, H, D] (contiguous) and grouped into sequences by int64 offsets. One work
   item of the forward is a block of up to `br` query rows of one sequence and one head: its
   scores against blocks of up to `bc` keys come from one GEMM each (torch's own sgemm_/dgemm_,
   given by pointer: MKL or OpenBLAS, whatever libtorch exports), the online softmax runs in C
   on the block in cache, and P V is a second GEMM into the block's accumulator. The output is
   written once, with the log-sum-exp of every row. The backward's work item is one sequence and
   one key-value head (all its query heads: the grouped-query gradients of K and V add up there,
   so no two threads write one row); it loops over key blocks, recomputes P from the saved
   log-sum-exp and makes dV, dP, dK and dQ with four more GEMMs per tile.

   Threads: `nthreads` pthreads (the caller's thread is one) take items from a shared counter,
   most expensive first; each item is computed by one thread in a fixed order, so results do not
   depend on the thread count. Inside the workers MKL is told to use one thread
   (MKL_Set_Num_Threads_Local), where the library has that function.

   Built with -fopenmp-simd: the `omp simd` reductions (row maximum, sum of exponentials) are
   vectorised without -ffast-math, which would break the -inf of hidden keys. */

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef RGA_BODY

typedef void (*rga_sgemm_t)(const char *, const char *, const int *, const int *, const int *,
                            const float *, const float *, const int *, const float *,
                            const int *, const float *, float *, const int *);
typedef void (*rga_dgemm_t)(const char *, const char *, const int *, const int *, const int *,
                            const double *, const double *, const int *, const double *,
                            const int *, const double *, double *, const int *);
typedef int (*rga_threads_t)(int);

static rga_sgemm_t rga_sgemm = 0;
static rga_dgemm_t rga_dgemm = 0;
static rga_threads_t rga_local_threads = 0;

/* The BLAS entry points (Fortran ABI, 32-bit integers) and MKL's per-thread thread count (or
   NULL). Returns 0. */
int rga_init(void *sgemm, void *dgemm, void *local_threads) {
  rga_sgemm = (rga_sgemm_t)sgemm;
  rga_dgemm = (rga_dgemm_t)dgemm;
  rga_local_threads = (rga_threads_t)local_threads;
  return 0;
}

/* With -DRGA_PROFILE (tools and docs/benchmarks.md, "Where the attention time goes"): the
   time-stamp counter ticks spent inside the GEMM calls and inside whole kernel calls, summed
   over threads; rga_profile copies and resets them. */
#ifdef RGA_PROFILE
#include <x86intrin.h>
static uint64_t rga_ticks[2];
#define RGA_START uint64_t rga_t0 = __rdtsc();
#define RGA_STOP(slot) __atomic_fetch_add(&rga_ticks[slot], __rdtsc() - rga_t0, __ATOMIC_RELAXED);
#else
#define RGA_START
#define RGA_STOP(slot)
#endif

int rga_profile(uint64_t *out) {
#ifdef RGA_PROFILE
  out[0] = rga_ticks[0], out[1] = rga_ticks[1];
  rga_ticks[0] = rga_ticks[1] = 0;
  return 0;
#else
  (void)out;
  return 1;
#endif
}

/* Row-major C[M, N] = alpha op(A) op(B) + beta C, as the column-major product C^T = op(B)^T
   op(A)^T. `ta`/`tb`: 'N' or 'T' for A and B as row-major matrices. */
static void rga_gemm_f32(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                         float *C, int64_t ldc) {
  int m = (int)N, n = (int)M, k = (int)K, la = (int)ldb, lb = (int)lda, lc = (int)ldc;
  RGA_START
  rga_sgemm(&tb, &ta, &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
  RGA_STOP(0)
}

static void rga_gemm_f64(char ta, char tb, int64_t M, int64_t N, int64_t K, double alpha,
                         const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                         double *C, int64_t ldc) {
  int m = (int)N, n = (int)M, k = (int)K, la = (int)ldb, lb = (int)lda, lc = (int)ldc;
  RGA_START
  rga_dgemm(&tb, &ta, &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
  RGA_STOP(0)
}

/* exp for float, vectorisable (no calls, no branches): Cephes' expf, ~1 ulp (the same
   polynomial as the segment kernels' in _native.c). */
static inline float rga_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 88.8f ? 88.8f : xc;
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  int32_t k = (int32_t)n;
  int32_t k1 = k >> 1, k2 = k - k1;
  union {
    int32_t i;
    float f;
  } s1, s2;
  s1.i = (k1 + 127) << 23;
  s2.i = (k2 + 127) << 23;
  return p * s1.f * s2.f;
}

static inline double rga_exp(double x) { return exp(x); }

static int rga_bad_offsets(const int64_t *off, int64_t B, int64_t N) {
  if (off[0] < 0 || off[B] > N) return 1;
  for (int64_t b = 0; b < B; b++)
    if (off[b + 1] < off[b]) return 1;
  return 0;
}

/* One work item: sequence `b`, head `h`, first query row `i0` of the block (forward); the
   backward uses b and h (the key-value head). `cost` orders the items, largest first. */
typedef struct {
  int64_t b, h, i0, cost;
} rga_item;

static int rga_by_cost(const void *x, const void *y) {
  int64_t a = ((const rga_item *)x)->cost, c = ((const rga_item *)y)->cost;
  return a < c ? 1 : (a > c ? -1 : 0);
}

/* Runs `work(arg, thread index)` on `nthreads` threads (the caller's among them). */
static int rga_parallel(void *(*work)(void *), void **args, int nthreads) {
  pthread_t tid[256];
  int started = 0;
  if (nthreads > 256) nthreads = 256;
  for (int t = 1; t < nthreads; t++) {
    if (pthread_create(&tid[t], 0, work, args[t]) != 0) break;
    started = t;
  }
  work(args[0]);
  for (int t = 1; t <= started; t++) pthread_join(tid[t], 0);
  /* Items not taken by a thread that failed to start are taken by the others (shared counter). */
  return 0;
}

#define RGA_BODY
#define T float
#define SUF(name) name##_f32
#define EXP rga_expf
#include __FILE__
#undef T
#undef SUF
#undef EXP
#define T double
#define SUF(name) name##_f64
#define EXP rga_exp
#include __FILE__

#else /* RGA_BODY: the kernels, once per dtype T */

typedef struct {
  const T *q, *k, *v;
  const int64_t *qoff, *koff;
  int64_t H, Hkv, D, Dv, br, bc, max_q;
  T scale;
  int causal;
  const rga_item *items;
  int64_t num_items;
  int64_t *next; /* the shared counter */
  T *out, *lse;
  /* backward */
  const T *o, *g;
  T *dq, *dk, *dv;
  int status;
} SUF(rga_job);

typedef struct {
  SUF(rga_job) * job;
} SUF(rga_arg);

static int64_t SUF(rga_take)(SUF(rga_job) * job) {
  return __atomic_fetch_add(job->next, 1, __ATOMIC_RELAXED);
}

/* --- forward ------------------------------------------------------------------------------ */

static void SUF(rga_fwd_item)(SUF(rga_job) * j, const rga_item *it, T *S, T *acc, T *m, T *l) {
  const int64_t H = j->H, Hkv = j->Hkv, D = j->D, Dv = j->Dv, bc = j->bc;
  const int64_t qs = j->qoff[it->b], ks = j->koff[it->b];
  const int64_t Lq = j->qoff[it->b + 1] - qs, Lk = j->koff[it->b + 1] - ks;
  const int64_t i0 = it->i0, rows = (Lq - i0 < j->br) ? Lq - i0 : j->br;
  const int64_t h = it->h, hk = h / (H / Hkv);
  const T *Q = j->q + (qs + i0) * H * D + h * D;
  const T *K = j->k + ks * Hkv * D + hk * D;
  const T *V = j->v + ks * Hkv * Dv + hk * Dv;
  T *O = j->out + (qs + i0) * H * Dv + h * Dv;
  T *lse = j->lse + (qs + i0) * H + h;
  int64_t kend = Lk;
  if (j->causal && i0 + rows < kend) kend = i0 + rows; /* row i sees keys j <= i */
  for (int64_t r = 0; r < rows; r++) {
    m[r] = -INFINITY;
    l[r] = 0;
  }
  memset(acc, 0, (size_t)(rows * Dv) * sizeof(T));
  for (int64_t j0 = 0; j0 < kend; j0 += bc) {
    const int64_t cols = (kend - j0 < bc) ? kend - j0 : bc;
    SUF(rga_gemm)('N', 'T', rows, cols, D, j->scale, Q, H * D, K + j0 * Hkv * D, Hkv * D, 0, S,
                  cols);
    for (int64_t r = 0; r < rows; r++) {
      T *s = S + r * cols;
      /* causal: keys j0 + c > i0 + r are hidden; `n` keys of this block are visible */
      int64_t n = cols;
      if (j->causal && i0 + r - j0 + 1 < n) n = i0 + r - j0 + 1;
      if (n <= 0) {
        memset(s, 0, (size_t)cols * sizeof(T));
        continue;
      }
      T mx = s[0];
#pragma omp simd reduction(max : mx)
      for (int64_t c = 1; c < n; c++) mx = s[c] > mx ? s[c] : mx;
      T mnew = mx > m[r] ? mx : m[r];
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < n; c++) {
        T e = EXP(s[c] - mnew);
        s[c] = e;
        sum += e;
      }
      for (int64_t c = n; c < cols; c++) s[c] = 0;
      T alpha = m[r] == -INFINITY ? 0 : EXP(m[r] - mnew);
      l[r] = l[r] * alpha + sum;
      m[r] = mnew;
      if (alpha != 1) {
        T *a = acc + r * Dv;
        for (int64_t d = 0; d < Dv; d++) a[d] *= alpha;
      }
    }
    SUF(rga_gemm)('N', 'N', rows, Dv, cols, 1, S, cols, V + j0 * Hkv * Dv, Hkv * Dv, 1, acc, Dv);
  }
  for (int64_t r = 0; r < rows; r++) {
    T *o = O + r * H * Dv;
    const T *a = acc + r * Dv;
    if (l[r] > 0) {
      T inv = 1 / l[r];
      for (int64_t d = 0; d < Dv; d++) o[d] = a[d] * inv;
      lse[r * H] = m[r] + log(l[r]);
    } else { /* no keys: output 0, as the other paths give, and log-sum-exp 0 (as torch's
                flash kernel) */
      for (int64_t d = 0; d < Dv; d++) o[d] = 0;
      lse[r * H] = 0;
    }
  }
}

static void *SUF(rga_fwd_worker)(void *p) {
  SUF(rga_job) *j = ((SUF(rga_arg) *)p)->job;
  int previous = rga_local_threads ? rga_local_threads(1) : 0;
  T *S = malloc((size_t)(j->br * j->bc + j->br * j->Dv + 2 * j->br) * sizeof(T));
  if (!S) {
    j->status = 2;
  } else {
    T *acc = S + j->br * j->bc, *m = acc + j->br * j->Dv, *l = m + j->br;
    for (int64_t i = SUF(rga_take)(j); i < j->num_items; i = SUF(rga_take)(j)) {
      RGA_START
      SUF(rga_fwd_item)(j, &j->items[i], S, acc, m, l);
      RGA_STOP(1)
    }
    free(S);
  }
  if (rga_local_threads) rga_local_threads(previous);
  return 0;
}

static int SUF(rga_run)(SUF(rga_job) * j, void *(*worker)(void *), int nthreads) {
  int64_t next = 0;
  j->next = &next;
  j->status = 0;
  if (nthreads < 1) nthreads = 1;
  if (nthreads > j->num_items) nthreads = j->num_items > 0 ? (int)j->num_items : 1;
  SUF(rga_arg) arg = {j};
  void *args[256];
  for (int t = 0; t < 256; t++) args[t] = &arg;
  rga_parallel(worker, args, nthreads);
  return j->status;
}

/* out [Tq, H, Dv] and lse [Tq, H] of every query row over the keys of its sequence. */
int SUF(rga_forward)(const T *q, const T *k, const T *v, const int64_t *qoff,
                     const int64_t *koff, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                     int64_t Hkv, int64_t D, int64_t Dv, T scale, int causal, int64_t br,
                     int64_t bc, int nthreads, T *out, T *lse) {
  if (rga_bad_offsets(qoff, B, Tq) || rga_bad_offsets(koff, B, Tk)) return 1;
  int64_t count = 0;
  for (int64_t b = 0; b < B; b++) count += (qoff[b + 1] - qoff[b] + br - 1) / br;
  rga_item *items = malloc((size_t)(count * H + 1) * sizeof(rga_item));
  if (!items) return 2;
  int64_t n = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t Lq = qoff[b + 1] - qoff[b], Lk = koff[b + 1] - koff[b];
    for (int64_t i0 = 0; i0 < Lq; i0 += br) {
      int64_t rows = Lq - i0 < br ? Lq - i0 : br, keys = Lk;
      if (causal && i0 + rows < keys) keys = i0 + rows;
      for (int64_t h = 0; h < H; h++) {
        rga_item it = {b, h, i0, rows * (keys + 16)};
        items[n++] = it;
      }
    }
  }
  if (nthreads > 1) qsort(items, (size_t)n, sizeof(rga_item), rga_by_cost);
  SUF(rga_job) j;
  memset(&j, 0, sizeof j);
  j.q = q, j.k = k, j.v = v, j.qoff = qoff, j.koff = koff;
  j.H = H, j.Hkv = Hkv, j.D = D, j.Dv = Dv, j.br = br, j.bc = bc, j.scale = scale;
  j.causal = causal, j.items = items, j.num_items = n, j.out = out, j.lse = lse;
  int status = SUF(rga_run)(&j, SUF(rga_fwd_worker), nthreads);
  free(items);
  return status;
}

/* --- backward ----------------------------------------------------------------------------- */

/* Scratch of one thread: P and dP tiles [br, bc], dK and dV accumulators [bc, D(v)], the
   row sums delta = rowsum(dO * O) of the group's heads [groups, max_q]. */
static void SUF(rga_bwd_item)(SUF(rga_job) * j, const rga_item *it, T *P, T *dP, T *dKa, T *dVa,
                              T *delta) {
  const int64_t H = j->H, Hkv = j->Hkv, D = j->D, Dv = j->Dv, br = j->br, bc = j->bc;
  const int64_t groups = H / Hkv, hk = it->h;
  const int64_t qs = j->qoff[it->b], ks = j->koff[it->b];
  const int64_t Lq = j->qoff[it->b + 1] - qs, Lk = j->koff[it->b + 1] - ks;
  const T *K = j->k + ks * Hkv * D + hk * D;
  const T *V = j->v + ks * Hkv * Dv + hk * Dv;
  T *dK = j->dk + ks * Hkv * D + hk * D;
  T *dV = j->dv + ks * Hkv * Dv + hk * Dv;
  for (int64_t t = 0; t < groups; t++) {
    const int64_t h = hk * groups + t;
    for (int64_t i = 0; i < Lq; i++) {
      const T *o = j->o + (qs + i) * H * Dv + h * Dv, *g = j->g + (qs + i) * H * Dv + h * Dv;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < Dv; d++) s += o[d] * g[d];
      delta[t * j->max_q + i] = s;
    }
  }
  for (int64_t j0 = 0; j0 < Lk; j0 += bc) {
    const int64_t cols = (Lk - j0 < bc) ? Lk - j0 : bc;
    memset(dKa, 0, (size_t)(cols * D) * sizeof(T));
    memset(dVa, 0, (size_t)(cols * Dv) * sizeof(T));
    const int64_t first = j->causal ? (j0 / br) * br : 0; /* rows i >= j0 see this block */
    for (int64_t t = 0; t < groups; t++) {
      const int64_t h = hk * groups + t;
      for (int64_t i0 = first; i0 < Lq; i0 += br) {
        const int64_t rows = (Lq - i0 < br) ? Lq - i0 : br;
        const T *Q = j->q + (qs + i0) * H * D + h * D;
        const T *G = j->g + (qs + i0) * H * Dv + h * Dv;
        const T *lse = j->lse + (qs + i0) * H + h;
        const T *dl = delta + t * j->max_q + i0;
        T *dQ = j->dq + (qs + i0) * H * D + h * D;
        SUF(rga_gemm)('N', 'T', rows, cols, D, j->scale, Q, H * D, K + j0 * Hkv * D, Hkv * D, 0,
                      P, cols);
        SUF(rga_gemm)('N', 'T', rows, cols, Dv, 1, G, H * Dv, V + j0 * Hkv * Dv, Hkv * Dv, 0, dP,
                      cols);
        for (int64_t r = 0; r < rows; r++) {
          T *p = P + r * cols, *dp = dP + r * cols;
          int64_t n = cols;
          if (j->causal && i0 + r - j0 + 1 < n) n = i0 + r - j0 + 1;
          if (n < 0) n = 0;
          const T shift = lse[r * H], dd = dl[r];
          for (int64_t c = 0; c < n; c++) {
            T e = EXP(p[c] - shift);
            p[c] = e;
            dp[c] = e * (dp[c] - dd);
          }
          for (int64_t c = n; c < cols; c++) p[c] = dp[c] = 0;
        }
        /* dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K */
        SUF(rga_gemm)('T', 'N', cols, Dv, rows, 1, P, cols, G, H * Dv, 1, dVa, Dv);
        SUF(rga_gemm)('T', 'N', cols, D, rows, j->scale, dP, cols, Q, H * D, 1, dKa, D);
        SUF(rga_gemm)('N', 'N', rows, D, cols, j->scale, dP, cols, K + j0 * Hkv * D, Hkv * D, 1,
                      dQ, H * D);
      }
    }
    for (int64_t c = 0; c < cols; c++) {
      memcpy(dK + (j0 + c) * Hkv * D, dKa + c * D, (size_t)D * sizeof(T));
      memcpy(dV + (j0 + c) * Hkv * Dv, dVa + c * Dv, (size_t)Dv * sizeof(T));
    }
  }
}

static void *SUF(rga_bwd_worker)(void *p) {
  SUF(rga_job) *j = ((SUF(rga_arg) *)p)->job;
  int previous = rga_local_threads ? rga_local_threads(1) : 0;
  const int64_t groups = j->H / j->Hkv;
  size_t tile = (size_t)(j->br * j->bc);
  size_t size = 2 * tile + (size_t)(j->bc * (j->D + j->Dv)) + (size_t)(groups * j->max_q) + 1;
  T *P = malloc(size * sizeof(T));
  if (!P) {
    j->status = 2;
  } else {
    T *dP = P + tile, *dKa = dP + tile, *dVa = dKa + j->bc * j->D, *delta = dVa + j->bc * j->Dv;
    for (int64_t i = SUF(rga_take)(j); i < j->num_items; i = SUF(rga_take)(j)) {
      RGA_START
      SUF(rga_bwd_item)(j, &j->items[i], P, dP, dKa, dVa, delta);
      RGA_STOP(1)
    }
    free(P);
  }
  if (rga_local_threads) rga_local_threads(previous);
  return 0;
}

/* dq [Tq, H, D] (zeroed by the caller), dk [Tk, Hkv, D], dv [Tk, Hkv, Dv] (every row of a
   sequence written; rows outside every sequence left as they are). */
int SUF(rga_backward)(const T *q, const T *k, const T *v, const T *o, const T *g, const T *lse,
                      const int64_t *qoff, const int64_t *koff, int64_t B, int64_t Tq,
                      int64_t Tk, int64_t H, int64_t Hkv, int64_t D, int64_t Dv, T scale,
                      int causal, int64_t br, int64_t bc, int nthreads, T *dq, T *dk, T *dv) {
  if (rga_bad_offsets(qoff, B, Tq) || rga_bad_offsets(koff, B, Tk)) return 1;
  rga_item *items = malloc((size_t)(B * Hkv + 1) * sizeof(rga_item));
  if (!items) return 2;
  int64_t n = 0, max_q = 1;
  for (int64_t b = 0; b < B; b++) {
    int64_t Lq = qoff[b + 1] - qoff[b], Lk = koff[b + 1] - koff[b];
    if (Lq > max_q) max_q = Lq;
    for (int64_t h = 0; h < Hkv; h++) {
      rga_item it = {b, h, 0, (Lq + 16) * (Lk + 16)};
      items[n++] = it;
    }
  }
  if (nthreads > 1) qsort(items, (size_t)n, sizeof(rga_item), rga_by_cost);
  SUF(rga_job) j;
  memset(&j, 0, sizeof j);
  j.q = q, j.k = k, j.v = v, j.o = o, j.g = g, j.qoff = qoff, j.koff = koff;
  j.H = H, j.Hkv = Hkv, j.D = D, j.Dv = Dv, j.br = br, j.bc = bc, j.scale = scale;
  j.max_q = max_q, j.causal = causal, j.items = items, j.num_items = n;
  j.lse = (T *)lse, j.dq = dq, j.dk = dk, j.dv = dv;
  int status = SUF(rga_run)(&j, SUF(rga_bwd_worker), nthreads);
  free(items);
  return status;
}

#endif /* RGA_BODY */
