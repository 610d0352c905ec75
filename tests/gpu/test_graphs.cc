// Step graphs (CUDA graphs) against eager steps, and which implementation
// each op took: cuBLASLt, cuDNN, and a cuDNN that cannot serve.
#include "tests/gpu/gpu_support.h"

using namespace pstrain::gpu_test;

namespace {

// A small MLP or CNN in backend calls over fixed buffers, as Model lays
// out a step: forward, loss, backward and Adam (whose bias corrections
// follow the step count). Batches come through pinned staging memory,
// uploaded without a synchronization, so a step that did not wait for
// them reads the previous batch.
class TinyNet {
 public:
  static constexpr int kN = 32, kSide = 12, kPixels = kSide * kSide, kClasses = 10;
  static constexpr int kHidden = 64, kFilters = 8, kPooled = kFilters * 5 * 5;

  TinyNet(Backend& b, bool cnn)
      : b_(b),
        cnn_(cnn),
        conv_{kN, 1, kSide, kSide, kFilters, 3},
        pool_{kN, kFilters, kSide - 2, kSide - 2, 2},
        x_(b, std::size_t(kN) * kPixels),
        labels_(b, kN),
        act_(b, std::size_t(kN) * std::max(kHidden, kFilters * (kSide - 2) * (kSide - 2))),
        pooled_(b, std::size_t(kN) * kPooled),
        logits_(b, std::size_t(kN) * kClasses),
        dlogits_(b, logits_.size),
        loss_(b, kN),
        correct_(b, kN),
        dact_(b, act_.size),
        dpooled_(b, pooled_.size),
        argmax_(b, pooled_.size),
        workspace_(b, cnn ? std::max<std::size_t>(b.conv2d_workspace(conv_), 1) : 1),
        staged_x_(b.alloc_host(x_.size * sizeof(float))),
        staged_labels_(b.alloc_host(kN * sizeof(std::int32_t))) {
    adam_.kind = pstrain::OptimizerKind::adam;
    adam_.lr = 0.01f;
    const std::vector<std::size_t> sizes =
        cnn ? std::vector<std::size_t>{kFilters * 9, kFilters, std::size_t(kPooled) * kClasses,
                                       kClasses}
            : std::vector<std::size_t>{std::size_t(kPixels) * kHidden, kHidden,
                                       std::size_t(kHidden) * kClasses, kClasses};
    for (std::size_t size : sizes) {
      params_.emplace_back(b, size);
      grads_.emplace_back(b, size);
      state_.emplace_back(b, 2 * size);
    }
  }

