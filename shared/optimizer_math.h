#pragma once
// Per-element optimizer steps. The ps applies them to its chunks in async
// mode; workers apply them to their replicas in sync mode; the CUDA backend
// calls the same functions from kernels.
#include "shared/hd.h"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace pstrain::opt {

// Plain SGD with optional L2 weight decay folded into the gradient.
PSTRAIN_HD void sgd_step(float& w, float g, float lr, float weight_decay) {
  w -= lr * (g + weight_decay * w);
}

// Heavy-ball momentum as PyTorch defines it (v = mu*v + g; w -= lr*v), or
// Nesterov's variant (w -= lr*(g + mu*v)).
PSTRAIN_HD void momentum_step(float& w, float& v, float g, float lr, float mu,
                              float weight_decay, bool nesterov) {
  g += weight_decay * w;
  v = mu * v + g;
  w -= lr * (nesterov ? g + mu * v : v);
}

// Adam (Kingma & Ba). bias1 = 1 - beta1^t and bias2 = 1 - beta2^t are
// computed once per chunk and step by the caller, not per element.
PSTRAIN_HD void adam_step(float& w, float& m, float& v, float g, float lr,
                          float beta1, float beta2, float eps, float bias1,
                          float bias2, float weight_decay) {
  g += weight_decay * w;
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  const float m_hat = m / bias1;
  const float v_hat = v / bias2;
  w -= lr * m_hat / (sqrtf(v_hat) + eps);
}

// Adagrad: per-element learning rates shrink with the accumulated squares.
PSTRAIN_HD void adagrad_step(float& w, float& acc, float g, float lr, float eps,
                             float weight_decay) {
  g += weight_decay * w;
  acc += g * g;
  w -= lr * g / (sqrtf(acc) + eps);
}

}  // namespace pstrain::opt
