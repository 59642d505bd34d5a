/* Streaming segment kernels of torch-ragged (see ragged/kernels/_native.py for the design).
 *
 * Plain C99, no headers beyond libc: it compiles in well under a second and is loaded with
 * ctypes. Every kernel walks the rows of `values` in order, one segment (a contiguous run of
 * rows, given by int64 offsets) at a time, keeping the segment's accumulators in a small
 * scratch buffer (cache-resident), and writes each output once.
 *
 * Layout: `v` is [N, D] with row stride `rs` (elements) and contiguous inner elements; every
 * other [*, D] buffer is contiguous unless it takes a row stride too (`gs`: gradients that may
 * be broadcast along rows). Sums, products and log-sum-exp accumulators are double for both
 * float and double inputs (sums add blocks of 16 rows in T first: rg_add_rows): a float32
 * segment of 10^6 rows keeps the accuracy of a float64 sum.
 *
 * Return codes: 0 ok, 1 offsets inconsistent with the rows, 2 out of memory.
 */
#ifndef RG_BODY

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* exp for float, vectorisable (no calls, no branches): Cephes' expf, ~1 ulp. The power of two
   is applied as two factors so that results near the under/overflow limits stay exact. */
static inline float rg_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 88.8f ? 88.8f : xc;                      /* NaN passes both */
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
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
  union { int32_t i; float f; } s1, s2;
  s1.i = (k1 + 127) << 23;
  s2.i = (k2 + 127) << 23;
  return p * s1.f * s2.f;
}

/* log for float on [1, 2^31) and NaN/inf (the running sums of logcumsumexp), vectorisable:
   Cephes' logf. */
static inline float rg_logf_pos(float x) {
  union { float f; int32_t i; } u = {x};
  int32_t e = ((u.i >> 23) & 0xff) - 127;
  u.i = (u.i & 0x007fffff) | 0x3f800000; /* mantissa in [1, 2) */
  float m = u.f;
  int big = m > 1.41421356f;
  m = big ? 0.5f * m : m;
  e = big ? e + 1 : e;
  float f = m - 1.0f;
  float z = f * f;
  float y = 7.0376836292E-2f;
  y = y * f - 1.1514610310E-1f;
  y = y * f + 1.1676998740E-1f;
  y = y * f - 1.2420140846E-1f;
  y = y * f + 1.4249322787E-1f;
  y = y * f - 1.6668057665E-1f;
  y = y * f + 2.0000714765E-1f;
  y = y * f - 2.4999993993E-1f;
  y = y * f + 3.3333331174E-1f;
  y = y * f * z;
  float fe = (float)e;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  float out = f + y + 0.693359375f * fe;
  return x == x && x < INFINITY ? out : x; /* NaN and +inf pass through */
}

static inline double rg_exp(double x) { return exp(x); }
static inline double rg_log_pos(double x) { return log(x); }

static int rg_bad_offsets(const int64_t *off, int64_t B, int64_t N) {
  if (B < 0 || N < 0 || (B > 0 && off[0] < 0)) return 1;
  for (int64_t b = 0; b < B; b++)
    if (off[b + 1] < off[b]) return 1;
  return B > 0 && off[B] > N;
}

#define RG_CHECK(off, B, N) \
  if (rg_bad_offsets(off, B, N)) return 1

/* 256-bit vectors where GCC's 512-bit code is slower: rg_add_rows and its callers (an inlined
   function takes its caller's vector width). */
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define RG_NARROW __attribute__((target("prefer-vector-width=256")))
#else
#define RG_NARROW
#endif

/* A kernel's scratch, one block: `doubles` arrays of D doubles, then `reals` arrays of D
   elements of `size` bytes (one element each when D is 0). NULL when out of memory; free()d by
   the kernel. The double arrays come first, so every array is aligned for its type. */
#define RG_WIDTH(D) ((D) > 0 ? (D) : 1) /* the length of each scratch array */
static void *rg_scratch(int64_t D, int doubles, int reals, size_t size) {
  return malloc((size_t)RG_WIDTH(D) * ((size_t)doubles * sizeof(double) + (size_t)reals * size));
}

#define RG_BODY
#define T float
#define SUF(name) name##_f32
#define EXP rg_expf
#define LOGP rg_logf_pos
#include __FILE__
#undef T
#undef SUF
#undef EXP
#undef LOGP
#define T double
#define SUF(name) name##_f64
#define EXP rg_exp
#define LOGP rg_log_pos
#include __FILE__

