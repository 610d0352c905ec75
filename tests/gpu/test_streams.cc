// The CUDA backend's two streams: transfers, their order, what they wait
// for, and fences.
#include "tests/gpu/gpu_support.h"

using namespace pstrain::gpu_test;

namespace {

TEST_CASE("transfers round-trip and keep issue order across the two streams") {
  auto b = make_backend();
  std::mt19937 rng(7);
  const std::size_t n = 1 << 20;
  auto pinned_in = b->alloc_host(n * sizeof(float));
  auto pinned_out = b->alloc_host(n * sizeof(float));
  const auto input = random_vector(n, rng);
  std::memcpy(pinned_in.data(), input.data(), n * sizeof(float));
  Buffer<> x(*b, n);
  b->upload(pinned_in.data(), x.data(), n * sizeof(float));
  b->download(x.data(), pinned_out.data(), n * sizeof(float));
  b->synchronize();
  CHECK(std::memcmp(pinned_out.data(), input.data(), n * sizeof(float)) == 0);

  // Each round uploads into buffers that the previous round's compute still
  // reads and writes, and downloads what this round's compute produced: any
  // missing wait between the streams shows up as a wrong value. Round r
  // expects 6 (r + 1), which neither a stale round (6 r), the fills (-1,
  // or 0 after the relu), nor untouched host memory (NaN) can give.
  const int rounds = 20;
  const std::size_t m = 1 << 18;
  Buffer<> a(*b, m), c(*b, m);
  std::vector<pstrain::HostMemory> in, out;
  for (int r = 0; r < rounds; ++r) {
    in.push_back(host_filled(*b, m, float(r + 1)));
    out.push_back(host_filled(*b, m, NAN));
  }
  for (int r = 0; r < rounds; ++r) {
    b->upload(in[r].data(), a.data(), m * sizeof(float));
    b->scale(a.data(), 2.0f, m);
    b->relu_forward(a.data(), c.data(), m);
    b->scale(c.data(), 3.0f, m);
    b->download(c.data(), out[r].data(), m * sizeof(float));
    b->fill(a.data(), -1.0f, m);
    b->fill(c.data(), -1.0f, m);
  }
  b->synchronize();
  for (int r = 0; r < rounds; ++r) {
    CHECK_MESSAGE(all_equal(out[r], m, 6.0f * float(r + 1)), "round " << r);
  }

  // Memory the backend did not allocate orders against everything.
  float* raw = nullptr;
  REQUIRE(cudaMalloc(&raw, m * sizeof(float)) == cudaSuccess);
  b->upload(in[3].data(), raw, m * sizeof(float));
  b->scale(raw, 2.0f, m);
  b->download(raw, out[0].data(), m * sizeof(float));
  b->synchronize();
  CHECK(all_equal(out[0], m, 8.0f));
  REQUIRE(cudaFree(raw) == cudaSuccess);
}

TEST_CASE("transfers wait for the compute they depend on, and only for it") {
  auto b = make_backend();
  const std::size_t m = 1 << 16;
  Buffer<> a(*b, std::vector<float>(m, 5.0f)), unrelated(*b, std::vector<float>(m, 4.0f));
  Buffer<> c(*b, m);
  b->fill(c.data(), -2.0f, m);  // what a download that does not wait would see
  auto in = host_filled(*b, m, 7.0f);
  auto out_a = host_filled(*b, m, NAN), out_c = host_filled(*b, m, NAN);
  auto out_unrelated = host_filled(*b, m, NAN);
  b->synchronize();

  ComputeHold hold(*b);
  b->scale(a.data(), 2.0f, m);  // a = 10
  b->download(unrelated.data(), out_unrelated.data(), m * sizeof(float));
  b->relu_forward(a.data(), c.data(), m);  // c = 10
  b->download(c.data(), out_c.data(), m * sizeof(float));
  b->upload(in.data(), a.data(), m * sizeof(float));  // after the relu read a = 10
  b->scale(a.data(), 3.0f, m);                        // a = 21
  b->download(a.data(), out_a.data(), m * sizeof(float));

  // The download that needs no compute lands while the compute stream is
  // held; the ones that need the held work do not.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!all_equal(out_unrelated, m, 4.0f) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(all_equal(out_unrelated, m, 4.0f));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(std::isnan(out_c.data()[0]));
  CHECK(std::isnan(out_a.data()[0]));

  hold.release();
  b->synchronize();
  // An upload that overtook the first scale gives c = 14, a = 42; one that
  // overtook the relu gives c = 14; downloads that did not wait give -2 or 5.
  CHECK(all_equal(out_c, m, 10.0f));
  CHECK(all_equal(out_a, m, 21.0f));
}

TEST_CASE("fences complete when, and only when, the work before them has") {
  auto b = make_backend();
  Buffer<> x(*b, std::vector<float>(1 << 20, 1.0f));
  const auto before = b->fence();
  ComputeHold hold(*b);
  b->scale(x.data(), 3.0f, x.size);
  const auto f1 = b->fence();
  const auto f2 = b->fence();
  CHECK(f2 > f1);
  // The fence issued before the hold completes while the stream is held.
  b->wait(before);
  CHECK(b->fence_done(before));
  // A fence that recorded nothing, or only on one stream, would be done by now.
  for (int i = 0; i < 50; ++i) {
    REQUIRE_FALSE(b->fence_done(f1));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK_FALSE(b->fence_done(f2));
  hold.release();
  b->wait(f2);
  CHECK(b->fence_done(f1));  // an earlier fence is done once a later one is
  CHECK(b->fence_done(f2));
  const auto got = x.read();
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 3.0f; }));

  // Fences retire in any order of asking.
  std::vector<Backend::Fence> many;
  ComputeHold second(*b);
  for (int i = 0; i < 1000; ++i) many.push_back(b->fence());
  CHECK_FALSE(b->fence_done(many.front()));
  second.release();
  b->wait(many.back());
  CHECK(std::all_of(many.begin(), many.end(), [&](auto f) { return b->fence_done(f); }));
}

}  // namespace
