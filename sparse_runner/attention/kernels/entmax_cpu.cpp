// Fused CPU kernels for alpha-entmax over the last dim of a (rows, n) contiguous tensor, plus the
// autograd node that wires them up (EntmaxFunction, at the end).
//
// Built on first use by sparse_runner/attention/kernels/__init__.py (torch.utils.cpp_extension.load).
// sparse_runner/attention/entmax_torch.py holds the maths in plain PyTorch (the "torch" backend the
// tests compare this file against); sparse_runner/attention/entmax.py derives the gradient formulas.
// Rows run in parallel (at::parallel_for over blocks of rows); all per-row work happens in L1/L2-sized
// scratch buffers.
//
// Notation (one row):  y = x - max(x) <= 0,  a1 = alpha - 1 in (0, 1],  k = 1 / a1,
//     p_i = [1 + a1 (y_i - u)]_+^k   with u >= 0 chosen so that sum_i p_i = 1.
// (u is the entmax threshold tau = a1 u - 1 in units of 1/a1; in these units the alpha -> 1 limit is
// softmax with u = logsumexp(y), so nothing degenerates for small a1.)
//
// Forward.
//   * alpha = 2 (sparsemax_row) and alpha = 1.5 (entmax15_row): one fused filter pass from tau = -1
//     (the max entry alone gives p = 1), then Newton steps over the compacted support, each checked
//     against the exact closed form on the current support (Michelot's tau for sparsemax; the root of
//     sum_S (z - tau)^2 = 1 for 1.5-entmax), which is the answer as soon as it keeps all of S >= 0.
//   * alpha - 1 < thr (ALPHA_SOFTMAX_THRESHOLD in entmax_torch.py): softmax (softmax_row).
//   * other alpha (FwdBlock), per row: max pass; filter pass keeping 1 + a1 y > 0 (u only grows, so
//     the rest never enters the support); a Jensen lower bound of u as the start; Newton from the
//     left on G(u) = F(u)^a1 - 1 = ||d(u)||_k - 1 (F = sum p, d = [1 + a1 (y - u)]_+): G is a norm
//     of convex non-negative functions, hence convex and decreasing, so the steps never overshoot and
//     every pass may drop the entries that left the support; G is exact in one step for softmax
//     (G -> log F) and on a fixed support for sparsemax.  Far from the root the step is Halley's
//     (bracketed: an overshoot is stepped back from the right, never below the last left point), and
//     the last step is applied as a first- or second-order correction of the pass's p when its error
//     bound allows (FwdBlock::step), so dense rows take about 2 transcendental passes at alpha < 1.5
//     and 2-3 above (the Jensen start also takes one step of Michelot's support iteration).  Rows
//     are solved in blocks whose survivors share one packed buffer: each Newton round is a single
//     dense vector pass for the whole block (a sparse row alone would be one vector and a long
//     dependent chain per pass).
//   * short rows (n <= 256, float32 with AVX2 or AVX-512; LaneBlock): the same solver with W = 8
//     or 16 rows at a time, one row per vector lane.  The rows (or each row's candidates, then its
//     support at the Jensen bound, compacted and padded to the group's longest) are transposed into
//     a (columns x W) buffer, so that a pass is a loop over columns whose vectors hold one entry of
//     every row: sums are lanes of vector accumulators (no horizontal sums), the step is taken for
//     all lanes at once without branches, and dense rows are transposed straight back (no scatter).
//     The last few slow rows of a group take their passes one by one (LaneBlock::lane_pass); the
//     polish runs per row for a few rows of a group, lane-wise for the whole group when more need it.
//     (A backward in the same form measured 1.5-1.8x slower than BwdBlock at 128 keys: supports are
//     mostly short, and padding every lane to the longest in its group costs more than it saves.)
//   * output: zero the row and scatter the survivors (or store directly when nothing was dropped).
//     float32 rows where the solver's float32 u and sums matter (flat rows, d ~ n^-a1, and rows with
//     an entry near the edge of the support at alpha > 1.5; FwdBlock::needs_polish) instead get their
//     threshold polished with float64 sums and are written through the threshold weights.
//
// Backward, with s_i = p_i^(2 - alpha) on the support (0 elsewhere):
//   dx = s * (g - <s, g> / sum s)                                      (Jacobian diag(s) - s s^T / sum s)
//   dalpha = -sum_i g_i A_i + (<s, g> / sum s) sum_i A_i,   A_i = p_i l_i^2 psi(-a1 l_i),  l_i = log p_i,
//   psi(x) = (e^x - 1 - x) / x^2: Correia et al.'s dp/dalpha rewritten without its 1/a1^2 cancellation
//   (derivation in entmax.py); at a1 = 0, psi = 1/2 gives the alpha = 1 limit.  Sparsemax, 1.5-entmax
//   and softmax rows without dalpha take two cheap full-row passes; the rest is batched like the
//   forward (BwdBlock: packed supports, logarithms on dense vectors, per-row segment sums).
//   Fully -inf rows give zeros and zero gradients.
//
// Threshold API (entry points `threshold`, `from_threshold`): the same solvers, but every row is
// written from its threshold t = max + u and normaliser F through one shared elementwise formula, so
// that `from_threshold` recomputes the weights bitwise (see the threshold section of Kernels).
//
// NaN or +inf scores give a NaN row (as softmax), in every entry point.
//
// SIMD: explicit AVX-512 or AVX2+FMA code, chosen at compile time.  The Python loader builds one
// extension per instruction set, with the ISA in its name, so a cache shared between machines never
// hands an AVX-512 build to a CPU without it.  Other CPUs (and float64 everywhere) use the scalar
// instantiation of the same templates.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "entmax_rows.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <limits>
#include <memory>
#include <type_traits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace {

// Scratch arrays: 64-byte aligned (the vector passes over packed buffers, which start at multiples of
// W, never split a load across two cache lines) and kept per thread between calls, growing only.
// Allocating them per call cost up to ~80 us per call at (4096, 128): glibc returns such blocks to
// the OS (or hands out fresh ones), and every call then page-faults its scratch in again.
template <typename E>
struct Buf {
  struct Free {
    void operator()(E* ptr) const { std::free(ptr); }
  };
  std::unique_ptr<E, Free> ptr;
  int64_t capacity = 0;
  // At least `count` elements (old contents are not kept when it grows).
  E* ensure(int64_t count) {
    if (count > capacity) {
      const size_t bytes = (size_t(count) * sizeof(E) + 63) / 64 * 64;
      ptr.reset(static_cast<E*>(std::aligned_alloc(64, bytes)));
      if (!ptr) {
        capacity = 0;
        throw std::bad_alloc();
      }
      capacity = int64_t(bytes / sizeof(E));
    }
    return ptr.get();
  }
};

// One grow-only buffer per thread, per element type and per purpose (Tag).
template <typename E, int Tag>
E* thread_buffer(int64_t count) {
  thread_local Buf<E> buf;
  return buf.ensure(count);
}
enum BufferTag { kFwdVals, kFwdIdx, kRowVals, kRowIdx, kBwdVals, kBwdIdx, kLaneVals, kLaneIdx };

// The Jensen-start memo (FwdBlock): g(c) = (1 - c^-a1) / a1 keyed by (c, a1), valid across calls and
// across the float / double kernels.  kWays values of a1 (slots) at a time, each with its own entry
// per c.
struct MemoStore {
  static constexpr int kWays = 8;
  Buf<double> a1, val;
  int64_t valid = 0;  // entries [0, valid) are initialised
  double slot_a1[kWays] = {-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0};
  int last = 0, next = 0;  // the slot of the last lookup; the next slot to reuse (round robin)
  int slot(double a) {
    if (slot_a1[last] == a) return last;
    for (int w = 0; w < kWays; ++w)
      if (slot_a1[w] == a) return last = w;
    slot_a1[next] = a;  // its entries still hold another a1: JensenMemo::g recomputes them
    last = next;
    next = (next + 1) % kWays;
    return last;
  }
};
inline MemoStore& memo_store() {
  thread_local MemoStore store;
  return store;
}

// Rounds a buffer length up to whole vectors of 64 bytes.
inline int64_t round64(int64_t count, int64_t elem_bytes) {
  const int64_t per = 64 / elem_bytes;
  return (count + per - 1) / per * per;
}