#else /* RG_BODY: the kernels, once per dtype T */

/* --- reductions --------------------------------------------------------------------------- */

/* Adds rows [start, end) into the double accumulators `acc` (D of them), in blocks: within a
   block of RG_BLOCK rows the adds are in T (full vector width, the block's sums in `part`,
   cache-resident), and each block's sum is added into `acc` in double. The error of a float32
   segment of any length stays that of a float64 sum of float32 blocks of 16 rows (well within
   issue 11's accuracy contract: docs/semantics.md, "Accuracy"), while the loop reads the
   values at memory speed (converting every float to double cost 20% of it). Two rows per step
   (one update of `part` per pair) and, with GCC on x86, 256-bit vectors (RG_NARROW): measured
   on Zen 4 against the one-row loop in GCC's 512-bit code, 7-10% less time for the sum, level
   with the max kernel (docs/benchmarks.md, "Where the misses come from"). */
#ifndef RG_BLOCK
#define RG_BLOCK 16
#endif
static inline RG_NARROW void SUF(rg_add_rows)(const T *restrict v, int64_t rs, int64_t D,
                                              int64_t start, int64_t end, T *restrict part,
                                              double *restrict acc) {
  for (int64_t i = start; i < end;) {
    int64_t stop = end - i > RG_BLOCK ? i + RG_BLOCK : end;
    memcpy(part, v + i * rs, (size_t)D * sizeof(T));
    for (i++; i + 1 < stop; i += 2) {
      const T *restrict r = v + i * rs, *restrict q = r + rs;
      for (int64_t j = 0; j < D; j++) part[j] += r[j] + q[j];
    }
    if (i < stop) {
      const T *restrict r = v + i * rs;
      for (int64_t j = 0; j < D; j++) part[j] += r[j];
      i++;
    }
    for (int64_t j = 0; j < D; j++) acc[j] += (double)part[j];
  }
}

/* Built only with -DRG_SUM_KAHAN (tools/sum_blocks.py measures it; issue 27 item 2): the
   compensated alternative to rg_add_rows, slower than it on Zen 4 (docs/benchmarks.md,
   "Compensated sums"), kept so that the measurement can be repeated on other CPUs.
   Adds rows [start, end) into `s` with Kahan compensation in T: `s - c` is the sum, `c` the
   running correction (the low part lost by each add, with its sign flipped); the error bound
   is about 2u * sum |x| (u the unit roundoff of T) for any length, against 16u * sum |x| for
   float32 blocks of 16 rows added in double, with no conversions: two adds and two
   subtractions per element. Needs IEEE arithmetic without reassociation (no -ffast-math;
   -fno-trapping-math is fine). Tiled so that the accumulators stay in registers: the rows
   come in blocks of about 16 KiB (L1-resident), each walked once per chunk of RG_KW columns,
   that chunk's `s` and `c` in local arrays across the block's rows (with the accumulators in
   memory, loaded and stored every row, it was slower still). */
#ifdef RG_SUM_KAHAN
#define RG_KW ((int)(128 / sizeof(T))) /* columns per chunk: 8 AVX2 vectors of s and c */
#define RG_KAHAN(x, sj, cj)          \
  do {                               \
    T y_ = (x) - (cj);               \
    T t_ = (sj) + y_;                \
    (cj) = (t_ - (sj)) - y_;         \
    (sj) = t_;                       \
  } while (0)
static inline RG_NARROW void SUF(rg_kahan_block)(const T *restrict v, int64_t rs, int64_t i,
                                                 int64_t end, T *restrict s, T *restrict c) {
  T sv[RG_KW], cv[RG_KW];
  for (int j = 0; j < RG_KW; j++) {
    sv[j] = s[j];
    cv[j] = c[j];
  }
  for (; i < end; i++) {
    const T *restrict r = v + i * rs;
    for (int j = 0; j < RG_KW; j++) RG_KAHAN(r[j], sv[j], cv[j]);
  }
  for (int j = 0; j < RG_KW; j++) {
    s[j] = sv[j];
    c[j] = cv[j];
  }
}

