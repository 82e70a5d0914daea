// The row kernels of entmax_cpu.cpp as the fused attention (entmax_attention_cpu.cpp) calls them: a
// block of `rows` contiguous rows of length n, one alpha for all of them, run on the calling thread.
// Semantics, threshold parameters (t, F) and thr (ALPHA_SOFTMAX_THRESHOLD) as in entmax_cpu.cpp.
#pragma once

#include <cstdint>

namespace entmax_rows {

// p = entmax(x) row by row, and each row's (t, F) in params (rows, 2).
template <class T>
void threshold(const T* x, T* p, double* params, int64_t rows, int64_t n, double alpha, double thr);

// The weights of `threshold` again from its params, bitwise.
template <class T>
void from_threshold(const T* x, T* p, const double* params, int64_t rows, int64_t n, double alpha, double thr);

// dx = the entmax Jacobian applied to g at weights p; dalpha (rows entries) when not null.
template <class T>
void backward(const T* p, const T* g, T* dx, int64_t rows, int64_t n, double alpha, double thr, double* dalpha);

}  // namespace entmax_rows