// F = sum_i w_i and Q = sum_i w_i / d_i over x[0, n), with d_i = 1 + a1 (x_i - t) and w_i = d_i^(1/a1)
// on d_i > 0, all in float64 (the threshold polish's last step, FwdBlock::polish).  Scalar libm; the
// AVX-512 layer has a vector version.
template <typename T>
inline void f64_sums_scalar(const T* x, int64_t n, double a1, double t, double& F, double& Q) {
  const double k = 1.0 / a1;
  F = Q = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = std::fma(a1, double(x[j]) - t, 1.0);
    if (d > 0.0) {
      const double w = std::exp(k * std::log(d));
      F += w;
      Q += w / d;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// SIMD layer.  Every struct provides the same static functions; kernels are templates over it.
// Arithmetic operators (+ - * /) work directly on __m512 / __m256 (GCC/Clang vector types).
// ------------------------------------------------------------------------------------------------

// Scalar fallback: one lane.  Used for float64 always and for float32 on CPUs without AVX2.
template <typename T>
struct Scalar {
  using Elem = T;
  using V = T;
  using VI = int32_t;
  using M = bool;
  static constexpr int W = 1;
  static const char* name() { return "generic"; }
  static V set1(T a) { return a; }
  static V load(const T* p) { return *p; }
  static V load_n(const T* p, int n, T fill) { return n > 0 ? *p : fill; }
  static void store(T* p, V v) { *p = v; }
  static void store_n(T* p, V v, int n) { if (n > 0) *p = v; }
  static void store_m(T* p, M m, V v) { if (m) *p = v; }  // the lanes of m only
  // r[0, W) as the rows of a W x W block, transposed in place (LaneBlock).
  static void transpose(V*) {}
  // std::fma where the hardware has it: the same rounding wherever it is inlined (a * b + c may or
  // may not be contracted, and the threshold API needs bitwise-reproducible weights).  Without it,
  // float goes through double, where the product is exact: the threshold weights need the exact
  // rounding error of a product, fma(a, b, -round(a b)) (a * b + c gives 0: errors up to 2e-2 on the
  // gradient of flat 20k-key rows); double keeps a * b + c (a software fma would slow every float64
  // kernel down, and float64 does not need it).
#if defined(__FMA__)
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
#else
  static V fma(V a, V b, V c) {
    if constexpr (std::is_same<T, float>::value)
      return T(double(a) * double(b) + double(c));
    else
      return a * b + c;
  }
#endif
  static V max(V a, V b) { return a > b ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  static V sqrt(V a) { return std::sqrt(a); }
  static M gt(V a, V b) { return a > b; }
  static M ge(V a, V b) { return a >= b; }
  static M lt(V a, V b) { return a < b; }
  static V select(M m, V a, V b) { return m ? a : b; }
  static V maskz(M m, V a) { return m ? a : T(0); }
  static bool any(M m) { return m; }
  static M isnan(V a) { return a != a; }
  static M mor(M a, M b) { return a || b; }
  static M mnone() { return false; }
  static int count(M m) { return m ? 1 : 0; }
  // Double-precision accumulation of a vector of elements (long sums whose rounding matters).
  using VD = double;
  static VD dzero() { return 0.0; }
  static void dadd(VD& lo, VD&, V v) { lo += double(v); }
  static double dsum(VD lo, VD hi) { return lo + hi; }
  // The per-lane sums of dadd (lane l of the accumulated vectors) to p[0, W).
  static void dstore_lanes(double* p, VD lo, VD hi) { p[0] = lo + hi; }
  static T hsum(V v) { return v; }
  static T hmax(V v) { return v; }
  static T hmin(V v) { return v; }
  static VI load_i(const int32_t* p) { return *p; }
  static VI iota(int32_t base) { return base; }
  // Writes v at dst unconditionally (dst has slack); the caller advances by count(m).
  static void compress(T* dst, M, V v) { *dst = v; }
  static void compress_i(int32_t* dst, M, VI v) { *dst = v; }
  // Bounded variants: write only the count(m) selected values (no slack needed).
  static void compress_n(T* dst, M m, V v) { if (m) *dst = v; }
  static void compress_i_n(int32_t* dst, M m, VI v) { if (m) *dst = v; }
  // base[idx[l]] = v[l] for the first n lanes (n <= W).
  static void scatter_n(T* base, const int32_t* idx, V v, int n) { if (n > 0) base[*idx] = v; }
  static V exp(V a) { return std::exp(a); }
  static V log(V a) { return std::log(a); }
  static V log1p(V a) { return std::log1p(a); }
  static V rcp(V a) { return T(1) / a; }
  static void f64_sums(const T* x, int64_t n, double a1, double t, double& F, double& Q) {
    f64_sums_scalar(x, n, a1, t, F, Q);
  }
};

// Polynomial kernels shared by the vector ISAs (Cephes single-precision coefficients, ~1 ulp on the
// reduced ranges).
#define ENTMAX_EXP_POLY(S, r)                                                       \
  ({                                                                                \
    auto _r = (r);                                                                  \
    auto _y = S::set1(1.9875691500E-4f);                                            \
    _y = S::fma(_y, _r, S::set1(1.3981999507E-3f));                                 \
    _y = S::fma(_y, _r, S::set1(8.3334519073E-3f));                                 \
    _y = S::fma(_y, _r, S::set1(4.1665795894E-2f));                                 \
    _y = S::fma(_y, _r, S::set1(1.6666665459E-1f));                                 \
    _y = S::fma(_y, _r, S::set1(5.0000001201E-1f));                                 \
    S::fma(_y, _r * _r, _r + S::set1(1.0f));                                        \
  })

// log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1], e = exponent: returns f + poly + e ln 2.
#define ENTMAX_LOG_POLY(S, f, e)                                                    \
  ({                                                                                \
    auto _f = (f);                                                                  \
    auto _e = (e);                                                                  \
    auto _z = _f * _f;                                                              \
    auto _y = S::set1(7.0376836292E-2f);                                            \
    _y = S::fma(_y, _f, S::set1(-1.1514610310E-1f));                                \
    _y = S::fma(_y, _f, S::set1(1.1676998740E-1f));                                 \
    _y = S::fma(_y, _f, S::set1(-1.2420140846E-1f));                                \
    _y = S::fma(_y, _f, S::set1(1.4249322787E-1f));                                 \
    _y = S::fma(_y, _f, S::set1(-1.6668057665E-1f));                                \
    _y = S::fma(_y, _f, S::set1(2.0000714765E-1f));                                 \
    _y = S::fma(_y, _f, S::set1(-2.4999993993E-1f));                                \
    _y = S::fma(_y, _f, S::set1(3.3333331174E-1f));                                 \
    _y = _y * _f * _z;                                                              \
    _y = S::fma(_e, S::set1(-2.12194440e-4f), _y);                                  \
    _y = S::fma(_z, S::set1(-0.5f), _y);                                            \
    S::fma(_e, S::set1(0.693359375f), _f + _y);                                     \
  })

#if defined(__AVX512F__)
struct Avx512 {
  using Elem = float;
  using V = __m512;
  using VI = __m512i;
  using M = __mmask16;
  static constexpr int W = 16;
  static const char* name() { return "avx512"; }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static M head(int n) { return (M)((1u << n) - 1u); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_n(const float* p, int n, float fill) { return _mm512_mask_loadu_ps(set1(fill), head(n), p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, V v, int n) { _mm512_mask_storeu_ps(p, head(n), v); }
  static void store_m(float* p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  // 16 x 16 transpose: pairs of rows interleaved within 128-bit lanes, then 4 x 4 blocks, then the
  // 128-bit lanes across the four groups of four rows (64 shuffles).
  static void transpose(V* r) {
    V t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    // u[4 g + k], 128-bit lane q: rows 4 g .. 4 g + 3 at column 4 q + k
    for (int g = 0; g < 16; g += 4) {
      u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      const V ab0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), ab1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
      const V cd0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), cd1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
      r[k] = _mm512_shuffle_f32x4(ab0, cd0, 0x88);
      r[8 + k] = _mm512_shuffle_f32x4(ab0, cd0, 0xDD);
      r[4 + k] = _mm512_shuffle_f32x4(ab1, cd1, 0x88);
      r[12 + k] = _mm512_shuffle_f32x4(ab1, cd1, 0xDD);
    }
  }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static M gt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M ge(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static V select(M m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }
  static V maskz(M m, V a) { return _mm512_maskz_mov_ps(m, a); }
  static bool any(M m) { return m != 0; }
  static M isnan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static M mor(M a, M b) { return a | b; }
  static M mnone() { return 0; }
  static int count(M m) { return __builtin_popcount((unsigned)m); }
  using VD = __m512d;
  static VD dzero() { return _mm512_setzero_pd(); }
  static void dadd(VD& lo, VD& hi, V v) {
    lo = lo + _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    hi = hi + _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
  }
  static double dsum(VD lo, VD hi) { return _mm512_reduce_add_pd(lo + hi); }
  static void dstore_lanes(double* p, VD lo, VD hi) {
    _mm512_storeu_pd(p, lo);
    _mm512_storeu_pd(p + 8, hi);
  }
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  static float hmin(V v) { return _mm512_reduce_min_ps(v); }
  static VI load_i(const int32_t* p) { return _mm512_loadu_si512((const void*)p); }
  static VI iota(int32_t base) {
    return _mm512_add_epi32(_mm512_set1_epi32(base),
                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  // In-register compress, then a full-width store (the memory form of vcompressps is slow on Zen 4).
  static void compress(float* dst, M m, V v) { _mm512_storeu_ps(dst, _mm512_maskz_compress_ps(m, v)); }
  static void compress_i(int32_t* dst, M m, VI v) {
    _mm512_storeu_si512((void*)dst, _mm512_maskz_compress_epi32(m, v));
  }
  static void compress_n(float* dst, M m, V v) {
    _mm512_mask_storeu_ps(dst, head(count(m)), _mm512_maskz_compress_ps(m, v));
  }
  static void compress_i_n(int32_t* dst, M m, VI v) {
    _mm512_mask_storeu_epi32((void*)dst, head(count(m)), _mm512_maskz_compress_epi32(m, v));
  }
  // One masked scatter instead of a scalar loop whose trip count the branch predictor cannot know.
  static void scatter_n(float* base, const int32_t* idx, V v, int n) {
    const M k = head(n);
    _mm512_mask_i32scatter_ps(base, k, _mm512_maskz_loadu_epi32(k, idx), v, 4);
  }
  static V exp(V x) {
    // Clamp: below -104 the result rounds to 0 (scalef handles the denormal range exactly).
    x = _mm512_max_ps(_mm512_min_ps(x, set1(88.3762626647949f)), set1(-104.0f));
    V n = _mm512_roundscale_ps(x * set1(1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    return _mm512_scalef_ps(ENTMAX_EXP_POLY(Avx512, r), n);
  }
  static V log(V x) {  // x > 0 (denormals included); other lanes give garbage, callers mask them
    V e = _mm512_getexp_ps(x);
    V m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
    M big = _mm512_cmp_ps_mask(m, set1(1.41421356237f), _CMP_GT_OQ);
    m = _mm512_mask_mul_ps(m, big, m, set1(0.5f));
    e = _mm512_mask_add_ps(e, big, e, set1(1.0f));
    return ENTMAX_LOG_POLY(Avx512, m - set1(1.0f), e);
  }
  static V log1p(V t) {  // t > -1; accurate for tiny |t| (the rounding of 1 + t is corrected)
    V u = t + set1(1.0f);
    return log(u) + (t - (u - set1(1.0f))) / u;
  }
  // 1 / a to ~1 ulp: rcp14 and one Newton step (a division costs ~5x more throughput on Zen 4).
  // a = 0 gives NaN (callers mask those lanes).
  static V rcp(V a) {
    V r = _mm512_rcp14_ps(a);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(a, r, set1(1.0f)), r);
  }

  // float64 exp and log to a few ulp (Taylor series on the reduced ranges: the polish needs sums
  // accurate to ~1e-13, not correctly rounded values).
  static __m512d dexp(__m512d x) {
    x = _mm512_min_pd(_mm512_max_pd(x, _mm512_set1_pd(-746.0)), _mm512_set1_pd(709.0));
    const __m512d n =
        _mm512_roundscale_pd(x * _mm512_set1_pd(1.4426950408889634), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), x);  // ln 2 in two parts
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);  // |r| <= ln 2 / 2
    __m512d p = _mm512_set1_pd(1.0 / 479001600.0);  // 1/12!: truncation error < 2e-16
    for (double f : {39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0})
      p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / f));
    return _mm512_scalef_pd(p, n);
  }
  static __m512d dlog(__m512d x) {  // x > 0
    __m512d e = _mm512_getexp_pd(x);
    __m512d m = _mm512_getmant_pd(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
    const __mmask8 big = _mm512_cmp_pd_mask(m, _mm512_set1_pd(1.4142135623730951), _CMP_GT_OQ);
    m = _mm512_mask_mul_pd(m, big, m, _mm512_set1_pd(0.5));
    e = _mm512_mask_add_pd(e, big, e, _mm512_set1_pd(1.0));
    // log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172: series to s^21 (error < 1e-17)
    const __m512d s = (m - _mm512_set1_pd(1.0)) / (m + _mm512_set1_pd(1.0)), z = s * s;
    __m512d p = _mm512_set1_pd(1.0 / 21.0);
    for (double c : {19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0})
      p = _mm512_fmadd_pd(p, z, _mm512_set1_pd(1.0 / c));
    const __m512d l = _mm512_fmadd_pd(e, _mm512_set1_pd(1.90821492927058770002e-10), (s + s) * p);
    return _mm512_fmadd_pd(e, _mm512_set1_pd(6.93147180369123816490e-01), l);
  }
  static void f64_sums(const float* x, int64_t n, double a1, double t, double& F, double& Q) {
    const __m512d va1 = _mm512_set1_pd(a1), vk = _mm512_set1_pd(1.0 / a1), vt = _mm512_set1_pd(t),
                  one = _mm512_set1_pd(1.0), zero = _mm512_setzero_pd();
    __m512d f = zero, q = zero;
    for (int64_t j = 0; j < n; j += 8) {
      const __mmask8 in = (__mmask8)((1u << std::min<int64_t>(8, n - j)) - 1u);
      const __m512d xv = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(in, x + j));
      const __m512d d = _mm512_fmadd_pd(va1, xv - vt, one);
      const __mmask8 k = _mm512_mask_cmp_pd_mask(in, d, zero, _CMP_GT_OQ);
      const __m512d ds = _mm512_mask_blend_pd(k, one, d);
      const __m512d w = _mm512_maskz_mov_pd(k, dexp(vk * dlog(ds)));
      f = f + w;
      q = q + w / ds;
    }
    F = _mm512_reduce_add_pd(f);
    Q = _mm512_reduce_add_pd(q);
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
  using Elem = float;
  using V = __m256;
  using VI = __m256i;
  using M = __m256;  // all-ones / all-zeros lanes
  static constexpr int W = 8;
  static const char* name() { return "avx2"; }
  // Permutation table for compress: lane order of the set bits of an 8-bit mask.
  struct Lut {
    alignas(32) int32_t idx[256][8];
    Lut() {
      for (int m = 0; m < 256; ++m) {
        int j = 0;
        for (int l = 0; l < 8; ++l)
          if (m & (1 << l)) idx[m][j++] = l;
        for (; j < 8; ++j) idx[m][j] = 0;
      }
    }
  };
  static const Lut& lut() {
    static const Lut table;
    return table;
  }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static __m256i head(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_n(const float* p, int n, float fill) {
    __m256i h = head(n);
    return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, h), _mm256_castsi256_ps(h));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, V v, int n) { _mm256_maskstore_ps(p, head(n), v); }
  static void store_m(float* p, M m, V v) { _mm256_maskstore_ps(p, _mm256_castps_si256(m), v); }
  static void transpose(V* r) {  // 8 x 8 (24 shuffles)
    V t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
      u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
      r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static M gt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M ge(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static V select(M m, V a, V b) { return _mm256_blendv_ps(b, a, m); }
  static V maskz(M m, V a) { return _mm256_and_ps(m, a); }
  static int bits(M m) { return _mm256_movemask_ps(m); }
  static bool any(M m) { return bits(m) != 0; }
  static M isnan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static M mor(M a, M b) { return _mm256_or_ps(a, b); }
  static M mnone() { return _mm256_setzero_ps(); }
  static int count(M m) { return __builtin_popcount((unsigned)bits(m)); }
  using VD = __m256d;
  static VD dzero() { return _mm256_setzero_pd(); }
  static void dadd(VD& lo, VD& hi, V v) {
    lo = lo + _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    hi = hi + _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  }
  static void dstore_lanes(double* p, VD lo, VD hi) {
    _mm256_storeu_pd(p, lo);
    _mm256_storeu_pd(p + 4, hi);
  }
  static double dsum(VD lo, VD hi) {
    __m256d s = lo + hi;
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  }
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static float hmax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static float hmin(V v) {
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    s = _mm_min_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static VI load_i(const int32_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static VI iota(int32_t base) {
    return _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static void compress(float* dst, M m, V v) {
    __m256i perm = _mm256_load_si256((const __m256i*)lut().idx[bits(m)]);
    _mm256_storeu_ps(dst, _mm256_permutevar8x32_ps(v, perm));
  }
  static void compress_i(int32_t* dst, M m, VI v) {
    __m256i perm = _mm256_load_si256((const __m256i*)lut().idx[bits(m)]);
    _mm256_storeu_si256((__m256i*)dst, _mm256_permutevar8x32_epi32(v, perm));
  }
  static void compress_n(float* dst, M m, V v) {
    __m256i perm = _mm256_load_si256((const __m256i*)lut().idx[bits(m)]);
    _mm256_maskstore_ps(dst, head(count(m)), _mm256_permutevar8x32_ps(v, perm));
  }
  static void compress_i_n(int32_t* dst, M m, VI v) {
    __m256i perm = _mm256_load_si256((const __m256i*)lut().idx[bits(m)]);
    _mm256_maskstore_epi32(dst, head(count(m)), _mm256_permutevar8x32_epi32(v, perm));
  }
  static void scatter_n(float* base, const int32_t* idx, V v, int n) {  // AVX2 has no scatter
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int l = 0; l < n; ++l) base[idx[l]] = tmp[l];
  }
  static V exp(V x) {
    // Results below FLT_MIN are flushed to 0 (no denormals on this path).
    V tiny = _mm256_cmp_ps(x, set1(-87.33654f), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, set1(88.3762626647949f)), set1(-87.33654f));
    V n = _mm256_round_ps(x * set1(1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    V y = ENTMAX_EXP_POLY(Avx2, r);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, y * _mm256_castsi256_ps(e));
  }
  static V log(V x) {  // x >= FLT_MIN; other lanes give garbage, callers mask them
    __m256i b = _mm256_castps_si256(x);
    V e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 23), _mm256_set1_epi32(127)));
    V m = _mm256_castsi256_ps(
        _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f800000)));
    V big = _mm256_cmp_ps(m, set1(1.41421356237f), _CMP_GT_OQ);
    m = _mm256_blendv_ps(m, m * set1(0.5f), big);
    e = e + _mm256_and_ps(big, set1(1.0f));
    return ENTMAX_LOG_POLY(Avx2, m - set1(1.0f), e);
  }
  static V log1p(V t) {
    V u = t + set1(1.0f);
    return log(u) + (t - (u - set1(1.0f))) / u;
  }
  static V rcp(V a) {  // rcp (12 bits) and one Newton step: ~1-2 ulp
    V r = _mm256_rcp_ps(a);
    return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(a, r, set1(1.0f)), r);
  }
  static void f64_sums(const float* x, int64_t n, double a1, double t, double& F, double& Q) {
    f64_sums_scalar(x, n, a1, t, F, Q);
  }
};
#endif

#if defined(__AVX512F__)
using SimdF = Avx512;
#elif defined(__AVX2__) && defined(__FMA__)
using SimdF = Avx2;
#else
using SimdF = Scalar<float>;
#endif
using SimdD = Scalar<double>;

// ------------------------------------------------------------------------------------------------
// Per-row kernels.
// ------------------------------------------------------------------------------------------------

enum Mode { kSoftmax = 0, kSparsemax = 1, kEntmax15 = 2, kGeneral = 3 };

template <typename T>
struct Tol;
// Stop the general-alpha Newton at |sum p - 1| <= tol; after the division by sum p the output error is
// at most about tol (float32: 2e-6, well inside the 1e-5 budget; quadratic convergence usually lands
// far below it).
// fin_*: |sum p - 1| below which the last Newton step is applied as a first-order correction
// instead of a new pass (FwdBlock::step), for alpha - 1 <= 0.7 and above.
// polish: whether FwdBlock polishes thresholds (FwdBlock::polish; float32 only, the float64 solver
// works in float64 throughout); solver_bias, polish_tol and weights_bias are _F32_BIAS, _POLISH_TOL
// and _F32_WEIGHTS_BIAS in entmax_polish.py.
template <>
struct Tol<float> {
  static constexpr double newton = 2e-6;
  static constexpr double fin_low_alpha = 1e-3, fin_high_alpha = 2e-4;
  static constexpr double fin2_err = 5e-8;  // bound on the second-order finish's error (FwdBlock::step)
  static constexpr float psi_switch = 1.0f;  // psi(x): series below, direct formula above
  static constexpr bool polish = true;
  static constexpr double solver_bias = 0x1p-23, polish_tol = 4e-6, weights_bias = 1e-7;
};
template <>
struct Tol<double> {
  static constexpr double newton = 1e-12;
  static constexpr double fin_low_alpha = 1e-7, fin_high_alpha = 1e-7;  // error ~0.1 r^2 ~ 1e-15
  static constexpr double fin2_err = 0.0;  // no second-order finish
  static constexpr double psi_switch = 0.1;
  static constexpr bool polish = false;
  static constexpr double solver_bias = 0.0, polish_tol = 0.0, weights_bias = 0.0;
};

constexpr int kMaxIter = 64;
constexpr int kPolishSteps = 4;

// Bound on the relative error of p and of s = p^(2 - alpha) (the backward's weights) when every d of a
// row is off by the same delta (derived in entmax_polish.py, above _F32_BIAS): delta max(k / d_max,
// e (d_min / d_max)^e / d_min), k = 1/a1, e = k - 1.  The second term is below e / d_max < k / d_max
// for e >= 1, and below e / d_min always, so pow is only called when that does not settle it.
inline double bias_effect(double delta, double a1, double dmax, double dmin) {
  dmax = std::max(dmax, 1e-30);
  dmin = std::max(dmin, 1e-30);
  const double e = 1.0 / a1 - 1.0, base = 1.0 / (a1 * dmax);
  if (e >= 1.0 || e <= 0.0 || e / dmin <= base) return delta * base;
  return delta * std::max(base, e * std::pow(dmin / dmax, e) / dmin);
}

template <class S>
struct Kernels {
  using T = typename S::Elem;
  using V = typename S::V;
  using VI = typename S::VI;
  using M = typename S::M;
  static constexpr int W = S::W;

  // Row max; `nan` says whether the row holds a NaN (the max is then meaningless, and the row's
  // output is NaN, as in softmax).
  static T row_max(const T* x, int64_t n, bool& nan) {
    const T ninf = -std::numeric_limits<T>::infinity();
    V a0 = S::set1(ninf), a1 = a0, a2 = a0, a3 = a0;
    M bad = S::mnone();
    int64_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
      V v0 = S::load(x + i), v1 = S::load(x + i + W), v2 = S::load(x + i + 2 * W), v3 = S::load(x + i + 3 * W);
      a0 = S::max(a0, v0);
      a1 = S::max(a1, v1);
      a2 = S::max(a2, v2);
      a3 = S::max(a3, v3);
      bad = S::mor(bad, S::isnan((v0 + v1) + (v2 + v3)));  // NaN in any of them (or inf - inf: rechecked below)
    }
    for (; i + W <= n; i += W) {
      V v = S::load(x + i);
      a0 = S::max(a0, v);
      bad = S::mor(bad, S::isnan(v));
    }
    if (i < n) {
      V v = S::load_n(x + i, int(n - i), ninf);
      a1 = S::max(a1, v);
      bad = S::mor(bad, S::isnan(v));
    }
    nan = S::any(bad);
    if (nan) {  // the cheap test above also fires on +inf and -inf in one sum: look element by element
      nan = false;
      for (int64_t j = 0; j < n; ++j) nan = nan || std::isnan(x[j]);
    }
    return S::hmax(S::max(S::max(a0, a1), S::max(a2, a3)));
  }

  static void fill_zero(T* out, int64_t n) {
    const V z = S::set1(T(0));
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(out + i, z);
    if (i < n) S::store_n(out + i, z, int(n - i));
  }

  // Pads a compacted buffer of length c with W copies of `fill`, so passes read whole vectors.
  static void pad(T* buf, int64_t c, T fill) { S::store(buf + c, S::set1(fill)); }

  // Applies body(vector of x, vector of indices) to a whole row; the tail is padded with `fill`.
  template <class Body>
  static void for_row(const T* x, int64_t n, T fill, Body body) {
    int64_t i = 0;
    for (; i + W <= n; i += W) body(S::load(x + i), S::iota(int32_t(i)));
    if (i < n) body(S::load_n(x + i, int(n - i), fill), S::iota(int32_t(i)));
  }

  // Writes out[idx[j]] = val(j) for the c survivors; the rest of the row is 0.  When nothing was
  // dropped (c == n, order is preserved) the buffer is the row itself: plain vector stores.
  template <class ValV>
  static void write_out(T* out, int64_t n, const T* buf, const int32_t* idx, int64_t c, ValV val) {
    if (c == n) {
      int64_t j = 0;
      for (; j + W <= n; j += W) S::store(out + j, val(S::load(buf + j)));
      if (j < n) S::store_n(out + j, val(S::load(buf + j)), int(n - j));
      return;
    }
    fill_zero(out, n);
    for (int64_t j = 0; j < c; j += W) S::scatter_n(out, idx + j, val(S::load(buf + j)), int(std::min<int64_t>(W, c - j)));
  }

  static void softmax_row(const T* x, T* out, int64_t n, T m) {
    const V vm = S::set1(m);
    V acc = S::set1(T(0));
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      V e = S::exp(S::load(x + i) - vm);
      S::store(out + i, e);
      acc = acc + e;
    }
    if (i < n) {  // exp(-inf) is exactly 0 on every path
      V e = S::exp(S::load_n(x + i, int(n - i), -std::numeric_limits<T>::infinity()) - vm);
      S::store_n(out + i, e, int(n - i));
      acc = acc + e;
    }
    const V inv = S::set1(T(1) / S::hsum(acc));
    for (i = 0; i + W <= n; i += W) S::store(out + i, S::load(out + i) * inv);
    if (i < n) S::store_n(out + i, S::load_n(out + i, int(n - i), T(0)) * inv, int(n - i));
  }

  // alpha = 2.  tau-space: p = [y - tau]_+, start tau = -1; the Newton step on the current support S is
  // Michelot's tau = (sum_S y - 1) / |S|; exact once S stops shrinking.
  // Solves for tau; leaves the support (y, column) compacted in yb / ib, c entries.
  static double sparsemax_solve(const T* x, int64_t n, T m, T* yb, int32_t* ib, int64_t& c) {
    const V vm = S::set1(m);
    V acc = S::set1(T(0));
    c = 0;
    const V vlo = S::set1(T(-1));
    // Compaction is unconditional: a branch on "any survivor in this vector" is data-dependent and
    // mispredicts on fresh inputs (measured: ~2x on sparse rows), while a compress costs ~4 ops.
    for_row(x, n, -std::numeric_limits<T>::infinity(), [&](V xv, VI iv) {
      V y = xv - vm;
      M k = S::gt(y, vlo);
      S::compress(yb + c, k, y);
      S::compress_i(ib + c, k, iv);
      c += S::count(k);
      acc = acc + S::maskz(k, y);
    });
    double tau = (double(S::hsum(acc)) - 1.0) / double(c);
    for (int64_t it = 0; it <= n; ++it) {
      pad(yb, c, -std::numeric_limits<T>::infinity());
      const V vt = S::set1(T(tau));
      acc = S::set1(T(0));
      int64_t c2 = 0;
      for (int64_t j = 0; j < c; j += W) {
        V y = S::load(yb + j);
        M k = S::gt(y, vt);
        VI iv = S::load_i(ib + j);
        S::compress(yb + c2, k, y);
        S::compress_i(ib + c2, k, iv);
        c2 += S::count(k);
        acc = acc + S::maskz(k, y);
      }
      if (c2 == c || c2 == 0) break;
      c = c2;
      tau = (double(S::hsum(acc)) - 1.0) / double(c);
    }
    // The output sums to 1 - (error of sum_S y): on long supports a float32 sum is off by up to
    // ~1e-6 (flat rows) to ~1e-4 (N(0,1) rows, thousands of keys), so the final sum is taken in float64.
    if (c > 2 * W) {
      pad(yb, c, T(0));
      typename S::VD lo = S::dzero(), hi = S::dzero();
      for (int64_t j = 0; j < c; j += W) S::dadd(lo, hi, S::load(yb + j));
      tau = (S::dsum(lo, hi) - 1.0) / double(c);
    }
    return tau;
  }

  // tau as two values of T (hi + lo): y - tau evaluated as (y - hi) - lo keeps the threshold's
  // precision (a float32 tau alone shifts every entry by up to half an ulp of tau -- in the same
  // direction, so the sum of a row with thousands of entries in the support is off by ~1e-4).
  static void split(double tau, V& hi, V& lo) {
    const T h = T(tau);
    hi = S::set1(h);
    lo = S::set1(T(tau - double(h)));
  }

  static void sparsemax_row(const T* x, T* out, int64_t n, T m, T* yb, int32_t* ib) {
    int64_t c;
    const double tau = sparsemax_solve(x, n, m, yb, ib, c);
    pad(yb, c, T(0));
    V th, tl;
    split(tau, th, tl);
    const V zero = S::set1(T(0));
    write_out(out, n, yb, ib, c, [&](V y) { return S::max((y - th) - tl, zero); });
  }

  // alpha = 1.5.  tau-space with z = y / 2: p = [z - tau]_+^2.  Each pass gives, on the current
  // support S (d = z - tau > 0): c, S1 = sum d, S2 = sum d^2, dmin.  The root of sum_S (d - e)^2 = 1 is
  // e = (S2 - 1) / (S1 + sqrt(S1^2 - c (S2 - 1))) (the rationalised form: no cancellation as e -> 0);
  // it is the exact threshold when e <= dmin.  Otherwise take the Newton step on G = sqrt(S2) - 1.
  // Solves for tau (z-space); leaves the support (z, column) compacted in zb / ib, c entries.
  static double entmax15_solve(const T* x, int64_t n, T m, T* zb, int32_t* ib, int64_t& c) {
    const T inf = std::numeric_limits<T>::infinity();
    const V vm = S::set1(m), half = S::set1(T(0.5)), vinf = S::set1(inf), zero = S::set1(T(0));
    V s1 = zero, s2 = zero, dmn = vinf;
    c = 0;
    {
      const V one = S::set1(T(1));
      for_row(x, n, -inf, [&](V xv, VI iv) {  // unconditional compaction, see sparsemax_row
        V z = (xv - vm) * half;
        V d = z + one;
        M k = S::gt(d, zero);
        S::compress(zb + c, k, z);
        S::compress_i(ib + c, k, iv);
        c += S::count(k);
        d = S::maskz(k, d);
        s1 = s1 + d;
        s2 = S::fma(d, d, s2);
        dmn = S::min(dmn, S::select(k, d, vinf));
      });
    }
    double tau = -1.0;
    for (int it = 0; it < kMaxIter; ++it) {
      const double S1 = S::hsum(s1), S2 = S::hsum(s2), dmin = S::hmin(dmn);
      const double f = S2 - 1.0;
      const double disc = S1 * S1 - double(c) * f;
      if (disc >= 0.0) {
        const double e = f / (S1 + std::sqrt(disc));
        if (e <= dmin) {
          tau += e;
          // S1^2 - c (S2 - 1) cancels when tau was far from the root relative to the spread of the
          // support (flat rows: S1^2 / disc ~ c), and float32 sums of thousands of terms are off by
          // ~1e-6: then one more closed-form pass at the new tau, with float64 sums, where
          // nothing cancels (rows summed to 1 - 5e-3 at 10k flat keys without it).
          if (S1 * S1 > 16.0 * disc || c > 4 * W) tau = entmax15_polish(zb, c, tau);
          break;
        }
      }
      tau += (S2 - std::sqrt(S2)) / S1;
      pad(zb, c, -inf);
      V th, tl;
      split(tau, th, tl);
      s1 = zero;
      s2 = zero;
      dmn = vinf;
      int64_t c2 = 0;
      for (int64_t j = 0; j < c; j += W) {
        V z = S::load(zb + j);
        V d = (z - th) - tl;
        M k = S::gt(d, zero);
        VI iv = S::load_i(ib + j);
        S::compress(zb + c2, k, z);
        S::compress_i(ib + c2, k, iv);
        c2 += S::count(k);
        d = S::maskz(k, d);
        s1 = s1 + d;
        s2 = S::fma(d, d, s2);
        dmn = S::min(dmn, S::select(k, d, vinf));
      }
      c = c2;
    }
    return tau;
  }

  // The closed-form root on the support zb[0, c) evaluated again at tau (float64 sums); returns the
  // refined tau (tau itself if the refinement is not consistent, which rounding alone can cause).
  static double entmax15_polish(T* zb, int64_t c, double tau) {
    const T inf = std::numeric_limits<T>::infinity();
    const V zero = S::set1(T(0)), vinf = S::set1(inf);
    pad(zb, c, -inf);
    V th, tl;
    split(tau, th, tl);
    typename S::VD a1 = S::dzero(), b1 = S::dzero(), a2 = S::dzero(), b2 = S::dzero();
    V dmn = vinf;
    int64_t cnt = 0;
    for (int64_t j = 0; j < c; j += W) {
      V d = (S::load(zb + j) - th) - tl;
      M k = S::gt(d, zero);
      d = S::maskz(k, d);
      S::dadd(a1, b1, d);
      S::dadd(a2, b2, d * d);
      cnt += S::count(k);
      dmn = S::min(dmn, S::select(k, d, vinf));
    }
    const double S1 = S::dsum(a1, b1), S2 = S::dsum(a2, b2), f = S2 - 1.0;
    const double disc = S1 * S1 - double(cnt) * f;
    if (cnt == 0 || !(disc >= 0.0)) return tau;
    const double e = f / (S1 + std::sqrt(disc));
    return e <= double(S::hmin(dmn)) ? tau + e : tau;
  }

  static void entmax15_row(const T* x, T* out, int64_t n, T m, T* zb, int32_t* ib) {
    const V zero = S::set1(T(0));
    int64_t c;
    const double tau = entmax15_solve(x, n, m, zb, ib, c);
    pad(zb, c, T(0));
    V th, tl;
    split(tau, th, tl);
    write_out(out, n, zb, ib, c, [&](V z) {
      V d = S::max((z - th) - tl, zero);
      return d * d;
    });
  }

  // ----------------------------------------------------------------------------------------------
  // The threshold representation (entmax_threshold / entmax_from_threshold in entmax_thresholds.py).
  // A row is (t, F), both float64:  w_i = [1 + a1 (x_i - t)]_+^(1/a1)  (softmax rows: exp(x_i - t)),
  // p_i = w_i * T(1 / F).  Precision: the support's d = 1 + a1 (x - t) lies in (0, 1] and, on long
  // flat supports, needs an absolute error well below float32's 6e-8 near 1 (a shared bias of
  // d shifts every weight the same way: 1e-5 on the biggest weight of a 10k-key row).  So x - t is
  // carried as r + c: r = x - t_hi rounded, c = its exact rounding error (TwoSum) - t_lo, with
  // t_hi = T(t), t_lo = T(t - t_hi), and d as h + delta, |delta| << h (general_d), with
  // log d = log h + delta / h.  a1 and k = 1/a1 are float64 values carried as two T each: T(a1) alone
  // is another alpha, whose d differ from alpha's by ~1e-10 near the edge of a long flat support
  // (0.3 % of its smallest weights).  The forward writes its output through the same code
  // (weights_pass + scale_out) that entmax_from_threshold runs (from_threshold_pass), with every
  // multiply-add an explicit fma, so recomputed weights are bitwise the forward's, on any column
  // subset.
  // ----------------------------------------------------------------------------------------------

  struct Thr {
    V th, mth, tl, a1, a1lo, k, klo;
  };
  static Thr make_thr(double t, double a1) {
    const T hi = T(t);
    const T lo = std::isfinite(t) ? T(t - double(hi)) : T(0);
    const T ah = T(a1), kh = T(1.0 / a1);
    return {S::set1(hi), S::set1(-hi), S::set1(lo), S::set1(ah), S::set1(T(a1 - double(ah))),
            S::set1(kh), S::set1(T(1.0 / a1 - double(kh)))};
  }

  // x - t as r + c (see above).  -inf entries get c = 0.
  static void x_minus_t(V xv, const Thr& q, V& r, V& c) {
    r = xv - q.th;
    // TwoSum(x, -t_hi): r + e == x - t_hi exactly (for finite r).
    const V bb = r - xv;
    const V e = (xv - (r - bb)) + (q.mth - bb);
    c = S::maskz(S::gt(r, S::set1(-std::numeric_limits<T>::infinity())), e - q.tl);
  }

  // d = 1 + a1 (r + c) as hs + delta (|delta| << hs), k = (d > 0), hs = 1 off the support.  Two forms,
  // chosen per lane.  Near 1 (h = fma(a1, r, 1) > 1/2): h is rounded once and fma(a1, r, 1 - h) is
  // its rounding error (1 - h is exact for h in [1/2, 2], Sterbenz).  Below 1/2, 1 - h itself rounds,
  // by up to 3e-8, as much as d near the edge of a long flat support (d ~ n^-a1 there): instead the
  // product is split exactly, a1 r = P + e (e = fma(a1, r, -P)), 1 + P is exact (P in [-2, -1/2]),
  // and d = (1 + P) + (e + a1 c) is rounded once, its error kept by Fast2Sum.
  static void general_d(V r, V c, const Thr& q, V& hs, V& delta, M& k) {
    const V one = S::set1(T(1)), zero = S::set1(T(0));
    const V h = S::fma(q.a1, r, one);
    const V rho = S::fma(q.a1lo, r, S::fma(q.a1, c, S::fma(q.a1, r, one - h)));
    const V P = S::fma(q.a1, r, zero);  // an fma: a plain product may be contracted into 1 + P below
    const V s0 = one + P;
    const V lo = S::fma(q.a1lo, r, S::fma(q.a1, c, S::fma(q.a1, r, -P)));
    const V d = s0 + lo;
    const M low = S::lt(P, S::set1(T(-0.5)));
    const V dd = S::select(low, d, h);  // (-inf entries: -inf or NaN, outside the support)
    delta = S::select(low, (s0 - d) + lo, rho);
    k = S::gt(dd, zero);
    hs = S::select(k, dd, one);
  }

  // d^k from general_d's parts (k = 1/a1 as k + klo).
  static V general_w(V hs, V delta, M k, const Thr& q) {
    const V L = S::fma(delta, S::set1(T(1)) / hs, S::log(hs));
    return S::maskz(k, S::exp(S::fma(q.k, L, q.klo * L)));
  }

  // Unnormalised weights of one vector.  -inf entries give 0 in every mode.
  template <int Mode>
  static V weight(V xv, const Thr& q) {
    const V one = S::set1(T(1)), zero = S::set1(T(0));
    V r, c;
    x_minus_t(xv, q, r, c);
    if (Mode == kSoftmax) return S::exp(r + c);
    if (Mode == kSparsemax) return S::max((one + r) + c, zero);  // 1 + r is exact on the support
    if (Mode == kEntmax15) {
      // a1 = 1/2: r / 2 is exact, and so is h = 1 + r / 2 where h <= 1/2 (then h and 1 - h are
      // multiples of 2^-24, 1 - h in [1/2, 1]): the near-1 form of general_d is exact on the whole
      // support.  (-inf entries: h = -inf and delta = NaN; the mask gives 0.)
      const V half = S::set1(T(0.5));
      const V h = S::fma(half, r, one);
      const V delta = S::fma(half, c, S::fma(half, r, one - h));
      const V d = S::max(S::maskz(S::gt(h, zero), h + delta), zero);
      return d * d;
    }
    V hs, delta;
    M k;
    general_d(r, c, q, hs, delta, k);
    // Sparse rows: most vectors hold no entry of the support; the branch skips their log and exp.
    if (!S::any(k)) return zero;
    return general_w(hs, delta, k, q);
  }

  // out = w, returns sum w (accumulated in float64: F decides the sum of the output).
  template <int Mode>
  static double weights_pass(const T* x, T* out, int64_t n, const Thr& q) {
    typename S::VD lo = S::dzero(), hi = S::dzero();
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      const V w = weight<Mode>(S::load(x + i), q);
      S::store(out + i, w);
      S::dadd(lo, hi, w);
    }
    if (i < n) {
      const V w = weight<Mode>(S::load_n(x + i, int(n - i), -std::numeric_limits<T>::infinity()), q);
      S::store_n(out + i, w, int(n - i));
      S::dadd(lo, hi, w);
    }
    return S::dsum(lo, hi);
  }

  template <int Mode>
  static void from_threshold_pass(const T* x, T* out, int64_t n, const Thr& q, T inv) {
    const V vi = S::set1(inv);
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(out + i, weight<Mode>(S::load(x + i), q) * vi);
    if (i < n) {
      const V w = weight<Mode>(S::load_n(x + i, int(n - i), -std::numeric_limits<T>::infinity()), q);
      S::store_n(out + i, w * vi, int(n - i));
    }
  }

  static void scale_out(T* out, int64_t n, T inv) {
    const V vi = S::set1(inv);
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(out + i, S::load(out + i) * vi);
    if (i < n) S::store_n(out + i, S::load_n(out + i, int(n - i), T(0)) * vi, int(n - i));
  }

  static void fill_value(T* out, int64_t n, T v) {
    const V vv = S::set1(v);
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(out + i, vv);
    if (i < n) S::store_n(out + i, vv, int(n - i));
  }

  // The reciprocal both sides multiply by (one rounding, the same everywhere).
  static T inverse(double F) { return T(1.0 / F); }

  // Writes the row from its threshold t; returns F.
  static double write_threshold(const T* x, T* out, int64_t n, int mode, double a1, double t) {
    const Thr q = make_thr(t, a1);
    double F;
    switch (mode) {
      case kSoftmax: F = weights_pass<kSoftmax>(x, out, n, q); break;
      case kSparsemax: F = weights_pass<kSparsemax>(x, out, n, q); break;
      case kEntmax15: F = weights_pass<kEntmax15>(x, out, n, q); break;
      default: F = weights_pass<kGeneral>(x, out, n, q); break;
    }
    scale_out(out, n, inverse(F));
    return F;
  }

  static void write_from_threshold(const T* x, T* out, int64_t n, int mode, double a1, double t, double F) {
    if (std::isnan(t) || std::isnan(F)) {  // a NaN row stays NaN
      fill_value(out, n, std::numeric_limits<T>::quiet_NaN());
      return;
    }
    const Thr q = make_thr(t, a1);
    const T inv = inverse(F);
    switch (mode) {
      case kSoftmax: from_threshold_pass<kSoftmax>(x, out, n, q, inv); break;
      case kSparsemax: from_threshold_pass<kSparsemax>(x, out, n, q, inv); break;
      case kEntmax15: from_threshold_pass<kEntmax15>(x, out, n, q, inv); break;
      default: from_threshold_pass<kGeneral>(x, out, n, q, inv); break;
    }
  }

  static int mode_of(double alpha, double thr) {
    const double a1 = alpha - 1.0;
    return a1 < thr ? kSoftmax : alpha == 2.0 ? kSparsemax : alpha == 1.5 ? kEntmax15 : kGeneral;
  }

  // General alpha in (1, 2): u-space (see the header), Newton on G(u) = F^a1 - 1:
  //   u += F (1 - F^-a1) / (a1 Q),   F = sum p,  Q = sum p / d = -dF/du.
  // Rows are solved in blocks: the survivors of every row of a block sit in one packed buffer with
  // their row's current u (and a1, 1/a1 unless the block shares one alpha) stored per element, so
  // each Newton round is one dense vector pass over all the block's unfinished rows, followed by
  // short per-row sums.  (Row by row, a sparse row's pass is a single vector and one long dependent
  // chain -- log, exp, horizontal sums, step -- and the core idles; packed, the same work is
  // throughput-bound.)

  // Per-thread memo of g(c) = (1 - c^-a1) / a1 for the Jensen start, kept between calls.  A thread's
  // rows cycle through the heads (one alpha each, a few hundred rows at a time): with one entry per c,
  // every change of head refilled it, a log and an expm1 per lookup (~2 % of the forward at 128 keys).
  struct JensenMemo {
    static constexpr int64_t kWays = MemoStore::kWays;
    MemoStore* st;
    double *a1, *val;
    explicit JensenMemo(int64_t n) : st(&memo_store()) {
      const int64_t count = (n + 1) * kWays, before = st->a1.capacity;
      a1 = st->a1.ensure(count);
      val = st->val.ensure(count);
      if (st->a1.capacity != before) st->valid = 0;  // regrown: contents lost
      for (int64_t i = st->valid; i < count; ++i) a1[i] = -1.0;
      st->valid = std::max(st->valid, count);
    }
    double g(int64_t c, double a) {
      const int64_t i = c * kWays + st->slot(a);
      if (a1[i] != a) {
        a1[i] = a;
        val[i] = -std::expm1(-a * std::log(double(c))) / a;
      }
      return val[i];
    }
  };

  struct FwdBlock {
    static constexpr int kRows = 64;
    struct Row {
      const T* x;
      T* out;
      double* params;  // not null: threshold API (write through write_threshold, store (t, F))
      T m;
      int64_t b, c;  // segment [b, b + c) of the packed buffers
      double a1, u, u_lo;  // u_lo: the last u known to be <= the root (F(u_lo) >= 1)
      double F, Q, M2, M3;  // sums of p, q = p r, q r, q r^2 (r = 1 / d) after a pass
      double qmax, rmax, mx3;  // maxima of q, r, q r^2 over the support
      double c2, c3, c4, c5;  // binomial-series coefficients of the Newton step
      double shift;           // > 0: finish with p - shift q + curv shift^2 q r (see step)
      double curv;
      int it;
      bool active;
      bool lag;  // the point being evaluated may lie right of the root (a Halley step): see gather
    };
    int64_t n, cap, tot = 0;
    int nrows = 0;
    T *yb, *pb, *rb, *ab, *kb, *ub;  // y = x - max, p, r = 1 / d, a1, 1/a1, u (per element)
    int32_t* ib;                           // column of each element
    // The a1 of every row of the block, or NaN once they differ: only then are ab and kb filled (rows
    // of one head share alpha, and blocks rarely straddle heads).
    double a1_all = 0.0;
    Row rows[kRows];
    JensenMemo memo;

    explicit FwdBlock(int64_t n_)
        : n(n_), cap(round64(std::max<int64_t>(n_, 4096) + 2 * W, sizeof(T))), memo(n_) {
      yb = thread_buffer<T, kFwdVals>(6 * cap);
      ib = thread_buffer<int32_t, kFwdIdx>(cap);
      pb = yb + cap;
      rb = pb + cap;
      ab = rb + cap;
      kb = ab + cap;
      ub = kb + cap;
    }

    static void fill(T* buf, int64_t b, int64_t e, T v) {  // buf[b, e) = v (no write outside)
      const V vv = S::set1(v);
      int64_t j = b;
      for (; j + W <= e; j += W) S::store(buf + j, vv);
      if (j < e) S::store_n(buf + j, vv, int(e - j));
    }

    // Filter and start.  Keeps y > -1/a1 (d > 0 at u = 0; u only grows, so the rest never enters
    // the support), then starts Newton at a lower bound of the root better than u = 0.  Jensen:
    // phi(d) = [d]_+^k is convex (k >= 1), so for any set S of entries F(u) >= |S| phi(mean_S d(u)),
    // and u_L(S) = mean_S y + (1 - |S|^-a1) / a1 satisfies F(u_L) >= 1, i.e. u_L <= u*.  S = all
    // candidates, twice "those above the mean", then (one step of Michelot's iteration for
    // sparsemax, which this bound is at alpha = 2) S = the support at the current bound, which also
    // drops the entries outside it (y <= u_L - 1/a1: outside the support for every u >= u_L) before
    // the first transcendental pass.  No transcendentals; the last step matters most at alpha > 1.5
    // on dense rows (5 -> 3 passes at 2048 keys).  Repeating it until S is stable saved fewer
    // passes than it cost (measured: the forward 0-9 % slower at 128-2048 keys).
    void add(const T* x, T* out, T m, double a1, double* params = nullptr) {
      if (nrows == kRows || tot + n > cap - 2 * W) solve();
      const T ninf = -std::numeric_limits<T>::infinity();
      const V vm = S::set1(m), vlo = S::set1(T(-1.0 / a1)), zero = S::set1(T(0));
      V sy = zero;
      int64_t c = tot;
      for_row(x, n, ninf, [&](V xv, VI iv) {  // branch-free, see sparsemax_row
        V y = xv - vm;
        M k = S::gt(y, vlo);
        S::compress(yb + c, k, y);
        S::compress_i(ib + c, k, iv);
        c += S::count(k);
        sy = sy + S::maskz(k, y);
      });
      Row& r = rows[nrows++];
      r.x = x;
      r.out = out;
      r.params = params;
      r.m = m;
      r.b = tot;
      r.c = c - tot;
      r.a1 = a1;
      tot = c;
      double ybar = double(S::hsum(sy)) / double(r.c);
      double u0 = std::max(0.0, ybar + memo.g(r.c, a1));
      int64_t cs = r.c;
      for (int refine = 0; refine < 2 && cs > 1; ++refine) {
        const V vt = S::set1(T(ybar));
        V acc = zero;
        int64_t c2 = 0, j = r.b;
        for (; j + W <= tot; j += W) {
          V y = S::load(yb + j);
          M k = S::ge(y, vt);
          c2 += S::count(k);
          acc = acc + S::maskz(k, y);
        }
        if (j < tot) {
          V y = S::load_n(yb + j, int(tot - j), ninf);
          M k = S::ge(y, vt);
          c2 += S::count(k);
          acc = acc + S::maskz(k, y);
        }
        const double s2 = S::hsum(acc);
        if (c2 == 0) break;
        cs = c2;
        ybar = s2 / double(c2);
        u0 = std::max(u0, ybar + memo.g(c2, a1));
      }
      const double lim = u0 - 1.0 / a1;
      if (r.c > 1 && lim < 0.0) {  // S = the support at u0, compacted (lim >= 0: rounding only)
        const V vl = S::set1(T(lim));
        V acc = zero;
        int64_t w = r.b, j = r.b;
        const int64_t e = r.b + r.c;
        for (; j + W <= e; j += W) {  // in place: the write position never passes the read one
          V y = S::load(yb + j);
          VI iv = S::load_i(ib + j);
          M k = S::gt(y, vl);
          S::compress(yb + w, k, y);
          S::compress_i(ib + w, k, iv);
          w += S::count(k);
          acc = acc + S::maskz(k, y);
        }
        if (j < e) {
          V y = S::load_n(yb + j, int(e - j), ninf);
          VI iv = S::load_i(ib + j);
          M k = S::gt(y, vl);
          S::compress(yb + w, k, y);
          S::compress_i(ib + w, k, iv);
          w += S::count(k);
          acc = acc + S::maskz(k, y);
        }
        const int64_t c2 = w - r.b;
        if (c2 != r.c) u0 = std::max(u0, double(S::hsum(acc)) / double(c2) + memo.g(c2, a1));
        r.c = c2;
        tot = w;
      }
      if (nrows == 1) {
        a1_all = a1;
      } else if (a1 != a1_all && !std::isnan(a1_all)) {  // the first row with another alpha
        for (int s = 0; s + 1 < nrows; ++s) fill_alpha(rows[s]);
        a1_all = std::numeric_limits<double>::quiet_NaN();
      }
      if (std::isnan(a1_all)) fill_alpha(r);
      r.u = u0;
      r.u_lo = u0;
      r.it = 0;
      r.active = true;
      r.lag = false;
      r.shift = 0.0;
      r.curv = 0.0;
      const double b = 1.0 - a1;  // c_j = -binom(1 - a1, j) / a1
      r.c2 = b / 2.0;
      r.c3 = -r.c2 * (1.0 + a1) / 3.0;
      r.c4 = -r.c3 * (2.0 + a1) / 4.0;
      r.c5 = -r.c4 * (3.0 + a1) / 5.0;
    }

    void fill_alpha(const Row& r) {
      fill(ab, r.b, r.b + r.c, T(r.a1));
      fill(kb, r.b, r.b + r.c, T(1.0 / r.a1));
    }

    void pass(int64_t lo, int64_t hi) {
      if (std::isnan(a1_all))
        pass_rows<false>(lo, hi);
      else
        pass_rows<true>(lo, hi);
    }

    // One evaluation of every element in [lo, hi) at its row's u: t = a1 (y - u) > -1 on the support,
    // d = 1 + t, p = exp(k log1p(t)) with log1p(t) = log(d) + (t - (d - 1)) / d (the rounding of
    // 1 + t matters once k = 1/a1 is large), r = 1 / d (q = p r is formed where it is summed).
    // kShared: a1 and k are a1_all's, else ab and kb's.
    template <bool kShared>
    void pass_rows(int64_t lo, int64_t hi) {
      const V one = S::set1(T(1)), mone = S::set1(T(-1)), va1 = S::set1(T(a1_all)), vk = S::set1(T(1.0 / a1_all));
      for (int64_t j = lo; j < hi; j += W) {
        V y = S::load(yb + j);
        V t = (kShared ? va1 : S::load(ab + j)) * (y - S::load(ub + j));
        M k = S::gt(t, mone);  // false on gaps and finished rows (y = -inf)
        V tc = S::max(t, mone);
        V d = one + tc;
        V rd = S::rcp(d);  // NaN or inf on the masked lanes (d = 0)
        V L;
        if (W == 1)
          L = S::log1p(tc);  // scalar (float64) path: the library log1p
        else
          L = S::fma(tc - (d - one), rd, S::log(d));
        S::store(pb + j, S::maskz(k, S::exp((kShared ? vk : S::load(kb + j)) * L)));
        S::store(rb + j, S::maskz(k, rd));
      }
    }

    // Row sums and maxima after a pass, compacting away the entries that left the support and
    // marking the freed tail dead (y = -inf).  Left of the root u only grows, so p = 0 entries never
    // return; after a Halley step (r.lag) the point may lie right of the root, and only the entries
    // outside the support at u_lo (the last point known to be left of it) are dropped.
    void gather(Row& r) {
      const int64_t b = r.b, e = r.b + r.c;
      const T ulo = T(r.u_lo);
      const T a1t = T(r.a1);
      if (r.c <= 6) {  // tiny segment (sparse rows): scalar, no horizontal sums
        double F = 0.0, Q = 0.0, M2 = 0.0, M3 = 0.0, qmax = 0.0, rmax = 0.0, mx3 = 0.0;
        int64_t w = b;
        for (int64_t j = b; j < e; ++j) {  // branchless compaction
          const T p = pb[j], rv = rb[j], y = yb[j], q = p * rv;
          const T qr = q * rv, qr2 = qr * rv;
          F += p;
          Q += q;
          M2 += qr;
          M3 += qr2;
          qmax = std::max<double>(qmax, q);
          rmax = std::max<double>(rmax, rv);
          mx3 = std::max<double>(mx3, qr2);
          yb[w] = y;
          pb[w] = p;
          rb[w] = rv;
          ib[w] = ib[j];
          w += r.lag ? (a1t * (y - ulo) > T(-1)) : (p > T(0));
        }
        for (int64_t j = w; j < e; ++j) yb[j] = -std::numeric_limits<T>::infinity();
        r.c = w - b;
        r.F = F;
        r.Q = Q;
        r.M2 = M2;
        r.M3 = M3;
        r.qmax = qmax;
        r.rmax = rmax;
        r.mx3 = mx3;
        return;
      }
      const V zero = S::set1(T(0)), va1 = S::set1(a1t), vulo = S::set1(ulo), mone = S::set1(T(-1));
      V fa = zero, qa = zero, m2 = zero, m3 = zero, qmx = zero, rmx = zero, mx3 = zero;
      int64_t w = b;
      for (int64_t j = b; j < e; j += W) {
        const int len = int(std::min<int64_t>(W, e - j));
        V p = len == W ? S::load(pb + j) : S::load_n(pb + j, len, T(0));
        V rv = len == W ? S::load(rb + j) : S::load_n(rb + j, len, T(0));
        V q = p * rv;
        V y = len == W ? S::load(yb + j) : S::load_n(yb + j, len, -std::numeric_limits<T>::infinity());
        M k = r.lag ? S::gt(va1 * (y - vulo), mone) : S::gt(p, zero);
        V qr = q * rv, qr2 = qr * rv;
        fa = fa + p;
        qa = qa + q;
        m2 = m2 + qr;
        m3 = m3 + qr2;
        qmx = S::max(qmx, q);
        rmx = S::max(rmx, rv);
        mx3 = S::max(mx3, qr2);
        if (len == W && S::count(k) == W && w == j) {  // nothing to drop, already in place
          w += W;
          continue;
        }
        VI iv = S::load_i(ib + j);
        if (len == W) {  // writes stay below j + W <= e
          S::compress(yb + w, k, y);
          S::compress(pb + w, k, p);
          S::compress(rb + w, k, rv);
          S::compress_i(ib + w, k, iv);
        } else {  // tail: bounded stores, the next row's segment starts at e (lanes past e: y = -inf, dropped)
          S::compress_n(yb + w, k, y);
          S::compress_n(pb + w, k, p);
          S::compress_n(rb + w, k, rv);
          S::compress_i_n(ib + w, k, iv);
        }
        w += S::count(k);
      }
      fill(yb, w, e, -std::numeric_limits<T>::infinity());
      r.c = w - b;
      r.F = S::hsum(fa);
      r.Q = S::hsum(qa);
      r.M2 = S::hsum(m2);
      r.M3 = S::hsum(m3);
      r.qmax = S::hmax(qmx);
      r.rmax = S::hmax(rmx);
      r.mx3 = S::hmax(mx3);
    }

    // Newton-type step, or retire the row.  With r = F - 1, the Newton step on G = F^a1 - 1 is
    //   du = g(r) / Q,   g(r) = F (1 - F^-a1) / a1 = ((1 + r) - (1 + r)^(1 - a1)) / a1;
    // close to the root (|r| < 0.05) g is its binomial series r + c2 r^2 + ... + c5 r^5 (relative
    // error < 5e-8, and below g, so the step stays on the safe side), which keeps libm calls off the
    // per-row work.  Further out the step is Halley's (the root of G's quadratic model; G'' from
    // M2 = sum q r, one more multiply-add per element): third order, about one pass less on dense
    // rows.  Unlike Newton's it can overshoot the root; the next pass then sees F < 1 and steps back
    // with Newton from the right (which lands left of the root, G being convex), never below u_lo.
    //
    // Retiring: at |r| <= tol the row is converged (output p / F).  Close enough, the last step
    // needs no new pass: with d -> d - a1 du every p becomes p (1 - du r)^k... to second order
    //   p (1 - a1 du / d)^(1/a1) = p - du q + (1 - a1)/2 du^2 q r - c du^3 q r^2 + ...
    // (c = (1 - a1)(1 - 2 a1)/6).  First order (du Newton's): the output [p - du q]_+ (normalised) is
    // off by O(r^2) -- measured in float64 over random, peaked, flat and spike rows at alpha
    // 1.05-1.97: <= 3e-7 at r <= 1e-3 for alpha <= 1.7, but up to 1.4e-5 at alpha 1.9, where clipping
    // at 0 (entries leaving the support, p ~ ((2-alpha) du)^k) dominates; r <= 2e-4 keeps that below
    // 2e-7.  Second order (float32 only; du the root of F's quadratic model): taken when the
    // neglected cubic term, bounded from the pass's maxima as |c| du^3 (max q r^2 + max q M3 / Q)
    // (per entry, plus what the error of du moves), is below Tol::fin2_err and du r <= 1/2 for every
    // entry (the series converges fast, nothing leaves the support): typically at r ~ 1e-2 for alpha
    // < 1.5 on dense rows, which saves a pass.
    static void step(Row& r) {
      const double rr = r.F - 1.0;
      if (!(std::fabs(rr) > Tol<T>::newton) || r.it >= kMaxIter) {
        r.active = false;
        return;
      }
      const double g = std::fabs(rr) < 0.05 ? rr * (1.0 + rr * (r.c2 + rr * (r.c3 + rr * (r.c4 + rr * r.c5))))
                                            : -std::expm1(-r.a1 * std::log1p(rr)) * r.F / r.a1;
      if (rr < 0.0) {  // right of the root (after a Halley step): Newton back, inside [u_lo, u]
        const double du = g / r.Q;
        if (!(du < 0.0) || !std::isfinite(du)) {
          r.active = false;
          return;
        }
        r.u = std::max(r.u + du, r.u_lo);
        r.lag = false;
        ++r.it;
        return;
      }
      r.u_lo = r.u;  // F >= 1: left of the root
      const double dn = g / r.Q;
      if (!(dn > 0.0) || !std::isfinite(dn)) {
        r.active = false;
        return;
      }
      if (rr <= (r.a1 <= 0.7 ? Tol<T>::fin_low_alpha : Tol<T>::fin_high_alpha)) {
        r.shift = dn;
        r.curv = 0.0;
        r.active = false;
        return;
      }
      const double b = 1.0 - r.a1;
      if (Tol<T>::fin2_err > 0.0 && rr <= 0.02) {
        const double disc = r.Q * r.Q - 2.0 * b * r.M2 * rr;
        if (disc > 0.0) {
          const double du = 2.0 * rr / (r.Q + std::sqrt(disc));
          const double c3 = std::fabs(b * (1.0 - 2.0 * r.a1)) / 6.0;
          const double est = c3 * du * du * du * (r.mx3 + r.qmax * r.M3 / r.Q);
          if (est <= Tol<T>::fin2_err && du * r.rmax <= 0.5) {
            r.shift = du;
            r.curv = b / 2.0;
            r.active = false;
            return;
          }
        }
      }
      const double g2 = b * (r.M2 - r.Q * r.Q / r.F);  // G'' (scaled like g), >= 0 by Cauchy-Schwarz
      const double disc = r.Q * r.Q - 2.0 * g2 * g;
      double du = dn;
      r.lag = false;
      if (g2 > 0.0 && disc > 0.0 && std::isfinite(disc)) {
        const double dh = 2.0 * g / (r.Q + std::sqrt(disc));
        if (dh > dn) {
          du = dh;
          r.lag = true;
        }
      }
      r.u += du;
      ++r.it;
    }

    // float32: the solver's u and sums are float32, which leaves every d = 1 + a1 (y - u) of the row
    // off by about the same amount (<= 1.3 * 2^-24 measured), and the autograd output is computed from
    // y = x - max (rounded).  Where that matters by bias_effect (flat rows, d_max ~ n^-a1, and rows
    // with an entry near the edge of the support at alpha > 1.5: 0.1 on the gradient at 20k keys,
    // alpha 1.9), the threshold is polished (polish) and the row written from it through the
    // threshold weights, exact to ~1e-15 in d, as the threshold API writes every row.
    static bool needs_polish(const Row& r) {
      if (!Tol<T>::polish) return false;
      const double dmax = 1.0 - r.a1 * (r.u + r.shift);
      return bias_effect(Tol<T>::solver_bias, r.a1, dmax, r.rmax > 0.0 ? 1.0 / r.rmax : dmax) > Tol<T>::polish_tol;
    }

    // Newton steps on G(t) = F(t)^a1 - 1, F the sum of the threshold weights (weight<kGeneral>) of the
    // row's surviving entries, in float64 sums, from t = max + u + shift; stops once the error the last
    // step leaves (its quadratic term, from M2 = sum w / d^2) moves p and s by at most polish_tol (bias_effect).
    // Entries the solver dropped have p ~ 0 here (they only matter to the output, which
    // write_threshold evaluates on the whole row).  Returns t.
    double polish(Row& r) {
      const int64_t b = r.b, e = r.b + r.c;
      T* xs = rb;  // the segment's scores, gathered (rb is free once the row is finished)
      for (int64_t j = b; j < e; ++j) xs[j] = r.x[ib[j]];
      return polish_t(xs, b, e, r.a1, double(r.m) + (r.u + r.shift));
    }

    // polish's iteration on the scores xs[b, e), from t (LaneBlock passes whole rows: entries outside
    // the support contribute nothing).
    static double polish_t(const T* xs, int64_t b, int64_t e, double a1, double t) {
      const V one = S::set1(T(1)), zero = S::set1(T(0)), vinf = S::set1(std::numeric_limits<T>::infinity());
      double Q = 0.0, dmin = 0.0, dmax = 0.0;
      for (int it = 0; it < kPolishSteps; ++it) {
        const Thr q = make_thr(t, a1);
        typename S::VD f0 = S::dzero(), f1 = f0, q0 = f0, q1 = f0, m0 = f0, m1 = f0;
        V dmn = vinf, dmx = zero;
        for (int64_t j = b; j < e; j += W) {
          const int len = int(std::min<int64_t>(W, e - j));
          const V xv = len == W ? S::load(xs + j) : S::load_n(xs + j, len, -std::numeric_limits<T>::infinity());
          V rr, cc, hs, delta;
          M k;
          x_minus_t(xv, q, rr, cc);
          general_d(rr, cc, q, hs, delta, k);
          const V w = general_w(hs, delta, k, q);
          const V rd = S::maskz(k, one / hs);
          const V qv = w * rd;
          S::dadd(f0, f1, w);
          S::dadd(q0, q1, qv);
          S::dadd(m0, m1, qv * rd);
          dmn = S::min(dmn, S::select(k, hs, vinf));
          dmx = S::max(dmx, S::maskz(k, hs));
        }
        const double F = S::dsum(f0, f1), M2 = S::dsum(m0, m1);
        Q = S::dsum(q0, q1);
        dmin = S::hmin(dmn);
        dmax = S::hmax(dmx);
        const double dt = -std::expm1(-a1 * std::log(F)) * F / (a1 * Q);
        if (!std::isfinite(dt)) return t;
        t += dt;
        const double rest = (1.0 - a1) * std::max(M2 - Q * Q / F, 0.0) / (2.0 * Q) * dt * dt;
        if (!(bias_effect(a1 * rest, a1, dmax, dmin) > Tol<T>::polish_tol)) break;
      }
      // The float32 weights' own errors (a bias of F of ~2e-8, measured, and rounding noise) limit t
      // to about a1 weights_bias / Q in d.  Where an entry close to the edge makes even that matter
      // (flat rows at alpha > 1.5: an entry within ~1e-6 of the edge, most long ones), one more step
      // with float64 weights (f64_sums).
      if (bias_effect(a1 * Tol<T>::weights_bias / Q, a1, dmax, dmin) > Tol<T>::polish_tol) {
        double F, Q64;
        S::f64_sums(xs + b, e - b, a1, t, F, Q64);
        const double dt = -std::expm1(-a1 * std::log(F)) * F / (a1 * Q64);
        if (std::isfinite(dt)) t += dt;
      }
      return t;
    }

    void finish(Row& r) {
      T* out = r.out;
      const int64_t b = r.b, c = r.c;
      if (needs_polish(r)) {
        const double t = polish(r);
        const double F = write_threshold(r.x, out, n, kGeneral, r.a1, t);
        if (r.params) {
          r.params[0] = t;
          r.params[1] = F;
        }
        fill(yb, b, b + c, -std::numeric_limits<T>::infinity());
        return;
      }
      if (r.params) {  // the pending step is taken in full; write_threshold renormalises
        const double t = double(r.m) + (r.u + r.shift);
        r.params[0] = t;
        r.params[1] = write_threshold(r.x, out, n, kGeneral, r.a1, t);
        fill(yb, b, b + c, -std::numeric_limits<T>::infinity());
        return;
      }
      if (r.shift > 0.0) {  // corrected finish (see step)
        const V vs = S::set1(T(r.shift)), vc = S::set1(T(r.curv * r.shift * r.shift)), zero = S::set1(T(0));
        // Entries near the support's boundary (du r >= 1/4: the first-order finish only) are evaluated
        // exactly at u + du instead, so that the support is the one the threshold API gives at
        // t = max + u + du (where 1 - du r <= 0 clips, a1 du r < 1 may still be inside).
        const bool exact_edge = r.shift * r.rmax >= 0.25;
        const V edge = S::set1(T(0.25)), va1 = S::set1(T(r.a1)), vk = S::set1(T(1.0 / r.a1)),
                vu = S::set1(T(r.u + r.shift)), one = S::set1(T(1)), mone = S::set1(T(-1));
        auto body = [&](V p, V q, V rv, V y) {
          V pc = S::max(S::fma(vc * q, rv, S::fma(-vs, q, p)), zero);
          if (exact_edge) {
            const M near = S::ge(rv * vs, edge);
            if (S::any(near)) {
              V t = va1 * (y - vu);
              M k = S::gt(t, mone);
              V tc = S::max(t, mone);
              V d = one + tc;
              V L = S::fma(tc - (d - one), one / S::select(k, d, one), S::log(S::select(k, d, one)));
              pc = S::select(near, S::maskz(k, S::exp(vk * L)), pc);
            }
          }
          return pc;
        };
        V acc = zero;
        int64_t j = b;
        for (; j + W <= b + c; j += W) {
          V p0 = S::load(pb + j), rv = S::load(rb + j);
          V p = body(p0, p0 * rv, rv, S::load(yb + j));
          S::store(pb + j, p);
          acc = acc + p;
        }
        if (j < b + c) {
          const int len = int(b + c - j);
          V p0 = S::load_n(pb + j, len, T(0)), rv = S::load_n(rb + j, len, T(0));
          V p = body(p0, p0 * rv, rv, S::load_n(yb + j, len, -std::numeric_limits<T>::infinity()));
          S::store_n(pb + j, p, len);
          acc = acc + p;
        }
        r.F = S::hsum(acc);
      }
      const V inv = S::set1(T(1.0 / r.F));
      if (c == n) {  // nothing was dropped: the segment is the row, in order
        int64_t j = 0;
        for (; j + W <= n; j += W) S::store(out + j, S::load(pb + b + j) * inv);
        if (j < n) S::store_n(out + j, S::load_n(pb + b + j, int(n - j), T(0)) * inv, int(n - j));
      } else {
        fill_zero(out, n);
        for (int64_t j = b; j < b + c; j += W) {
          const int len = int(std::min<int64_t>(W, b + c - j));
          S::scatter_n(out, ib + j, S::load(pb + j) * inv, len);
        }
      }
      fill(yb, b, b + c, -std::numeric_limits<T>::infinity());  // dead from now on
    }

    // Newton rounds until every row of the block is finished.  Each round evaluates the segments of
    // the unfinished rows only (merged into contiguous ranges), so no vector is spent on finished rows
    // and the pass needs no data-dependent branch.
    void solve() {
      if (nrows == 0) return;
      pad(yb, tot, -std::numeric_limits<T>::infinity());  // the last vector of a pass reads past tot
      pad(ab, tot, T(1));
      pad(kb, tot, T(1));
      pad(ub, tot, T(0));
      int act[kRows];
      int na = 0;
      for (int s = 0; s < nrows; ++s) {
        fill(ub, rows[s].b, rows[s].b + rows[s].c, T(rows[s].u));
        act[na++] = s;
      }
      while (na > 0) {
        int64_t lo = -1, hi = -1;
        for (int i = 0; i < na; ++i) {  // active rows are in buffer order: merge touching segments
          const Row& r = rows[act[i]];
          const int64_t b = r.b - r.b % W, e = r.b + r.c;  // vector loads stay aligned
          if (b > hi) {
            if (hi > lo) pass(lo, hi);
            lo = b;
          }
          hi = std::max(hi, e);
        }
        if (hi > lo) pass(lo, hi);
        int live = 0;
        for (int i = 0; i < na; ++i) {
          Row& r = rows[act[i]];
          gather(r);
          step(r);
          if (r.active) {
            fill(ub, r.b, r.b + r.c, T(r.u));
            act[live++] = act[i];
          } else {
            finish(r);
          }
        }
        na = live;
      }
      nrows = 0;
      tot = 0;
    }
  };

  // Short rows, one row per vector lane (LaneBlock; float32 SIMD builds, n <= kLaneMaxN).  At 128
  // keys a row is 8 vectors, and FwdBlock's per-row work -- horizontal sums, a scalar step with
  // data-dependent branches per pass, compaction, the scatter -- costs about as much as the
  // transcendentals.  Here W rows are transposed into a (columns x W) buffer, so that every vector
  // holds one column of W rows: each lane walks its own row, every sum is a lane of a vector
  // accumulator, and the step is taken for all lanes at once, branch-free (FwdBlock::step in vector
  // form).  The maths is FwdBlock's: candidates y > -1/a1, Jensen start, pass, step, finishes,
  // polish.  Layout per group: whole rows when dense (the output is transposed straight back into
  // the rows, no scatter), else each row's candidates and then its support at the Jensen bound,
  // compacted row by row and padded to the group's longest (scattered at the end).  A group runs
  // until its slowest lane converges; once at most W / 4 lanes are left they take their passes
  // alone (lane_pass), since a group pass costs the same with one lane as with W.
  static constexpr int64_t kLaneMaxN = 256;
  static constexpr bool kLanes = W >= 8;

  struct LaneBlock {
    using Row = typename FwdBlock::Row;
    int64_t n, np, stride;  // row length, rounded up to whole vectors, row stride of yr / ir
    int nrows = 0;
    // Transposed buffers: entry j of lane l at [j W + l].  xt: the scores (a row's, or its
    // candidates'), yt: y = x - max, pt / rt: p and r = 1 / d of the lane's last pass.
    T *xt, *yt, *pt, *rt;
    // Row-major, per lane (sparse groups): the scores of the candidates y > -1/a1, then of the
    // support at the Jensen bound, and their columns; at the end the output values of those columns.
    T* yr;
    int32_t* ir;
    T* tmp;  // one lane's y, p, r in row order (lane_pass)
    Row rows[W];
    int64_t cnt[W];  // entries per row in yr / ir (candidates, then the support at the Jensen bound)

    explicit LaneBlock(int64_t n_) : n(n_), np((n_ + W - 1) / W * W), stride(np + W) {
      xt = thread_buffer<T, kLaneVals>(4 * np * W + W * stride + 3 * np);
      yt = xt + np * W;
      pt = yt + np * W;
      rt = pt + np * W;
      yr = rt + np * W;
      tmp = yr + W * stride;
      ir = thread_buffer<int32_t, kLaneIdx>(W * stride);
    }

    // Queues a row (max m, finite); counts its candidates y > -1/a1.
    void add(const T* x, T* out, T m, double a1) {
      if (nrows == W) solve();
      const int l = nrows++;
      Row& r = rows[l];
      r.x = x;
      r.out = out;
      r.params = nullptr;
      r.m = m;
      r.a1 = a1;
      const V vm = S::set1(m), vlo = S::set1(T(-1.0 / a1));
      int64_t c = 0;
      for_row(x, n, -std::numeric_limits<T>::infinity(), [&](V xv, VI) { c += S::count(S::gt(xv - vm, vlo)); });
      cnt[l] = c;
    }

    // g(c) = (1 - c^-a1) / a1 per lane (FwdBlock's Jensen memo), as log(c) h(x), x = a1 log c,
    // h(x) = (1 - e^-x) / x: by its Taylor series below 1/2 (error < 1e-8), where 1 - e^-x would
    // cancel (alpha near 1: at a1 = 1e-6, 1 - e^-x alone is off by ~1 %).
    static V jensen_g(V c, V va1) {
      const V L = S::log(c);
      return L * h_fun(va1 * L);
    }
    static V h_fun(V x) {
      const V one = S::set1(T(1));
      V h = S::set1(T(1.0 / 362880));  // h(x) = sum_j (-x)^j / (j + 1)!, j <= 8
      for (double f : {-40320.0, 5040.0, -720.0, 120.0, -24.0, 6.0, -2.0}) h = S::fma(h, x, S::set1(T(1.0 / f)));
      h = S::fma(h, x, one);
      const V direct = (one - S::exp(S::set1(T(0)) - x)) / x;
      return S::select(S::lt(S::max(x, S::set1(T(0)) - x), S::set1(T(0.5))), h, direct);
    }

    void solve() {
      if (nrows == 0) return;
      const T ninf = -std::numeric_limits<T>::infinity();
      const V one = S::set1(T(1)), zero = S::set1(T(0)), mone = S::set1(T(-1));
      const T* src[W];
      int64_t len[W];
      alignas(64) T lm[W], la1[W], lk[W], llim[W], lc[W];
      for (int l = 0; l < W; ++l) {
        Row& r = rows[l];
        if (l >= nrows) {  // idle lanes: a row of one entry (done at once), never written
          r.x = nullptr;
          r.out = nullptr;
          r.m = T(0);
          r.a1 = 0.5;
          r.u = r.shift = 0.0;
          T* yb = yr + l * stride;
          yb[0] = T(0);
          fill(yb, 1, np, ninf);
        }
        src[l] = r.x ? r.x : yr + l * stride;
        len[l] = r.x ? n : 1;
        lm[l] = r.m;
        la1[l] = T(r.a1);
        lk[l] = T(1.0 / r.a1);
      }
      const V vm = S::load(lm), va1 = S::load(la1), vk = S::load(lk);
      // Rows [0, len) of src, padded with -inf, into columns [0, cp) of xt and yt.
      auto transpose_in = [&](int64_t cp) {
        for (int64_t jb = 0; jb < cp; jb += W) {
          V v[W];
          for (int l = 0; l < W; ++l) {
            const int64_t k = std::min<int64_t>(W, std::max<int64_t>(0, len[l] - jb));
            v[l] = k == W ? S::load(src[l] + jb) : S::load_n(src[l] + jb, int(k), ninf);
          }
          S::transpose(v);
          for (int i = 0; i < W; ++i) {
            S::store(xt + (jb + i) * W, v[i]);
            S::store(yt + (jb + i) * W, v[i] - vm);
          }
        }
      };
      // Rows with few candidates (y > -1/a1; most of a sparse row's entries are not) are compacted
      // to them first, so that the start's passes run over fewer columns.
      int64_t ccand = 1;
      for (int l = 0; l < W; ++l) ccand = std::max(ccand, l < nrows ? cnt[l] : int64_t(1));
      int64_t cp = (ccand + W - 1) / W * W;
      const bool whole = 4 * cp > 3 * np;  // layout: whole rows, or each row's entries in yr / ir
      if (whole) {
        cp = np;
      } else {
        for (int l = 0; l < nrows; ++l) {
          const Row& r = rows[l];
          T* yb = yr + l * stride;
          int32_t* ib = ir + l * stride;
          const V vml = S::set1(r.m), vlo = S::set1(T(-1.0 / r.a1));
          int64_t c = 0;
          for_row(r.x, n, ninf, [&](V xv, VI iv) {  // branch-free, see sparsemax_row
            const M k = S::gt(xv - vml, vlo);
            S::compress(yb + c, k, xv);
            S::compress_i(ib + c, k, iv);
            c += S::count(k);
          });
          src[l] = yb;
          len[l] = c;
        }
      }
      transpose_in(cp);

      // Jensen start (FwdBlock::add) on whole rows: S = the candidates y > -1/a1, twice "those at or
      // above the mean", then the support at the bound, {y > lim = u0 - 1/a1} (outside it for every
      // u >= u0).
      const V vlo = zero - vk;
      V c1 = zero, s1 = zero;
      for (int64_t j = 0; j < cp; ++j) {
        const V y = S::load(yt + j * W);
        const M k = S::gt(y, vlo);
        c1 = c1 + S::maskz(k, one);
        s1 = s1 + S::maskz(k, y);
      }
      V ybar = s1 / c1;  // c1 >= 1: the max entry
      V u0 = S::max(zero, ybar + jensen_g(c1, va1));
      for (int refine = 0; refine < 2; ++refine) {
        V c2 = zero, s2 = zero;
        for (int64_t j = 0; j < cp; ++j) {
          const V y = S::load(yt + j * W);
          const M k = S::ge(y, ybar);  // ybar <= 0 keeps the max entry
          c2 = c2 + S::maskz(k, one);
          s2 = s2 + S::maskz(k, y);
        }
        ybar = s2 / c2;
        u0 = S::max(u0, ybar + jensen_g(c2, va1));
      }
      const V lim = u0 - vk;
      V c3 = zero;
      {
        V s3 = zero;
        for (int64_t j = 0; j < cp; ++j) {
          const V y = S::load(yt + j * W);
          const M k = S::gt(y, lim);
          c3 = c3 + S::maskz(k, one);
          s3 = s3 + S::maskz(k, y);
        }
        const M some = S::gt(c3, zero);  // none only by rounding (lim >= 0)
        const V c3s = S::max(c3, one);
        u0 = S::select(some, S::max(u0, s3 / c3s + jensen_g(c3s, va1)), u0);
      }
      // Dense groups stay whole rows, in column order (the output is transposed straight back into
      // the rows); the others are solved on each row's support at the bound, compacted and padded to
      // the longest (fewer columns per pass), and scattered at the end -- when that saves a vector.
      S::store(llim, lim);
      S::store(lc, c3);
      int64_t cmax = 1;
      for (int l = 0; l < W; ++l) cmax = std::max(cmax, int64_t(lc[l]));
      const int64_t cpc = (cmax + W - 1) / W * W;
      const bool dense = whole && 4 * cpc > 3 * np;
      if (!dense && cpc < cp) {
        for (int l = 0; l < nrows; ++l) {  // in place when from yr: writes never pass the reads
          const Row& r = rows[l];
          T* yb = yr + l * stride;
          int32_t* ib = ir + l * stride;
          const V vml = S::set1(r.m), vl = S::set1(llim[l]);
          int64_t c = 0;
          auto take = [&](V xv, VI iv) {  // branch-free, see sparsemax_row
            const M k = S::gt(xv - vml, vl);
            S::compress(yb + c, k, xv);
            S::compress_i(ib + c, k, iv);
            c += S::count(k);
          };
          if (whole) {
            for_row(r.x, n, ninf, take);
          } else {
            const int64_t e = len[l];
            for (int64_t j = 0; j < e; j += W) {
              const int k = int(std::min<int64_t>(W, e - j));
              take(S::load_n(yb + j, k, ninf), S::load_i(ib + j));
            }
          }
          len[l] = c;
        }
        for (int l = 0; l < nrows; ++l) src[l] = yr + l * stride;
        cp = cpc;
        transpose_in(cp);
      }
      for (int l = 0; l < nrows; ++l) cnt[l] = len[l];
      // Newton rounds: FwdBlock's pass, gather and step for every lane at once, the step in vector
      // form (branch-free: taken per lane, its data-dependent branches mispredict on fresh inputs).
      // Lane flags are 0 / 1 vectors (and = product, not = 1 - f).  Finished lanes keep p and r.
      const V half = S::set1(T(0.5)), vinf = S::set1(std::numeric_limits<T>::infinity());
      auto flag = [&](M m) { return S::select(m, one, zero); };
      auto on = [&](V f) { return S::gt(f, half); };
      auto finite = [&](V v) { return flag(S::lt(S::max(v, zero - v), vinf)); };  // NaN: 0
      const V vb = one - va1, b2 = vb * half, b3 = zero - b2 * (one + va1) * S::set1(T(1.0 / 3)),
              b4 = zero - b3 * (S::set1(T(2)) + va1) * S::set1(T(0.25)),
              b5 = zero - b4 * (S::set1(T(3)) + va1) * S::set1(T(0.2)),  // FwdBlock::Row::c2 .. c5
              finthr = S::select(S::gt(va1, S::set1(T(0.7))), S::set1(T(Tol<T>::fin_high_alpha)),
                                 S::set1(T(Tol<T>::fin_low_alpha))),
              c3abs = S::max(vb * (one - va1 - va1), zero - vb * (one - va1 - va1)) * S::set1(T(1.0 / 6));
      V vu = u0, vulo = zero, vit = zero, vact = flag(S::gt(one, zero)), vsh = zero, vcu = zero, vrmax = zero;
      alignas(64) T sums[7][W], lu[W];
      for (;;) {
        const M act = on(vact);
        const int nact = S::count(act);
        if (nact == 0) break;
        V F, Q, M2, M3, qmx, rmx, mx3;
        if (nact <= kTailLanes) {  // a few slow rows left: their passes alone, row by row
          S::store(lu, vu);
          alignas(64) T la[W];
          S::store(la, vact);
          for (int l = 0; l < W; ++l)
            if (la[l] > T(0.5)) lane_pass(l, cp, lu[l], sums);
          F = S::load(sums[0]);
          Q = S::load(sums[1]);
          M2 = S::load(sums[2]);
          M3 = S::load(sums[3]);
          qmx = S::load(sums[4]);
          rmx = S::load(sums[5]);
          mx3 = S::load(sums[6]);
        } else {
          V F0 = zero, F1 = zero, Q0 = zero, Q1 = zero;
          M2 = M3 = qmx = rmx = mx3 = zero;
          auto eval = [&](int64_t j, V& Fs, V& Qs) {
            const V y = S::load(yt + j * W);
            const V t = va1 * (y - vu);
            const M k = S::gt(t, mone);
            const V tc = S::max(t, mone), d = one + tc, rd = S::rcp(d);
            const V L = S::fma(tc - (d - one), rd, S::log(d));
            const V p = S::maskz(k, S::exp(vk * L)), rv = S::maskz(k, rd);
            S::store_m(pt + j * W, act, p);
            S::store_m(rt + j * W, act, rv);
            const V q = p * rv, qr = q * rv, qr2 = qr * rv;
            Fs = Fs + p;
            Qs = Qs + q;
            M2 = M2 + qr;
            M3 = M3 + qr2;
            qmx = S::max(qmx, q);
            rmx = S::max(rmx, rv);
            mx3 = S::max(mx3, qr2);
          };
          for (int64_t j = 0; j < cp; j += 2) {  // two partial sums: shorter chains, smaller rounding
            eval(j, F0, Q0);
            eval(j + 1, F1, Q1);
          }
          F = F0 + F1;
          Q = Q0 + Q1;
        }
        // FwdBlock::step.  g(r) by its series near the root, else log(F) h(a1 log F) F (h as in
        // jensen_g: no cancellation as alpha -> 1).
        const V rr = F - one, arr = S::max(rr, zero - rr);
        const V gs = rr * S::fma(rr, S::fma(rr, S::fma(rr, S::fma(rr, b5, b4), b3), b2), one);
        const V LF = S::log(S::max(F, S::set1(std::numeric_limits<T>::min())));
        const V g = S::select(S::lt(arr, S::set1(T(0.05))), gs, LF * h_fun(va1 * LF) * F);
        const V dn = g / Q;
        const V conv = S::max(one - flag(S::gt(arr, S::set1(T(Tol<T>::newton)))),
                              flag(S::ge(vit, S::set1(T(kMaxIter)))));
        const V fstep = vact * (one - conv);
        const V fr = fstep * flag(S::lt(rr, zero)), fl = fstep - fr;  // right / left of the root
        const V fr_ok = fr * flag(S::lt(dn, zero)) * finite(dn);
        const V fl_ok = fl * flag(S::gt(dn, zero)) * finite(dn);
        const V f1 = fl_ok * flag(S::ge(finthr, rr));  // first-order finish
        const V disc2 = Q * Q - (vb + vb) * M2 * rr;
        const V du2 = (rr + rr) / (Q + S::sqrt(S::max(disc2, zero)));
        const V est = c3abs * du2 * du2 * du2 * (mx3 + qmx * M3 / Q);
        const V f2 = (fl_ok - f1) * flag(S::ge(S::set1(T(0.02)), rr)) * flag(S::gt(disc2, zero)) *
                     flag(S::ge(S::set1(T(Tol<T>::fin2_err)), est)) * flag(S::ge(half, du2 * rmx));
        const V fh = fl_ok - f1 - f2;  // Halley (or Newton) step from the left
        const V g2 = vb * (M2 - Q * Q / F), disc = Q * Q - (g2 + g2) * g;
        const V dh = (g + g) / (Q + S::sqrt(S::max(disc, zero)));
        const M useh = S::gt(flag(S::gt(g2, zero)) * flag(S::gt(disc, zero)) * finite(disc) * flag(S::gt(dh, dn)), half);
        const V u_right = S::max(vu + dn, vulo);
        vulo = S::select(on(fl), vu, vulo);
        vu = S::select(on(fr_ok), u_right, S::select(on(fh), vu + S::select(useh, dh, dn), vu));
        vsh = S::select(on(f1), dn, S::select(on(f2), du2, vsh));
        vcu = S::select(on(f2), vb * half, vcu);
        vit = vit + fr_ok + fh;
        vrmax = S::select(act, rmx, vrmax);
        vact = fr_ok + fh;
      }
      {
        alignas(64) T a[W], b[W], c[W], d[W];
        S::store(a, vu);
        S::store(b, vsh);
        S::store(c, vcu);
        S::store(d, vrmax);
        for (int l = 0; l < W; ++l) {
          rows[l].u = a[l];
          rows[l].shift = b[l];
          rows[l].curv = c[l];
          rows[l].rmax = d[l];
        }
      }

      // Finishes (FwdBlock::finish): p - shift q + curv shift^2 q r, entries near the edge exactly at
      // u + shift; lanes without a pending step have shift = 0.  Sums per lane in float64.
      alignas(64) T lsh[W], lcu[W], lue[W], ledge[W], linv[W];
      double F[W];
      bool edges = false, own[W];
      int npolish = 0;
      for (int l = 0; l < W; ++l) {
        const Row& r = rows[l];
        lsh[l] = T(r.shift);
        lcu[l] = T(r.curv * r.shift * r.shift);
        lue[l] = T(r.u + r.shift);
        const bool e = r.shift > 0.0 && r.shift * r.rmax >= 0.25;
        ledge[l] = e ? T(r.shift) : T(0);
        edges = edges || e;
        own[l] = r.x && FwdBlock::needs_polish(r);
        npolish += own[l];
      }
      // Rows that need the threshold polish (FwdBlock::needs_polish): up to W / 4 take FwdBlock's
      // polish on their own (its passes run over one row); more, and the whole group takes it
      // lane-wise (one vector pass serves every lane) and is written through the threshold weights.
      const bool group_polish = npolish > W / 4;
      if (group_polish) {
        polish_lanes(cp, F);
        for (int l = 0; l < W; ++l) own[l] = false;
      } else {
        const V vs = S::load(lsh), vc = S::load(lcu), vue = S::load(lue), ves = S::load(ledge),
                quarter = S::set1(T(0.25));
        typename S::VD lo = S::dzero(), hi = S::dzero();
        for (int64_t j = 0; j < cp; ++j) {
          const V p0 = S::load(pt + j * W), rv = S::load(rt + j * W), q = p0 * rv;
          V pc = S::max(S::fma(vc * q, rv, S::fma(zero - vs, q, p0)), zero);
          if (edges) {
            const M near = S::ge(rv * ves, quarter);
            if (S::any(near)) {
              const V t = va1 * (S::load(yt + j * W) - vue);
              const M k = S::gt(t, mone);
              const V tc = S::max(t, mone), d = S::select(k, one + tc, one);
              const V L = S::fma(tc - (d - one), one / d, S::log(d));
              pc = S::select(near, S::maskz(k, S::exp(vk * L)), pc);
            }
          }
          S::store(pt + j * W, pc);
          S::dadd(lo, hi, pc);
        }
        S::dstore_lanes(F, lo, hi);
      }
      for (int l = 0; l < W; ++l) linv[l] = T(1.0 / F[l]);
      const V vinv = S::load(linv);
      for (int64_t jb = 0; jb < cp; jb += W) {  // back into the rows
        V v[W];
        for (int i = 0; i < W; ++i) v[i] = S::load(pt + (jb + i) * W) * vinv;
        S::transpose(v);
        for (int l = 0; l < nrows; ++l) {
          if (own[l]) continue;
          if (dense)
            S::store_n(rows[l].out + jb, v[l], int(std::min<int64_t>(W, n - jb)));
          else
            S::store(yr + l * stride + jb, v[l]);
        }
      }
      for (int l = 0; l < nrows; ++l) {
        if (!own[l]) continue;
        const Row& r = rows[l];
        write_threshold(r.x, r.out, n, kGeneral, r.a1, FwdBlock::polish_t(r.x, 0, n, r.a1, double(r.m) + (r.u + r.shift)));
      }
      if (!dense) {
        for (int l = 0; l < nrows; ++l) {
          if (own[l]) continue;
          const T* yb = yr + l * stride;
          const int32_t* ib = ir + l * stride;
          fill_zero(rows[l].out, n);
          for (int64_t s = 0; s < cnt[l]; s += W)
            S::scatter_n(rows[l].out, ib + s, S::load(yb + s), int(std::min<int64_t>(W, cnt[l] - s)));
        }
      }
      nrows = 0;
    }

    // The Newton pass of lane l alone, in row order: a whole-group pass costs as much with one
    // active lane as with W, so the last few slow rows of a group (a row needing one pass more than
    // the others holds back all W lanes) take their passes one by one.  Same formulas as the group
    // pass; p and r go back into the lane's column of pt / rt.
    static constexpr int kTailLanes = W / 4;
    void lane_pass(int l, int64_t cp, T u, T (*sums)[W]) {
      const Row& r = rows[l];
      T *ty = tmp, *tp = tmp + np, *tr = tmp + 2 * np;
      for (int64_t j = 0; j < cp; ++j) ty[j] = yt[j * W + l];
      const V one = S::set1(T(1)), zero = S::set1(T(0)), mone = S::set1(T(-1)), va1 = S::set1(T(r.a1)),
              vk = S::set1(T(1.0 / r.a1)), vu = S::set1(u);
      V F = zero, Q = zero, m2 = zero, m3 = zero, qmx = zero, rmx = zero, mx3 = zero;
      for (int64_t j = 0; j < cp; j += W) {
        const V t = va1 * (S::load(ty + j) - vu);
        const M k = S::gt(t, mone);
        const V tc = S::max(t, mone), d = one + tc, rd = S::rcp(d);
        const V L = S::fma(tc - (d - one), rd, S::log(d));
        const V p = S::maskz(k, S::exp(vk * L)), rv = S::maskz(k, rd);
        S::store(tp + j, p);
        S::store(tr + j, rv);
        const V q = p * rv, qr = q * rv, qr2 = qr * rv;
        F = F + p;
        Q = Q + q;
        m2 = m2 + qr;
        m3 = m3 + qr2;
        qmx = S::max(qmx, q);
        rmx = S::max(rmx, rv);
        mx3 = S::max(mx3, qr2);
      }
      for (int64_t j = 0; j < cp; ++j) {
        pt[j * W + l] = tp[j];
        rt[j * W + l] = tr[j];
      }
      sums[0][l] = S::hsum(F);
      sums[1][l] = S::hsum(Q);
      sums[2][l] = S::hsum(m2);
      sums[3][l] = S::hsum(m3);
      sums[4][l] = S::hmax(qmx);
      sums[5][l] = S::hmax(rmx);
      sums[6][l] = S::hmax(mx3);
    }

    // FwdBlock::polish_t for every lane at once on the transposed scores (per-lane thresholds t and
    // float64 sums), then the threshold weights (weight<kGeneral>) at the polished t into pt and
    // their sums into F (write_threshold, per lane).
    void polish_lanes(int64_t cp, double* F) {
      const V one = S::set1(T(1)), zero = S::set1(T(0)), vinf = S::set1(std::numeric_limits<T>::infinity());
      double t[W], Q[W], M2[W], a1[W];
      bool done[W];
      alignas(64) T ldmin[W], ldmax[W];
      for (int l = 0; l < W; ++l) {
        t[l] = double(rows[l].m) + (rows[l].u + rows[l].shift);
        a1[l] = rows[l].a1;
        done[l] = false;
      }
      for (int it = 0; it < kPolishSteps; ++it) {
        const Thr q = lane_thr(t, a1);
        typename S::VD f0 = S::dzero(), f1 = f0, q0 = f0, q1 = f0, m0 = f0, m1 = f0;
        V dmn = vinf, dmx = zero;
        for (int64_t j = 0; j < cp; ++j) {
          V rr, cc, hs, delta;
          M k;
          x_minus_t(S::load(xt + j * W), q, rr, cc);
          general_d(rr, cc, q, hs, delta, k);
          const V w = general_w(hs, delta, k, q);
          const V rd = S::maskz(k, one / hs);
          const V qv = w * rd;
          S::dadd(f0, f1, w);
          S::dadd(q0, q1, qv);
          S::dadd(m0, m1, qv * rd);
          dmn = S::min(dmn, S::select(k, hs, vinf));
          dmx = S::max(dmx, S::maskz(k, hs));
        }
        S::dstore_lanes(F, f0, f1);
        double Qi[W];
        S::dstore_lanes(Qi, q0, q1);
        S::dstore_lanes(M2, m0, m1);
        S::store(ldmin, dmn);
        S::store(ldmax, dmx);
        bool more = false;
        for (int l = 0; l < W; ++l) {
          if (done[l]) continue;
          Q[l] = Qi[l];
          const double dt = -std::expm1(-a1[l] * std::log(F[l])) * F[l] / (a1[l] * Q[l]);
          if (!std::isfinite(dt)) {
            done[l] = true;
            continue;
          }
          t[l] += dt;
          const double rest = (1.0 - a1[l]) * std::max(M2[l] - Q[l] * Q[l] / F[l], 0.0) / (2.0 * Q[l]) * dt * dt;
          done[l] = !(bias_effect(a1[l] * rest, a1[l], ldmax[l], ldmin[l]) > Tol<T>::polish_tol);
          more = more || !done[l];
        }
        if (!more) break;
      }
      for (int l = 0; l < nrows; ++l) {  // float64 weights where even float32 ones are not enough
        if (bias_effect(a1[l] * Tol<T>::weights_bias / Q[l], a1[l], ldmax[l], ldmin[l]) > Tol<T>::polish_tol) {
          double F64, Q64;
          S::f64_sums(rows[l].x, n, a1[l], t[l], F64, Q64);
          const double dt = -std::expm1(-a1[l] * std::log(F64)) * F64 / (a1[l] * Q64);
          if (std::isfinite(dt)) t[l] += dt;
        }
      }
      const Thr q = lane_thr(t, a1);
      typename S::VD f0 = S::dzero(), f1 = f0;
      for (int64_t j = 0; j < cp; ++j) {
        const V w = weight<kGeneral>(S::load(xt + j * W), q);
        S::store(pt + j * W, w);
        S::dadd(f0, f1, w);
      }
      S::dstore_lanes(F, f0, f1);
    }

    // make_thr with one threshold and alpha per lane.
    static Thr lane_thr(const double* t, const double* a1) {
      alignas(64) T th[W], mth[W], tl[W], ah[W], al[W], kh[W], kl[W];
      for (int l = 0; l < W; ++l) {
        th[l] = T(t[l]);
        mth[l] = -th[l];
        tl[l] = std::isfinite(t[l]) ? T(t[l] - double(th[l])) : T(0);
        ah[l] = T(a1[l]);
        al[l] = T(a1[l] - double(ah[l]));
        kh[l] = T(1.0 / a1[l]);
        kl[l] = T(1.0 / a1[l] - double(kh[l]));
      }
      return {S::load(th), S::load(mth), S::load(tl), S::load(ah), S::load(al), S::load(kh), S::load(kl)};
    }

    static void fill(T* buf, int64_t b, int64_t e, T v) { FwdBlock::fill(buf, b, e, v); }
  };

  // Scratch of the alpha = 1.5 / 2 rows.
  struct Scratch {
    T* vals;
    int32_t* idx;
    explicit Scratch(int64_t n)
        : vals(thread_buffer<T, kRowVals>(n + 2 * W)), idx(thread_buffer<int32_t, kRowIdx>(n + 2 * W)) {}
  };

  // Rows [b, e) of a (rows, n) tensor; alpha_of(r) gives the row's alpha (already clamped to [1, 2]).
  template <class AlphaAt>
  static void forward_rows(const T* X, T* Y, int64_t b, int64_t e, int64_t n, AlphaAt alpha_of, double thr) {
    Scratch sc(n);
    std::unique_ptr<FwdBlock> block;
    std::unique_ptr<LaneBlock> lanes;
    for (int64_t r = b; r < e; ++r) {
      const T* x = X + r * n;
      T* out = Y + r * n;
      const double alpha = alpha_of(r);
      bool nan;
      const T m = row_max(x, n, nan);
      if (nan || m == std::numeric_limits<T>::infinity()) {  // NaN or +inf scores: a NaN row, as softmax
        fill_value(out, n, std::numeric_limits<T>::quiet_NaN());
        continue;
      }
      if (!(m > -std::numeric_limits<T>::infinity())) {  // fully masked (or empty) row
        fill_zero(out, n);
        continue;
      }
      const double a1 = alpha - 1.0;
      if (a1 < thr) {
        softmax_row(x, out, n, m);
      } else if (alpha == 2.0) {
        sparsemax_row(x, out, n, m, sc.vals, sc.idx);
      } else if (alpha == 1.5) {
        entmax15_row(x, out, n, m, sc.vals, sc.idx);
      } else if (kLanes && n <= kLaneMaxN) {
        if (!lanes) lanes.reset(new LaneBlock(n));
        lanes->add(x, out, m, a1);
      } else {
        if (!block) block.reset(new FwdBlock(n));
        block->add(x, out, m, a1);
      }
    }
    if (block) block->solve();
    if (lanes) lanes->solve();
  }

  // Threshold API: as forward_rows, and the row's (t, F) go to params[2 r], params[2 r + 1].
  template <class AlphaAt>
  static void threshold_rows(const T* X, T* Y, double* P, int64_t b, int64_t e, int64_t n, AlphaAt alpha_of,
                             double thr) {
    Scratch sc(n);
    std::unique_ptr<FwdBlock> block;
    for (int64_t r = b; r < e; ++r) {
      const T* x = X + r * n;
      T* out = Y + r * n;
      double* prm = P + 2 * r;
      const double alpha = alpha_of(r);
      bool nan;
      const T m = row_max(x, n, nan);
      if (nan || m == std::numeric_limits<T>::infinity()) {
        fill_value(out, n, std::numeric_limits<T>::quiet_NaN());
        prm[0] = prm[1] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      if (!(m > -std::numeric_limits<T>::infinity())) {  // t = +inf gives w = 0 for any x
        fill_zero(out, n);
        prm[0] = std::numeric_limits<double>::infinity();
        prm[1] = 1.0;
        continue;
      }
      const int mode = mode_of(alpha, thr);
      const double a1 = alpha - 1.0;
      double t;
      int64_t c;
      if (mode == kSoftmax) {
        t = double(m);
      } else if (mode == kSparsemax) {  // p = [y - tau]_+ = 1 + (y - u): u = 1 + tau
        t = double(m) + (1.0 + sparsemax_solve(x, n, m, sc.vals, sc.idx, c));
      } else if (mode == kEntmax15) {  // p = (y / 2 - tau)^2 = (1 + (y - u) / 2)^2: u = 2 + 2 tau
        t = double(m) + (2.0 + 2.0 * entmax15_solve(x, n, m, sc.vals, sc.idx, c));
      } else {
        if (!block) block.reset(new FwdBlock(n));
        block->add(x, out, m, a1, prm);
        continue;
      }
      prm[0] = t;
      prm[1] = write_threshold(x, out, n, mode, a1, t);
    }
    if (block) block->solve();
  }

  template <class AlphaAt>
  static void from_threshold_rows(const T* X, T* Y, const double* P, int64_t b, int64_t e, int64_t n,
                                  AlphaAt alpha_of, double thr) {
    for (int64_t r = b; r < e; ++r) {
      const double alpha = alpha_of(r);
      write_from_threshold(X + r * n, Y + r * n, n, mode_of(alpha, thr), alpha - 1.0, P[2 * r], P[2 * r + 1]);
    }
  }

  // psi(x) = (e^x - 1 - x) / x^2 by its Taylor series (used for x < Tol<T>::psi_switch).
  static V psi_series(V x) {
    V r = S::set1(T(1.0 / 3628800));
    r = S::fma(r, x, S::set1(T(1.0 / 362880)));
    r = S::fma(r, x, S::set1(T(1.0 / 40320)));
    r = S::fma(r, x, S::set1(T(1.0 / 5040)));
    r = S::fma(r, x, S::set1(T(1.0 / 720)));
    r = S::fma(r, x, S::set1(T(1.0 / 120)));
    r = S::fma(r, x, S::set1(T(1.0 / 24)));
    r = S::fma(r, x, S::set1(T(1.0 / 6)));
    return S::fma(r, x, S::set1(T(0.5)));
  }

  // Second pass of the full-row backward paths: dx = s * (g - c), s read back from dx.
  static void scale_pass(const T* g, T* dx, int64_t n, T cst) {
    const V vc = S::set1(cst);
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(dx + i, S::load(dx + i) * (S::load(g + i) - vc));
    if (i < n) S::store_n(dx + i, S::load_n(dx + i, int(n - i), T(0)) * (S::load_n(g + i, int(n - i), T(0)) - vc), int(n - i));
  }

  // Backward of one row when no logarithm is needed (sparsemax, 1.5-entmax, softmax limit; no
  // dalpha): two cheap full-row vector passes.
  static void backward_simple_row(const T* p, const T* g, T* dx, int64_t n, bool sparsemax, bool soft) {
    const V zero = S::set1(T(0));
    int64_t i = 0;
    if (sparsemax) {  // s = 1 on the support
      V cnt = zero, sg = zero;
      const V one = S::set1(T(1));
      for (; i + W <= n; i += W) {
        M k = S::gt(S::load(p + i), zero);
        cnt = cnt + S::maskz(k, one);
        sg = sg + S::maskz(k, S::load(g + i));
      }
      if (i < n) {
        M k = S::gt(S::load_n(p + i, int(n - i), T(0)), zero);
        cnt = cnt + S::maskz(k, one);
        sg = sg + S::maskz(k, S::load_n(g + i, int(n - i), T(0)));
      }
      const double Ss = S::hsum(cnt);
      const V vc = S::set1(Ss > 0 ? T(S::hsum(sg) / Ss) : T(0));
      for (i = 0; i + W <= n; i += W) {
        V pv = S::load(p + i);
        S::store(dx + i, S::maskz(S::gt(pv, zero), S::load(g + i) - vc));
      }
      if (i < n) {
        V pv = S::load_n(p + i, int(n - i), T(0));
        S::store_n(dx + i, S::maskz(S::gt(pv, zero), S::load_n(g + i, int(n - i), T(0)) - vc), int(n - i));
      }
      return;
    }
    V ss = zero, sgs = zero;  // s = p (softmax limit) or sqrt(p) (alpha = 1.5)
    auto body = [&](V pv, V gv) {
      V s = soft ? pv : S::sqrt(pv);
      ss = ss + s;
      sgs = S::fma(s, gv, sgs);
      return s;
    };
    for (; i + W <= n; i += W) S::store(dx + i, body(S::load(p + i), S::load(g + i)));
    if (i < n) S::store_n(dx + i, body(S::load_n(p + i, int(n - i), T(0)), S::load_n(g + i, int(n - i), T(0))), int(n - i));
    const double Ss = S::hsum(ss);
    scale_pass(g, dx, n, Ss > 0 ? T(S::hsum(sgs) / Ss) : T(0));
  }

  // General backward (s = p^(1 - a1) = exp((1 - a1) log p); with dalpha also A = p l^2 psi(-a1 l)),
  // batched over rows: each row's support (p, g, column, a1) is appended to one packed buffer, the
  // logarithms run over the packed buffer as dense vectors, then short per-row segment sums give
  // <s, g> / sum s and dalpha, and dx is written as zeros plus a scatter.  On sparse attention rows
  // (a few nonzeros in 128-2048) this turns one short latency-bound chain per row into throughput-
  // bound vector work shared by the whole block.
  struct BwdBlock {
    static constexpr int kRows = 64;
    int64_t n, cap, tot = 0;
    int nrows = 0;
    T *pb, *gb, *ab, *sb, *xb;  // p, g, a1 (per element), s, A
    int32_t* ib;
    int64_t start[kRows + 1];
    T* dx_row[kRows];
    double* da_out[kRows];
    explicit BwdBlock(int64_t n_)
        : n(n_), cap(round64(std::max<int64_t>(n_, 4096) + 2 * W, sizeof(T))) {
      pb = thread_buffer<T, kBwdVals>(5 * cap);
      gb = pb + cap;
      ab = gb + cap;
      sb = ab + cap;
      xb = sb + cap;
      ib = thread_buffer<int32_t, kBwdIdx>(cap);
    }

    // Appends a row (a1 = 0 for the softmax limit); solves the block first if it is full.
    void add(const T* p, const T* g, T* dx, double a1, double* da, bool need_da) {
      if (nrows == kRows || tot + n > cap - 2 * W) solve(need_da);
      const V tiny = S::set1(std::numeric_limits<T>::min()), va1 = S::set1(T(a1));
      int64_t c = tot;
      auto take = [&](V pv, V gv, VI iv) {  // branch-free compaction, see sparsemax_row
        M k = S::ge(pv, tiny);
        S::compress(pb + c, k, pv);
        S::compress(gb + c, k, gv);
        S::compress_i(ib + c, k, iv);
        S::store(ab + c, va1);
        c += S::count(k);
      };
      int64_t i = 0;
      for (; i + W <= n; i += W) take(S::load(p + i), S::load(g + i), S::iota(int32_t(i)));
      if (i < n) take(S::load_n(p + i, int(n - i), T(0)), S::load_n(g + i, int(n - i), T(0)), S::iota(int32_t(i)));
      start[nrows] = tot;
      dx_row[nrows] = dx;
      da_out[nrows] = da;
      ++nrows;
      tot = c;
    }

    void solve(bool need_da) {
      if (nrows == 0) return;
      start[nrows] = tot;
      pad(pb, tot, T(0));
      pad(ab, tot, T(1));
      const V tiny = S::set1(std::numeric_limits<T>::min()), one = S::set1(T(1)),
              sw = S::set1(Tol<T>::psi_switch);
      for (int64_t j = 0; j < tot; j += W) {  // s (and A) for every packed element
        V pv = S::load(pb + j);
        V va1 = S::load(ab + j);
        M k = S::ge(pv, tiny);
        V l = S::log(S::select(k, pv, one));
        V s = S::maskz(k, S::exp((one - va1) * l));
        S::store(sb + j, s);
        if (need_da) {
          V xx = -(va1 * l);
          V a_small = pv * l * l * psi_series(xx);
          V a_big = (s - pv - pv * xx) * S::rcp(S::max(va1 * va1, tiny));
          S::store(xb + j, S::maskz(k, S::select(S::lt(xx, sw), a_small, a_big)));
        }
      }
      for (int r = 0; r < nrows; ++r) {  // per-row sums, dalpha, dx
        const int64_t b = start[r], e = start[r + 1];
        double ss = 0, sgs = 0, sa = 0, sga = 0;
        int64_t j = b;
        if (e - b >= 2 * W) {  // long segment: vector sums
          const V zero = S::set1(T(0));
          V vs = zero, vgs = zero, va = zero, vga = zero;
          for (; j + W <= e; j += W) {
            V s = S::load(sb + j), gv = S::load(gb + j);
            vs = vs + s;
            vgs = S::fma(s, gv, vgs);
            if (need_da) {
              V a = S::load(xb + j);
              va = va + a;
              vga = S::fma(a, gv, vga);
            }
          }
          ss = S::hsum(vs);
          sgs = S::hsum(vgs);
          if (need_da) {
            sa = S::hsum(va);
            sga = S::hsum(vga);
          }
        }
        for (; j < e; ++j) {  // short segments (typical) and tails: scalar
          ss += sb[j];
          sgs += double(sb[j]) * gb[j];
          if (need_da) {
            sa += xb[j];
            sga += double(xb[j]) * gb[j];
          }
        }
        const double cst = ss > 0 ? sgs / ss : 0.0;
        if (need_da) *da_out[r] = -sga + cst * sa;
        T* dx = dx_row[r];
        const T tc = T(cst);
        if (e - b == n) {  // whole row in the support: columns are 0..n-1 in order
          const V vc = S::set1(tc);
          int64_t i = 0;
          for (; i + W <= n; i += W) S::store(dx + i, S::load(sb + b + i) * (S::load(gb + b + i) - vc));
          for (; i < n; ++i) dx[i] = sb[b + i] * (gb[b + i] - tc);
        } else {
          fill_zero(dx, n);
          const V vc = S::set1(tc);
          for (int64_t i = b; i < e; i += W) {
            const int len = int(std::min<int64_t>(W, e - i));
            S::scatter_n(dx, ib + i, S::load(sb + i) * (S::load(gb + i) - vc), len);
          }
        }
      }
      nrows = 0;
      tot = 0;
    }
  };

  // Rows [b, e) of the backward; dalpha (per row) is written when not null.
  template <class AlphaAt>
  static void backward_rows(const T* P, const T* G, T* D, int64_t b, int64_t e, int64_t n, AlphaAt alpha_of,
                            double thr, double* dalpha) {
    const bool need_da = dalpha != nullptr;
    BwdBlock block(n);
    double sink = 0.0;
    for (int64_t r = b; r < e; ++r) {
      const double alpha = alpha_of(r);
      const double a1 = alpha - 1.0;
      const bool soft = a1 < thr;
      if (!need_da && (soft || alpha == 2.0 || alpha == 1.5)) {
        backward_simple_row(P + r * n, G + r * n, D + r * n, n, !soft && alpha == 2.0, soft);
        continue;
      }
      block.add(P + r * n, G + r * n, D + r * n, soft ? 0.0 : a1, need_da ? dalpha + r : &sink, need_da);
    }
    block.solve(need_da);
  }
};