static inline RG_NARROW void SUF(rg_kahan_rows)(const T *restrict v, int64_t rs, int64_t D,
                                                int64_t start, int64_t end, T *restrict s,
                                                T *restrict c) {
  for (int64_t j = 0; j < D; j++) s[j] = c[j] = 0;
  int64_t rows = (int64_t)16384 / ((D > 0 ? D : 1) * (int64_t)sizeof(T));
  rows = rows < 1 ? 1 : rows > 64 ? 64 : rows;
  for (int64_t i0 = start; i0 < end; i0 += rows) {
    int64_t i1 = end - i0 > rows ? i0 + rows : end;
    int64_t j0 = 0;
    for (; j0 + RG_KW <= D; j0 += RG_KW)
      SUF(rg_kahan_block)(v + j0, rs, i0, i1, s + j0, c + j0);
    for (int64_t i = i0; j0 < D && i < i1; i++) { /* the last D % RG_KW columns */
      const T *restrict r = v + i * rs;
      for (int64_t j = j0; j < D; j++) RG_KAHAN(r[j], s[j], c[j]);
    }
  }
}
#undef RG_KAHAN
#undef RG_KW
#endif /* RG_SUM_KAHAN */

/* Per-segment sums, or with `mean` the means (the double sum divided by the row count before
   its one rounding to T; an empty segment gives 0 / 0 = NaN): one pass, one output. Built with
   -DRG_SUM_KAHAN, the compensated T accumulation of rg_kahan_rows instead (s - c in double,
   then the same division): tools/sum_blocks.py compares them. */
RG_NARROW int SUF(rg_sum)(const T *restrict v, int64_t rs, int64_t D,
                          const int64_t *restrict off, int64_t B, int64_t N, int mean,
                          T *restrict out) {
  RG_CHECK(off, B, N);
#ifndef RG_SUM_KAHAN
  double *restrict acc = rg_scratch(D, 1, 1, sizeof(T));
  if (!acc) return 2;
  T *restrict part = (T *)(acc + RG_WIDTH(D));
#else
  T *restrict acc = rg_scratch(D, 0, 2, sizeof(T));
  if (!acc) return 2;
  T *restrict c = acc + RG_WIDTH(D);
#endif
  for (int64_t b = 0; b < B; b++) {
    T *restrict o = out + b * D;
    double n = mean ? (double)(off[b + 1] - off[b]) : 1.0; /* x / 1.0 is x exactly */
#ifndef RG_SUM_KAHAN
    for (int64_t j = 0; j < D; j++) acc[j] = 0.0;
    SUF(rg_add_rows)(v, rs, D, off[b], off[b + 1], part, acc);
    for (int64_t j = 0; j < D; j++) o[j] = (T)(acc[j] / n);
#else
    SUF(rg_kahan_rows)(v, rs, D, off[b], off[b + 1], acc, c);
    for (int64_t j = 0; j < D; j++) o[j] = (T)(((double)acc[j] - (double)c[j]) / n);
#endif
  }
  free(acc);
  return 0;
}

/* Per-segment mean and sum of squared deviations from it (the second pass reads the segment
   from cache): the variance without cancellation, both accumulated in double. Empty segments
   give NaN and 0. */
RG_NARROW int SUF(rg_moments)(const T *restrict v, int64_t rs, int64_t D,
                              const int64_t *restrict off, int64_t B, int64_t N,
                              T *restrict mean, T *restrict m2) {
  RG_CHECK(off, B, N);
  double *restrict acc = rg_scratch(D, 2, 1, sizeof(T));
  if (!acc) return 2;
  double *restrict mu = acc + RG_WIDTH(D);
  T *restrict part = (T *)(mu + RG_WIDTH(D));
  for (int64_t b = 0; b < B; b++) {
    int64_t start = off[b], end = off[b + 1];
    for (int64_t j = 0; j < D; j++) acc[j] = 0.0;
    SUF(rg_add_rows)(v, rs, D, start, end, part, acc);
    for (int64_t j = 0; j < D; j++) {
      mu[j] = acc[j] / (double)(end - start);
      acc[j] = 0.0;
    }
    for (int64_t i = start; i < end; i++) {
      const T *restrict r = v + i * rs;
      for (int64_t j = 0; j < D; j++) {
        double c = (double)r[j] - mu[j];
        acc[j] += c * c;
      }
    }
    for (int64_t j = 0; j < D; j++) {
      mean[b * D + j] = (T)mu[j];
      m2[b * D + j] = (T)acc[j];
    }
  }
  free(acc);
  return 0;
}