  // Weights from `rng`, Adam's state zero.
  void initialize(std::mt19937& rng) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto w = random_vector(params_[i].size, rng, -0.2f, 0.2f);
      b_.upload(w.data(), params_[i].data(), w.size() * sizeof(float));
      b_.fill(state_[i].data(), 0.0f, state_[i].size);
      b_.synchronize();
    }
  }

  // Issues the batch's upload; the staging memory is reused once the step's
  // results were read (read() synchronizes).
  void load(const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
    std::copy(x.begin(), x.end(), staged_x_.data());
    std::copy(labels.begin(), labels.end(), staged_labels_.data<std::int32_t>());
    b_.upload(staged_x_.data(), x_.data(), x.size() * sizeof(float));
    b_.upload(staged_labels_.data(), labels_.data(), labels.size() * sizeof(std::int32_t));
  }

  void step(const pstrain::StepScalars& s) {
    const float* features = x_.data();
    int width = kPixels;
    if (cnn_) {
      b_.conv2d_forward(x_.data(), params_[0].data(), params_[1].data(), act_.data(),
                        workspace_.data(), nullptr, conv_);
      b_.relu_forward(act_.data(), act_.data(), act_.size);
      b_.maxpool_forward(act_.data(), pooled_.data(), argmax_.data(), pool_);
      features = pooled_.data();
      width = kPooled;
    } else {
      b_.dense_forward(x_.data(), params_[0].data(), params_[1].data(), act_.data(), kN, kPixels,
                       kHidden);
      b_.relu_forward(act_.data(), act_.data(), std::size_t(kN) * kHidden);
      features = act_.data();
      width = kHidden;
    }
    b_.dense_forward(features, params_[2].data(), params_[3].data(), logits_.data(), kN, width,
                     kClasses);
    b_.softmax_xent(logits_.data(), labels_.data(), dlogits_.data(), loss_.data(), correct_.data(),
                    kN, kClasses);
    b_.dense_backward(features, params_[2].data(), dlogits_.data(),
                      cnn_ ? dpooled_.data() : dact_.data(), grads_[2].data(), grads_[3].data(), kN,
                      width, kClasses);
    if (cnn_) {
      b_.maxpool_backward(dpooled_.data(), argmax_.data(), dact_.data(), pool_);
      b_.relu_backward(act_.data(), dact_.data(), dact_.data(), act_.size);
      b_.conv2d_backward(x_.data(), params_[0].data(), dact_.data(), nullptr, grads_[0].data(),
                         grads_[1].data(), workspace_.data(), nullptr, conv_);
    } else {
      b_.relu_backward(act_.data(), dact_.data(), dact_.data(), std::size_t(kN) * kHidden);
      b_.dense_backward(x_.data(), params_[0].data(), dact_.data(), nullptr, grads_[0].data(),
                        grads_[1].data(), kN, kPixels, kHidden);
    }
    for (std::size_t i = 0; i < params_.size(); ++i)
      b_.apply_optimizer(adam_, params_[i].data(), grads_[i].data(), state_[i].data(),
                         params_[i].size, s.step, s.lr_scale);
  }

  // Weights, optimizer state and losses, concatenated.
  std::vector<float> read() const {
    std::vector<float> all = loss_.read();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      for (const auto* buffer : {&params_[i], &state_[i]}) {
        const auto v = buffer->read();
        all.insert(all.end(), v.begin(), v.end());
      }
    }
    return all;
  }

 private:
  Backend& b_;
  bool cnn_;
  ConvShape conv_;
  PoolShape pool_;
  pstrain::OptimizerConfig adam_;
  Buffer<> x_;
  Buffer<std::int32_t> labels_;
  Buffer<> act_, pooled_, logits_, dlogits_, loss_, correct_, dact_, dpooled_;
  Buffer<std::int32_t> argmax_;
  Buffer<> workspace_;
  std::vector<Buffer<>> params_, grads_, state_;
  pstrain::HostMemory staged_x_, staged_labels_;
};

// A random batch for TinyNet.
std::pair<std::vector<float>, std::vector<std::int32_t>> tiny_batch(std::mt19937& rng) {
  std::vector<std::int32_t> labels(TinyNet::kN);
  for (auto& l : labels) l = std::int32_t(rng() % TinyNet::kClasses);
  return {random_vector(std::size_t(TinyNet::kN) * TinyNet::kPixels, rng), labels};
}

// Bit for bit, as the same kernels on the same inputs give.
void check_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                     const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  }
  INFO(what << ": " << differ << " of " << got.size() << " differ; first at " << first << ": got "
            << got[first] << ", want " << want[first]);
  CHECK(differ == 0);
}

