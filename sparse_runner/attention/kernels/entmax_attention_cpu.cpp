// Fused alpha-entmax attention on CPU (model.attention_impl=cpp).  The autograd wiring, the checks and
// the dtype handling are in entmax_attention_cpu.py; the row solvers are entmax_cpu.cpp's (entmax_rows.h).
//
// Forward, per task = (pair, block of query rows): the block's scores go into a per-thread buffer that
// stays in cache, each row's threshold is solved there (entmax_rows::threshold), and p v accumulates in
// register tiles.  Only the row's threshold parameters (t, F) are kept.
// Backward, per task = one pair (all of its query blocks, in order): the scores are computed again by the
// same code, the weights recomputed from (t, F) (bitwise the forward's), dp = dO v^T, ds from the entmax
// Jacobian (entmax_rows::backward, with dalpha per row), and dq, dk, dv.  Attention dropout multiplies the
// weights by a keep mask drawn from a counter-based hash, drawn again in the backward (Dropout).
// A pair's dk, dv and dalpha are summed by one thread in a fixed order, so the gradients do not depend
// on the thread count.
//
// Why by hand: PyTorch's fused attention (SDPA) is softmax only; the explicit path writes the n x n
// scores, weights and their gradients to memory, where at head size 16 the batched products run at a
// fraction of the machine's speed (K or N = 16 is a poor shape for the BLAS).
//
// Layout (P = batch x heads pairs, pair i = batch i / H, head i % H):
//   q (P, Nq, D), already scaled; k (P, Nk, D); v (P, Nk, Dv); kt (P, D, Nk) and vt (P, Dv, Nk), the
//   transposes, so that score-like products run along keys, one vector of keys per FMA.
//   key padding (B, Nk) uint8, 1 = real key, or empty; valid (P, Nq, Nk) uint8, 1 = the pair may interact
//   (block patterns' tiles), or empty; causal: query i sees keys j <= i + Nk - Nq.
//   alpha (H,) float64, each in [1, 2]; a query without any key gets a zero output and zero gradients.
//   dropout: the rate in [0, 1) and a 64-bit seed.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "entmax_rows.h"

namespace {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;  // AVX2; elsewhere the compiler splits it into what the CPU has
#endif

// GCC/Clang vector extension: one SIMD register of T, unaligned loads and stores through memcpy.
template <class T>
struct Lanes {
  static constexpr int W = kVectorBytes / sizeof(T);
  typedef T V __attribute__((vector_size(kVectorBytes)));
  static V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static void store(T* p, V v) { std::memcpy(p, &v, sizeof(V)); }
  static V splat(T x) { return V{} + x; }
};

// out[i][j] = sum_c a[i][c] bt[c][j] for RB rows at a time (RB x 2 vectors of accumulators in registers).
// Forward and backward compute the scores through this one function, so they get them bitwise equal.
template <class T, int RB>
void row_tile(const T* a, int64_t lda, const T* bt, int64_t ldb, T* out, int64_t ldo, int64_t n, int64_t depth) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int W = L::W;
  int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    V acc[RB][2] = {};
    for (int64_t c = 0; c < depth; ++c) {
      const T* b = bt + c * ldb + j;
      const V b0 = L::load(b), b1 = L::load(b + W);
      for (int r = 0; r < RB; ++r) {
        const V ar = L::splat(a[r * lda + c]);
        acc[r][0] += ar * b0;
        acc[r][1] += ar * b1;
      }
    }
    for (int r = 0; r < RB; ++r) {
      L::store(out + r * ldo + j, acc[r][0]);
      L::store(out + r * ldo + j + W, acc[r][1]);
    }
  }
  for (; j < n; ++j) {
    T acc[RB] = {};
    for (int64_t c = 0; c < depth; ++c)
      for (int r = 0; r < RB; ++r) acc[r] += a[r * lda + c] * bt[c * ldb + j];
    for (int r = 0; r < RB; ++r) out[r * ldo + j] = acc[r];
  }
}