// ------------------------------------------------------------------------------------------------
// Entry points.
// ------------------------------------------------------------------------------------------------

int64_t grain_rows(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

double alpha_at(const double* alpha, int64_t stride, int64_t r) {
  double a = alpha[r * stride];
  // Documented contract: tensor alpha is used clamped to [1, 2] (no device sync to validate it).
  if (!(a >= 1.0)) a = 1.0;
  if (a > 2.0) a = 2.0;
  return a;
}

void check_inputs(const at::Tensor& x, const at::Tensor& alpha) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "entmax_cpu: x must be a contiguous 2-D CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, "entmax_cpu: float32 or float64 only");
  TORCH_CHECK(x.size(1) < (int64_t(1) << 30), "entmax_cpu: rows longer than 2^30 are not supported");
  TORCH_CHECK(alpha.device().is_cpu() && alpha.scalar_type() == at::kDouble && alpha.dim() == 1 && alpha.is_contiguous(),
              "entmax_cpu: alpha must be a contiguous 1-D float64 CPU tensor");
  TORCH_CHECK(alpha.numel() == 1 || alpha.numel() == x.size(0), "entmax_cpu: alpha must have 1 or rows entries");
}

template <class S>
void forward_impl(const at::Tensor& x, at::Tensor& out, const at::Tensor& alpha, double thr) {
  using T = typename S::Elem;
  const int64_t rows = x.size(0), n = x.size(1);
  const T* X = x.data_ptr<T>();
  T* Y = out.data_ptr<T>();
  const double* A = alpha.data_ptr<double>();
  const int64_t astride = alpha.numel() == 1 ? 0 : 1;
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t b, int64_t e) {
    Kernels<S>::forward_rows(X, Y, b, e, n, [&](int64_t r) { return alpha_at(A, astride, r); }, thr);
  });
}

