#pragma once
// A CPU backend that claims its memory is out of the host's reach, so the
// code paths written for device backends (pinned staging buffers, uploads,
// downloads and fences) run and are tested on machines without a GPU.
//
// Transfers behave as asynchronously as a GPU's may, so a missing fence wait
// gives wrong results instead of passing by luck:
//   - a fence completes late: fence_done() answers "not yet" to the first
//     polls of each fence; wait() completes it at once;
//   - a download takes the device data at issue time (later compute may
//     overwrite it, as on a stream) but fills the host memory only when a
//     fence issued after it completes; until then that memory holds NaNs.
// Uploads copy at once: compute issued after them must see their data.
//
// Recorded steps (Backend::make_step_graph): record_steps() makes the
// backend claim it records, so the trainers take their CUDA graph path; its
// graphs run the work on every run(), or refuse the first one as a driver
// without graph support would, and count their runs (graph_runs()).
//
// keep_conv_columns(false) makes its convolutions recompute their im2col
// matrices in backward, where the CPU backend keeps them from forward.
//
// For the error paths: fail_wait() makes a later wait() throw, as a device
// error would; released host memory is kept, filled with 0xff bytes, until
// the backend dies, so host_written_after_release() can tell whether anything
// (a ps reply, a download) wrote into a buffer after its owner freed it.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "client/compute/backend.h"
#include "client/compute/cpu/cpu_backend.h"

namespace pstrain::testing {

class StagingBackend final : public Backend {
 public:
  explicit StagingBackend(CpuKernels kernels = cpu_kernels_from_env())
      : cpu_(make_cpu_backend(1, kernels)) {}

  // Whether convolutions keep their im2col matrices from forward for
  // backward (Backend::conv2d_columns), as the CPU backend does; false makes
  // a model recompute them, to compare the two.
  void keep_conv_columns(bool keep) { keep_columns_ = keep; }

  std::string name() const override { return "staging(" + cpu_->name() + ")"; }
  bool host_accessible() const override { return false; }

  ~StagingBackend() override {
    for (const auto& [p, bytes] : released_host_) std::free(p);
  }

  DeviceMemory alloc(std::size_t bytes) override { return cpu_->alloc(bytes); }
  HostMemory alloc_host(std::size_t bytes) override {
    if (bytes == 0) return {};
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    host_bytes_[p] = bytes;
    return HostMemory(this, p, bytes);
  }
  void release(void* p) noexcept override { cpu_->release(p); }
  void release_host(void* p) noexcept override {
    const auto node = host_bytes_.extract(p);
    std::memset(p, 0xff, node.mapped());
    released_host_.emplace_back(p, node.mapped());
  }

  enum class Recording { off, on, refused };
  void record_steps(Recording recording) { recording_ = recording; }
  bool records_steps() const override { return recording_ != Recording::off; }
  std::unique_ptr<StepGraph> make_step_graph(StepWork work) override {
    class Graph final : public StepGraph {
     public:
      Graph(StagingBackend& owner, StepWork work) : owner_(owner), work_(std::move(work)) {}
      void run(const StepScalars& scalars) override {
        if (owner_.recording_ == Recording::refused)
          throw std::runtime_error("staging backend: capture refused");
        work_(scalars);
        ++owner_.graph_runs_;
        ++owner_.graph_paths_[ran_ ? "step_graph replayed" : "step_graph recorded"];
        ran_ = true;
      }

     private:
      StagingBackend& owner_;
      StepWork work_;
      bool ran_ = false;
    };
    return std::make_unique<Graph>(*this, std::move(work));
  }
  int graph_runs() const { return graph_runs_; }
  // The CPU backend's paths, and its graphs' first runs as recorded and
  // later ones as replayed, as the CUDA backend counts them.
  PathCounts path_counts() const override {
    PathCounts counts = cpu_->path_counts();
    counts.insert(graph_paths_.begin(), graph_paths_.end());
    return counts;
  }

  // The wait() after the next `waits` ones throws std::runtime_error.
  void fail_wait(int waits) { waits_to_failure_ = waits + 1; }
  bool host_written_after_release() const {
    for (const auto& [p, bytes] : released_host_) {
      const auto* b = static_cast<const unsigned char*>(p);
      if (std::any_of(b, b + bytes, [](unsigned char c) { return c != 0xff; })) return true;
    }
    return false;
  }
  void upload(const void* h, void* d, std::size_t n) override { cpu_->upload(h, d, n); }
  void download(const void* d, void* h, std::size_t n) override {
    if (n == 0) return;
    const auto* bytes = static_cast<const std::byte*>(d);
    in_flight_.push_back({static_cast<std::byte*>(h), {bytes, bytes + n}});
    std::memset(h, 0xff, n);  // NaN as floats
  }
  void fill(float* d, float v, std::size_t n) override { cpu_->fill(d, v, n); }

  Fence fence() override {
    // It covers the downloads issued before it that no earlier fence covers.
    fences_.push_back({kPollsToComplete, in_flight_.size()});
    return completed_ + fences_.size();
  }
  bool fence_done(Fence f) override {
    if (f <= completed_) return true;
    PendingFence& pending = fences_.at(f - completed_ - 1);
    if (--pending.polls_left > 0) return false;
    complete_through(f);
    return true;
  }
  void wait(Fence f) override {
    if (waits_to_failure_ > 0 && --waits_to_failure_ == 0)
      throw std::runtime_error("staging backend: injected failure of wait()");
    if (f > completed_) complete_through(f);
  }