template <class T>
void row_products(const T* a, int64_t lda, const T* bt, int64_t ldb, T* out, int64_t ldo, int64_t rows, int64_t n,
                  int64_t depth) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) row_tile<T, 4>(a + i * lda, lda, bt, ldb, out + i * ldo, ldo, n, depth);
  for (; i < rows; ++i) row_tile<T, 1>(a + i * lda, lda, bt, ldb, out + i * ldo, ldo, n, depth);
}

// y[0, m) += w x[0, m)
template <class T>
inline void axpy(T* __restrict__ y, T w, const T* __restrict__ x, int64_t m) {
  for (int64_t c = 0; c < m; ++c) y[c] += w * x[c];
}

// Per-thread scratch, grown only (a fresh buffer per task would be page-faulted in every time).
template <class T, int Tag>
T* scratch(int64_t count) {
  thread_local std::vector<T> buffer;
  if (int64_t(buffer.size()) < count) buffer.resize(count);
  return buffer.data();
}

// Keys summed into one partial sum before it joins the row's total: one running float32 sum over 20,000
// keys was 10x further from the float64 result than the BLAS's blocked sums.
constexpr int64_t kSumChunk = 128;

// The products with v and k, the other two thirds of the work, run on widths of whole vectors (head sizes
// 16, 32, 64, 128 ...) with their sums in registers; other widths take the plain loops below them.  Both
// are dense: a branch per weight cost more than the multiplications by zero it saved at the supports
// alpha-entmax has early in training.
constexpr int kMaxVectors = 16;  // widths up to 16 vectors (256 floats with AVX-512)

// out[i][:] = sum_j w[i][j] x[j][:] for RB rows, over keys [0, n); x rows are NV vectors wide.
template <class T, int NV, int RB>
void weighted_tile(const T* w, int64_t ldw, const T* x, T* out, int64_t n) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int W = L::W, width = NV * W;
  for (int r = 0; r < RB; ++r) std::fill(out + r * width, out + (r + 1) * width, T(0));
  for (int64_t j0 = 0; j0 < n; j0 += kSumChunk) {
    V acc[RB][NV] = {};
    for (int64_t j = j0; j < std::min(n, j0 + kSumChunk); ++j) {
      V xv[NV];
      for (int c = 0; c < NV; ++c) xv[c] = L::load(x + j * width + c * W);
      for (int r = 0; r < RB; ++r) {
        const V wr = L::splat(w[r * ldw + j]);
        for (int c = 0; c < NV; ++c) acc[r][c] += wr * xv[c];
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < NV; ++c) L::store(out + r * width + c * W, L::load(out + r * width + c * W) + acc[r][c]);
  }
}

// dx[j][:] += sum_i w[i][j] y[i][:] over the rows i of the block, for KB keys at a time.
template <class T, int NV, int KB>
void transposed_tile(const T* w, int64_t ldw, const T* y, T* dx, int64_t rows) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int W = L::W, width = NV * W;
  V acc[KB][NV] = {};
  for (int64_t i = 0; i < rows; ++i) {
    V yv[NV];
    for (int c = 0; c < NV; ++c) yv[c] = L::load(y + i * width + c * W);
    for (int kb = 0; kb < KB; ++kb) {
      const V wk = L::splat(w[i * ldw + kb]);
      for (int c = 0; c < NV; ++c) acc[kb][c] += wk * yv[c];
    }
  }
  for (int kb = 0; kb < KB; ++kb)
    for (int c = 0; c < NV; ++c) L::store(dx + kb * width + c * W, L::load(dx + kb * width + c * W) + acc[kb][c]);
}

template <class T, int NV>
void weighted_rows_fixed(const T* w, int64_t ldw, const T* x, T* out, int64_t rows, int64_t n) {
  constexpr int RB = NV <= 4 ? 4 : (NV <= 8 ? 2 : 1);
  constexpr int64_t width = NV * Lanes<T>::W;
  int64_t i = 0;
  for (; i + RB <= rows; i += RB) weighted_tile<T, NV, RB>(w + i * ldw, ldw, x, out + i * width, n);
  for (; i < rows; ++i) weighted_tile<T, NV, 1>(w + i * ldw, ldw, x, out + i * width, n);
}

