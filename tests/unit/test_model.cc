// Models over the CPU backend: presets, validation, end-to-end gradients,
// callback order, local training on the synthetic set, determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "tests/support/staging_backend.h"

using namespace pstrain;

namespace {

ModelConfig preset(const std::string& name) {
  ModelConfig config;
  config.preset = name;
  return config;
}

ModelConfig custom(std::vector<ModelLayer> layers) {
  ModelConfig config;
  config.preset = "custom";
  config.layers = std::move(layers);
  return config;
}

std::string build_error(const ModelConfig& config, InputShape input = {}, int classes = 10) {
  auto backend = make_cpu_backend(1);
  try {
    Model model(config, *backend, input, classes, 4);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

double mean_loss(const Model& model, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += model.loss_buffer()[i];
  return sum / n;
}

// Trains with plain SGD on the synthetic set, applying each variable's update
// as soon as its gradient is ready (the way the workers overlap compute and
// communication), and returns every step's mean loss.
std::vector<double> train(Model& model, Backend& backend, const Dataset& data, int steps) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.lr = 0.1f;
  model.initialize(42);
  WorkerShard shard(data, 0, 1, 42);
  std::vector<double> losses;
  const int batch = model.max_batch();
  for (int step = 1; step <= steps; ++step) {
    const Batch b = shard.next_batch(batch, model.input_buffer(), model.label_buffer());
    const int n = static_cast<int>(b.size);
    model.forward_backward(n, [&](std::size_t i) {
      backend.apply_optimizer(sgd, model.param(i).data(), model.grad(i).data(), nullptr,
                              model.variables()[i].size, static_cast<std::uint64_t>(step), 1.0f);
    });
    losses.push_back(mean_loss(model, n));
  }
  return losses;
}

}  // namespace

TEST_CASE("model: presets have the published layer sizes") {
  auto backend = make_cpu_backend(1);
  Model mlp(preset("mlp"), *backend, {}, 10, 64);
  CHECK(mlp.parameter_count() == 235146);
  std::vector<std::string> names;
  for (const auto& v : mlp.variables()) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"dense0/w", "dense0/b", "dense1/w", "dense1/b",
                                          "dense2/w", "dense2/b"});
  CHECK(mlp.variables()[0].size == 784u * 256);
  CHECK(mlp.variables()[0].init.kind == InitKind::uniform);
  CHECK(mlp.variables()[0].init.scale == doctest::Approx(std::sqrt(6.0 / 784)));  // He
  CHECK(mlp.variables()[4].init.scale == doctest::Approx(std::sqrt(6.0 / 138)));  // Glorot
  CHECK(mlp.variables()[1].init.kind == InitKind::zeros);

  Model cnn(preset("cnn"), *backend, {}, 10, 64);
  CHECK(cnn.parameter_count() == 225034);
  CHECK(cnn.variables()[0].name == "conv0/w");
  CHECK(cnn.variables()[0].size == 32u * 9);
  CHECK(cnn.variables()[2].size == 64u * 32 * 9);
  CHECK(cnn.variables()[4].name == "dense0/w");
  CHECK(cnn.variables()[4].size == 1600u * 128);
  const std::string text = cnn.describe();
  CHECK(text.find("parameters: 225034") != std::string::npos);
  CHECK(text.find("{name: conv1, type: conv2d, filters: 64, kernel: 3, output: [64, 11, 11], "
                  "parameters: 18496}") != std::string::npos);
  CHECK(text.find("output: [64, 5, 5]") != std::string::npos);
}

