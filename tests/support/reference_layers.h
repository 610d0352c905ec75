#pragma once
// Naive double-precision versions of every Backend math call, with the same
// argument order, as the ground truth the CPU and CUDA backends are tested
// against. Written for obviousness, not speed: direct loops over the
// definitions, no im2col, no fusion.
//
// Conventions shared with the backends: maxpool's argmax holds the flat index
// into the whole input tensor x (n*c*h*w), ties go to the first element of the
// window in row-major order; softmax_xent's `correct` uses the first maximal
// logit.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/compute/backend.h"

namespace pstrain::reference {

// y[n x out] = x[n x in] * w[in x out] + b[out]
inline void dense_forward(const double* x, const double* w, const double* b, double* y, int n,
                          int in, int out) {
  for (int i = 0; i < n; ++i) {
    for (int o = 0; o < out; ++o) {
      double sum = b[o];
      for (int k = 0; k < in; ++k) sum += x[i * in + k] * w[k * out + o];
      y[i * out + o] = sum;
    }
  }
}

inline void dense_backward(const double* x, const double* w, const double* dy, double* dx,
                           double* dw, double* db, int n, int in, int out) {
  for (int k = 0; k < in; ++k) {
    for (int o = 0; o < out; ++o) {
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += x[i * in + k] * dy[i * out + o];
      dw[k * out + o] = sum;
    }
  }
  for (int o = 0; o < out; ++o) {
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += dy[i * out + o];
    db[o] = sum;
  }
  if (!dx) return;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < in; ++k) {
      double sum = 0;
      for (int o = 0; o < out; ++o) sum += dy[i * out + o] * w[k * out + o];
      dx[i * in + k] = sum;
    }
  }
}

inline void relu_forward(const double* x, double* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.0;
}

inline void relu_backward(const double* y, const double* dy, double* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = y[i] > 0 ? dy[i] : 0.0;
}

// Valid cross-correlation, stride 1: y[i,f,r,c] = b[f] +
// sum_{ch,u,v} x[i,ch,r+u,c+v] * w[f,ch,u,v].
inline void conv2d_forward(const double* x, const double* w, const double* b, double* y,
                           const ConvShape& s) {
  const int oh = s.out_h(), ow = s.out_w(), k = s.kernel;
  for (int i = 0; i < s.n; ++i)
    for (int f = 0; f < s.filters; ++f)
      for (int r = 0; r < oh; ++r)
        for (int c = 0; c < ow; ++c) {
          double sum = b[f];
          for (int ch = 0; ch < s.c; ++ch)
            for (int u = 0; u < k; ++u)
              for (int v = 0; v < k; ++v)
                sum += x[((i * s.c + ch) * s.h + r + u) * s.w + c + v] *
                       w[((f * s.c + ch) * k + u) * k + v];
          y[((i * s.filters + f) * oh + r) * ow + c] = sum;
        }
}

// dx (skipped when null), dw and db are overwritten.
inline void conv2d_backward(const double* x, const double* w, const double* dy, double* dx,
                            double* dw, double* db, const ConvShape& s) {
  const int oh = s.out_h(), ow = s.out_w(), k = s.kernel;
  const std::size_t wsize = static_cast<std::size_t>(s.filters) * s.c * k * k;
  for (std::size_t j = 0; j < wsize; ++j) dw[j] = 0;
  for (int f = 0; f < s.filters; ++f) db[f] = 0;
  if (dx) {
    const std::size_t xsize = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    for (std::size_t j = 0; j < xsize; ++j) dx[j] = 0;
  }
  for (int i = 0; i < s.n; ++i)
    for (int f = 0; f < s.filters; ++f)
      for (int r = 0; r < oh; ++r)
        for (int c = 0; c < ow; ++c) {
          const double g = dy[((i * s.filters + f) * oh + r) * ow + c];
          db[f] += g;
          for (int ch = 0; ch < s.c; ++ch)
            for (int u = 0; u < k; ++u)
              for (int v = 0; v < k; ++v) {
                const int xi = ((i * s.c + ch) * s.h + r + u) * s.w + c + v;
                const int wi = ((f * s.c + ch) * k + u) * k + v;
                dw[wi] += g * x[xi];
                if (dx) dx[xi] += g * w[wi];
              }
        }
}

inline void maxpool_forward(const double* x, double* y, std::int32_t* argmax, const PoolShape& s) {
  const int oh = s.out_h(), ow = s.out_w();
  for (int i = 0; i < s.n; ++i)
    for (int ch = 0; ch < s.c; ++ch)
      for (int r = 0; r < oh; ++r)
        for (int c = 0; c < ow; ++c) {
          int best = -1;
          for (int u = 0; u < s.k; ++u)
            for (int v = 0; v < s.k; ++v) {
              const int xi = ((i * s.c + ch) * s.h + r * s.k + u) * s.w + c * s.k + v;
              if (best < 0 || x[xi] > x[best]) best = xi;
            }
          const int yi = ((i * s.c + ch) * oh + r) * ow + c;
          y[yi] = x[best];
          argmax[yi] = best;
        }
}

// dx is overwritten: zero except at the chosen maxima.
inline void maxpool_backward(const double* dy, const std::int32_t* argmax, double* dx,
                             const PoolShape& s) {
  const std::size_t xsize = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
  const std::size_t ysize = static_cast<std::size_t>(s.n) * s.c * s.out_h() * s.out_w();
  for (std::size_t j = 0; j < xsize; ++j) dx[j] = 0;
  for (std::size_t j = 0; j < ysize; ++j) dx[argmax[j]] += dy[j];
}