/* out = scale[b] * (x - centre[b]) for the rows of every segment b. */
int SUF(rg_affine_rows)(const T *restrict v, int64_t rs, int64_t D,
                        const int64_t *restrict off, int64_t B, int64_t N,
                        const T *restrict scale, const T *restrict centre, T *restrict out) {
  RG_CHECK(off, B, N);
  for (int64_t b = 0; b < B; b++) {
    const T *restrict a = scale + b * D, *restrict c = centre + b * D;
    for (int64_t i = off[b]; i < off[b + 1]; i++) {
      const T *restrict r = v + i * rs;
      T *restrict o = out + i * D;
      for (int64_t j = 0; j < D; j++) o[j] = a[j] * (r[j] - c[j]);
    }
  }
  return 0;
}

/* Running maximum (largest) or minimum into `o`; NaN propagates. */
static inline void SUF(rg_extreme_rows)(const T *restrict v, int64_t rs, int64_t D,
                                        int64_t start, int64_t end, int largest,
                                        T *restrict o) {
  memcpy(o, v + start * rs, (size_t)D * sizeof(T));
  if (largest) {
    for (int64_t i = start + 1; i < end; i++) {
      const T *restrict r = v + i * rs;
      for (int64_t j = 0; j < D; j++) {
        T x = r[j];
        o[j] = (x > o[j] || x != x) ? x : o[j];
      }
    }
  } else {
    for (int64_t i = start + 1; i < end; i++) {
      const T *restrict r = v + i * rs;
      for (int64_t j = 0; j < D; j++) {
        T x = r[j];
        o[j] = (x < o[j] || x != x) ? x : o[j];
      }
    }
  }
}

int SUF(rg_extreme)(const T *restrict v, int64_t rs, int64_t D, const int64_t *restrict off,
                    int64_t B, int64_t N, T fill, int largest, T *restrict out) {
  RG_CHECK(off, B, N);
  for (int64_t b = 0; b < B; b++) {
    T *restrict o = out + b * D;
    if (off[b + 1] == off[b]) {
      for (int64_t j = 0; j < D; j++) o[j] = fill;
    } else {
      SUF(rg_extreme_rows)(v, rs, D, off[b], off[b + 1], largest, o);
    }
  }
  return 0;
}

/* Gradient of a segment max/min: split evenly among the rows attaining it (ties). */
int SUF(rg_extreme_bwd)(const T *restrict v, int64_t rs, int64_t D,
                        const int64_t *restrict off, int64_t B, int64_t N,
                        const T *restrict best, const T *restrict g, int64_t gs,
                        T *restrict gin) {
  RG_CHECK(off, B, N);
  T *restrict share = rg_scratch(D, 0, 1, sizeof(T));
  if (!share) return 2;
  for (int64_t b = 0; b < B; b++) {
    const T *restrict m = best + b * D, *restrict gb = g + b * gs;
    for (int64_t j = 0; j < D; j++) share[j] = 0;
    for (int64_t i = off[b]; i < off[b + 1]; i++) {
      const T *restrict r = v + i * rs;
      for (int64_t j = 0; j < D; j++) share[j] += (T)(r[j] == m[j]);
    }
    for (int64_t j = 0; j < D; j++) share[j] = gb[j] / (share[j] > 1 ? share[j] : (T)1);
    for (int64_t i = off[b]; i < off[b + 1]; i++) {
      const T *restrict r = v + i * rs;
      T *restrict o = gin + i * D;
      for (int64_t j = 0; j < D; j++) o[j] = r[j] == m[j] ? share[j] : (T)0;
    }
  }
  free(share);
  return 0;
}

/* The per-column shift of exp: the segment's maximum where finite, else 0. */
static inline void SUF(rg_shift)(const T *restrict v, int64_t rs, int64_t D, int64_t start,
                                 int64_t end, T *restrict shift) {
  SUF(rg_extreme_rows)(v, rs, D, start, end, 1, shift);
  for (int64_t j = 0; j < D; j++) shift[j] = shift[j] - shift[j] == 0 ? shift[j] : (T)0;
}