TEST_CASE("model: bad layer lists are rejected with the layer named") {
  CHECK(build_error(preset("resnet")) ==
        "model.preset: unknown preset 'resnet' (expected mlp, cnn, dlrm, wide_deep or custom)");
  CHECK(build_error(custom({})) == "model.layers: a custom model needs at least one layer");
  CHECK(build_error(custom({{"dense", 32, 0, 0}, {"conv2d", 0, 8, 3}, {"dense", 10, 0, 0}})) ==
        "model: layer 1 (conv2d): needs an image input (channels x height x width), got the "
        "flat [32] output of 'dense0'");
  CHECK(build_error(custom({{"conv2d", 0, 8, 29}, {"dense", 10, 0, 0}})) ==
        "model: layer 0 (conv2d): kernel 29 does not fit its input [1, 28, 28]");
  CHECK(build_error(custom({{"maxpool2d", 0, 0, 0}, {"dense", 10, 0, 0}})) ==
        "model: layer 0 (maxpool2d): kernel must be >= 1, got 0");
  CHECK(build_error(custom({{"dense", 0, 0, 0}, {"dense", 10, 0, 0}})) ==
        "model: layer 0 (dense): units must be >= 1, got 0");
  CHECK(build_error(custom({{"dense", 10, 0, 0}, {"relu", 0, 0, 0}})) ==
        "model: layer 1 (relu): the last layer must be dense with 10 units (the number of "
        "classes), got output [10]");
  CHECK(build_error(custom({{"dense", 7, 0, 0}})) ==
        "model: layer 0 (dense): the last layer must be dense with 10 units (the number of "
        "classes), got output [7]");
  CHECK(build_error(custom({{"dropout", 0, 0, 0}, {"dense", 10, 0, 0}})) ==
        "model: layer 0: unknown type 'dropout' (expected dense, relu, conv2d, maxpool2d, "
        "flatten, concat or dot_interaction)");
}

TEST_CASE("model: end-to-end gradients match finite differences") {
  auto backend = make_cpu_backend(1);
  const InputShape input{2, 9, 8};
  const int classes = 4, n = 3;
  Model model(custom({{"conv2d", 0, 3, 3},
                      {"relu", 0, 0, 0},
                      {"maxpool2d", 0, 0, 2},
                      {"flatten", 0, 0, 0},
                      {"dense", 6, 0, 0},
                      {"relu", 0, 0, 0},
                      {"dense", classes, 0, 0}}),
              *backend, input, classes, n);
  model.initialize(3);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (int i = 0; i < n * 2 * 9 * 8; ++i) model.input_buffer()[i] = pixel(rng);
  for (int i = 0; i < n; ++i) model.label_buffer()[i] = i % classes;
  // Biases away from zero so no relu sits at its kink.
  for (std::size_t v = 1; v < model.variables().size(); v += 2) {
    for (std::size_t e = 0; e < model.variables()[v].size; ++e) {
      model.param(v).data()[e] = 0.1f * static_cast<float>(e % 3) + 0.05f;
    }
  }

  std::vector<std::size_t> order;
  model.forward_backward(n, [&](std::size_t i) { order.push_back(i); });
  CHECK(order == std::vector<std::size_t>{5, 4, 3, 2, 1, 0});

  auto loss = [&] {
    model.forward_backward(n, [](std::size_t) {});
    return mean_loss(model, n);
  };
  for (std::size_t v = 0; v < model.variables().size(); ++v) {
    loss();
    const std::vector<float> analytic(model.grad(v).data(),
                                      model.grad(v).data() + model.variables()[v].size);
    float* values = model.param(v).data();
    for (std::size_t e = 0; e < analytic.size(); e += 5) {
      const float saved = values[e];
      const float eps = 1e-2f;
      values[e] = saved + eps;
      const double up = loss();
      values[e] = saved - eps;
      const double down = loss();
      values[e] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      INFO(model.variables()[v].name << "[" << e << "]");
      CHECK(std::abs(numeric - analytic[e]) <= 3e-3 * (1 + std::abs(numeric)));
    }
  }
}

TEST_CASE("model: an emulated step computes nothing, takes its time, and issues decay gradients") {
  auto backend = make_cpu_backend(1);
  Model model(preset("mlp"), *backend, {}, 10, 8);
  model.initialize(5);
  CHECK_FALSE(model.emulated());
  CHECK_THROWS_AS(model.emulate(0), std::invalid_argument);
  model.emulate(30);
  REQUIRE(model.emulated());
  // Whatever the input: nothing reads it.
  std::fill_n(model.input_buffer(), 8 * 28 * 28, std::nanf(""));
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<std::size_t> order;
  std::vector<double> issued_ms;
  model.forward_backward(8, [&](std::size_t i) {
    order.push_back(i);
    issued_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  });
  const double took = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  // The whole step, and the forward's third before the first gradient: a
  // sleep lasts at least as long as asked, however loaded the machine.
  CHECK(took >= 30);
  REQUIRE(!issued_ms.empty());
  CHECK(issued_ms.front() >= 10);
  std::vector<std::size_t> expected(model.variables().size());
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = expected.size() - 1 - i;
  CHECK(order == expected);
  for (std::size_t v = 0; v < model.variables().size(); ++v) {
    INFO(model.variables()[v].name);
    const float* w = model.param(v).data();
    const float* g = model.grad(v).data();
    std::size_t exact = 0;
    for (std::size_t e = 0; e < model.variables()[v].size; ++e)
      exact += g[e] == Model::kEmulatedDecay * w[e] ? 1 : 0;
    CHECK(exact == model.variables()[v].size);
  }
  for (int i = 0; i < 8; ++i) {
    CHECK(model.loss_buffer()[i] == 0);
    CHECK(model.correct_buffer()[i] == 0);
  }
}

