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

   float32 has its own micro-kernels where the build targets AVX-512 (no BLAS call per tile;
   see "The float32 forward on AVX-512" and "the float32 backward on AVX-512" below); float64,
   head widths that are not a multiple of 16 (values in the forward, both in the backward) and
   builds without AVX-512 keep the BLAS tiles.

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

#if defined(__AVX512F__) && !defined(RGA_NO_FAST)
#include <immintrin.h>
#define RGA_FAST 1
#else
#define RGA_FAST 0
#endif

/* Whether float32 has its own micro-kernels in this build (1) or uses BLAS (0). */
int rga_micro_kernel(void) { return RGA_FAST; }

#define RGA_BODY
#define T float
#define SUF(name) name##_f32
#define EXP rga_expf
#define RGA_F32 1
#include __FILE__
#undef T
#undef SUF
#undef EXP
#undef RGA_F32
#define RGA_F32 0
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

/* Work (items' costs times the head width) that pays for one more thread: starting and joining
   one took 60 us here, about the time of 2^23 such units of work. */
#define RGA_THREAD_WORK ((int64_t)1 << 23)

static int SUF(rga_run)(SUF(rga_job) * j, void *(*worker)(void *), int nthreads) {
  int64_t next = 0, work = 0;
  j->next = &next;
  j->status = 0;
  for (int64_t i = 0; i < j->num_items; i++) work += j->items[i].cost * j->D;
  if (nthreads > 1 + work / RGA_THREAD_WORK) nthreads = (int)(1 + work / RGA_THREAD_WORK);
  if (nthreads < 1) nthreads = 1;
  if (nthreads > j->num_items) nthreads = j->num_items > 0 ? (int)j->num_items : 1;
  SUF(rga_arg) arg = {j};
  void *args[256];
  for (int t = 0; t < 256; t++) args[t] = &arg;
  rga_parallel(worker, args, nthreads);
  return j->status;
}

#if RGA_F32 && RGA_FAST
/* The float32 forward on AVX-512 (the build's -march=native defines __AVX512F__ where the CPU
   has it): a micro-kernel of our own instead of two BLAS calls per tile. One work item is a
   sequence and a head: its keys are first copied, transposed, into tiles of RGA_BC keys
   ([D][RGA_BC], zero-padded, in the thread's scratch: they stay in its cache while it uses
   them; a shared copy of all keys made in a first pass was 5% slower). Then per block of `br`
   query rows, per tile of keys and per RGA_MR query rows: the scores of up to RGA_BC keys stay in
   registers (RGA_MR x 4 vectors of 16), the online softmax (base 2: the scale times log2(e)
   is folded into the scores) runs on them there, the probabilities go to a small buffer in L1
   and P V is accumulated with the rescaling of the rows' accumulators folded in. On the causal
   diagonal only the vectors of keys that some row of the RGA_MR rows sees are computed, and
   only the keys up to the last visible one are read for P V. */
#define RGA_BC 64
#define RGA_MR 6
#define RGA_LOG2E 1.44269504088896341f
#define RGA_LN2 0.693147180559945309f
#define RGA_INLINE static inline __attribute__((always_inline))

/* 2^x (x <= 0 here; -inf and anything below -150 give 0): x = n + f, |f| <= 1/2, 2^f by its
   Taylor polynomial of degree 7 (relative error < 2e-8), times 2^n by vscalefps. */
RGA_INLINE __m512 rga_exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5252733804e-5f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393e-4f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/* Mask of the first `n` of 16 lanes (n may be <= 0 or >= 16). */
RGA_INLINE __mmask16 rga_first(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : (n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1));
}

/* acc[r][u] += sum over k < K of a[r * lda + k * ak] b[k * ldb + 16 u ...], for MR rows and
   NV vectors of 16 columns: the micro-kernel of every product (K rank-one updates). */
RGA_INLINE void rga_updates(const int MR, const int NV, __m512 acc[RGA_MR][4], const float *a,
                            int64_t lda, int64_t ak, const float *b, int64_t ldb, int64_t K) {
  for (int64_t k = 0; k < K; k++) {
    __m512 bv[4];
#pragma GCC unroll 4
    for (int u = 0; u < NV; u++) bv[u] = _mm512_loadu_ps(b + k * ldb + 16 * u);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      const __m512 ab = _mm512_set1_ps(a[r * lda + k * ak]);
#pragma GCC unroll 4
      for (int u = 0; u < NV; u++) acc[r][u] = _mm512_fmadd_ps(ab, bv[u], acc[r][u]);
    }
  }
}