template <class T, int NV>
void add_transposed_fixed(const T* w, int64_t ldw, const T* y, T* dx, int64_t rows, int64_t n) {
  constexpr int KB = NV <= 4 ? 4 : (NV <= 8 ? 2 : 1);
  constexpr int64_t width = NV * Lanes<T>::W;
  int64_t j = 0;
  for (; j + KB <= n; j += KB) transposed_tile<T, NV, KB>(w + j, ldw, y, dx + j * width, rows);
  for (; j < n; ++j) transposed_tile<T, NV, 1>(w + j, ldw, y, dx + j * width, rows);
}

// Runs Tile::run<NV>(args...) where `width` is NV whole vectors (NV = 1, 2, 4, 8, 16); false for other widths.
template <class T, class Tile, class... Args>
bool in_vectors(int64_t width, Args... args) {
  constexpr int W = Lanes<T>::W;
  switch (width % W == 0 ? width / W : 0) {
    case 1: Tile::template run<1>(args...); return true;
    case 2: Tile::template run<2>(args...); return true;
    case 4: Tile::template run<4>(args...); return true;
    case 8: Tile::template run<8>(args...); return true;
    case kMaxVectors: Tile::template run<kMaxVectors>(args...); return true;
    default: return false;
  }
}

template <class T>
struct WeightedRows {
  template <int NV>
  static void run(const T* w, int64_t ldw, const T* x, T* out, int64_t rows, int64_t n) {
    weighted_rows_fixed<T, NV>(w, ldw, x, out, rows, n);
  }
};

template <class T>
struct AddTransposed {
  template <int NV>
  static void run(const T* w, int64_t ldw, const T* y, T* dx, int64_t rows, int64_t n) {
    add_transposed_fixed<T, NV>(w, ldw, y, dx, rows, n);
  }
};

// out[i][:] = sum_j w[i][j] x[j][:] over the keys j < n.
template <class T>
void weighted_rows(const T* w, int64_t ldw, const T* x, int64_t width, T* out, int64_t rows, int64_t n) {
  if (in_vectors<T, WeightedRows<T>>(width, w, ldw, x, out, rows, n)) return;
  T* part = scratch<T, 3>(width);
  for (int64_t i = 0; i < rows; ++i) {
    T* o = out + i * width;
    std::fill(o, o + width, T(0));
    const T* wi = w + i * ldw;
    for (int64_t j0 = 0; j0 < n; j0 += kSumChunk) {
      std::fill(part, part + width, T(0));
      for (int64_t j = j0; j < std::min(n, j0 + kSumChunk); ++j) axpy(part, wi[j], x + j * width, width);
      axpy(o, T(1), part, width);
    }
  }
}

// dx[j][:] += sum_i w[i][j] y[i][:] (the transposed product, into key rows).
template <class T>
void add_transposed(const T* w, int64_t ldw, const T* y, int64_t width, T* dx, int64_t rows, int64_t n) {
  if (in_vectors<T, AddTransposed<T>>(width, w, ldw, y, dx, rows, n)) return;
  for (int64_t i = 0; i < rows; ++i) {
    const T* wi = w + i * ldw;
    const T* yi = y + i * width;
    for (int64_t j = 0; j < n; ++j) axpy(dx + j * width, wi[j], yi, width);
  }
}

// Attention dropout.  Whether weight (row, key) of a pair is kept is a hash of (seed, pair, row, key): the
// backward draws the same mask again without storing it, and the mask does not depend on the block size or
// the thread count.  A 32-bit integer hash (multiply-xorshift, "lowbias32") vectorises along the keys.
inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

struct Dropout {
  double rate = 0.0;
  uint64_t seed = 0;
  uint32_t threshold = 0;  // keep where hash >= threshold: probability 1 - rate

  explicit Dropout(double r = 0.0, uint64_t s = 0) : rate(r), seed(s) {
    threshold = uint32_t(std::min(4294967295.0, std::ldexp(r, 32)));
  }
  bool on() const { return rate > 0.0; }
  // The row's stream: every (pair, row) gets its own, from the 64-bit seed.
  uint32_t row_base(int64_t pair, int64_t row, int64_t rows_per_pair) const {
    const uint64_t id = uint64_t(pair) * uint64_t(rows_per_pair) + uint64_t(row);
    return hash32(uint32_t(seed) ^ hash32(uint32_t(seed >> 32) ^ hash32(uint32_t(id) ^ hash32(uint32_t(id >> 32)))));
  }
  // out[j] = x[j] / (1 - rate) where (row, j) is kept, else 0, for keys [0, n).
  template <class T>
  void apply(const T* x, T* out, int64_t n, uint32_t base) const {
    const T scale = T(1.0 / (1.0 - rate));
    for (int64_t j = 0; j < n; ++j) out[j] = hash32(base ^ (uint32_t(j) * 0x9e3779b9U)) >= threshold ? x[j] * scale : T(0);
  }
};