TEST_CASE("a step graph replays forward, backward and Adam bit for bit like eager steps") {
  auto b = make_backend();
  for (const bool cnn : {false, true}) {
    INFO((cnn ? "cnn" : "mlp"));
    TinyNet eager(*b, cnn), recorded(*b, cnn);
    std::mt19937 init_eager(20), init_recorded(20), data(21);
    eager.initialize(init_eager);
    recorded.initialize(init_recorded);
    auto graph = b->make_step_graph([&](const pstrain::StepScalars& s) { recorded.step(s); });
    std::vector<float> before = recorded.read();
    for (int step = 1; step <= 6; ++step) {
      INFO("step " << step);
      const auto [x, labels] = tiny_batch(data);
      eager.load(x, labels);
      recorded.load(x, labels);
      // A new step count (Adam's bias corrections) and learning-rate scale
      // every step: a replay that kept the recording's would differ.
      const pstrain::StepScalars scalars{std::uint64_t(step), 1.0f / float(step)};
      eager.step(scalars);  // first: the recording then finds every plan made
      graph->run(scalars);
      const auto after = recorded.read();
      check_same_bits(after, eager.read(), "recorded against eager");
      CHECK(after != before);  // the step did something
      before = after;
    }
    const auto paths = b->path_counts();
    INFO("paths: " << describe(paths));
    CHECK(paths.at("step_graph recorded") == (cnn ? 2u : 1u));
    CHECK(paths.at("step_graph replayed") == (cnn ? 10u : 5u));
  }
}

TEST_CASE("a step graph sees weights written after its capture") {
  auto b = make_backend();
  TinyNet eager(*b, false), recorded(*b, false);
  std::mt19937 init_eager(30), init_recorded(30), data(31);
  eager.initialize(init_eager);
  recorded.initialize(init_recorded);
  auto graph = b->make_step_graph([&](const pstrain::StepScalars& s) { recorded.step(s); });
  const auto [x, labels] = tiny_batch(data);
  eager.load(x, labels);
  eager.step({1, 1.0f});  // plans made outside the capture, as a trainer's warm-up does
  recorded.load(x, labels);
  graph->run({1, 1.0f});  // captured with these weights
  (void)recorded.read();
  // New weights and a fresh optimizer state on both, as a pull brings them;
  // uploads in issue order, no synchronization before the replay.
  std::mt19937 again_eager(32), again_recorded(32);
  eager.initialize(again_eager);
  recorded.initialize(again_recorded);
  eager.load(x, labels);
  recorded.load(x, labels);
  eager.step({1, 1.0f});
  graph->run({1, 1.0f});
  check_same_bits(recorded.read(), eager.read(), "replay after new weights");
}

TEST_CASE(
    "a step graph whose work needs the host throws, runs none of it, and leaves the backend "
    "working") {
  auto b = make_backend();
  const std::size_t n = 4096;
  Buffer<> x(*b, n);
  b->fill(x.data(), 1.0f, n);  // the kernel loaded outside the capture
  // A host wait (as all_finite and axpby make): no capture can hold that.
  auto graph = b->make_step_graph([&](const pstrain::StepScalars&) {
    b->fill(x.data(), 7.0f, n);
    b->synchronize();
  });
  CHECK_THROWS_WITH_AS(graph->run({1, 1.0f}), doctest::Contains("a step graph cannot record"),
                       std::invalid_argument);
  for (float v : x.read())
    if (v != 1.0f) FAIL("the failed capture ran its fill: " << v);
  // The compute stream is no longer capturing: eager work runs, ordered as usual.
  b->fill(x.data(), 3.0f, n);
  b->scale(x.data(), 2.0f, n);
  for (float v : x.read())
    if (v != 6.0f) FAIL("eager work after the failed capture gave " << v);
}