/* dst[r] = alpha[r] dst[r] (dst[r] where alpha is NULL) + sum over k < K of a[r * lda + k * ak]
   b[k * ldb ...], for MR rows of dst (stride ldd) and ND vectors of 16 columns. */
RGA_INLINE void rga_acc(const int MR, const int ND, float *dst, int64_t ldd, const float *alpha,
                        const float *a, int64_t lda, int64_t ak, const float *b, int64_t ldb,
                        int64_t K) {
  __m512 o[RGA_MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    const __m512 f = _mm512_set1_ps(alpha ? alpha[r] : 1.0f);
#pragma GCC unroll 4
    for (int u = 0; u < ND; u++) o[r][u] = _mm512_mul_ps(f, _mm512_loadu_ps(dst + r * ldd + 16 * u));
  }
  rga_updates(MR, ND, o, a, lda, ak, b, ldb, K);
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int u = 0; u < ND; u++) _mm512_storeu_ps(dst + r * ldd + 16 * u, o[r][u]);
}

typedef void (*rga_acc_t)(float *, int64_t, const float *, const float *, int64_t, int64_t,
                          const float *, int64_t, int64_t);
#define RGA_ACC(MR, ND)                                                                         \
  static void rga_acc_##MR##_##ND(float *dst, int64_t ldd, const float *alpha, const float *a, \
                                  int64_t lda, int64_t ak, const float *b, int64_t ldb,         \
                                  int64_t K) {                                                  \
    rga_acc(MR, ND, dst, ldd, alpha, a, lda, ak, b, ldb, K);                                    \
  }
#define RGA_ACCS(MR) RGA_ACC(MR, 1) RGA_ACC(MR, 2) RGA_ACC(MR, 3) RGA_ACC(MR, 4)
RGA_ACCS(1)
RGA_ACCS(2)
RGA_ACCS(3)
RGA_ACCS(4)
RGA_ACCS(5)
RGA_ACCS(6)
#define RGA_ACC_ROW(MR) {rga_acc_##MR##_1, rga_acc_##MR##_2, rga_acc_##MR##_3, rga_acc_##MR##_4}
static const rga_acc_t rga_accs[RGA_MR][4] = {RGA_ACC_ROW(1), RGA_ACC_ROW(2), RGA_ACC_ROW(3),
                                              RGA_ACC_ROW(4), RGA_ACC_ROW(5), RGA_ACC_ROW(6)};

/* rga_acc on mr (1..RGA_MR) rows and N columns (a multiple of 16), 64 columns at a time. */
static void rga_accumulate(int64_t mr, int64_t N, float *dst, int64_t ldd, const float *alpha,
                           const float *a, int64_t lda, int64_t ak, const float *b, int64_t ldb,
                           int64_t K) {
  for (int64_t d0 = 0; d0 < N; d0 += 64) {
    const int64_t nd = N - d0 >= 64 ? 4 : (N - d0) / 16;
    rga_accs[mr - 1][nd - 1](dst + d0, ldd, alpha, a, lda, ak, b + d0, ldb, K);
  }
}

/* One tile: rows [r0, r0 + MR) of the item (absolute query rows i0 + r0 + r) against keys
   [j0, j0 + cols) of the sequence, NV vectors of 16 keys computed. q: the first row's query
   (row stride ldq), kt: the tile [D][RGA_BC], vb: the first key's value (row stride ldv), acc:
   the first row's accumulator [Dv], m and l: the rows' running maximum (base 2) and sum. */
