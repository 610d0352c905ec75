// The NCCL communicator of the CUDA library: one rank's collectives among
// the backend's ops, overlap with compute, and all devices of the host.
#include "tests/gpu/gpu_support.h"

using namespace pstrain::gpu_test;

namespace {

// With one rank a sum is the identity, so this case checks what one rank can
// show: the collectives are queued in order with the backend's ops (behind
// held work, which they must not overtake: a collective that read or wrote
// early would lose a scale) and the errors. Sums across ranks are the
// all-devices case's, skipped on a one-GPU host.
TEST_CASE("nccl with one rank: collectives keep their place among the backend's ops") {
  auto b = make_backend();
  auto comm = make_comm(*b, unique_id(), 0, 1);
  CHECK(comm->name() == "nccl");
  CHECK(comm->size() == 1);
  std::vector<float> v(1 << 20);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 1000 + 1);
  Buffer<> x(*b, v);
  ComputeHold hold(*b);
  b->scale(x.data(), 2.0f, v.size());
  comm->allreduce_sum(x.data(), v.size());
  b->scale(x.data(), 3.0f, v.size());
  comm->broadcast(x.data(), v.size(), 0);
  b->scale(x.data(), 0.5f, v.size());
  const auto queued = b->fence();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(b->fence_done(queued));
  hold.release();
  comm->barrier();
  CHECK(b->fence_done(queued));
  const auto got = x.read();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i) wrong += got[i] != 3.0f * v[i];
  CHECK_MESSAGE(wrong == 0, wrong << " elements are not 3x their input; element 7 is " << got[7]);
  CHECK_THROWS_AS(comm->broadcast(x.data(), 1, 1), std::invalid_argument);
  std::array<char, 512> error{};
  const auto id = unique_id();
  CHECK(pstrain_nccl_create(b.get(), id.data(), id.size(), 2, 2, 5.0, error.data(), error.size()) ==
        nullptr);
  CHECK(std::string(error.data()).find("rank 2 is not in a group of size 2") != std::string::npos);
}

TEST_CASE("nccl: a collective runs alongside compute it does not depend on") {
  auto b = make_backend();
  auto comm = make_comm(*b, unique_id(), 0, 1);
  const std::size_t m = 1 << 16;
  Buffer<> x(*b, std::vector<float>(m, 1.0f)), y(*b, std::vector<float>(m, 9.0f));
  auto out = host_filled(*b, m, NAN);
  ComputeHold hold(*b);
  b->scale(x.data(), 2.0f, m);  // held
  comm->allreduce_sum(y.data(), m);
  b->download(y.data(), out.data(), m * sizeof(float));  // waits for the collective alone
  // On the compute stream, the collective and so the download would wait
  // for the held scale.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!all_equal(out, m, 9.0f) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(all_equal(out, m, 9.0f));
  const auto f = b->fence();
  CHECK_FALSE(b->fence_done(f));
  hold.release();
  b->wait(f);
  const auto got = x.read();
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 2.0f; }));
  // Both collectives' device time is reported once they are done.
  comm->mark();
  comm->allreduce_sum(y.data(), m);
  b->synchronize();
  const auto times = comm->device_times();
  REQUIRE(times.has_value());
  CHECK(times->busy_ms > 0);
  CHECK(times->after_mark_ms > 0);            // the second ran after the mark
  CHECK(comm->device_times()->busy_ms == 0);  // reported once
}

TEST_CASE(kAllDevicesCase) {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  REQUIRE_MESSAGE(devices >= 2, "the multi-GPU all-reduce needs two devices");
  const auto id = unique_id();
  std::vector<std::vector<float>> results(devices);
  std::vector<std::string> errors(devices);
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) {
    threads.emplace_back([&, d] {
      try {
        auto b = make_backend(d);
        auto comm = make_comm(*b, id, d, devices);
        Buffer<> x(*b, std::vector<float>(4096, float(d + 1)));
        comm->allreduce_sum(x.data(), x.size);
        results[d] = x.read();
      } catch (const std::exception& e) {
        errors[d] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const float want = float(devices * (devices + 1) / 2);
  for (int d = 0; d < devices; ++d) {
    CHECK_MESSAGE(errors[d].empty(), errors[d]);
    CHECK(std::all_of(results[d].begin(), results[d].end(), [&](float v) { return v == want; }));
  }
}

}  // namespace