template <class S>
void backward_impl(const at::Tensor& p, const at::Tensor& g, at::Tensor& dx, const at::Tensor& alpha, double thr,
                   double* dalpha) {
  using T = typename S::Elem;
  const int64_t rows = p.size(0), n = p.size(1);
  const T* P = p.data_ptr<T>();
  const T* G = g.data_ptr<T>();
  T* D = dx.data_ptr<T>();
  const double* A = alpha.data_ptr<double>();
  const int64_t astride = alpha.numel() == 1 ? 0 : 1;
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t b, int64_t e) {
    Kernels<S>::backward_rows(P, G, D, b, e, n, [&](int64_t r) { return alpha_at(A, astride, r); }, thr, dalpha);
  });
}

at::Tensor entmax_forward(const at::Tensor& x, const at::Tensor& alpha, double thr) {
  check_inputs(x, alpha);
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  if (x.scalar_type() == at::kFloat)
    forward_impl<SimdF>(x, out, alpha, thr);
  else
    forward_impl<SimdD>(x, out, alpha, thr);
  return out;
}

// Threshold API entry points (see the threshold section of Kernels): params is (rows, 2) float64.
std::vector<at::Tensor> entmax_threshold(const at::Tensor& x, const at::Tensor& alpha, double thr) {
  check_inputs(x, alpha);
  at::Tensor out = at::empty_like(x);
  at::Tensor params = at::empty({x.size(0), 2}, x.options().dtype(at::kDouble));
  if (x.numel() == 0) return {out, params};
  const int64_t rows = x.size(0), n = x.size(1);
  const double* A = alpha.data_ptr<double>();
  const int64_t astride = alpha.numel() == 1 ? 0 : 1;
  double* P = params.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "entmax_threshold", [&] {
    using Sm = std::conditional_t<std::is_same<scalar_t, float>::value, SimdF, SimdD>;
    const scalar_t* X = x.data_ptr<scalar_t>();
    scalar_t* Y = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t b, int64_t e) {
      Kernels<Sm>::threshold_rows(X, Y, P, b, e, n, [&](int64_t r) { return alpha_at(A, astride, r); }, thr);
    });
  });
  return {out, params};
}