RGA_INLINE void rga_tile(const int MR, const int NV, const float *q, int64_t ldq, int64_t D,
                         const float *kt, const float *vb, int64_t ldv, int64_t Dv, float c,
                         int causal, int64_t i, int64_t j0, int64_t cols, float *acc, float *m,
                         float *l, float *P) {
  __m512 s[RGA_MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int u = 0; u < NV; u++) s[r][u] = _mm512_setzero_ps();
  rga_updates(MR, NV, s, q, ldq, 1, kt, RGA_BC, D);
  float alpha[16] = {0}, sums[RGA_MR];
  int64_t used = 0; /* keys seen by some row */
  const __m512 cv = _mm512_set1_ps(c), ninf = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    int64_t n = cols;
    if (causal && i + r - j0 + 1 < n) n = i + r - j0 + 1;
    if (n <= 0) { /* alpha 2^0 = 1 */
      sums[r] = 0;
#pragma GCC unroll 4
      for (int u = 0; u < NV; u++) _mm512_store_ps(P + r * RGA_BC + 16 * u, _mm512_setzero_ps());
      continue;
    }
    used = n > used ? n : used;
    __m512 x[4], mx = ninf;
#pragma GCC unroll 4
    for (int u = 0; u < NV; u++) {
      x[u] = _mm512_mask_mul_ps(ninf, rga_first(n - 16 * u), s[r][u], cv);
      mx = _mm512_max_ps(mx, x[u]);
    }
    const float mb = _mm512_reduce_max_ps(mx), mold = m[r];
    const float mnew = mb > mold ? mb : mold;
    const __m512 mv = _mm512_set1_ps(mnew);
    __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int u = 0; u < NV; u++) {
      __m512 p = rga_exp2_ps(_mm512_sub_ps(x[u], mv));
      sum = _mm512_add_ps(sum, p);
      _mm512_store_ps(P + r * RGA_BC + 16 * u, p);
    }
    alpha[r] = mold - mnew; /* -inf - finite: -inf, whose 2^ is 0 */
    sums[r] = _mm512_reduce_add_ps(sum);
    m[r] = mnew;
  }
  _mm512_storeu_ps(alpha, rga_exp2_ps(_mm512_loadu_ps(alpha))); /* the rows' 2^(mold - mnew) */
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) l[r] = l[r] * alpha[r] + sums[r];
  rga_accumulate(MR, Dv, acc, Dv, alpha, P, RGA_BC, 1, vb, ldv, used); /* alpha acc + P V */
}

typedef void (*rga_tile_t)(const float *, int64_t, int64_t, const float *, const float *,
                           int64_t, int64_t, float, int, int64_t, int64_t, int64_t, float *,
                           float *, float *, float *);
#define RGA_TILE(MR, NV)                                                                        \
  static void rga_tile_##MR##_##NV(const float *q, int64_t ldq, int64_t D, const float *kt,     \
                                   const float *vb, int64_t ldv, int64_t Dv, float c,           \
                                   int causal, int64_t i, int64_t j0, int64_t cols, float *acc,  \
                                   float *m, float *l, float *P) {                              \
    rga_tile(MR, NV, q, ldq, D, kt, vb, ldv, Dv, c, causal, i, j0, cols, acc, m, l, P);         \
  }
#define RGA_TILES(MR) RGA_TILE(MR, 1) RGA_TILE(MR, 2) RGA_TILE(MR, 3) RGA_TILE(MR, 4)
RGA_TILES(1)
RGA_TILES(2)
RGA_TILES(3)
RGA_TILES(4)
RGA_TILES(5)
RGA_TILES(6)
#define RGA_ROW(MR) {rga_tile_##MR##_1, rga_tile_##MR##_2, rga_tile_##MR##_3, rga_tile_##MR##_4}
static const rga_tile_t rga_tiles[RGA_MR][4] = {RGA_ROW(1), RGA_ROW(2), RGA_ROW(3),
                                                RGA_ROW(4), RGA_ROW(5), RGA_ROW(6)};

/* r[i] = column i of the 16 x 16 matrix whose rows are r[0..15] (64 shuffles). */
RGA_INLINE void rga_transpose16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#define RGA_PD(x) _mm512_castps_pd(x)
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) { /* r[4i + j], lane L: column 4L + j of rows 4i..4i+3 */
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(RGA_PD(t[4 * i]), RGA_PD(t[4 * i + 2])));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(RGA_PD(t[4 * i]), RGA_PD(t[4 * i + 2])));
    r[4 * i + 2] =
        _mm512_castpd_ps(_mm512_unpacklo_pd(RGA_PD(t[4 * i + 1]), RGA_PD(t[4 * i + 3])));
    r[4 * i + 3] =
        _mm512_castpd_ps(_mm512_unpackhi_pd(RGA_PD(t[4 * i + 1]), RGA_PD(t[4 * i + 3])));
  }
#undef RGA_PD
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd);
  }
}

/* Copies n <= 16 rows of src (row stride ld, D columns) transposed to out[d * RGA_BC + i]
   (rows past n: 0), 16 columns at a time. */
static void rga_pack16(float *out, const float *src, int64_t ld, int64_t n, int64_t D) {
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    const __mmask16 cols = rga_first(D - d0);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
      r[i] = i < n ? _mm512_maskz_loadu_ps(cols, src + i * ld + d0) : _mm512_setzero_ps();
    rga_transpose16(r);
    const int64_t rows = D - d0 < 16 ? D - d0 : 16;
    for (int64_t i = 0; i < rows; i++) _mm512_store_ps(out + (d0 + i) * RGA_BC, r[i]);
  }
}