// One call's geometry and operands.
template <class T>
struct Call {
  const T *q, *k, *v, *kt, *vt;
  int64_t pairs, heads, nq, nk, d, dv, rows;
  const uint8_t* padding;  // (B, Nk) or null
  const uint8_t* valid;    // (P, Nq, Nk) or null: which (query, key) pairs may interact
  std::vector<int64_t> key_end;  // per batch: 1 + its last real key (nk without padding)
  bool causal;
  const double* alpha;
  double thr;
  Dropout dropout;

  // The dropped weights of rows [r0, r1) of `pair` (R x n, row stride n): out = mask(x) / (1 - rate).
  void drop(const T* x, T* out, int64_t pair, int64_t r0, int64_t r1, int64_t n) const {
    for (int64_t i = 0; i < r1 - r0; ++i) dropout.apply(x + i * n, out + i * n, n, dropout.row_base(pair, r0 + i, nq));
  }

  int64_t blocks() const { return (nq + rows - 1) / rows; }

  // Keys that rows [r0, r1) of `pair` may see, as a prefix [0, n): up to the causal limit of the last
  // row and the pair's last real key (keys past it never get weight, so they are never computed).
  int64_t keys(int64_t pair, int64_t r1) const {
    int64_t n = causal ? std::min(nk, r1 + nk - nq) : nk;
    return std::max<int64_t>(0, std::min(n, key_end[pair / heads]));
  }

  // Sets the scores s (R x n, row stride n) of the pairs that may not interact to -inf.
  void mask(T* s, int64_t pair, int64_t r0, int64_t r1, int64_t n) const {
    const T neg = -std::numeric_limits<T>::infinity();
    if (padding != nullptr) {
      const uint8_t* real = padding + (pair / heads) * nk;
      for (int64_t j = 0; j < n; ++j)
        if (!real[j])
          for (int64_t i = 0; i < r1 - r0; ++i) s[i * n + j] = neg;
    }
    if (causal)
      for (int64_t i = 0; i < r1 - r0; ++i)
        for (int64_t j = std::max<int64_t>(0, r0 + i + nk - nq + 1); j < n; ++j) s[i * n + j] = neg;
    if (valid != nullptr)
      for (int64_t i = 0; i < r1 - r0; ++i) {
        const uint8_t* ok = valid + (pair * nq + r0 + i) * nk;
        for (int64_t j = 0; j < n; ++j)
          if (!ok[j]) s[i * n + j] = neg;
      }
  }

  // The scores of rows [r0, r1) of `pair` over keys [0, n), masked.
  void scores(T* s, int64_t pair, int64_t r0, int64_t r1, int64_t n) const {
    row_products(q + (pair * nq + r0) * d, d, kt + pair * d * nk, nk, s, n, r1 - r0, n, d);
    mask(s, pair, r0, r1, n);
  }
};

template <class T>
void forward_impl(const Call<T>& c, T* out, double* params) {
  const int64_t blocks = c.blocks();
  at::parallel_for(0, c.pairs * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t pair = task / blocks, r0 = (task % blocks) * c.rows, r1 = std::min(c.nq, r0 + c.rows);
      const int64_t n = c.keys(pair, r1);
      T* o = out + (pair * c.nq + r0) * c.dv;
      double* prm = params + 2 * (pair * c.nq + r0);
      if (n == 0) {  // no key at all: zero output; t = +inf gives zero weights in backward
        std::fill(o, o + (r1 - r0) * c.dv, T(0));
        for (int64_t i = 0; i < r1 - r0; ++i) prm[2 * i] = std::numeric_limits<double>::infinity(), prm[2 * i + 1] = 1.0;
        continue;
      }
      T* s = scratch<T, 0>(c.rows * n);
      T* p = scratch<T, 1>(c.rows * n);
      c.scores(s, pair, r0, r1, n);
      entmax_rows::threshold(s, p, prm, r1 - r0, n, c.alpha[pair % c.heads], c.thr);
      if (c.dropout.on()) c.drop(p, p, pair, r0, r1, n);
      weighted_rows(p, n, c.v + pair * c.nk * c.dv, c.dv, o, r1 - r0, n);
    }
  });
}