int SUF(rg_logsumexp)(const T *restrict v, int64_t rs, int64_t D, const int64_t *restrict off,
                      int64_t B, int64_t N, T *restrict out) {
  RG_CHECK(off, B, N);
  double *restrict s = rg_scratch(D, 1, 1, sizeof(T));
  if (!s) return 2;
  T *restrict shift = (T *)(s + RG_WIDTH(D));
  for (int64_t b = 0; b < B; b++) {
    T *restrict o = out + b * D;
    if (off[b + 1] == off[b]) {
      for (int64_t j = 0; j < D; j++) o[j] = -INFINITY;
      continue;
    }
    SUF(rg_shift)(v, rs, D, off[b], off[b + 1], shift);
    for (int64_t j = 0; j < D; j++) s[j] = 0.0;
    for (int64_t i = off[b]; i < off[b + 1]; i++) {
      const T *restrict r = v + i * rs;
      for (int64_t j = 0; j < D; j++) s[j] += (double)EXP(r[j] - shift[j]);
    }
    for (int64_t j = 0; j < D; j++) o[j] = (T)log(s[j]) + shift[j];
  }
  free(s);
  return 0;
}

/* d logsumexp / d x = exp(x - out): gin = g * exp(x - out), per segment. */
int SUF(rg_logsumexp_bwd)(const T *restrict v, int64_t rs, int64_t D,
                          const int64_t *restrict off, int64_t B, int64_t N,
                          const T *restrict out, const T *restrict g, int64_t gs,
                          T *restrict gin) {
  RG_CHECK(off, B, N);
  for (int64_t b = 0; b < B; b++) {
    const T *restrict ob = out + b * D, *restrict gb = g + b * gs;
    for (int64_t i = off[b]; i < off[b + 1]; i++) {
      const T *restrict r = v + i * rs;
      T *restrict o = gin + i * D;
      for (int64_t j = 0; j < D; j++) o[j] = gb[j] * EXP(r[j] - ob[j]);
    }
  }
  return 0;
}

/* --- softmax ------------------------------------------------------------------------------ */

int SUF(rg_softmax)(const T *restrict v, int64_t rs, int64_t D, const int64_t *restrict off,
                    int64_t B, int64_t N, int log_, T *restrict out) {
  RG_CHECK(off, B, N);
  double *restrict s = rg_scratch(D, 1, 2, sizeof(T));
  if (!s) return 2;
  T *restrict shift = (T *)(s + RG_WIDTH(D)), *restrict scale = shift + RG_WIDTH(D);
  for (int64_t b = 0; b < B; b++) {
    int64_t start = off[b], end = off[b + 1];
    if (start == end) continue;
    SUF(rg_shift)(v, rs, D, start, end, shift);
    for (int64_t j = 0; j < D; j++) s[j] = 0.0;
    if (log_) { /* out = (x - shift) - log(sum) */
      for (int64_t i = start; i < end; i++) {
        const T *restrict r = v + i * rs;
        for (int64_t j = 0; j < D; j++) s[j] += (double)EXP(r[j] - shift[j]);
      }
      for (int64_t j = 0; j < D; j++) scale[j] = (T)log(s[j]);
      for (int64_t i = start; i < end; i++) {
        const T *restrict r = v + i * rs;
        T *restrict o = out + i * D;
        for (int64_t j = 0; j < D; j++) o[j] = (r[j] - shift[j]) - scale[j];
      }
    } else { /* out = exp(x - shift) / sum, the exponentials written once and scaled in cache */
      for (int64_t i = start; i < end; i++) {
        const T *restrict r = v + i * rs;
        T *restrict o = out + i * D;
        for (int64_t j = 0; j < D; j++) {
          T e = EXP(r[j] - shift[j]);
          o[j] = e;
          s[j] += (double)e;
        }
      }
      for (int64_t j = 0; j < D; j++) scale[j] = (T)(1.0 / s[j]);
      for (int64_t i = start; i < end; i++) {
        T *restrict o = out + i * D;
        for (int64_t j = 0; j < D; j++) o[j] *= scale[j];
      }
    }
  }
  free(s);
  return 0;
}