/* Zeroes the columns past the first `L` rounded up to 16 of the tile [D][RGA_BC] holding key L
   (the last one of a sequence of L keys). */
static void rga_pad(float *tiles, int64_t L, int64_t D) {
  const int64_t from = (L + 15) / 16 * 16, end = (L + RGA_BC - 1) / RGA_BC * RGA_BC;
  if (from >= end) return;
  float *tile = tiles + (from / RGA_BC) * D * RGA_BC + from % RGA_BC;
  for (int64_t d = 0; d < D; d++) memset(tile + d * RGA_BC, 0, (size_t)(end - from) * sizeof(float));
}

/* Rows [0, L) of src (row stride ld, D columns) transposed into tiles [D][RGA_BC], one after
   the other (the last one zero-padded). */
static void rga_pack(float *tiles, const float *src, int64_t ld, int64_t L, int64_t D) {
  for (int64_t c0 = 0; c0 < L; c0 += 16)
    rga_pack16(tiles + (c0 / RGA_BC) * D * RGA_BC + c0 % RGA_BC, src + c0 * ld, ld, L - c0, D);
  rga_pad(tiles, L, D);
}

/* Rows [i0, i0 + rows) of head h of sequence b (Q: its first row; Kt: the sequence's keys of
   the head's key-value head, transposed; V: its first key's value). */
static void rga_fast_block(rga_job_f32 *j, int64_t b, int64_t h, int64_t i0, const float *Kt,
                           const float *V, float *P, float *acc, float *m, float *l) {
  const int64_t H = j->H, Hkv = j->Hkv, D = j->D, Dv = j->Dv;
  const int64_t qs = j->qoff[b], Lq = j->qoff[b + 1] - qs, Lk = j->koff[b + 1] - j->koff[b];
  const int64_t rows = (Lq - i0 < j->br) ? Lq - i0 : j->br;
  const float *Q = j->q + (qs + i0) * H * D + h * D;
  const float c = j->scale * RGA_LOG2E;
  int64_t kend = Lk;
  if (j->causal && i0 + rows < kend) kend = i0 + rows;
  for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
  memset(acc, 0, (size_t)(rows * Dv) * sizeof(float));
  for (int64_t j0 = 0; j0 < kend; j0 += RGA_BC) {
    const int64_t cols = (kend - j0 < RGA_BC) ? kend - j0 : RGA_BC;
    const float *kt = Kt + (j0 / RGA_BC) * D * RGA_BC, *vb = V + j0 * Hkv * Dv;
    for (int64_t r0 = 0; r0 < rows; r0 += RGA_MR) {
      const int64_t mr = rows - r0 < RGA_MR ? rows - r0 : RGA_MR;
      int64_t last = cols; /* keys of this tile seen by the block's last row */
      if (j->causal && i0 + r0 + mr - j0 < last) last = i0 + r0 + mr - j0;
      if (last <= 0) continue;
      rga_tiles[mr - 1][(last + 15) / 16 - 1](Q + r0 * H * D, H * D, D, kt, vb, Hkv * Dv, Dv, c,
                                              j->causal, i0 + r0, j0, cols, acc + r0 * Dv,
                                              m + r0, l + r0, P);
    }
  }
  float *O = j->out + (qs + i0) * H * Dv + h * Dv, *lse = j->lse + (qs + i0) * H + h;
  for (int64_t r = 0; r < rows; r++) {
    float *o = O + r * H * Dv;
    const float *a = acc + r * Dv;
    if (l[r] > 0) {
      const float inv = 1 / l[r];
      for (int64_t d = 0; d < Dv; d++) o[d] = a[d] * inv;
      lse[r * H] = (m[r] + log2f(l[r])) * RGA_LN2;
    } else {
      for (int64_t d = 0; d < Dv; d++) o[d] = 0;
      lse[r * H] = 0;
    }
  }
}

/* The keys of the job's longest sequence, rounded up to whole tiles of RGA_BC: the rows of a
   fast-path worker's transposed key (and value) tiles. */
static int64_t rga_tile_keys(const rga_job_f32 *j) {
  int64_t longest = 0;
  for (int64_t i = 0; i < j->num_items; i++) {
    const int64_t b = j->items[i].b, Lk = j->koff[b + 1] - j->koff[b];
    longest = Lk > longest ? Lk : longest;
  }
  return (longest + RGA_BC - 1) / RGA_BC * RGA_BC;
}

/* A worker's scratch: `floats` floats aligned to 64 bytes in *mem (the caller frees *mem), or
   NULL with the job's status set when out of memory. */