at::Tensor entmax_from_threshold(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& params, double thr) {
  check_inputs(x, alpha);
  TORCH_CHECK(params.device().is_cpu() && params.scalar_type() == at::kDouble && params.is_contiguous() &&
                  params.dim() == 2 && params.size(0) == x.size(0) && params.size(1) == 2,
              "entmax_cpu: params must be a contiguous (rows, 2) float64 CPU tensor");
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  const int64_t rows = x.size(0), n = x.size(1);
  const double* A = alpha.data_ptr<double>();
  const int64_t astride = alpha.numel() == 1 ? 0 : 1;
  const double* P = params.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "entmax_from_threshold", [&] {
    using Sm = std::conditional_t<std::is_same<scalar_t, float>::value, SimdF, SimdD>;
    const scalar_t* X = x.data_ptr<scalar_t>();
    scalar_t* Y = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t b, int64_t e) {
      Kernels<Sm>::from_threshold_rows(X, Y, P, b, e, n, [&](int64_t r) { return alpha_at(A, astride, r); }, thr);
    });
  });
  return out;
}

// Returns (dx, dalpha per row as float64; empty unless need_dalpha).
std::vector<at::Tensor> entmax_backward(const at::Tensor& p, const at::Tensor& g, const at::Tensor& alpha, double thr,
                                        bool need_dalpha) {
  check_inputs(p, alpha);
  TORCH_CHECK(g.sizes() == p.sizes() && g.scalar_type() == p.scalar_type() && g.is_contiguous(),
              "entmax_cpu: grad must match the output");
  at::Tensor dx = at::empty_like(p);
  // every row's dalpha is written when it is requested (all rows then take the packed general path)
  at::Tensor da = at::empty({need_dalpha ? p.size(0) : 0}, p.options().dtype(at::kDouble));
  if (p.numel() == 0) return {dx, da};
  double* dap = need_dalpha ? da.data_ptr<double>() : nullptr;
  if (p.scalar_type() == at::kFloat)
    backward_impl<SimdF>(p, g, dx, alpha, thr, dap);
  else
    backward_impl<SimdD>(p, g, dx, alpha, thr, dap);
  return {dx, da};
}