TEST_CASE("cuBLASLt serves the MLP's dense layers, counted as it runs") {
  auto b = make_backend();
  std::mt19937 rng(40);
  // The mlp preset's shapes at batch 64 (784 -> 256 -> 128 -> 10).
  for (const auto& [n, in, out] :
       {std::tuple{64, 784, 256}, std::tuple{64, 256, 128}, std::tuple{64, 128, 10}}) {
    INFO(n << " x " << in << " -> " << out);
    const auto x = random_vector(std::size_t(n) * in, rng),
               w = random_vector(std::size_t(in) * out, rng);
    const auto bias = random_vector(out, rng), dy = random_vector(std::size_t(n) * out, rng);
    Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), bdy(*b, dy);
    Buffer<> y(*b, std::size_t(n) * out), dx(*b, std::size_t(n) * in), dw(*b, w.size()),
        db(*b, bias.size());
    const auto before = b->path_counts();
    b->dense_forward(bx.data(), bw.data(), bb.data(), y.data(), n, in, out);
    b->dense_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(), n, in,
                      out);
    b->synchronize();
    const auto after = b->path_counts();
    INFO("paths: " << describe(after));
    // Forward, and the weight gradient with the bias gradient, fused: the
    // hidden layers' shapes at least (whether the 10-wide output layer has a
    // plan is cuBLASLt's call; its fallback computes the same).
    CHECK(ran(before, after, "dense cublaslt") + ran(before, after, "dense cublaslt refused") == 2);
    if (out != 10) CHECK(ran(before, after, "dense cublaslt") == 2);
    std::vector<double> ry(y.size), rdx(dx.size), rdw(dw.size), rdb(db.size);
    ref::dense_forward(widen(x).data(), widen(w).data(), widen(bias).data(), ry.data(), n, in, out);
    check_close(y.read(), ry, "dense y");
    ref::dense_backward(widen(x).data(), widen(w).data(), widen(dy).data(), rdx.data(), rdw.data(),
                        rdb.data(), n, in, out);
    check_close(dw.read(), rdw, "dense dw");
    check_close(db.read(), rdb, "dense db");
  }
}

// tests/support/fake_cudnn.cc's stand-ins, built into tests/fakes/ beside
// this executable.
std::string fake_cudnn(const char* name) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  REQUIRE_MESSAGE(!ec, "cannot read /proc/self/exe");
  const auto path = exe.parent_path() / "tests" / "fakes" / (std::string("lib") + name + ".so");
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string() << " is missing (build it)");
  return path.string();
}

TEST_CASE("a cuDNN that loads but cannot serve leaves convolutions on im2col, said and counted") {
  // fake_cudnn_broken lacks the convolution calls; fake_cudnn_partial has
  // them all but its sub-libraries are missing, which only the backend's
  // probe (running a tiny convolution) finds. Either way the backend starts,
  // names the im2col path, and its convolutions are right.
  for (const char* name : {"fake_cudnn_broken", "fake_cudnn_partial"}) {
    INFO(name);
    setenv("PSTRAIN_CUDNN_LIB", fake_cudnn(name).c_str(), 1);
    std::unique_ptr<Backend> b;
    try {
      b = make_backend();
    } catch (const std::exception& e) {
      unsetenv("PSTRAIN_CUDNN_LIB");
      FAIL("the backend did not start: " << e.what());
    }
    unsetenv("PSTRAIN_CUDNN_LIB");
    CHECK(b->name().find("im2col convolutions") != std::string::npos);
    const ConvShape s{4, 2, 9, 9, 5, 3};
    std::mt19937 rng(41);
    const std::size_t xn = std::size_t(s.n) * s.c * s.h * s.w;
    const std::size_t wn = std::size_t(s.filters) * s.c * s.kernel * s.kernel;
    const std::size_t yn = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
    const auto x = random_vector(xn, rng), w = random_vector(wn, rng);
    const auto bias = random_vector(s.filters, rng);
    Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), y(*b, yn);
    Buffer<> workspace(*b, b->conv2d_workspace(s));
    b->conv2d_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(), nullptr, s);
    std::vector<double> ry(yn);
    ref::conv2d_forward(widen(x).data(), widen(w).data(), widen(bias).data(), ry.data(), s);
    check_close(y.read(), ry, "conv y");
    const auto paths = b->path_counts();
    INFO("paths: " << describe(paths));
    CHECK(paths.count("conv2d im2col") == 1);
    CHECK(paths.count("conv2d cudnn") == 0);
  }
}