/* softmax: gin = out * (g - sum(g * out)); log-softmax: gin = g - exp(out) * sum(g). */
int SUF(rg_softmax_bwd)(const T *restrict out, const T *restrict g, int64_t gs, int64_t D,
                        const int64_t *restrict off, int64_t B, int64_t N, int log_,
                        T *restrict gin) {
  RG_CHECK(off, B, N);
  double *restrict t = rg_scratch(D, 1, 1, sizeof(T));
  if (!t) return 2;
  T *restrict tt = (T *)(t + RG_WIDTH(D));
  for (int64_t b = 0; b < B; b++) {
    int64_t start = off[b], end = off[b + 1];
    for (int64_t j = 0; j < D; j++) t[j] = 0.0;
    for (int64_t i = start; i < end; i++) {
      const T *restrict gr = g + i * gs, *restrict o = out + i * D;
      if (log_)
        for (int64_t j = 0; j < D; j++) t[j] += (double)gr[j];
      else
        for (int64_t j = 0; j < D; j++) t[j] += (double)(gr[j] * o[j]);
    }
    for (int64_t j = 0; j < D; j++) tt[j] = (T)t[j];
    for (int64_t i = start; i < end; i++) {
      const T *restrict gr = g + i * gs, *restrict o = out + i * D;
      T *restrict q = gin + i * D;
      if (log_)
        for (int64_t j = 0; j < D; j++) q[j] = gr[j] - EXP(o[j]) * tt[j];
      else
        for (int64_t j = 0; j < D; j++) q[j] = o[j] * (gr[j] - tt[j]);
    }
  }
  free(t);
  return 0;
}

/* --- scans -------------------------------------------------------------------------------- */

/* op: 0 sum, 1 prod, 2 max, 3 min, 4 logsumexp. Rows of a segment in scan order: from its
   first row, or from its last with `reverse`. `exclusive` writes the running value before a
   row is combined (the identity first). */
int SUF(rg_scan)(const T *restrict v, int64_t rs, int64_t D, const int64_t *restrict off,
                 int64_t B, int64_t N, int op, int reverse, int exclusive, T *restrict out) {
  RG_CHECK(off, B, N);
  double *restrict acc = rg_scratch(D, 1, 1, sizeof(T));
  if (!acc) return 2;
  T *restrict run = (T *)(acc + RG_WIDTH(D));
  for (int64_t b = 0; b < B; b++) {
    int64_t len = off[b + 1] - off[b];
    int64_t first = reverse ? off[b + 1] - 1 : off[b], step = reverse ? -1 : 1;
    for (int64_t j = 0; j < D; j++) {
      acc[j] = op == 1 ? 1.0 : 0.0;
      run[j] = op == 3 ? (T)INFINITY : (T)-INFINITY;
    }
    for (int64_t p = 0; p < len; p++) {
      int64_t i = first + p * step;
      const T *restrict r = v + i * rs;
      T *restrict o = out + i * D;
      switch (op) {
        case 0:
          for (int64_t j = 0; j < D; j++) {
            double a = acc[j], n = a + (double)r[j];
            o[j] = (T)(exclusive ? a : n);
            acc[j] = n;
          }
          break;
        case 1:
          for (int64_t j = 0; j < D; j++) {
            double a = acc[j], n = a * (double)r[j];
            o[j] = (T)(exclusive ? a : n);
            acc[j] = n;
          }
          break;
        case 2:
          for (int64_t j = 0; j < D; j++) {
            T a = run[j], x = r[j];
            T n = (x > a || x != x) ? x : a;
            o[j] = exclusive ? a : n;
            run[j] = n;
          }
          break;
        case 3:
          for (int64_t j = 0; j < D; j++) {
            T a = run[j], x = r[j];
            T n = (x < a || x != x) ? x : a;
            o[j] = exclusive ? a : n;
            run[j] = n;
          }
          break;
        default: /* running max `run` and sum of exp(x - run) `acc` (0: nothing yet) */
          for (int64_t j = 0; j < D; j++) {
            T m = run[j], x = r[j];
            double s = acc[j];
            T before = s > 0 ? m + (T)LOGP((T)s) : (s == 0 ? (T)-INFINITY : (T)s);
            int up = x > m || x != x;
            T hi = up ? x : m, lo = up ? m : x;
            T e = lo == -(T)INFINITY ? (T)0 : (lo == hi ? (T)1 : EXP(lo - hi));
            s = up ? s * (double)e + 1.0 : s + (double)e;
            s = x != x ? (double)x : s;
            acc[j] = s;
            run[j] = hi;
            T after = s > 0 ? hi + (T)LOGP((T)s) : (s == 0 ? (T)-INFINITY : (T)s);
            o[j] = exclusive ? before : after;
          }
          break;
      }
    }
  }
  free(acc);
  return 0;
}

