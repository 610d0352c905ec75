#pragma once
// CudaBackend: the Backend interface on one GPU. Memory and transfers are
// CUDA runtime calls, GEMMs are cuBLAS, convolutions cuDNN where it loads
// (client/compute/cuda/cudnn_convolution.h; else im2col + cuBLAS, and the backend's
// name and stderr say so), dense layers cuBLASLt with the bias work in the
// GEMM's epilogue where it serves the shape (client/compute/cuda/lt_dense.h), the
// rest are kernels (client/compute/cuda/kernels.h). Every op goes through
// StreamOrder (client/compute/cuda/stream_order.h), which keeps the promise of issue order across
// the backend's compute and copy streams, and owns its fences. Step graphs are CUDA graphs
// (client/compute/cuda/step_graph.h).
//
// One thread drives a backend. Every call, releases and the destructor
// included, makes the backend's device current for its duration, so one
// process may drive several GPUs.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "client/compute/backend.h"
#include "client/compute/cuda/cuda_memory.h"
#include "client/compute/cuda/cudnn_convolution.h"
#include "client/compute/cuda/kernels.h"
#include "client/compute/cuda/lt_dense.h"
#include "client/compute/cuda/stream_order.h"

namespace pstrain::cuda {

class CudaStepGraph;

class CudaBackend final : public Backend {
 public:
  // cuBLAS's workspace, eager and in each step graph: set explicitly so that
  // both pick their GEMM algorithms for the same size (NVIDIA's figure for
  // Hopper, ample for older GPUs).
  static constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  bool host_accessible() const override { return false; }
  int device() const { return device_; }

  DeviceMemory alloc(std::size_t bytes) override;
  HostMemory alloc_host(std::size_t bytes) override;
  void release(void* device_ptr) noexcept override;
  void release_host(void* host_ptr) noexcept override;

  void upload(const void* host, void* device, std::size_t bytes) override;
  void download(const void* device, void* host, std::size_t bytes) override;
  void fill(float* device, float value, std::size_t n) override;

  Fence fence() override;
  bool fence_done(Fence fence) override;
  void wait(Fence fence) override;