std::string isa() { return SimdF::name(); }

// ------------------------------------------------------------------------------------------------
// Autograd wiring in C++ (so the backward never enters Python): alpha-entmax along `dim` of any
// tensor.  x: float32/float64 CPU.  alpha: a tensor broadcastable to x's shape with size 1 along dim
// (checked in Python); it gets a gradient when it requires one.
// ------------------------------------------------------------------------------------------------

// The common case (dim = last) skips the movedim/contiguous dispatches: per call they cost more
// than the kernel on small inputs.
at::Tensor to_last(const at::Tensor& t, int64_t dim) {
  at::Tensor r = dim == t.dim() - 1 ? t : t.movedim(dim, -1);
  return r.is_contiguous() ? r : r.contiguous();
}

at::Tensor from_last(const at::Tensor& t, int64_t dim) { return dim == t.dim() - 1 ? t : t.movedim(-1, dim); }

// alpha as one float64 per row of x.movedim(dim, -1), or a single value.
at::Tensor alpha_rows(const at::Tensor& alpha, at::IntArrayRef x_sizes, int64_t dim) {
  at::Tensor a = alpha.scalar_type() == at::kDouble ? alpha.detach() : alpha.detach().to(at::kDouble);
  if (a.numel() == 1) return a.dim() == 1 ? a : a.reshape({1});
  std::vector<int64_t> row_shape(x_sizes.begin(), x_sizes.end());
  row_shape[dim] = 1;
  return to_last(a.expand(row_shape), dim).reshape({-1});
}

