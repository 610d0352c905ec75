#pragma once
// Per-element optimizer steps and the one dispatch from an optimizer kind to
// them. The ps applies them to its chunks in async mode; workers apply them to
// their replicas in sync mode; the CUDA backend calls the same functions from
// kernels.
//
// Usage: build an OptimizerStep on the host once per update with
// OptimizerStep::make(), then call step.apply(i, w[i], g[i], state) for every
// element i (a CUDA kernel does exactly that, one thread per element). A CPU
// loop goes through dispatch() instead, so that it is compiled once per kind
// with no branch per element, and vectorizes.
#include <cstddef>
#include <cstdint>

#include "shared/host_device.h"
#include "shared/optimizer.h"

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
PSTRAIN_HD void momentum_step(float& w, float& v, float g, float lr, float mu, float weight_decay,
                              bool nesterov) {
  g += weight_decay * w;
  v = mu * v + g;
  w -= lr * (nesterov ? g + mu * v : v);
}

// Adam (Kingma & Ba). bias1 = 1 - beta1^t and bias2 = 1 - beta2^t are
// computed once per chunk and step by the caller, not per element.
PSTRAIN_HD void adam_step(float& w, float& m, float& v, float g, float lr, float beta1, float beta2,
                          float eps, float bias1, float bias2, float weight_decay) {
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

// An optimizer kind as a type: code written once for any kind, called with
// a Kind<K>, is compiled for each kind separately.
template <OptimizerKind K>
struct Kind {
  // Floats of state per element, slot-major (see OptimizerStep::n).
  static constexpr std::size_t state_slots = K == OptimizerKind::sgd    ? 0
                                             : K == OptimizerKind::adam ? 2
                                                                        : 1;
};

// The one switch over optimizer kinds: returns body(Kind<kind>{}).
template <class Body>
PSTRAIN_HD auto dispatch(OptimizerKind kind, Body&& body) {
  switch (kind) {
    case OptimizerKind::sgd:
      return body(Kind<OptimizerKind::sgd>{});
    case OptimizerKind::momentum:
      return body(Kind<OptimizerKind::momentum>{});
    case OptimizerKind::adam:
      return body(Kind<OptimizerKind::adam>{});
    case OptimizerKind::adagrad:
      break;
  }
  return body(Kind<OptimizerKind::adagrad>{});
}

// beta^t by squaring, in double. Only multiplications, so every x86-64 CPU
// gets the same bits, where glibc's pow() picks an FMA or a plain variant by
// CPU and the two may round differently.
inline double power(double beta, std::uint64_t t) {
  double result = 1.0;
  for (; t != 0; t >>= 1, beta *= beta) {
    if (t & 1) result *= beta;
  }
  return result;
}

// One update of n elements: the hyper-parameters with the learning-rate scale
// and Adam's bias corrections applied. Trivially copyable, so a CUDA kernel
// takes it by value.
struct OptimizerStep {
  OptimizerKind kind;
  float lr;  // config.lr * lr_scale
  float momentum, beta1, beta2, eps, weight_decay;
  float bias1, bias2;  // Adam: 1 - beta1^t, 1 - beta2^t
  bool nesterov;
  std::size_t n;  // state slot s of element i is state[s * n + i]

  // Host only. `step` is the 1-based number of this update (0 counts as 1).
  static OptimizerStep make(const OptimizerConfig& c, std::size_t n, std::uint64_t step,
                            float lr_scale) {
    const std::uint64_t t = step == 0 ? 1 : step;
    return {c.kind,
            c.lr * lr_scale,
            c.momentum,
            c.beta1,
            c.beta2,
            c.eps,
            c.weight_decay,
            static_cast<float>(1.0 - power(c.beta1, t)),
            static_cast<float>(1.0 - power(c.beta2, t)),
            c.nesterov,
            n};
  }

  // Updates element i as kind K; `state` is the whole slot-major array.
  template <OptimizerKind K>
  PSTRAIN_HD void apply(Kind<K>, std::size_t i, float& w, float g, float* state) const {
    if constexpr (K == OptimizerKind::sgd) {
      sgd_step(w, g, lr, weight_decay);
    } else if constexpr (K == OptimizerKind::momentum) {
      momentum_step(w, state[i], g, lr, momentum, weight_decay, nesterov);
    } else if constexpr (K == OptimizerKind::adam) {
      adam_step(w, state[i], state[n + i], g, lr, beta1, beta2, eps, bias1, bias2, weight_decay);
    } else {
      adagrad_step(w, state[i], g, lr, eps, weight_decay);
    }
  }

  // Updates element i as this step's kind. The branch on the kind is the same
  // for every element, so in a kernel all threads of a warp take it together.
  PSTRAIN_HD void apply(std::size_t i, float& w, float g, float* state) const {
    dispatch(kind, [&](auto k) { apply(k, i, w, g, state); });
  }
};

}  // namespace pstrain::opt
