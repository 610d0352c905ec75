#pragma once
// Per-element arithmetic of the layers, shared by the CPU backend and the
// CUDA kernels (PSTRAIN_HD) so both compute the same values and the CPU tests
// cover the definitions the GPU runs. Only functions that exist on the device
// too (expf, logf, log1pf, fmaxf, fabsf) may appear here.
#include <cstddef>
#include <cstdint>

#include "shared/host_device.h"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace pstrain::ew {

PSTRAIN_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }

// The derivative in terms of the forward output y, so the backward pass needs
// no copy of the input; the subgradient at 0 is 0.
PSTRAIN_HD float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// Gradient accumulation's y = a x + b y, where b == 0 ignores y's old value
// (a fresh buffer may hold NaNs, and 0 * NaN is NaN).
PSTRAIN_HD float axpby(float a, float x, float b, float y) {
  return b != 0.0f ? a * x + b * y : a * x;
}

// An embedding bag's pooling of its k rows: their sum, scaled by this
// (1/k for the mean). Forward and backward both scale a finished sum, so
// no backend can fuse the scale into the adds.
PSTRAIN_HD float pool_scale(int k, bool mean) { return mean ? 1.0f / static_cast<float>(k) : 1.0f; }
// Where column j of occurrence o (sample o / k, id o % k) lies in an
// activation of `stride` floats per sample: a bag's k ids share its dim
// columns, an embedding layer's ids have dim columns each.
PSTRAIN_HD std::size_t embedding_column(std::int32_t o, int j, int k, int dim, int stride,
                                        bool bag) {
  const std::size_t sample = static_cast<std::size_t>(o / k);
  return sample * static_cast<std::size_t>(stride) +
         (bag ? 0 : static_cast<std::size_t>(o % k) * dim) + static_cast<std::size_t>(j);
}

// Softmax cross-entropy of one row of logits, in the log-sum-exp form that
// cannot overflow: lse = max + log(sum_j exp(logit_j - max)).
PSTRAIN_HD float softmax_exp_term(float logit, float max) { return expf(logit - max); }
PSTRAIN_HD float log_sum_exp(float max, float sum_exp) { return max + logf(sum_exp); }
// d loss / d logit for one element, already divided by the batch size n
// (the mean over the batch): (softmax - onehot) / n.
PSTRAIN_HD float xent_grad(float logit, float lse, bool is_label, float inv_n) {
  return (expf(logit - lse) - (is_label ? 1.0f : 0.0f)) * inv_n;
}
// The per-sample loss: -log softmax(label) = lse - logit[label].
PSTRAIN_HD float xent_loss(float label_logit, float lse) { return lse - label_logit; }

// Binary cross-entropy of one logit z against a label y in {0, 1}, in the
// form that cannot overflow: max(z, 0) - z y + log(1 + e^-|z|).
PSTRAIN_HD float bce_loss(float z, std::int32_t y) {
  return fmaxf(z, 0.0f) - (y != 0 ? z : 0.0f) + log1pf(expf(-fabsf(z)));
}
// d loss / d z, divided by the batch size: (sigmoid(z) - y) / n, the
// sigmoid from e^-|z| so that neither branch overflows.
PSTRAIN_HD float bce_grad(float z, std::int32_t y, float inv_n) {
  const float e = expf(-fabsf(z));
  const float p = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  return (p - (y != 0 ? 1.0f : 0.0f)) * inv_n;
}
// 1 where the logit's side of 0 is the label's (a probability above one half
// predicts a click).
PSTRAIN_HD float bce_correct(float z, std::int32_t y) {
  return (z > 0.0f) == (y != 0) ? 1.0f : 0.0f;
}

// The dot interaction (client/compute/interaction_shape.h) on one sample's
// row x of `vectors` x `dim` floats. The place of pair (a, b), a < b, among
// the pairs in row-major order of the upper triangle.
PSTRAIN_HD int interaction_pair(int a, int b, int vectors) {
  return a * vectors - a * (a + 1) / 2 + (b - a - 1);
}
// <x_a, x_b>, summed in increasing column order.
PSTRAIN_HD float interaction_dot(const float* x, int dim, int a, int b) {
  float acc = 0.0f;
  for (int j = 0; j < dim; ++j) acc += x[a * dim + j] * x[b * dim + j];
  return acc;
}
// d loss / d x[v * dim + j] given the output row's gradient dy (`keep`
// passed-through floats, then the pairs): the passed-through gradient, then
// the sum over the other vectors u in increasing order of dy(pair u, v) x_u.
PSTRAIN_HD float interaction_grad(const float* x, const float* dy, int vectors, int dim, int keep,
                                  int v, int j) {
  const int c = v * dim + j;
  float acc = c < keep ? dy[c] : 0.0f;
  for (int u = 0; u < vectors; ++u) {
    if (u == v) continue;
    const int pair = u < v ? interaction_pair(u, v, vectors) : interaction_pair(v, u, vectors);
    acc += dy[keep + pair] * x[u * dim + j];
  }
  return acc;
}

// Argmax with ties broken towards the lower index, so every backend picks the
// same class (and the same pooling input) for equal values: scan in
// increasing index order and replace the best only on a strict improvement.
PSTRAIN_HD bool takes_max(float candidate, float best) { return candidate > best; }

// Stable argmax of row[0..n): the first index of the maximum.
PSTRAIN_HD int argmax(const float* row, int n) {
  int best = 0;
  for (int j = 1; j < n; ++j) {
    if (takes_max(row[j], row[best])) best = j;
  }
  return best;
}

// 1 where the predicted class is the label, as the float the per-sample
// accuracy buffers hold.
PSTRAIN_HD float correct(int predicted, std::int32_t label) {
  return predicted == label ? 1.0f : 0.0f;
}

}  // namespace pstrain::ew