  void dense_forward(const float* x, const float* w, const float* b, float* y, int n, int in,
                     int out) override;
  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int n, int in, int out) override;
  void relu_forward(const float* x, float* y, std::size_t n) override;
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override;
  std::size_t conv2d_workspace(const ConvShape& s) const override;
  std::size_t conv2d_columns(const ConvShape& s) const override;
  void conv2d_forward(const float* x, const float* w, const float* b, float* y, float* workspace,
                      float* columns, const ConvShape& s) override;
  void conv2d_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, float* workspace, const float* columns,
                       const ConvShape& s) override;
  void conv2d_relu_forward(const float* x, const float* w, const float* b, float* y,
                           float* workspace, float* columns, const ConvShape& s) override;
  void maxpool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& s) override;
  void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx,
                        const PoolShape& s) override;
  void softmax_xent(const float* logits, const std::int32_t* labels, float* dlogits, float* loss,
                    float* correct, int n, int classes) override;
  void scale(float* x, float a, std::size_t n) override;
  void apply_optimizer(const OptimizerConfig& config, float* w, const float* g, float* state,
                       std::size_t n, std::uint64_t step, float lr_scale) override;
  void apply_optimizers(const OptimizerConfig& config, std::span<const OptimizerTensor> tensors,
                        std::uint64_t step, float lr_scale) override;
  // y = a x + b y by a kernel on the compute stream (no host round trip).
  void axpby(float a, const float* x, float b, float* y, std::size_t n) override;
  void bce_logits(const float* logits, const std::int32_t* labels, float* dlogits, float* loss,
                  float* correct, int n) override;
  void dot_interaction_forward(const float* x, float* y, const InteractionShape& s) override;
  void dot_interaction_backward(const float* x, const float* dy, float* dx,
                                const InteractionShape& s) override;
  void embedding_forward(const float* rows, const std::int32_t* inverse, float* out,
                         const EmbeddingShape& s) override;
  void embedding_backward(const float* dout, const std::int32_t* by_row,
                          const std::int32_t* offsets, float* drows,
                          const EmbeddingShape& s) override;
  void copy_columns(const float* src, std::size_t src_stride, float* dst, std::size_t dst_stride,
                    std::size_t rows, std::size_t cols) override;

  // bf16 needs compute capability 8.0 (bf16 tensor-core GEMMs); fp16 runs
  // everywhere the library does. Other precisions than fp32 round the
  // operands with shared/low_precision.h into scratch memory and multiply
  // them on tensor cores with float32 accumulation (cublasGemmEx), and take
  // the im2col path for convolutions (cuDNN runs in float32 here).
  std::string precision_unavailable(Precision p) const override;
  void set_precision(Precision p) override;
  // A flag set on the device and one int downloaded, not the whole buffer.
  bool all_finite(const float* x, std::size_t n) override;

  // Step graphs record fp32 steps only: make_step_graph refuses the others,
  // and set_precision refuses them while a graph exists.
  bool records_steps() const override;
  std::unique_ptr<StepGraph> make_step_graph(StepWork work) override;

  // "dense cublaslt" (and "dense cublaslt refused" where cuBLASLt had no
  // plan), "dense cublas" (the unfused GEMM), "conv2d cudnn" or "conv2d
  // im2col" (with "conv2d cudnn unsupported" where cuDNN is loaded but has
  // no algorithm for the shape), "step_graph recorded" and "step_graph
  // replayed".
  PathCounts path_counts() const override { return paths_; }

  // Tests: the compute stream waits until *host_flag (pinned memory from
  // alloc_host) is non-zero, for 60 s at most (pstrain_cuda_hold_compute).
  void hold_compute(const std::int32_t* host_flag);

  // For work issued from outside the backend (NCCL collectives): orders the
  // compute stream after pending copies of `buffers`, runs `enqueue` with the
  // compute stream, and records the buffers as touched by it. The buffers are
  // recorded even when `enqueue` throws: part of its work (a conv's first
  // chunks, say) may already be queued, and a later copy of those buffers
  // must still wait for it.
  // While a step graph captures, the work goes on the compute stream alone:
  // the graph's launch is ordered as a whole (CudaStepGraph::run).
  template <class F>
  void compute(std::initializer_list<const void*> buffers, F&& enqueue) {
    const DeviceScope scope(device_);
    if (capturing_) return enqueue(order_.compute_stream());
    order_.before_compute(buffers);
    const ComputeIssued issued(order_, buffers);
    enqueue(order_.compute_stream());
  }

  // The same for work on another stream, `side` (NCCL's): it waits for the
  // compute and copies issued on `buffers`, and later ops on them wait for
  // it; everything else overlaps it (StreamOrder::before_side).
  template <class F>
  void side(cudaStream_t side, std::initializer_list<const void*> buffers, F&& enqueue) {
    const DeviceScope scope(device_);
    order_.before_side(side, buffers);
    try {
      enqueue();
    } catch (...) {
      order_.after_side(side, buffers);  // part of it may be queued
      throw;
    }
    order_.after_side(side, buffers);
  }

  // Checks wait() runs while it polls a fence (StreamOrder::Watchdog).
  void add_watchdog(const void* owner, StreamOrder::Watchdog check) {
    order_.add_watchdog(owner, std::move(check));
  }
  void remove_watchdog(const void* owner) noexcept { order_.remove_watchdog(owner); }

 private:
  friend class CudaStepGraph;

  // Where compute()'s kernels go: its stream, sized for this device.
  kernels::Launch on(cudaStream_t stream) const { return {stream, sm_count_}; }
  // upload and download: `bytes` from `from` to `to` on the copy stream;
  // `device` is the side in device memory, checked against its allocation.
  void transfer(void* to, const void* from, const void* device, std::size_t bytes,
                cudaMemcpyKind kind, const char* op);
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b,
            float beta, float* c);
  // cuDNN where it loaded and serves the shape, at fp32 (it computes in
  // float32 here; other precisions round the im2col path's GEMM operands).
  bool use_cudnn(const ConvShape& s) const {
    return cudnn_ && precision_ == Precision::fp32 && cudnn_->supports(s);
  }
  void count_path(const char* path) { ++paths_[path]; }
  void count_conv_path(const ConvShape& s) {
    if (cudnn_ && precision_ == Precision::fp32 && !use_cudnn(s))
      count_path("conv2d cudnn unsupported");
    count_path(use_cudnn(s) ? "conv2d cudnn" : "conv2d im2col");
  }
  int conv_chunk(const ConvShape& s) const;
  // conv2d_forward, with the relu in the epilogue when `relu`.
  void conv_forward(const float* x, const float* w, const float* b, float* y, float* workspace,
                    float* columns, const ConvShape& s, bool relu);
  // The im2col buffers of one chunk, at the start of the workspace.
  std::size_t conv_chunk_floats(const ConvShape& s) const;
  // Frees `buffer` (a DeviceBuffer or PinnedBuffer) once the streams drained.
  template <class Buffer>
  void free_when_idle(Buffer& buffer) noexcept;

  // Calls after_compute when it leaves scope, by return or by exception.
  class ComputeIssued {
   public:
    ComputeIssued(StreamOrder& order, std::initializer_list<const void*> buffers)
        : order_(order), buffers_(buffers) {}
    ~ComputeIssued() { order_.after_compute(buffers_); }
    ComputeIssued(const ComputeIssued&) = delete;
    ComputeIssued& operator=(const ComputeIssued&) = delete;

   private:
    StreamOrder& order_;
    std::initializer_list<const void*> buffers_;
  };

  int device_;
  std::string name_;
  int sm_count_ = 1;
  // Declared before the memory it orders, so the streams outlive the buffers
  // their queued work uses.
  StreamOrder order_;
  Cublas cublas_;
  DeviceBuffer<std::byte> cublas_workspace_;  // kCublasWorkspaceBytes
  std::unique_ptr<CudnnConvolutions> cudnn_;  // null: the im2col path
  std::unique_ptr<LtDense> lt_;               // fused dense epilogues (fp32)
  int compute_capability_ = 0;                // major * 10 + minor
  Precision precision_ = Precision::fp32;
  // The rounded operands of a mixed-precision GEMM; grown as needed.
  DeviceBuffer<std::uint16_t> half_operands_;
  std::size_t half_capacity_ = 0;
  DeviceBuffer<int> nonfinite_;         // all_finite's flag
  PinnedBuffer<int> nonfinite_host_;    // and where it is downloaded
  CudaStepGraph* capturing_ = nullptr;  // the step graph capturing the compute stream
  int step_graphs_ = 0;                 // live CudaStepGraphs
  PathCounts paths_;
  std::unordered_map<void*, DeviceBuffer<std::byte>> device_allocations_;
  std::unordered_map<void*, PinnedBuffer<std::byte>> host_allocations_;
};

}  // namespace pstrain::cuda