static float *rga_scratch_f32(rga_job_f32 *j, int64_t floats, char **mem) {
  *mem = malloc((size_t)floats * sizeof(float) + 64);
  if (!*mem) {
    j->status = 2;
    return 0;
  }
  return (float *)(((uintptr_t)*mem + 63) & ~(uintptr_t)63);
}

/* One work item: head it->h of sequence it->b, its keys first transposed into the thread's
   tiles (they stay in its cache for the item's blocks of query rows). */
static void *rga_fast_worker(void *p) {
  rga_job_f32 *j = ((rga_arg_f32 *)p)->job;
  const int64_t keys = rga_tile_keys(j), Hkv = j->Hkv, D = j->D;
  /* the keys' tiles [keys][D] and P [RGA_MR][RGA_BC] aligned to 64 bytes, acc [br][Dv], m and
     l [br] */
  char *mem;
  float *kt = rga_scratch_f32(j, keys * D + RGA_MR * RGA_BC + j->br * (j->Dv + 2), &mem);
  if (!kt) return 0;
  float *P = kt + keys * D, *acc = P + RGA_MR * RGA_BC, *m = acc + j->br * j->Dv, *l = m + j->br;
  for (int64_t i = rga_take_f32(j); i < j->num_items; i = rga_take_f32(j)) {
    RGA_START
    const int64_t b = j->items[i].b, h = j->items[i].h, hk = h / (j->H / Hkv);
    const int64_t ks = j->koff[b], Lk = j->koff[b + 1] - ks, Lq = j->qoff[b + 1] - j->qoff[b];
    rga_pack(kt, j->k + ks * Hkv * D + hk * D, Hkv * D, Lk, D);
    for (int64_t i0 = 0; i0 < Lq; i0 += j->br)
      rga_fast_block(j, b, h, i0, kt, j->v + ks * Hkv * j->Dv + hk * j->Dv, P, acc, m, l);
    RGA_STOP(1)
  }
  free(mem);
  return 0;
}

/* The forward of rga_forward_f32 on this path: work items (sequence, head), largest first. */
static int rga_fast_forward(rga_job_f32 *j, int64_t B, int nthreads) {
  rga_item *items = malloc((size_t)(B * j->H + 1) * sizeof(rga_item));
  if (!items) return 2;
  int64_t n = 0;
  for (int64_t b = 0; b < B; b++) {
    const int64_t Lq = j->qoff[b + 1] - j->qoff[b], Lk = j->koff[b + 1] - j->koff[b];
    const int64_t pairs = j->causal ? Lq * (Lq + 1) / 2 : Lq * Lk; /* causal: Lq == Lk */
    for (int64_t h = 0; h < j->H && Lq > 0; h++) {
      rga_item it = {b, h, 0, pairs + 16 * (Lq + Lk)};
      items[n++] = it;
    }
  }
  if (nthreads > 1) qsort(items, (size_t)n, sizeof(rga_item), rga_by_cost);
  rga_job_f32 job = *j;
  job.items = items, job.num_items = n;
  const int status = rga_run_f32(&job, rga_fast_worker, nthreads);
  free(items);
  return status;
}
#endif

/* out [Tq, H, Dv] and lse [Tq, H] of every query row over the keys of its sequence. */
int SUF(rga_forward)(const T *q, const T *k, const T *v, const int64_t *qoff,
                     const int64_t *koff, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                     int64_t Hkv, int64_t D, int64_t Dv, T scale, int causal, int64_t br,
                     int64_t bc, int nthreads, int fast, T *out, T *lse) {
  if (rga_bad_offsets(qoff, B, Tq) || rga_bad_offsets(koff, B, Tk)) return 1;
  SUF(rga_job) j;
  memset(&j, 0, sizeof j);
  j.q = q, j.k = k, j.v = v, j.qoff = qoff, j.koff = koff;
  j.H = H, j.Hkv = Hkv, j.D = D, j.Dv = Dv, j.br = br, j.bc = bc, j.scale = scale;
  j.causal = causal, j.out = out, j.lse = lse;
#if RGA_F32 && RGA_FAST
  if (fast && Dv % 16 == 0) return rga_fast_forward(&j, B, nthreads);
#endif
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
  j.items = items, j.num_items = n;
  (void)fast;
  int status = SUF(rga_run)(&j, SUF(rga_fwd_worker), nthreads);
  free(items);
  return status;
}

/* --- backward ----------------------------------------------------------------------------- */