// dq (P, Nq, D) and dk (P, Nk, D) are with respect to the scaled q and k; dk, dv start at zero.
template <class T>
void backward_impl(const Call<T>& c, const double* params, const T* grad, T* dq, T* dk, T* dv, double* dalpha) {
  at::parallel_for(0, c.pairs, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> da_rows(dalpha != nullptr ? c.rows : 0);
    for (int64_t pair = begin; pair < end; ++pair) {
      const double alpha = c.alpha[pair % c.heads];
      const T* kp = c.k + pair * c.nk * c.d;
      // dk and dv sum over every query: partial sums over about kSumChunk queries join the totals (dk, dv)
      // together, as in weighted_rows.
      T* dk_part = scratch<T, 4>(c.nk * c.d);
      T* dv_part = scratch<T, 5>(c.nk * c.dv);
      int64_t part_rows = 0, part_keys = 0;
      auto flush = [&] {
        axpy(dk + pair * c.nk * c.d, T(1), dk_part, part_keys * c.d);
        axpy(dv + pair * c.nk * c.dv, T(1), dv_part, part_keys * c.dv);
        std::fill(dk_part, dk_part + part_keys * c.d, T(0));
        std::fill(dv_part, dv_part + part_keys * c.dv, T(0));
        part_rows = part_keys = 0;
      };
      std::fill(dk_part, dk_part + c.nk * c.d, T(0));
      std::fill(dv_part, dv_part + c.nk * c.dv, T(0));
      double da = 0.0;
      for (int64_t r0 = 0; r0 < c.nq; r0 += c.rows) {
        const int64_t r1 = std::min(c.nq, r0 + c.rows), rows = r1 - r0, n = c.keys(pair, r1);
        T* dqb = dq + (pair * c.nq + r0) * c.d;
        if (n == 0) {
          std::fill(dqb, dqb + rows * c.d, T(0));
          continue;
        }
        const T* g = grad + (pair * c.nq + r0) * c.dv;
        const T* qb = c.q + (pair * c.nq + r0) * c.d;
        T* s = scratch<T, 0>(c.rows * n);
        T* p = scratch<T, 1>(c.rows * n);
        T* dp = scratch<T, 2>(c.rows * n);
        c.scores(s, pair, r0, r1, n);
        entmax_rows::from_threshold(s, p, params + 2 * (pair * c.nq + r0), rows, n, alpha, c.thr);
        row_products(g, c.dv, c.vt + pair * c.dv * c.nk, c.nk, dp, n, rows, n, c.dv);
        if (c.dropout.on()) {  // dv from the dropped weights; dp through the mask to the weights
          c.drop(p, s, pair, r0, r1, n);  // into the scores' buffer: the weights are computed from them
          add_transposed(s, n, g, c.dv, dv_part, rows, n);
          c.drop(dp, dp, pair, r0, r1, n);
        } else {
          add_transposed(p, n, g, c.dv, dv_part, rows, n);
        }
        T* ds = s;
        entmax_rows::backward(p, dp, ds, rows, n, alpha, c.thr, dalpha != nullptr ? da_rows.data() : nullptr);
        weighted_rows(ds, n, kp, c.d, dqb, rows, n);
        add_transposed(ds, n, qb, c.d, dk_part, rows, n);
        part_keys = std::max(part_keys, n);
        part_rows += rows;
        if (part_rows >= kSumChunk) flush();
        if (dalpha != nullptr)
          for (int64_t i = 0; i < rows; ++i) da += da_rows[i];
      }
      flush();
      if (dalpha != nullptr) dalpha[pair] = da;
    }
  });
}