// Mean softmax cross-entropy: dlogits already divided by n, per-sample loss
// and correct (1 where the first maximal logit is the label).
inline void softmax_xent(const double* logits, const std::int32_t* labels, double* dlogits,
                         double* loss, double* correct, int n, int classes) {
  for (int i = 0; i < n; ++i) {
    const double* row = logits + static_cast<std::size_t>(i) * classes;
    int best = 0;
    for (int j = 1; j < classes; ++j)
      if (row[j] > row[best]) best = j;
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(row[j] - row[best]);
    const double lse = row[best] + std::log(sum);
    for (int j = 0; j < classes; ++j)
      dlogits[i * classes + j] = (std::exp(row[j] - lse) - (j == labels[i] ? 1.0 : 0.0)) / n;
    loss[i] = lse - row[labels[i]];
    correct[i] = best == labels[i] ? 1.0 : 0.0;
  }
}

// Mean binary cross-entropy of one logit per sample, the naive way (fine in
// double for |z| well below 700): dlogits already divided by n.
inline void bce_logits(const double* logits, const std::int32_t* labels, double* dlogits,
                       double* loss, double* correct, int n) {
  for (int i = 0; i < n; ++i) {
    const double z = logits[i];
    const double p = 1 / (1 + std::exp(-z));
    dlogits[i] = (p - labels[i]) / n;
    // -log p for a click, -log(1 - p) else, each from its own exponential.
    loss[i] = labels[i] == 1 ? std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
    correct[i] = (logits[i] > 0) == (labels[i] == 1) ? 1.0 : 0.0;
  }
}

// The dot interaction (Backend::dot_interaction_forward) straight from its
// definition: the first `keep` floats, then <x_a, x_b> for a < b in
// row-major order of the upper triangle.
template <class T>
void dot_interaction_forward(const T* x, T* y, const InteractionShape& s) {
  for (int i = 0; i < s.n; ++i) {
    const T* row = x + static_cast<std::size_t>(i) * s.in_width();
    T* out = y + static_cast<std::size_t>(i) * s.out_width();
    for (int c = 0; c < s.keep; ++c) out[c] = row[c];
    int p = s.keep;
    for (int a = 0; a < s.vectors; ++a)
      for (int b = a + 1; b < s.vectors; ++b) {
        T acc = 0;
        for (int j = 0; j < s.dim; ++j) acc += row[a * s.dim + j] * row[b * s.dim + j];
        out[p++] = acc;
      }
  }
}

// Its backward by the chain rule over the pairs in the forward's order,
// each pair adding its share to both of its vectors.
template <class T>
void dot_interaction_backward(const T* x, const T* dy, T* dx, const InteractionShape& s) {
  for (int i = 0; i < s.n; ++i) {
    const T* row = x + static_cast<std::size_t>(i) * s.in_width();
    const T* grad = dy + static_cast<std::size_t>(i) * s.out_width();
    T* out = dx + static_cast<std::size_t>(i) * s.in_width();
    for (int c = 0; c < s.in_width(); ++c) out[c] = c < s.keep ? grad[c] : T(0);
    int p = s.keep;
    for (int a = 0; a < s.vectors; ++a)
      for (int b = a + 1; b < s.vectors; ++b, ++p)
        for (int j = 0; j < s.dim; ++j) {
          out[a * s.dim + j] += grad[p] * row[b * s.dim + j];
          out[b * s.dim + j] += grad[p] * row[a * s.dim + j];
        }
  }
}

// Embedding lookups (Backend::embedding_forward) in T, summing in the order
// the backends do: in float it gives their bits, in double the exact value.
template <class T>
void embedding_forward(const T* rows, const std::int32_t* inverse, T* out,
                       const EmbeddingShape& s) {
  const T scale = s.mean ? T(1) / static_cast<T>(s.k) : T(1);
  for (int i = 0; i < s.n; ++i)
    for (int t = 0; t < s.k; ++t)
      for (int j = 0; j < s.dim; ++j) {
        const T v = rows[static_cast<std::size_t>(inverse[i * s.k + t]) * s.dim + j];
        T* o = out + static_cast<std::size_t>(i) * s.stride + (s.bag ? 0 : t * s.dim) + j;
        *o = s.bag && t > 0 ? *o + v : v;
        if (s.bag && t == s.k - 1) *o = *o * scale;
      }
}

// Its backward: each unique row sums the gradients of its occurrences in
// ascending order (found by scanning `inverse`, not from by_row).
template <class T>
void embedding_backward(const T* dout, const std::int32_t* inverse, T* drows,
                        const EmbeddingShape& s) {
  const T scale = s.bag && s.mean ? T(1) / static_cast<T>(s.k) : T(1);
  for (int u = 0; u < s.unique; ++u)
    for (int j = 0; j < s.dim; ++j) {
      T acc = 0;
      for (int o = 0; o < s.n * s.k; ++o)
        if (inverse[o] == u)
          acc += dout[static_cast<std::size_t>(o / s.k) * s.stride +
                      (s.bag ? 0 : (o % s.k) * s.dim) + j];
      drows[static_cast<std::size_t>(u) * s.dim + j] = acc * scale;
    }
}

// The occurrences of `inverse` grouped by row, ascending within each row, and
// where each row's group starts: the by_row and offsets embedding_backward
// takes.
inline void occurrences_by_row(const std::vector<std::int32_t>& inverse, int unique,
                               std::vector<std::int32_t>& by_row,
                               std::vector<std::int32_t>& offsets) {
  offsets.assign(static_cast<std::size_t>(unique) + 1, 0);
  by_row.clear();
  for (int u = 0; u < unique; ++u) {
    for (std::size_t o = 0; o < inverse.size(); ++o)
      if (inverse[o] == u) by_row.push_back(static_cast<std::int32_t>(o));
    offsets[static_cast<std::size_t>(u) + 1] = static_cast<std::int32_t>(by_row.size());
  }
}

}  // namespace pstrain::reference