/* Gradients of the scans (op 1-4; the sum's is the sum scan in the other direction), walking
   each segment backwards in scan order. `x` is the input, `out` the saved output, `g` the
   incoming gradient (row stride gs). Exact with zeros (products), ties and NaN (extrema), and
   -inf (log-sum-exp) as documented in ragged/kernels/_native.py. */
int SUF(rg_scan_bwd)(const T *restrict x, int64_t rs, const T *restrict out,
                     const T *restrict g, int64_t gs, int64_t D, const int64_t *restrict off,
                     int64_t B, int64_t N, int op, int reverse, int exclusive,
                     T *restrict gin) {
  RG_CHECK(off, B, N);
  double *restrict acc = rg_scratch(D, 1, 0, sizeof(T));
  if (!acc) return 2;
  for (int64_t b = 0; b < B; b++) {
    int64_t len = off[b + 1] - off[b];
    int64_t first = reverse ? off[b + 1] - 1 : off[b], step = reverse ? -1 : 1;
    for (int64_t j = 0; j < D; j++) acc[j] = 0.0;
    for (int64_t p = len - 1; p >= 0; p--) {
      int64_t i = first + p * step, nx = i + step, pv = i - step;
      int has_next = p + 1 < len;
      const T *restrict xi = x + i * rs, *restrict oi = out + i * D;
      const T *restrict gi = g + i * gs;
      const T *restrict xn = has_next ? x + nx * rs : xi;
      const T *restrict gn = has_next ? g + nx * gs : gi;
      const T *restrict on = has_next ? out + nx * D : oi;
      T *restrict q = gin + i * D;
      if (op == 1) {
        /* U_i = g_i + x_next U_next (inclusive), g_next + x_next U_next (exclusive);
           gin_i = (product of the rows before i) * U_i. */
        const T *restrict before = exclusive ? oi : (p > 0 ? out + pv * D : NULL);
        for (int64_t j = 0; j < D; j++) {
          double u = has_next ? (double)xn[j] * acc[j] : 0.0;
          u += exclusive ? (has_next ? (double)gn[j] : 0.0) : (double)gi[j];
          acc[j] = u;
          q[j] = (T)((before ? (double)before[j] : 1.0) * u);
        }
      } else if (op == 2 || op == 3) {
        /* The gradient of every output goes to the last row (in scan order) attaining its
           running extremum: a row is a record when it equals the running value (or is NaN). */
        for (int64_t j = 0; j < D; j++) {
          T xv = xi[j], ov = oi[j];
          int rec;
          if (exclusive)
            rec = xv != xv || (ov == ov && (op == 2 ? xv >= ov : xv <= ov));
          else
            rec = xv != xv || xv == ov;
          double a = acc[j] + (exclusive ? (has_next ? (double)gn[j] : 0.0) : (double)gi[j]);
          q[j] = rec ? (T)a : (T)0;
          acc[j] = rec ? 0.0 : a;
        }
      } else {
        /* Q_i = g_i + exp(O_i - O_next) Q_next, gin_i = exp(x_i - O_i) Q_i, with O the
           inclusive output (for an exclusive scan, O_i is the output of the next row, and the
           last row gets no gradient). */
        if (exclusive && !has_next) {
          for (int64_t j = 0; j < D; j++) q[j] = 0;
          continue;
        }
        const T *restrict oo = exclusive ? on : oi;
        int next_has_next = p + 2 < len;
        const T *restrict onn = exclusive ? (next_has_next ? out + (nx + step) * D : on) : on;
        for (int64_t j = 0; j < D; j++) {
          T o_i = oo[j];
          double f = 0.0;
          if (exclusive ? next_has_next : has_next)
            f = o_i == -(T)INFINITY ? 0.0 : (double)EXP(o_i - onn[j]);
          double qv = (exclusive ? (double)gn[j] : (double)gi[j]) + f * acc[j];
          acc[j] = qv;
          T w = xi[j] == -(T)INFINITY ? (T)0 : EXP(xi[j] - o_i);
          q[j] = (T)((double)w * qv);
        }
      }
    }
  }
  free(acc);
  return 0;
}

#endif /* RG_BODY */
