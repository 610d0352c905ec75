#pragma once
// A CPU backend that claims its memory is out of the host's reach, so the
// code paths written for device backends (pinned staging buffers, uploads,
// downloads and fences) run and are tested on machines without a GPU.
#include <memory>

#include "client/backend.h"
#include "client/cpu_backend.h"

namespace pstrain::testing {

class StagingBackend final : public Backend {
 public:
  StagingBackend() : cpu_(make_cpu_backend(1)) {}

  std::string name() const override { return "staging(" + cpu_->name() + ")"; }
  bool host_accessible() const override { return false; }

  DeviceMemory alloc(std::size_t bytes) override { return cpu_->alloc(bytes); }
  HostMemory alloc_host(std::size_t bytes) override { return cpu_->alloc_host(bytes); }
  void release(void* p) noexcept override { cpu_->release(p); }
  void release_host(void* p) noexcept override { cpu_->release_host(p); }
  void upload(const void* h, void* d, std::size_t n) override { cpu_->upload(h, d, n); }
  void download(const void* d, void* h, std::size_t n) override { cpu_->download(d, h, n); }
  void fill(float* d, float v, std::size_t n) override { cpu_->fill(d, v, n); }
  Fence fence() override { return cpu_->fence(); }
  bool fence_done(Fence f) override { return cpu_->fence_done(f); }
  void wait(Fence f) override { cpu_->wait(f); }

  void dense_forward(const float* x, const float* w, const float* b, float* y, int n, int in,
                     int out) override {
    cpu_->dense_forward(x, w, b, y, n, in, out);
  }
  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int n, int in, int out) override {
    cpu_->dense_backward(x, w, dy, dx, dw, db, n, in, out);
  }
  void relu_forward(const float* x, float* y, std::size_t n) override { cpu_->relu_forward(x, y, n); }
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    cpu_->relu_backward(y, dy, dx, n);
  }
  std::size_t conv2d_workspace(const ConvShape& s) const override { return cpu_->conv2d_workspace(s); }
  void conv2d_forward(const float* x, const float* w, const float* b, float* y, float* ws,
                      const ConvShape& s) override {
    cpu_->conv2d_forward(x, w, b, y, ws, s);
  }
  void conv2d_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, float* ws, const ConvShape& s) override {
    cpu_->conv2d_backward(x, w, dy, dx, dw, db, ws, s);
  }
  void maxpool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& s) override {
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
  void scale(float* x, float a, std::size_t n) override { cpu_->scale(x, a, n); }
  void apply_optimizer(const OptimizerConfig& c, float* w, const float* g, float* state,
                       std::size_t n, std::uint64_t step, float lr_scale) override {
    cpu_->apply_optimizer(c, w, g, state, n, step, lr_scale);
  }

 private:
  std::unique_ptr<Backend> cpu_;
};

}  // namespace pstrain::testing