TEST_CASE("model: batches larger than max_batch are refused") {
  auto backend = make_cpu_backend(1);
  Model model(preset("mlp"), *backend, {}, 10, 8);
  CHECK_THROWS_WITH_AS(model.forward(9), "model: batch of 9 samples, expected 1 to 8",
                       std::invalid_argument);
  CHECK_THROWS_AS(model.forward(0), std::invalid_argument);
}

TEST_CASE("model: the MLP learns the synthetic set, identically on every run") {
  const Dataset train_set = make_synthetic(2000, true);
  const Dataset test_set = make_synthetic(500, false);
  auto backend = make_cpu_backend(1);
  Model model(preset("mlp"), *backend, {}, 10, 32);
  const EvalResult before = (model.initialize(42), model.evaluate(test_set));
  const std::vector<double> losses = train(model, *backend, train_set, 200);
  const EvalResult after = model.evaluate(test_set);
  MESSAGE("mlp synthetic: accuracy " << before.accuracy << " -> " << after.accuracy << ", loss "
                                     << before.loss << " -> " << after.loss);
  CHECK(before.accuracy < 0.5);
  CHECK(after.accuracy >= 0.9);
  CHECK(after.loss < before.loss / 2);
  CHECK(after.samples == 500);
  CHECK(model.evaluate(test_set, 100).samples == 100);

  Model again(preset("mlp"), *backend, {}, 10, 32);
  const std::vector<double> rerun = train(again, *backend, train_set, 50);
  CHECK(rerun == std::vector<double>(losses.begin(), losses.begin() + 50));
}

TEST_CASE("model: a small CNN learns the synthetic set") {
  const Dataset train_set = make_synthetic(1000, true);
  const Dataset test_set = make_synthetic(300, false);
  auto backend = make_cpu_backend(1);
  Model model(custom({{"conv2d", 0, 8, 3},
                      {"relu", 0, 0, 0},
                      {"maxpool2d", 0, 0, 2},
                      {"flatten", 0, 0, 0},
                      {"dense", 10, 0, 0}}),
              *backend, {}, 10, 32);
  train(model, *backend, train_set, 150);
  const EvalResult result = model.evaluate(test_set);
  MESSAGE("cnn synthetic: accuracy " << result.accuracy << ", loss " << result.loss);
  CHECK(result.accuracy >= 0.9);
}

// A model whose convolutions keep their im2col matrices from forward
// (Backend::conv2d_columns) computes the bits of one that recomputes them:
// two convolutions (the lower one without dx and fused with its relu, the
// upper one with dx and a pool after it), steps at the largest batch and a
// smaller one on new inputs (the kept matrices must be the current
// batch's). The staging backend computes in fp32 only; the layer test in
// test_layers.cc covers bf16.
TEST_CASE("model: kept convolution columns give the gradients of recomputed ones, bit for bit") {
  const InputShape input{2, 12, 11};
  const int classes = 3, max_batch = 5;
  const ModelConfig config = custom({{"conv2d", 0, 4, 3},
                                     {"relu", 0, 0, 0},
                                     {"conv2d", 0, 3, 3},
                                     {"maxpool2d", 0, 0, 2},
                                     {"relu", 0, 0, 0},
                                     {"flatten", 0, 0, 0},
                                     {"dense", classes, 0, 0}});
  testing::StagingBackend keeping(CpuKernels::openblas), recomputing(CpuKernels::openblas);
  recomputing.keep_conv_columns(false);
  REQUIRE(keeping.conv2d_columns(ConvShape{max_batch, 2, 12, 11, 4, 3}) > 0);
  Model kept(config, keeping, input, classes, max_batch);
  Model recomputed(config, recomputing, input, classes, max_batch);
  kept.initialize(5);
  recomputed.initialize(5);
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (const int n : {max_batch, 3, max_batch}) {
    CAPTURE(n);
    for (int i = 0; i < n * 2 * 12 * 11; ++i)
      kept.input_buffer()[i] = recomputed.input_buffer()[i] = pixel(rng);
    for (int i = 0; i < n; ++i) kept.label_buffer()[i] = recomputed.label_buffer()[i] = i % 3;
    kept.forward_backward(n, [](std::size_t) {});
    recomputed.forward_backward(n, [](std::size_t) {});
    CHECK(std::equal(kept.loss_buffer(), kept.loss_buffer() + n, recomputed.loss_buffer()));
    for (std::size_t v = 0; v < kept.variables().size(); ++v) {
      CAPTURE(kept.variables()[v].name);
      const float* g = kept.grad(v).data();
      CHECK(std::equal(g, g + kept.variables()[v].size, recomputed.grad(v).data()));
    }
  }
}