  void dense_forward(const float* x, const float* w, const float* b, float* y, int n, int in,
                     int out) override {
    cpu_->dense_forward(x, w, b, y, n, in, out);
  }
  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int n, int in, int out) override {
    cpu_->dense_backward(x, w, dy, dx, dw, db, n, in, out);
  }
  void relu_forward(const float* x, float* y, std::size_t n) override {
    cpu_->relu_forward(x, y, n);
  }
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    cpu_->relu_backward(y, dy, dx, n);
  }
  std::size_t conv2d_workspace(const ConvShape& s) const override {
    return cpu_->conv2d_workspace(s);
  }
  std::size_t conv2d_columns(const ConvShape& s) const override {
    return keep_columns_ ? cpu_->conv2d_columns(s) : 0;
  }
  void conv2d_forward(const float* x, const float* w, const float* b, float* y, float* ws,
                      float* columns, const ConvShape& s) override {
    cpu_->conv2d_forward(x, w, b, y, ws, columns, s);
  }
  void conv2d_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, float* ws, const float* columns, const ConvShape& s) override {
    cpu_->conv2d_backward(x, w, dy, dx, dw, db, ws, columns, s);
  }
  void maxpool_forward(const float* x, float* y, std::int32_t* argmax,
                       const PoolShape& s) override {
    cpu_->maxpool_forward(x, y, argmax, s);
  }
  void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx,
                        const PoolShape& s) override {
    cpu_->maxpool_backward(dy, argmax, dx, s);
  }
  void softmax_xent(const float* logits, const std::int32_t* labels, float* dlogits, float* loss,
                    float* correct, int n, int classes) override {
    cpu_->softmax_xent(logits, labels, dlogits, loss, correct, n, classes);
  }
  void bce_logits(const float* logits, const std::int32_t* labels, float* dlogits, float* loss,
                  float* correct, int n) override {
    cpu_->bce_logits(logits, labels, dlogits, loss, correct, n);
  }
  void dot_interaction_forward(const float* x, float* y, const InteractionShape& s) override {
    cpu_->dot_interaction_forward(x, y, s);
  }
  void dot_interaction_backward(const float* x, const float* dy, float* dx,
                                const InteractionShape& s) override {
    cpu_->dot_interaction_backward(x, dy, dx, s);
  }
  void embedding_forward(const float* rows, const std::int32_t* inverse, float* out,
                         const EmbeddingShape& s) override {
    cpu_->embedding_forward(rows, inverse, out, s);
  }
  void embedding_backward(const float* dout, const std::int32_t* by_row,
                          const std::int32_t* offsets, float* drows,
                          const EmbeddingShape& s) override {
    cpu_->embedding_backward(dout, by_row, offsets, drows, s);
  }
  void copy_columns(const float* src, std::size_t src_stride, float* dst, std::size_t dst_stride,
                    std::size_t rows, std::size_t cols) override {
    cpu_->copy_columns(src, src_stride, dst, dst_stride, rows, cols);
  }
  void scale(float* x, float a, std::size_t n) override { cpu_->scale(x, a, n); }
  void apply_optimizer(const OptimizerConfig& c, float* w, const float* g, float* state,
                       std::size_t n, std::uint64_t step, float lr_scale) override {
    cpu_->apply_optimizer(c, w, g, state, n, step, lr_scale);
  }

 private:
  // The fence_done() poll that completes a fence; the ones before say "not yet".
  static constexpr int kPollsToComplete = 3;

  struct Download {
    std::byte* host;
    std::vector<std::byte> data;  // the device memory when it was issued
  };
  struct PendingFence {
    int polls_left;
    std::size_t downloads;  // in_flight_.size() when it was issued
  };

  // Completes fence `f` and the earlier ones: their downloads reach the host.
  void complete_through(Fence f) {
    const std::size_t covered = fences_.at(f - completed_ - 1).downloads;
    for (std::size_t i = 0; i < covered; ++i) {
      std::ranges::copy(in_flight_.front().data, in_flight_.front().host);
      in_flight_.pop_front();
    }
    fences_.erase(fences_.begin(), fences_.begin() + static_cast<std::ptrdiff_t>(f - completed_));
    for (auto& pending : fences_) pending.downloads -= covered;
    completed_ = f;
  }

  std::unique_ptr<Backend> cpu_;
  std::map<void*, std::size_t> host_bytes_;                   // live host memory
  std::vector<std::pair<void*, std::size_t>> released_host_;  // kept, 0xff-filled
  int waits_to_failure_ = 0;                                  // 0: none planned
  Recording recording_ = Recording::off;
  int graph_runs_ = 0;
  PathCounts graph_paths_;
  bool keep_columns_ = true;
  std::deque<Download> in_flight_;
  std::deque<PendingFence> fences_;  // issued, not completed, oldest first
  Fence completed_ = 0;
};

}  // namespace pstrain::testing