template <class T>
Call<T> make_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kt,
                  const at::Tensor& vt, const at::Tensor& padding, const at::Tensor& valid, bool causal,
                  const at::Tensor& alpha, double thr, int64_t rows, double dropout, int64_t seed) {
  Call<T> c;
  c.dropout = Dropout(dropout, uint64_t(seed));
  c.q = q.data_ptr<T>(), c.k = k.data_ptr<T>(), c.v = v.data_ptr<T>(), c.kt = kt.data_ptr<T>(), c.vt = vt.data_ptr<T>();
  c.pairs = q.size(0), c.heads = alpha.numel(), c.nq = q.size(1), c.nk = k.size(1), c.d = q.size(2), c.dv = v.size(2);
  c.rows = rows;
  c.padding = padding.numel() > 0 ? padding.data_ptr<uint8_t>() : nullptr;
  c.valid = valid.numel() > 0 ? valid.data_ptr<uint8_t>() : nullptr;
  const int64_t batches = c.pairs / c.heads;
  c.key_end.assign(batches, c.nk);
  if (c.padding != nullptr)
    for (int64_t b = 0; b < batches; ++b) {
      int64_t last = 0;
      for (int64_t j = 0; j < c.nk; ++j)
        if (c.padding[b * c.nk + j]) last = j + 1;
      c.key_end[b] = last;
    }
  c.causal = causal;
  c.alpha = alpha.data_ptr<double>();
  c.thr = thr;
  return c;
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kt, const at::Tensor& vt,
           const at::Tensor& padding, const at::Tensor& valid, const at::Tensor& alpha, int64_t rows, double dropout) {
  TORCH_CHECK(valid.numel() == 0 || (valid.scalar_type() == at::kByte && valid.is_contiguous() &&
                                     valid.numel() == q.size(0) * q.size(1) * k.size(1)),
              "entmax_attention_cpu: valid must be empty or (P, Nq, Nk) uint8");
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, "entmax_attention_cpu: dropout must be in [0, 1)");
  for (const at::Tensor* t : {&q, &k, &v, &kt, &vt})
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 3 && t->is_contiguous() && t->scalar_type() == q.scalar_type(),
                "entmax_attention_cpu: q, k, v, kt, vt must be contiguous 3-D CPU tensors of one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, "entmax_attention_cpu: float32 or float64");
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(2) == q.size(2) && v.size(1) == k.size(1),
              "entmax_attention_cpu: q (P, Nq, D), k (P, Nk, D), v (P, Nk, Dv)");
  TORCH_CHECK(kt.size(1) == k.size(2) && kt.size(2) == k.size(1) && vt.size(1) == v.size(2) && vt.size(2) == v.size(1),
              "entmax_attention_cpu: kt, vt must be the transposes of k, v");
  TORCH_CHECK(alpha.device().is_cpu() && alpha.scalar_type() == at::kDouble && alpha.dim() == 1 && alpha.numel() > 0 &&
                  q.size(0) % alpha.numel() == 0,
              "entmax_attention_cpu: alpha must be (H,) float64 with P a multiple of H");
  TORCH_CHECK(padding.numel() == 0 || (padding.scalar_type() == at::kByte && padding.is_contiguous() &&
                                       padding.numel() == q.size(0) / alpha.numel() * k.size(1)),
              "entmax_attention_cpu: padding must be empty or (B, Nk) uint8");
  TORCH_CHECK(rows > 0, "entmax_attention_cpu: rows per block must be positive");
}

// Returns (out (P, Nq, Dv), params (P, Nq, 2) float64).
std::vector<at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& kt, const at::Tensor& vt, const at::Tensor& padding,
                                          const at::Tensor& valid, bool causal, const at::Tensor& alpha, double thr,
                                          int64_t rows, double dropout, int64_t seed) {
  check(q, k, v, kt, vt, padding, valid, alpha, rows, dropout);
  at::Tensor out = at::empty({q.size(0), q.size(1), v.size(2)}, q.options());
  at::Tensor params = at::empty({q.size(0), q.size(1), 2}, q.options().dtype(at::kDouble));
  if (q.numel() == 0) return {out, params};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "entmax_attention_forward", [&] {
    const Call<scalar_t> c = make_call<scalar_t>(q, k, v, kt, vt, padding, valid, causal, alpha, thr, rows, dropout, seed);
    forward_impl(c, out.data_ptr<scalar_t>(), params.data_ptr<double>());
  });
  return {out, params};
}

