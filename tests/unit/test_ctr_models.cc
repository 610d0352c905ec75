// Click-through models over the CPU backend: binary cross-entropy, the dot
// interaction, layers that branch and join, and the dlrm and wide_deep
// presets' forward and backward against double-precision references.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/model/model.h"
#include "tests/support/reference_layers.h"

using namespace pstrain;

namespace {

std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint32_t seed) {
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
std::vector<double> dense(const std::vector<double>& x, const std::vector<double>& w,
                          const std::vector<double>& b) {
  const std::size_t out = b.size(), in = x.size();
  REQUIRE(w.size() == in * out);
  std::vector<double> y(b);
  for (std::size_t i = 0; i < in; ++i)
    for (std::size_t o = 0; o < out; ++o) y[o] += x[i] * w[i * out + o];
  return y;
}

std::vector<double> relu(std::vector<double> x) {
  for (double& v : x) v = std::max(v, 0.0);
  return x;
}

double bce(double z, int y) { return std::log1p(std::exp(z)) - y * z; }

// The row of id t of sample s, `dim` wide.
std::vector<double> row(const Tensors& rows, std::size_t table, const CtrBatch& b, int s, int t,
                        int dim) {
  const std::size_t r = b.inverse[static_cast<std::size_t>(s) * kCtrFields + t];
  return {rows[table].begin() + static_cast<std::ptrdiff_t>(r * dim),
          rows[table].begin() + static_cast<std::ptrdiff_t>((r + 1) * dim)};
}

// DLRM as Naumov et al. define it, in double: params in the model's
// variables() order (bottom dense0, dense1; top dense2, dense3).
double dlrm_reference(const Tensors& p, const Tensors& rows, const CtrBatch& b, int dim,
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
double wide_deep_reference(const Tensors& p, const Tensors& rows, const CtrBatch& b, int dim,
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

// Builds the preset, runs forward_backward on a batch, and checks the
// logits, the loss, every parameter's and every row's gradient against
// central differences of the double reference.
void check_preset(const ModelConfig& config, Reference reference) {
  const int dim = config.embedding_dim;
  const std::vector<TableSpec> tables = {
      {std::string(kCtrTable), static_cast<std::uint32_t>(dim), std::nullopt},
      {std::string(kCtrWideTable), 1, std::nullopt}};
  auto backend = make_cpu_backend(1);
  const CtrBatch b(7);
  Model model(config, *backend, {kCtrDenseFeatures, 1, 1}, 2, b.n, tables);
  REQUIRE(model.binary());
  model.initialize(11);
  // Biases away from zero so no relu sits at its kink.
  for (std::size_t v = 1; v < model.variables().size(); v += 2)
    for (std::size_t e = 0; e < model.variables()[v].size; ++e)
      model.param(v).data()[e] = 0.05f + 0.02f * static_cast<float>(e % 3);
  Tensors params, rows;
  for (std::size_t v = 0; v < model.variables().size(); ++v)
    params.emplace_back(model.param(v).data(), model.param(v).data() + model.variables()[v].size);
  std::vector<std::vector<float>> row_values;
  for (std::size_t e = 0; e < model.embeddings().size(); ++e) {
    const int width = model.embeddings()[e].dim;
    row_values.push_back(uniform(static_cast<std::size_t>(b.unique) * width, -0.5f, 0.5f,
                                 20 + static_cast<std::uint32_t>(e)));
    rows.emplace_back(row_values.back().begin(), row_values.back().end());
    model.set_embedding_batch(e, b.n, row_values.back(), b.inverse);
  }
  std::copy(b.features.begin(), b.features.end(), model.input_buffer());
  std::copy(b.labels.begin(), b.labels.end(), model.label_buffer());
  model.forward_backward(b.n, [](std::size_t) {});

  std::vector<double> logits;
  const double loss = reference(params, rows, b, dim, &logits);
  double model_loss = 0;
  for (int s = 0; s < b.n; ++s) {
    CHECK(model.logits()[s] == doctest::Approx(logits[s]).epsilon(1e-5));
    model_loss += model.loss_buffer()[s];
  }
  CHECK(model_loss / b.n == doctest::Approx(loss).epsilon(1e-5));

  const auto numeric = [&](std::vector<double>& values, std::size_t e) {
    const double saved = values[e], eps = 1e-6;
    values[e] = saved + eps;
    const double up = reference(params, rows, b, dim, nullptr);
    values[e] = saved - eps;
    const double down = reference(params, rows, b, dim, nullptr);
    values[e] = saved;
    return (up - down) / (2 * eps);
  };
  for (std::size_t v = 0; v < params.size(); ++v)
    for (std::size_t e = 0; e < params[v].size(); e += 1 + params[v].size() / 40) {
      INFO(model.variables()[v].name << "[" << e << "]");
      const double want = numeric(params[v], e);
      CHECK(std::abs(model.grad(v).data()[e] - want) <= 1e-4 * (1 + std::abs(want)));
    }
  for (std::size_t t = 0; t < rows.size(); ++t) {
    std::vector<float> grads(rows[t].size());
    model.embedding_grads(t, grads);
    for (std::size_t e = 0; e < rows[t].size(); e += 3) {
      INFO(model.embeddings()[t].table << " row float " << e);
      const double want = numeric(rows[t], e);
      CHECK(std::abs(grads[e] - want) <= 1e-4 * (1 + std::abs(want)));
    }
  }
}

ModelConfig ctr_preset(const std::string& name) {
  ModelConfig config;
  config.preset = name;
  config.embedding_dim = 4;
  config.bottom_mlp = {8};
  config.top_mlp = {8};
  config.deep_mlp = {8, 4};
  return config;
}

std::string build_error(const ModelConfig& config, InputShape input, int classes,
                        const std::vector<TableSpec>& tables = {}) {
  auto backend = make_cpu_backend(1);
  try {
    Model model(config, *backend, input, classes, 4, tables);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

ModelLayer layer(std::string type, int units = 0, std::string name = {},
                 std::vector<std::string> inputs = {}) {
  ModelLayer l{std::move(type), units};
  l.name = std::move(name);
  l.inputs = std::move(inputs);
  return l;
}

}  // namespace

TEST_CASE("bce: the CPU's loss and gradient are the reference's, finite at any logit") {
  auto backend = make_cpu_backend(1);
  const std::vector<float> z = {-30.0f, -3.0f, -0.5f, 0.0f, 0.25f, 2.0f, 17.0f, 90.0f};
  const std::vector<std::int32_t> y = {0, 1, 1, 0, 0, 1, 0, 1};
  const int n = static_cast<int>(z.size());
  std::vector<float> dz(z.size()), loss(z.size()), correct(z.size());
  backend->bce_logits(z.data(), y.data(), dz.data(), loss.data(), correct.data(), n);
  std::vector<double> zd(z.begin(), z.end()), rdz(z.size()), rloss(z.size()), rcorrect(z.size());
  reference::bce_logits(zd.data(), y.data(), rdz.data(), rloss.data(), rcorrect.data(), n);
  for (int i = 0; i < n; ++i) {
    INFO("logit " << z[i] << " label " << y[i]);
    CHECK(std::isfinite(loss[i]));
    CHECK(loss[i] == doctest::Approx(rloss[i]).epsilon(1e-6));
    CHECK(dz[i] == doctest::Approx(rdz[i]).epsilon(1e-6));
    CHECK(correct[i] == rcorrect[i]);
    // The gradient is the loss's derivative (central differences in double).
    const double eps = 1e-4;
    const double up = std::log1p(std::exp(-std::abs(zd[i] + eps))) + std::max(zd[i] + eps, 0.0) -
                      y[i] * (zd[i] + eps);
    const double down = std::log1p(std::exp(-std::abs(zd[i] - eps))) + std::max(zd[i] - eps, 0.0) -
                        y[i] * (zd[i] - eps);
    CHECK(dz[i] == doctest::Approx((up - down) / (2 * eps) / n).epsilon(1e-4));
  }
  // A confidently wrong logit costs its size, not infinity.
  CHECK(loss[7] == doctest::Approx(0.0).epsilon(1e-6));
  const std::int32_t bad[] = {0, 2};
  CHECK_THROWS_WITH_AS(
      backend->bce_logits(z.data(), bad, dz.data(), loss.data(), correct.data(), 2),
      "bce_logits: label 2 of sample 1 is not 0 or 1", std::invalid_argument);
}

TEST_CASE("dot interaction: the CPU's forward and backward are the reference's") {
  auto backend = make_cpu_backend(1);
  for (const InteractionShape s : {InteractionShape{3, 4, 5, 5}, InteractionShape{2, 27, 16, 16},
                                   InteractionShape{4, 2, 3, 0}}) {
    INFO("vectors " << s.vectors << " dim " << s.dim << " keep " << s.keep);
    const auto x = uniform(static_cast<std::size_t>(s.n) * s.in_width(), -1, 1, 3);
    const auto dy = uniform(static_cast<std::size_t>(s.n) * s.out_width(), -1, 1, 4);
    std::vector<float> y(dy.size()), dx(x.size());
    backend->dot_interaction_forward(x.data(), y.data(), s);
    backend->dot_interaction_backward(x.data(), dy.data(), dx.data(), s);
    const std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
    std::vector<double> ry(y.size()), rdx(x.size());
    reference::dot_interaction_forward(xd.data(), ry.data(), s);
    reference::dot_interaction_backward(xd.data(), dyd.data(), rdx.data(), s);
    for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(ry[i]).epsilon(1e-5));
    for (std::size_t i = 0; i < dx.size(); ++i)
      CHECK(dx[i] == doctest::Approx(rdx[i]).epsilon(1e-5));
    // The reference's backward is its forward's derivative: <dy, y> is linear
    // in dy, so its gradient in x is dx.
    std::vector<double> bumped = xd, out(ry.size());
    for (std::size_t i = 0; i < xd.size(); i += 7) {
      const auto dot_dy = [&](double value) {
        bumped[i] = value;
        reference::dot_interaction_forward(bumped.data(), out.data(), s);
        double sum = 0;
        for (std::size_t k = 0; k < out.size(); ++k) sum += out[k] * dyd[k];
        return sum;
      };
      const double numeric = (dot_dy(xd[i] + 1e-6) - dot_dy(xd[i] - 1e-6)) / 2e-6;
      bumped[i] = xd[i];
      CHECK(rdx[i] == doctest::Approx(numeric).epsilon(1e-6));
    }
  }
}

TEST_CASE("dlrm: forward and backward match a double-precision reference") {
  check_preset(ctr_preset("dlrm"), dlrm_reference);
}

TEST_CASE("wide_deep: forward and backward match a double-precision reference") {
  check_preset(ctr_preset("wide_deep"), wide_deep_reference);
}

TEST_CASE("model: a layer list that branches and joins, and its errors") {
  const std::vector<TableSpec> tables = {{"t", 4, std::nullopt}};
  ModelConfig config;
  config.preset = "custom";
  config.loss = "bce";
  ModelLayer embedding{"embedding"};
  embedding.table = "t";
  embedding.ids = 3;
  embedding.name = "e";
  config.layers = {embedding, layer("dense", 4, "z", {"input"}),
                   layer("dot_interaction", 0, "dots", {"z", "e"}),
                   layer("concat", 0, "", {"dots"}), layer("dense", 1)};
  auto backend = make_cpu_backend(1);
  Model model(config, *backend, {5, 1, 1}, 2, 4, tables);
  const std::string text = model.describe();
  INFO(text);
  CHECK(text.find("loss: bce") != std::string::npos);
  // 4 vectors of 4: z passed through, then 6 dots.
  CHECK(text.find("{name: dots, type: dot_interaction, inputs: [z, e], output: [10]}") !=
        std::string::npos);
  CHECK(text.find("{name: z, type: dense, units: 4, inputs: [input], output: [4]") !=
        std::string::npos);

  const auto with = [&](std::size_t at, ModelLayer replacement) {
    ModelConfig c = config;
    c.layers[at] = std::move(replacement);
    return build_error(c, {5, 1, 1}, 2, tables);
  };
  CHECK(with(2, layer("dot_interaction", 0, "dots", {"z", "missing"})) ==
        "model: layer 2 (dot_interaction): input 'missing' names no earlier layer (input, e, z)");
  CHECK(with(3, layer("concat", 0, "", {"dots", "e"})) ==
        "model: layer 3 (concat): reads 'e', which an earlier layer reads already (each output "
        "feeds one layer)");
  CHECK(with(3, layer("concat", 0, "", {"z"})) ==
        "model: layer 3 (concat): reads 'z', which an earlier layer reads already (each output "
        "feeds one layer)");
  CHECK(with(2, layer("dense", 3, "dots", {"z"})) ==
        "model: layer 0 (embedding): no layer reads its output");
  CHECK(with(1, layer("dense", 5, "z", {"input"})) ==
        "model: layer 2 (dot_interaction): input 'e' has 12 floats per sample, not a whole number "
        "of vectors of the first input's width 5");
  CHECK(with(1, layer("dense", 4, "e", {"input"})) ==
        "model: layer 1 (dense): the name 'e' is taken by an earlier layer");
  CHECK(with(4, layer("dense", 2)) ==
        "model: layer 4 (dense): the last layer must be dense with 1 unit (the logit of binary "
        "cross-entropy), got output [2]");
  CHECK(build_error(config, {0, 1, 1}, 2, tables) ==
        "model: layer 1 (dense): reads the input, but the data has no features besides ids");
  ModelConfig lone = config;
  lone.layers = {embedding, layer("dot_interaction", 0, "", {"e"}), layer("dense", 1)};
  CHECK(build_error(lone, {5, 1, 1}, 2, tables) == "");
  lone.layers[0].ids = 1;
  CHECK(build_error(lone, {5, 1, 1}, 2, tables) ==
        "model: layer 1 (dot_interaction): needs at least two vectors of width 4 among its "
        "inputs, got one");
  ModelConfig softmax = config;
  softmax.loss = "softmax";
  softmax.layers.back().units = 3;
  CHECK(build_error(softmax, {5, 1, 1}, 3, tables) == "");
  config.loss = "bce";
  CHECK(build_error(config, {5, 1, 1}, 3, tables) ==
        "model.loss: bce needs a data set of 2 classes (click or not), got 3");
}

TEST_CASE("model: bce evaluation reports the exact AUC of its logits") {
  auto backend = make_cpu_backend(1);
  ModelConfig config;
  config.preset = "custom";
  config.loss = "bce";
  config.layers = {layer("dense", 1)};
  Model model(config, *backend, {1, 1, 1}, 2, 3);
  // logit = feature: the AUC is that of the features themselves.
  model.param(0).data()[0] = 1;
  model.param(1).data()[0] = 0;
  Dataset data;
  data.channels = 1;
  data.height = data.width = 1;
  data.classes = 2;
  data.images = {0.1f, 0.9f, 0.4f, 0.4f, 0.8f, 0.2f, 0.6f};
  data.labels = {0, 1, 0, 1, 1, 0, 0};
  const EvalResult result = model.evaluate(data);
  REQUIRE(result.auc);
  // Positives 0.9, 0.4, 0.8 against negatives 0.1, 0.4, 0.2, 0.6: 3 + (1 + 0.5 + 1 + 0) +
  // 3 wins... counted by hand: 0.9 beats 4, 0.4 beats 2 ties 1, 0.8 beats 4 -> 10.5 / 12.
  CHECK(*result.auc == doctest::Approx(10.5 / 12));
  double logloss = 0;
  for (std::size_t i = 0; i < data.size(); ++i) logloss += bce(data.images[i], data.labels[i]);
  CHECK(result.loss == doctest::Approx(logloss / static_cast<double>(data.size())));
}