TEST_CASE("step graphs record fp32 steps only, and the backend itself refuses the others") {
  auto b = make_backend();
  CHECK(b->records_steps());
  const std::size_t n = 256;
  Buffer<> x(*b, std::vector<float>(n, 1.0f));
  {
    auto graph = b->make_step_graph([&](const pstrain::StepScalars&) { b->scale(x.data(), 2, n); });
    // While a graph exists, its steps must stay fp32.
    CHECK_THROWS_WITH_AS(b->set_precision(pstrain::Precision::fp16),
                         doctest::Contains("step graphs exist"), std::invalid_argument);
    graph->run({1, 1.0f});
    graph->run({2, 1.0f});
  }
  for (float v : x.read()) REQUIRE(v == 4.0f);
  b->set_precision(pstrain::Precision::fp16);
  CHECK_FALSE(b->records_steps());
  CHECK_THROWS_WITH_AS(b->make_step_graph([](const pstrain::StepScalars&) {}),
                       doctest::Contains("step graphs record fp32 steps only, not fp16"),
                       std::invalid_argument);
  b->set_precision(pstrain::Precision::fp32);
  CHECK(b->records_steps());
}

TEST_CASE(
    "apply_optimizers in a step graph after an NCCL all-reduce records, and replays exactly") {
  // The sync trainer's order: gradients all-reduced on NCCL's stream, then
  // the optimizer step from a graph. The capture must not make the compute
  // stream wait for the all-reduce's events (recorded outside the capture,
  // which CUDA refuses): the graph's launch waits for it instead.
  auto b = make_backend();
  auto comm = make_comm(*b, unique_id(), 0, 1);
  pstrain::OptimizerConfig adam;
  adam.kind = pstrain::OptimizerKind::adam;
  adam.lr = 0.01f;
  std::mt19937 rng(42);
  const std::vector<std::size_t> sizes{1 << 16, 1000, 10};
  std::vector<Buffer<>> eager_w, graph_w, grads, eager_state, graph_state;
  std::vector<pstrain::OptimizerTensor> eager, recorded;
  for (std::size_t size : sizes) {
    const auto w = random_vector(size, rng);
    eager_w.emplace_back(*b, w);
    graph_w.emplace_back(*b, w);
    grads.emplace_back(*b, size);
    eager_state.emplace_back(*b, std::vector<float>(2 * size, 0.0f));
    graph_state.emplace_back(*b, std::vector<float>(2 * size, 0.0f));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    eager.push_back({eager_w[i].data(), grads[i].data(), eager_state[i].data(), sizes[i]});
    recorded.push_back({graph_w[i].data(), grads[i].data(), graph_state[i].data(), sizes[i]});
  }
  auto graph = b->make_step_graph([&](const pstrain::StepScalars& s) {
    b->apply_optimizers(adam, recorded, s.step, s.lr_scale);
  });
  const auto before = b->path_counts();
  for (std::uint64_t step = 1; step <= 4; ++step) {
    INFO("step " << step);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto g = random_vector(sizes[i], rng);
      b->upload(g.data(), grads[i].data(), g.size() * sizeof(float));
      b->synchronize();                                // g goes out of scope
      comm->allreduce_sum(grads[i].data(), sizes[i]);  // one rank: the identity
    }
    const pstrain::StepScalars scalars{step, 1.0f / float(step)};
    graph->run(scalars);  // first, right behind the all-reduces
    b->apply_optimizers(adam, eager, scalars.step, scalars.lr_scale);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      check_same_bits(graph_w[i].read(), eager_w[i].read(), "weights");
      check_same_bits(graph_state[i].read(), eager_state[i].read(), "state");
    }
  }
  const auto after = b->path_counts();
  INFO("paths: " << describe(after));
  CHECK(ran(before, after, "step_graph recorded") == 1);
  CHECK(ran(before, after, "step_graph replayed") == 3);
}

}  // namespace
