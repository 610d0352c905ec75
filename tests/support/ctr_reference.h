#pragma once
// Click-through models in double precision, straight from their papers'
// definitions, and the check that a backend's dlrm and wide_deep presets
// compute them: what tests/unit/test_ctr_models.cc runs on the CPU and
// tests/cluster/test_gpu_training.cc on a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "client/compute/backend.h"
#include "client/model/model.h"

namespace pstrain::ctr_reference {

inline std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A batch of Criteo-shaped samples: 13 features, 26 ids per sample naming
// `unique` rows (repeats within and across samples), labels alternating.
struct CtrBatch {
  int n = 5, unique = 40;
  std::vector<float> features;
  std::vector<std::int32_t> labels;
  std::vector<std::uint32_t> inverse;
  explicit CtrBatch(std::uint32_t seed) {
    features = uniform(static_cast<std::size_t>(n) * kCtrDenseFeatures, 0.0f, 3.0f, seed);
    std::mt19937 rng(seed + 1);
    for (int i = 0; i < n * kCtrFields; ++i)
      inverse.push_back(static_cast<std::uint32_t>(rng() % static_cast<std::uint32_t>(unique)));
    for (int i = 0; i < n; ++i) labels.push_back(i % 2);
  }
};

using Tensors = std::vector<std::vector<double>>;

// y = x w + b over `in` -> `out` (w: in x out, as the backends hold it).
inline std::vector<double> dense(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& b) {
  const std::size_t out = b.size(), in = x.size();
  REQUIRE(w.size() == in * out);
  std::vector<double> y(b);
  for (std::size_t i = 0; i < in; ++i)
    for (std::size_t o = 0; o < out; ++o) y[o] += x[i] * w[i * out + o];
  return y;
}

inline std::vector<double> relu(std::vector<double> x) {
  for (double& v : x) v = std::max(v, 0.0);
  return x;
}

inline double bce(double z, int y) { return std::log1p(std::exp(z)) - y * z; }

// The row of id t of sample s, `dim` wide.
inline std::vector<double> row(const Tensors& rows, std::size_t table, const CtrBatch& b, int s,
                               int t, int dim) {
  const std::size_t r = b.inverse[static_cast<std::size_t>(s) * kCtrFields + t];
  return {rows[table].begin() + static_cast<std::ptrdiff_t>(r * dim),
          rows[table].begin() + static_cast<std::ptrdiff_t>((r + 1) * dim)};
}

// DLRM as Naumov et al. define it, in double: params in the model's
// variables() order (bottom dense0, dense1; top dense2, dense3).
inline double dlrm_reference(const Tensors& p, const Tensors& rows, const CtrBatch& b, int dim,
                             std::vector<double>* logits) {
  double loss = 0;
  for (int s = 0; s < b.n; ++s) {
    const std::vector<double> x(b.features.begin() + s * kCtrDenseFeatures,
                                b.features.begin() + (s + 1) * kCtrDenseFeatures);
    const auto z = relu(dense(relu(dense(x, p[0], p[1])), p[2], p[3]));
    std::vector<std::vector<double>> vectors = {z};
    for (int t = 0; t < kCtrFields; ++t) vectors.push_back(row(rows, 0, b, s, t, dim));
    std::vector<double> joined = z;
    for (std::size_t a = 0; a < vectors.size(); ++a)
      for (std::size_t c = a + 1; c < vectors.size(); ++c) {
        double dot = 0;
        for (int j = 0; j < dim; ++j) dot += vectors[a][j] * vectors[c][j];
        joined.push_back(dot);
      }
    const double logit = dense(relu(dense(joined, p[4], p[5])), p[6], p[7])[0];
    if (logits) logits->push_back(logit);
    loss += bce(logit, b.labels[s]);
  }
  return loss / b.n;
}

// Wide & Deep as Cheng et al. define it, in double: the deep MLP (dense0,
// dense1) over the features and 26 embeddings, one logistic unit (dense2)
// over the wide sum of the ids' weights and the deep part's last layer.
inline double wide_deep_reference(const Tensors& p, const Tensors& rows, const CtrBatch& b, int dim,
                                  std::vector<double>* logits) {
  double loss = 0;
  for (int s = 0; s < b.n; ++s) {
    std::vector<double> deep(b.features.begin() + s * kCtrDenseFeatures,
                             b.features.begin() + (s + 1) * kCtrDenseFeatures);
    double wide = 0;
    for (int t = 0; t < kCtrFields; ++t) {
      const auto r = row(rows, 0, b, s, t, dim);
      deep.insert(deep.end(), r.begin(), r.end());
      wide += row(rows, 1, b, s, t, 1)[0];
    }
    std::vector<double> joint = {wide};
    const auto h = relu(dense(relu(dense(deep, p[0], p[1])), p[2], p[3]));
    joint.insert(joint.end(), h.begin(), h.end());
    const double logit = dense(joint, p[4], p[5])[0];
    if (logits) logits->push_back(logit);
    loss += bce(logit, b.labels[s]);
  }
  return loss / b.n;
}

using Reference = double (*)(const Tensors&, const Tensors&, const CtrBatch&, int,
                             std::vector<double>*);

// Copies of backend memory, through the backend, whatever it is.
inline std::vector<float> download(Backend& backend, const float* device, std::size_t n) {
  std::vector<float> host(n);
  backend.download(device, host.data(), n * sizeof(float));
  backend.synchronize();
  return host;
}
inline void upload(Backend& backend, const void* host, void* device, std::size_t bytes) {
  backend.upload(host, device, bytes);
  backend.synchronize();
}

// Builds the preset on `backend`, runs forward_backward on a batch, and
// checks the logits, the loss, every parameter's and every row's gradient
// against central differences of the double reference, each within
// `tolerance` relative to 1 + its size.
inline void check_preset(Backend& backend, const ModelConfig& config, Reference reference,
                         double tolerance) {
  const int dim = config.embedding_dim;
  const std::vector<TableSpec> tables = {
      {std::string(kCtrTable), static_cast<std::uint32_t>(dim), std::nullopt},
      {std::string(kCtrWideTable), 1, std::nullopt}};
  const CtrBatch b(7);
  Model model(config, backend, {kCtrDenseFeatures, 1, 1}, 2, b.n, tables);
  REQUIRE(model.binary());
  model.initialize(11);
  Tensors params;
  for (std::size_t v = 0; v < model.variables().size(); ++v) {
    std::vector<float> values = download(backend, model.param(v).data(), model.variables()[v].size);
    // Biases away from zero so no relu sits at its kink.
    if (v % 2 == 1) {
      for (std::size_t e = 0; e < values.size(); ++e)
        values[e] = 0.05f + 0.02f * static_cast<float>(e % 3);
      upload(backend, values.data(), model.param(v).data(), values.size() * sizeof(float));
    }
    params.emplace_back(values.begin(), values.end());
  }
  Tensors rows;
  std::vector<std::vector<float>> row_values;
  for (std::size_t e = 0; e < model.embeddings().size(); ++e) {
    const int width = model.embeddings()[e].dim;
    row_values.push_back(uniform(static_cast<std::size_t>(b.unique) * width, -0.5f, 0.5f,
                                 20 + static_cast<std::uint32_t>(e)));
    rows.emplace_back(row_values.back().begin(), row_values.back().end());
    model.set_embedding_batch(e, b.n, row_values.back(), b.inverse);
  }
  upload(backend, b.features.data(), model.input_buffer(), b.features.size() * sizeof(float));
  upload(backend, b.labels.data(), model.label_buffer(), b.labels.size() * sizeof(std::int32_t));
  model.forward_backward(b.n, [](std::size_t) {});

  std::vector<double> logits;
  const double loss = reference(params, rows, b, dim, &logits);
  const auto got_logits = download(backend, model.logits(), static_cast<std::size_t>(b.n));
  const auto got_losses = download(backend, model.loss_buffer(), static_cast<std::size_t>(b.n));
  double model_loss = 0;
  for (int s = 0; s < b.n; ++s) {
    CHECK(std::abs(got_logits[s] - logits[s]) <= tolerance * (1 + std::abs(logits[s])));
    model_loss += got_losses[s];
  }
  CHECK(std::abs(model_loss / b.n - loss) <= tolerance * (1 + std::abs(loss)));

  const auto numeric = [&](std::vector<double>& values, std::size_t e) {
    const double saved = values[e], eps = 1e-6;
    values[e] = saved + eps;
    const double up = reference(params, rows, b, dim, nullptr);
    values[e] = saved - eps;
    const double down = reference(params, rows, b, dim, nullptr);
    values[e] = saved;
    return (up - down) / (2 * eps);
  };
  for (std::size_t v = 0; v < params.size(); ++v) {
    const auto grads = download(backend, model.grad(v).data(), params[v].size());
    for (std::size_t e = 0; e < params[v].size(); e += 1 + params[v].size() / 40) {
      INFO(model.variables()[v].name << "[" << e << "]");
      const double want = numeric(params[v], e);
      CHECK(std::abs(grads[e] - want) <= tolerance * (1 + std::abs(want)));
    }
  }
  for (std::size_t t = 0; t < rows.size(); ++t) {
    std::vector<float> grads(rows[t].size());
    model.embedding_grads(t, grads);
    for (std::size_t e = 0; e < rows[t].size(); e += 3) {
      INFO(model.embeddings()[t].table << " row float " << e);
      const double want = numeric(rows[t], e);
      CHECK(std::abs(grads[e] - want) <= tolerance * (1 + std::abs(want)));
    }
  }
}

inline ModelConfig ctr_preset(const std::string& name) {
  ModelConfig config;
  config.preset = name;
  config.embedding_dim = 4;
  config.bottom_mlp = {8};
  config.top_mlp = {8};
  config.deep_mlp = {8, 4};
  return config;
}

}  // namespace pstrain::ctr_reference