/* The start of a backward work item (sequence it->b, key-value head it->h): zeroes the rows of
   dQ of the group's heads (then accumulated) and makes delta = rowsum(dO * O) of each. */
static void SUF(rga_bwd_start)(SUF(rga_job) * j, const rga_item *it, T *delta) {
  const int64_t H = j->H, D = j->D, Dv = j->Dv, groups = H / j->Hkv;
  const int64_t qs = j->qoff[it->b], Lq = j->qoff[it->b + 1] - qs;
  for (int64_t t = 0; t < groups; t++) {
    const int64_t h = it->h * groups + t;
    for (int64_t i = 0; i < Lq; i++) {
      const T *o = j->o + (qs + i) * H * Dv + h * Dv, *g = j->g + (qs + i) * H * Dv + h * Dv;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < Dv; d++) s += o[d] * g[d];
      delta[t * j->max_q + i] = s;
      memset(j->dq + (qs + i) * H * D + h * D, 0, (size_t)D * sizeof(T));
    }
  }
}

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
  SUF(rga_bwd_start)(j, it, delta);
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

#if RGA_F32 && RGA_FAST
/* --- the float32 backward on AVX-512 -------------------------------------------------------
   One work item is a sequence and a key-value head (as on the BLAS path). Its keys and values
   are first copied, transposed, into tiles of RGA_BC (the thread's scratch). Per tile of keys,
   per query head of the group and per block of query rows: per RGA_MR rows, the scores against
   the tile (registers) give P = 2^(S log2(e) scale - lse log2(e)), dO V^T gives dP, and
   dS = scale P (dP - delta) (both to the block's buffers in L1, the keys no row of the block
   sees skipped as in the forward); dQ += dS K goes straight into dQ's rows; then dV += P^T dO
   and dK += dS^T Q for the tile's keys, RGA_MR keys at a time, over the block's rows that see
   them. */

/* P and dS of MR rows (absolute query row i + r) against keys [j0, j0 + cols), NV vectors of
   16 keys computed, the rest of the RGA_BC columns written 0. */
RGA_INLINE void rga_btile(const int MR, const int NV, const float *q, int64_t ldq, int64_t D,
                          const float *kt, const float *g, int64_t ldg, int64_t Dv,
                          const float *vt, float c, float scale, int causal, int64_t i,
                          int64_t j0, int64_t cols, const float *lse, int64_t ldl,
                          const float *delta, float *P, float *dS) {
  __m512 s[RGA_MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int u = 0; u < NV; u++) s[r][u] = _mm512_setzero_ps();
  rga_updates(MR, NV, s, q, ldq, 1, kt, RGA_BC, D);
  const __m512 cv = _mm512_set1_ps(c), zero = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    int64_t n = cols;
    if (causal && i + r - j0 + 1 < n) n = i + r - j0 + 1;
    const __m512 shift = _mm512_set1_ps(lse[r * ldl] * RGA_LOG2E);
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
      __m512 p = zero;
      if (u < NV)
        p = _mm512_maskz_mov_ps(rga_first(n - 16 * u),
                                rga_exp2_ps(_mm512_fmsub_ps(s[r][u], cv, shift)));
      _mm512_store_ps(P + r * RGA_BC + 16 * u, p);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int u = 0; u < NV; u++) s[r][u] = _mm512_setzero_ps();
  rga_updates(MR, NV, s, g, ldg, 1, vt, RGA_BC, Dv);
  const __m512 sv = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    const __m512 dl = _mm512_set1_ps(delta[r]);
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
      __m512 ds = zero;
      if (u < NV) {
        const __m512 p = _mm512_load_ps(P + r * RGA_BC + 16 * u);
        ds = _mm512_mul_ps(_mm512_mul_ps(sv, p), _mm512_sub_ps(s[r][u], dl));
      }
      _mm512_store_ps(dS + r * RGA_BC + 16 * u, ds);
    }
  }
}

typedef void (*rga_btile_t)(const float *, int64_t, int64_t, const float *, const float *,
                            int64_t, int64_t, const float *, float, float, int, int64_t, int64_t,
                            int64_t, const float *, int64_t, const float *, float *, float *);
#define RGA_BTILE(MR, NV)                                                                       \
  static void rga_btile_##MR##_##NV(                                                           \
      const float *q, int64_t ldq, int64_t D, const float *kt, const float *g, int64_t ldg,     \
      int64_t Dv, const float *vt, float c, float scale, int causal, int64_t i, int64_t j0,     \
      int64_t cols, const float *lse, int64_t ldl, const float *delta, float *P, float *dS) {   \
    rga_btile(MR, NV, q, ldq, D, kt, g, ldg, Dv, vt, c, scale, causal, i, j0, cols, lse, ldl,   \
              delta, P, dS);                                                                    \
  }