TEST_CASE(
    "model: embedding layers open the list, name a table, and their row gradients are exact") {
  auto backend = make_cpu_backend(1);
  const std::vector<TableSpec> tables = {{"a", 3, std::nullopt}, {"b", 2, 100}};
  ModelConfig config{.preset = "custom",
                     .layers = {{.type = "embedding_bag", .table = "a", .ids = 2, .pool = "mean"},
                                {.type = "embedding", .table = "b", .ids = 2},
                                {.type = "dense", .units = 5},
                                {.type = "relu"},
                                {.type = "dense", .units = 3}}};
  SUBCASE("validation") {
    ModelConfig late = config;
    std::swap(late.layers[1], late.layers[2]);
    CHECK_THROWS_WITH_AS(Model(late, *backend, {2, 1, 1}, 3, 4, tables),
                         doctest::Contains("embedding layers must come first"), ConfigError);
    CHECK_THROWS_WITH_AS(Model(config, *backend, {2, 1, 1}, 3, 4, {tables[0]}),
                         doctest::Contains("table 'b' is not among the run's tables"), ConfigError);
    Model model(config, *backend, {0, 1, 1}, 3, 4, tables);
    CHECK_THROWS_WITH_AS(check_ids_for_embeddings(model.embeddings(), make_synthetic(10, true)),
                         doctest::Contains("take 4 ids per sample, and synthetic/train has 0"),
                         ConfigError);
    Dataset with_ids = make_synthetic_ids(10, true);
    with_ids.ids_per_sample = 4;
    CHECK_NOTHROW(check_ids_for_embeddings(model.embeddings(), with_ids));
  }
  SUBCASE("gradients against finite differences") {
    constexpr int n = 4;
    Model model(config, *backend, {2, 1, 1}, 3, n, tables);
    REQUIRE(model.embeddings().size() == 2);
    CHECK(model.describe().find("{name: embedding_bag0, type: embedding_bag, table: a, first_id: "
                                "0, ids: 2, pool: mean, "
                                "output: [3]}") != std::string::npos);
    model.initialize(5);
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (int i = 0; i < n * 2; ++i) model.input_buffer()[i] = dist(rng);
    for (int i = 0; i < n; ++i) model.label_buffer()[i] = i % 3;
    // Layer 0: 3 unique rows for 8 ids; layer 1: 4 unique rows for 8 ids.
    std::vector<std::vector<float>> rows = {std::vector<float>(9), std::vector<float>(8)};
    for (auto& r : rows)
      for (auto& v : r) v = dist(rng);
    const std::vector<std::vector<std::uint32_t>> inverse = {{0, 1, 2, 2, 1, 1, 0, 2},
                                                             {3, 0, 1, 1, 2, 3, 0, 0}};
    const auto mean_loss = [&] {
      for (std::size_t e = 0; e < 2; ++e) model.set_embedding_batch(e, n, rows[e], inverse[e]);
      model.forward_backward(n, [](std::size_t) {});
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += model.loss_buffer()[i];
      return sum / n;
    };
    mean_loss();
    std::vector<std::vector<float>> grads = {std::vector<float>(9), std::vector<float>(8)};
    for (std::size_t e = 0; e < 2; ++e) model.embedding_grads(e, grads[e]);
    for (std::size_t e = 0; e < 2; ++e)
      for (std::size_t i = 0; i < rows[e].size(); ++i) {
        CAPTURE(e);
        CAPTURE(i);
        const float keep = rows[e][i], h = 1e-2f;
        rows[e][i] = keep + h;
        const double up = mean_loss();
        rows[e][i] = keep - h;
        const double down = mean_loss();
        rows[e][i] = keep;
        CHECK(grads[e][i] == doctest::Approx((up - down) / (2 * h)).epsilon(2e-2));
      }
  }
}