struct EntmaxFunction : public torch::autograd::Function<EntmaxFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& alpha,
                            int64_t dim, double thr) {
    at::Tensor x_last = to_last(x, dim);
    const int64_t n = x_last.size(-1);
    at::Tensor a_rows = alpha_rows(alpha, x.sizes(), dim);
    at::Tensor out2 = entmax_forward(x_last.view({-1, n}), a_rows, thr);
    ctx->save_for_backward({out2, a_rows});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["thr"] = thr;
    ctx->saved_data["shape"] = x_last.sizes().vec();
    if (alpha.requires_grad()) {
      ctx->saved_data["alpha_shape"] = alpha.sizes().vec();
      ctx->saved_data["alpha_dtype"] = alpha.scalar_type();
    }
    return from_last(out2.view(x_last.sizes()), dim);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& out2 = saved[0];
    const at::Tensor& a_rows = saved[1];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const double thr = ctx->saved_data["thr"].toDouble();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const bool need_da = ctx->needs_input_grad(1);
    at::Tensor g = grads[0].scalar_type() == out2.scalar_type() ? grads[0] : grads[0].to(out2.scalar_type());
    at::Tensor g2 = to_last(g, dim).view(out2.sizes());
    std::vector<at::Tensor> res = entmax_backward(out2, g2, a_rows, thr, need_da);
    at::Tensor dx = ctx->needs_input_grad(0) ? from_last(res[0].view(shape), dim) : at::Tensor();
    at::Tensor da;
    if (need_da) {
      std::vector<int64_t> da_shape(shape.begin(), shape.end() - 1);
      da_shape.push_back(1);
      da = from_last(res[1].view(da_shape), dim)
               .sum_to_size(ctx->saved_data["alpha_shape"].toIntVector())
               .to(ctx->saved_data["alpha_dtype"].toScalarType());
    }
    return {dx, da, at::Tensor(), at::Tensor()};
  }
};