#define RGA_BTILES(MR) RGA_BTILE(MR, 1) RGA_BTILE(MR, 2) RGA_BTILE(MR, 3) RGA_BTILE(MR, 4)
RGA_BTILES(1)
RGA_BTILES(2)
RGA_BTILES(3)
RGA_BTILES(4)
RGA_BTILES(5)
RGA_BTILES(6)
#define RGA_BROW(MR) {rga_btile_##MR##_1, rga_btile_##MR##_2, rga_btile_##MR##_3, rga_btile_##MR##_4}
static const rga_btile_t rga_btiles[RGA_MR][4] = {RGA_BROW(1), RGA_BROW(2), RGA_BROW(3),
                                                  RGA_BROW(4), RGA_BROW(5), RGA_BROW(6)};

/* Scratch of one thread (floats): the transposed keys and values of the longest sequence, P
   and dS of a block of rows, the tile's dK and dV accumulators, delta of the group's heads. */
typedef struct {
  float *kt, *vt, *P, *dS, *dKa, *dVa, *delta;
} rga_bscratch;

static void rga_fast_bwd_item(rga_job_f32 *j, const rga_item *it, const rga_bscratch *w) {
  const int64_t H = j->H, Hkv = j->Hkv, D = j->D, Dv = j->Dv, br = j->br;
  const int64_t groups = H / Hkv, hk = it->h;
  const int64_t qs = j->qoff[it->b], ks = j->koff[it->b];
  const int64_t Lq = j->qoff[it->b + 1] - qs, Lk = j->koff[it->b + 1] - ks;
  const float *K = j->k + ks * Hkv * D + hk * D;
  const float c = j->scale * RGA_LOG2E;
  rga_pack(w->kt, K, Hkv * D, Lk, D);
  rga_pack(w->vt, j->v + ks * Hkv * Dv + hk * Dv, Hkv * Dv, Lk, Dv);
  rga_bwd_start_f32(j, it, w->delta);
  for (int64_t j0 = 0; j0 < Lk; j0 += RGA_BC) {
    const int64_t cols = (Lk - j0 < RGA_BC) ? Lk - j0 : RGA_BC;
    const float *kt = w->kt + (j0 / RGA_BC) * D * RGA_BC, *vt = w->vt + (j0 / RGA_BC) * Dv * RGA_BC;
    memset(w->dKa, 0, (size_t)(cols * D) * sizeof(float));
    memset(w->dVa, 0, (size_t)(cols * Dv) * sizeof(float));
    const int64_t first = j->causal ? j0 : 0; /* rows i >= j0 see this tile */
    for (int64_t t = 0; t < groups; t++) {
      const int64_t h = hk * groups + t;
      for (int64_t i0 = first; i0 < Lq; i0 += br) {
        const int64_t rows = (Lq - i0 < br) ? Lq - i0 : br;
        const float *Q = j->q + (qs + i0) * H * D + h * D;
        const float *G = j->g + (qs + i0) * H * Dv + h * Dv;
        float *dQ = j->dq + (qs + i0) * H * D + h * D;
        int64_t used = 0; /* keys of the tile seen by some row of the block */
        for (int64_t r0 = 0; r0 < rows; r0 += RGA_MR) {
          const int64_t mr = rows - r0 < RGA_MR ? rows - r0 : RGA_MR;
          int64_t last = cols;
          if (j->causal && i0 + r0 + mr - j0 < last) last = i0 + r0 + mr - j0;
          if (last <= 0) { /* no row sees a key of the tile: P = dS = 0 */
            memset(w->P + r0 * RGA_BC, 0, (size_t)(mr * RGA_BC) * sizeof(float));
            memset(w->dS + r0 * RGA_BC, 0, (size_t)(mr * RGA_BC) * sizeof(float));
            continue;
          }
          rga_btiles[mr - 1][(last + 15) / 16 - 1](
              Q + r0 * H * D, H * D, D, kt, G + r0 * H * Dv, H * Dv, Dv, vt, c, j->scale,
              j->causal, i0 + r0, j0, cols, j->lse + (qs + i0 + r0) * H + h, H,
              w->delta + t * j->max_q + i0 + r0, w->P + r0 * RGA_BC, w->dS + r0 * RGA_BC);
          /* dQ += dS K */
          rga_accumulate(mr, D, dQ + r0 * H * D, H * D, 0, w->dS + r0 * RGA_BC, RGA_BC, 1,
                         K + j0 * Hkv * D, Hkv * D, last);
          used = last > used ? last : used;
        }
        /* dV += P^T dO, dK += dS^T Q, RGA_MR keys at a time, over the rows that see them */
        for (int64_t c0 = 0; c0 < used; c0 += RGA_MR) {
          const int64_t mc = used - c0 < RGA_MR ? used - c0 : RGA_MR;
          int64_t r = 0;
          if (j->causal && j0 + c0 - i0 > 0) r = j0 + c0 - i0;
          if (r >= rows) break;
          rga_accumulate(mc, Dv, w->dVa + c0 * Dv, Dv, 0, w->P + r * RGA_BC + c0, 1, RGA_BC,
                         G + r * H * Dv, H * Dv, rows - r);
          rga_accumulate(mc, D, w->dKa + c0 * D, D, 0, w->dS + r * RGA_BC + c0, 1, RGA_BC,
                         Q + r * H * D, H * D, rows - r);
        }
      }
    }
    float *dK = j->dk + (ks + j0) * Hkv * D + hk * D, *dV = j->dv + (ks + j0) * Hkv * Dv + hk * Dv;
    for (int64_t k = 0; k < cols; k++) {
      memcpy(dK + k * Hkv * D, w->dKa + k * D, (size_t)D * sizeof(float));
      memcpy(dV + k * Hkv * Dv, w->dVa + k * Dv, (size_t)Dv * sizeof(float));
    }
  }
}