// Returns (dq, dk, dv: with respect to the scaled q, k, v; dalpha per pair (P,) float64, empty unless asked).
std::vector<at::Tensor> attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& kt, const at::Tensor& vt, const at::Tensor& padding,
                                           const at::Tensor& valid, bool causal, const at::Tensor& alpha, double thr,
                                           int64_t rows, double dropout, int64_t seed, const at::Tensor& params,
                                           const at::Tensor& grad, bool need_dalpha) {
  check(q, k, v, kt, vt, padding, valid, alpha, rows, dropout);
  TORCH_CHECK(grad.is_contiguous() && grad.scalar_type() == q.scalar_type() && grad.size(0) == q.size(0) &&
                  grad.size(1) == q.size(1) && grad.size(2) == v.size(2),
              "entmax_attention_cpu: grad must be a contiguous (P, Nq, Dv) tensor of q's dtype");
  TORCH_CHECK(params.scalar_type() == at::kDouble && params.is_contiguous() && params.numel() == q.size(0) * q.size(1) * 2,
              "entmax_attention_cpu: params must be the forward's (P, Nq, 2) float64 tensor");
  at::Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  at::Tensor da = at::zeros({need_dalpha ? q.size(0) : 0}, q.options().dtype(at::kDouble));
  if (q.numel() == 0) return {dq, dk, dv, da};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "entmax_attention_backward", [&] {
    const Call<scalar_t> c = make_call<scalar_t>(q, k, v, kt, vt, padding, valid, causal, alpha, thr, rows, dropout, seed);
    backward_impl(c, params.data_ptr<double>(), grad.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(),
                  dk.data_ptr<scalar_t>(), dv.data_ptr<scalar_t>(), need_dalpha ? da.data_ptr<double>() : nullptr);
  });
  return {dq, dk, dv, da};
}

// The keep mask of `dropout` for P pairs of Nq x Nk weights (uint8, 1 = kept), as forward and backward draw it.
at::Tensor dropout_keep(int64_t pairs, int64_t nq, int64_t nk, double dropout, int64_t seed) {
  const Dropout d(dropout, uint64_t(seed));
  at::Tensor keep = at::empty({pairs, nq, nk}, at::TensorOptions().dtype(at::kByte));
  std::vector<float> ones(nk, 1.0f), row(nk);
  uint8_t* out = keep.data_ptr<uint8_t>();
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t i = 0; i < nq; ++i) {
      d.apply(ones.data(), row.data(), nk, d.row_base(p, i, nq));
      for (int64_t j = 0; j < nk; ++j) out[(p * nq + i) * nk + j] = row[j] != 0.0f;
    }
  return keep;
}

}  // namespace

void register_entmax_attention(pybind11::module_& m) {
  m.def("attention_forward", &attention_forward, "fused alpha-entmax attention: (out, per-row (t, F))",
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("kt"), pybind11::arg("vt"),
        pybind11::arg("padding"), pybind11::arg("valid"), pybind11::arg("causal"), pybind11::arg("alpha"), pybind11::arg("thr"),
        pybind11::arg("rows"), pybind11::arg("dropout"), pybind11::arg("seed"));
  m.def("attention_backward", &attention_backward, "its gradients: (dq, dk, dv, dalpha per pair)",
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("kt"), pybind11::arg("vt"),
        pybind11::arg("padding"), pybind11::arg("valid"), pybind11::arg("causal"), pybind11::arg("alpha"), pybind11::arg("thr"),
        pybind11::arg("rows"), pybind11::arg("dropout"), pybind11::arg("seed"), pybind11::arg("params"),
        pybind11::arg("grad"), pybind11::arg("need_dalpha"));
  m.def("attention_dropout_keep", &dropout_keep, "the kernel's attention-dropout keep mask (P, Nq, Nk) uint8",
        pybind11::arg("pairs"), pybind11::arg("nq"), pybind11::arg("nk"), pybind11::arg("dropout"), pybind11::arg("seed"));
}