at::Tensor entmax(const at::Tensor& x, const at::Tensor& alpha, int64_t dim, double thr) {
  // dim may be negative (as in PyTorch); everything below indexes shapes with it.
  return EntmaxFunction::apply(x, alpha, at::maybe_wrap_dim(dim, x.dim()), thr);
}

}  // namespace

// The row kernels for the fused attention (entmax_attention_cpu.cpp; declared in entmax_rows.h): one
// alpha for every row of a call, no threading of their own (the caller's at::parallel_for runs them).
namespace entmax_rows {

template <class T>
using RowKernels = Kernels<std::conditional_t<std::is_same<T, float>::value, SimdF, SimdD>>;

template <class T>
void threshold(const T* x, T* p, double* params, int64_t rows, int64_t n, double alpha, double thr) {
  RowKernels<T>::threshold_rows(x, p, params, 0, rows, n, [alpha](int64_t) { return alpha; }, thr);
}

template <class T>
void from_threshold(const T* x, T* p, const double* params, int64_t rows, int64_t n, double alpha, double thr) {
  RowKernels<T>::from_threshold_rows(x, p, params, 0, rows, n, [alpha](int64_t) { return alpha; }, thr);
}

template <class T>
void backward(const T* p, const T* g, T* dx, int64_t rows, int64_t n, double alpha, double thr, double* dalpha) {
  RowKernels<T>::backward_rows(p, g, dx, 0, rows, n, [alpha](int64_t) { return alpha; }, thr, dalpha);
}

template void threshold<float>(const float*, float*, double*, int64_t, int64_t, double, double);
template void threshold<double>(const double*, double*, double*, int64_t, int64_t, double, double);
template void from_threshold<float>(const float*, float*, const double*, int64_t, int64_t, double, double);
template void from_threshold<double>(const double*, double*, const double*, int64_t, int64_t, double, double);
template void backward<float>(const float*, const float*, float*, int64_t, int64_t, double, double, double*);
template void backward<double>(const double*, const double*, double*, int64_t, int64_t, double, double, double*);

}  // namespace entmax_rows

void register_entmax_attention(pybind11::module_& m);  // entmax_attention_cpu.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused alpha-entmax CPU kernels (see sparse_runner/attention/entmax.py)";
  m.def("entmax", &entmax, "differentiable alpha-entmax along dim (x float32/64 CPU, alpha tensor)",
        pybind11::arg("x"), pybind11::arg("alpha"), pybind11::arg("dim"), pybind11::arg("thr"));
  m.def("forward", &entmax_forward, "alpha-entmax over the last dim of a contiguous (rows, n) tensor",
        pybind11::arg("x"), pybind11::arg("alpha"), pybind11::arg("thr"));
  m.def("backward", &entmax_backward, "gradients wrt x and (optionally) alpha per row", pybind11::arg("p"),
        pybind11::arg("g"), pybind11::arg("alpha"), pybind11::arg("thr"), pybind11::arg("need_dalpha"));
  m.def("threshold", &entmax_threshold,
        "alpha-entmax over the last dim of a contiguous (rows, n) tensor, and each row's (t, F) as (rows, 2) float64",
        pybind11::arg("x"), pybind11::arg("alpha"), pybind11::arg("thr"));
  m.def("from_threshold", &entmax_from_threshold, "the weights of `threshold` recomputed from its (t, F)",
        pybind11::arg("x"), pybind11::arg("alpha"), pybind11::arg("params"), pybind11::arg("thr"));
  m.def("isa", &isa, "instruction set the float32 kernels were compiled for");
  register_entmax_attention(m);
}