static void *rga_fast_bwd_worker(void *p) {
  rga_job_f32 *j = ((rga_arg_f32 *)p)->job;
  const int64_t keys = rga_tile_keys(j), D = j->D, Dv = j->Dv;
  const int64_t size = keys * (D + Dv) + 2 * j->br * RGA_BC + RGA_BC * (D + Dv) +
                       (j->H / j->Hkv) * j->max_q;
  char *mem;
  rga_bscratch w;
  w.kt = rga_scratch_f32(j, size, &mem);
  if (!w.kt) return 0;
  w.vt = w.kt + keys * D, w.P = w.vt + keys * Dv, w.dS = w.P + j->br * RGA_BC;
  w.dKa = w.dS + j->br * RGA_BC, w.dVa = w.dKa + RGA_BC * D, w.delta = w.dVa + RGA_BC * Dv;
  for (int64_t i = rga_take_f32(j); i < j->num_items; i = rga_take_f32(j)) {
    RGA_START
    rga_fast_bwd_item(j, &j->items[i], &w);
    RGA_STOP(1)
  }
  free(mem);
  return 0;
}
#endif

/* dq [Tq, H, D], dk [Tk, Hkv, D], dv [Tk, Hkv, Dv]: every row written (those outside every
   sequence: 0), so the caller need not zero them (first touched by the threads). */
int SUF(rga_backward)(const T *q, const T *k, const T *v, const T *o, const T *g, const T *lse,
                      const int64_t *qoff, const int64_t *koff, int64_t B, int64_t Tq,
                      int64_t Tk, int64_t H, int64_t Hkv, int64_t D, int64_t Dv, T scale,
                      int causal, int64_t br, int64_t bc, int nthreads, int fast, T *dq, T *dk,
                      T *dv) {
  if (rga_bad_offsets(qoff, B, Tq) || rga_bad_offsets(koff, B, Tk)) return 1;
  memset(dq, 0, (size_t)(qoff[0] * H * D) * sizeof(T)); /* rows outside every sequence */
  memset(dq + qoff[B] * H * D, 0, (size_t)((Tq - qoff[B]) * H * D) * sizeof(T));
  memset(dk, 0, (size_t)(koff[0] * Hkv * D) * sizeof(T));
  memset(dk + koff[B] * Hkv * D, 0, (size_t)((Tk - koff[B]) * Hkv * D) * sizeof(T));
  memset(dv, 0, (size_t)(koff[0] * Hkv * Dv) * sizeof(T));
  memset(dv + koff[B] * Hkv * Dv, 0, (size_t)((Tk - koff[B]) * Hkv * Dv) * sizeof(T));
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
  void *(*worker)(void *) = SUF(rga_bwd_worker);
#if RGA_F32 && RGA_FAST
  if (fast && D % 16 == 0 && Dv % 16 == 0) worker = rga_fast_bwd_worker;
#endif
  (void)fast;
  int status = SUF(rga_run)(&j, worker, nthreads);
  free(items);
  return status;
}

#endif /* RGA_BODY */
