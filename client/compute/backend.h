#pragma once
// The compute backend interface: the layer operations of the models, over
// memory the backend owns. The CPU backend (oneDNN or OpenBLAS) is the
// tested reference; the CUDA backend (libpstrain_cuda.so, loaded on demand)
// implements the same calls on a stream.
//
// Conventions: float32, row-major, images NCHW, convolutions stride 1 with no
// padding, pooling windows of size k with stride k. Pointers passed to the
// math calls point into the backend's memory (DeviceMemory::data()). Work may
// run asynchronously in issue order (CUDA: one compute stream); results are
// visible to the host only after a transfer and a fence.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "client/compute/embedding_shape.h"
#include "client/compute/interaction_shape.h"
#include "shared/all_finite.h"
#include "shared/config.h"
#include "shared/optimizer.h"

namespace pstrain {

class Backend;

// How many ops each implementation served (Backend::path_counts), keyed
// "OP PATH": "conv2d cudnn", "dense cublaslt refused", "step_graph replayed".
using PathCounts = std::map<std::string, std::uint64_t>;

// Memory owned by a backend, freed through it: DeviceMemory is device memory
// for CUDA and aligned host memory for the CPU; HostMemory is host memory
// suited for transfers to and from the backend (pinned for CUDA).
enum class MemoryKind { device, host };

template <MemoryKind Kind>
class BackendMemory {
 public:
  BackendMemory() = default;
  BackendMemory(Backend* owner, void* ptr, std::size_t bytes)
      : owner_(owner), ptr_(ptr), bytes_(bytes) {}
  BackendMemory(BackendMemory&& other) noexcept { swap(other); }
  BackendMemory& operator=(BackendMemory&& other) noexcept {
    BackendMemory tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  BackendMemory(const BackendMemory&) = delete;
  BackendMemory& operator=(const BackendMemory&) = delete;
  ~BackendMemory();

  template <class T = float>
  T* data() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void swap(BackendMemory& other) noexcept {
    std::swap(owner_, other.owner_);
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
  }
  Backend* owner_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

using DeviceMemory = BackendMemory<MemoryKind::device>;
using HostMemory = BackendMemory<MemoryKind::host>;

struct ConvShape {
  int n = 0, c = 0, h = 0, w = 0;  // input NCHW
  int filters = 0, kernel = 0;     // output: n x filters x out_h() x out_w()
  int out_h() const { return h - kernel + 1; }
  int out_w() const { return w - kernel + 1; }
};

// "n=64 c=1 h=28 w=28 filters=32 kernel=3", for messages.
inline std::string to_string(const ConvShape& s) {
  return "n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) + " h=" + std::to_string(s.h) +
         " w=" + std::to_string(s.w) + " filters=" + std::to_string(s.filters) +
         " kernel=" + std::to_string(s.kernel);
}

// The bound on conv2d_columns: 2^24 floats (64 MiB) per convolution layer.
inline constexpr std::size_t kConvKeptColumnsMax = std::size_t{1} << 24;

// The floats of a convolution's im2col matrix over its whole batch, or 0
// above kConvKeptColumnsMax: conv2d_columns of the backends that compute it.
inline std::size_t conv2d_im2col_columns(const ConvShape& s) {
  const std::size_t floats = std::size_t(s.c) * s.kernel * s.kernel * std::size_t(s.out_h()) *
                             std::size_t(s.out_w()) * std::size_t(s.n);
  return floats <= kConvKeptColumnsMax ? floats : 0;
}

struct PoolShape {
  int n = 0, c = 0, h = 0, w = 0;  // input NCHW
  int k = 2;                       // window and stride; the remainder is dropped
  int out_h() const { return h / k; }
  int out_w() const { return w / k; }
};

// Per-step values of a recorded step (StepGraph::run): the optimizer's
// update count (Adam's bias corrections) and learning-rate scale.
struct StepScalars {
  std::uint64_t step = 1;
  float lr_scale = 1;
};

// One training step's backend calls for a fixed batch, issued as a unit
// (Backend::make_step_graph). The CUDA backend captures them into a CUDA
// Graph on the first run() and replays it on later ones, one launch instead
// of dozens; other backends issue them afresh each time.
//
// A replay repeats the recorded calls with the recorded arguments, so the
// work must issue the same calls on the same buffers every time: math only
// (no transfers, fences, all_finite or axpby, which need the host), shapes
// and scale() factors fixed, and apply_optimizer given the scalars its work
// receives, which a replay reads afresh from device memory. Transfers stay
// outside, issued before or after run() in issue order as usual. A graph
// belongs to its backend and must not outlive it.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Issues the step. Throws where the backend cannot record it (a driver
  // that refuses the capture): nothing of the step has been issued then, and
  // the caller may run the work eagerly instead.
  virtual void run(const StepScalars& scalars) = 0;
};

using StepWork = std::function<void(const StepScalars&)>;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H100 ...)"
  // True when DeviceMemory is ordinary host memory, so the ps client can pull
  // into it and push from it directly.
  virtual bool host_accessible() const = 0;

  virtual DeviceMemory alloc(std::size_t bytes) = 0;
  virtual HostMemory alloc_host(std::size_t bytes) = 0;
  virtual void release(void* device_ptr) noexcept = 0;
  virtual void release_host(void* host_ptr) noexcept = 0;

  // Transfers in issue order with the math (CUDA: on a copy stream, ordered
  // against the compute stream with events). The host memory must stay valid
  // until a fence issued after the call has completed.
  virtual void upload(const void* host, void* device, std::size_t bytes) = 0;
  virtual void download(const void* device, void* host, std::size_t bytes) = 0;
  virtual void fill(float* device, float value, std::size_t n) = 0;

  // A fence completes when all work issued before it has finished.
  using Fence = std::uint64_t;
  virtual Fence fence() = 0;
  virtual bool fence_done(Fence fence) = 0;  // non-blocking
  virtual void wait(Fence fence) = 0;
  void synchronize() { wait(fence()); }

  // y[n x out] = x[n x in] * w[in x out] + b[out]
  virtual void dense_forward(const float* x, const float* w, const float* b, float* y, int n,
                             int in, int out) = 0;
  // dw = x^T dy, db = column sums of dy, dx = dy w^T (skipped when dx is null).
  // dw and db are overwritten, not accumulated.
  virtual void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                              float* db, int n, int in, int out) = 0;

  virtual void relu_forward(const float* x, float* y, std::size_t n) = 0;
  // dx = dy where y > 0, else 0 (y is the forward output).
  virtual void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) = 0;

  // Scratch floats the convolution needs for its im2col buffers, at the
  // current precision: size workspaces after set_precision. One workspace
  // may serve every convolution of a model in turn.
  virtual std::size_t conv2d_workspace(const ConvShape& s) const = 0;
  // Floats of a convolution's own buffer for the im2col matrix of its input
  // x, kept from forward for backward's weight gradient so that backward
  // does not compute it again: c*k*k * out_h*out_w * n floats (the columns
  // of the batch), or 0 where the convolution does not compute the matrix
  // (oneDNN, cuDNN) or the matrix is over kConvKeptColumnsMax floats (the
  // memory cost is one such buffer per convolution layer, beside its
  // activations). Below the bound it grows with s.n, so a buffer sized at
  // a model's largest batch serves the smaller ones. At the current
  // precision, like conv2d_workspace.
  virtual std::size_t conv2d_columns(const ConvShape&) const { return 0; }
  // w: filters x c x kernel x kernel, b: filters.
  //
  // columns: null, or a buffer of conv2d_columns(s) floats (never shared
  // with another layer) when that is not 0. Forward then leaves x's im2col
  // matrix in it, and backward reads the matrix there instead of computing
  // it: the caller passes backward the buffer only while it still holds the
  // matrix of this very x (unchanged since the last forward with it, same
  // shape and precision), any number of times. Backward writes nothing to
  // it. The matrix stays float32 (at a low precision the GEMMs round it as
  // they round a recomputed one), so the results are the same bits with or
  // without the buffer; without it (null), backward computes the matrix
  // again in the workspace. The model gives each convolution layer its own
  // buffer, allocated once, so steps stay capture-safe.
  virtual void conv2d_forward(const float* x, const float* w, const float* b, float* y,
                              float* workspace, float* columns, const ConvShape& s) = 0;
  virtual void conv2d_backward(const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, float* workspace, const float* columns,
                               const ConvShape& s) = 0;
  // conv2d_forward, then relu_forward on y in place: a convolution followed
  // by a relu. The CUDA backend applies the relu in the convolution's
  // epilogue (cuDNN's fused forward, or the im2col path's output kernel),
  // saving a pass over y; the default makes the two calls.
  virtual void conv2d_relu_forward(const float* x, const float* w, const float* b, float* y,
                                   float* workspace, float* columns, const ConvShape& s);

  // argmax: per output element, the flat input index of the chosen maximum.
  virtual void maxpool_forward(const float* x, float* y, std::int32_t* argmax,
                               const PoolShape& s) = 0;
  virtual void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx,
                                const PoolShape& s) = 0;

  // Mean softmax cross-entropy over the batch. Writes dlogits (already divided
  // by n), per-sample loss[n] and correct[n] (1 where argmax == label).
  virtual void softmax_xent(const float* logits, const std::int32_t* labels, float* dlogits,
                            float* loss, float* correct, int n, int classes) = 0;

  // Mean binary cross-entropy of one logit per sample (a click model's
  // output) against labels 0 or 1, by ew::bce_loss and ew::bce_grad: writes
  // dlogits (already divided by n), loss[n] and correct[n] (1 where the
  // logit's sign is the label's). A label other than 0 or 1 throws
  // std::invalid_argument on the CPU and makes its row NaN on a device.
  virtual void bce_logits(const float* logits, const std::int32_t* labels, float* dlogits,
                          float* loss, float* correct, int n) = 0;

  // DLRM's dot interaction (client/compute/interaction_shape.h): y's row
  // is x's first s.keep floats, then ew::interaction_dot of every pair of
  // x's vectors. Backward writes every dx by ew::interaction_grad.
  virtual void dot_interaction_forward(const float* x, float* y, const InteractionShape& s) = 0;
  virtual void dot_interaction_backward(const float* x, const float* dy, float* dx,
                                        const InteractionShape& s) = 0;

  // Embedding lookups (docs/embeddings.md). A bag: out[s, j] = the sum over
  // t < k, in order, of rows[inverse[s*k + t], j], times
  // ew::pool_scale(k, mean); else out[s, t*dim + j] = rows[inverse[s*k + t], j].
  virtual void embedding_forward(const float* rows, const std::int32_t* inverse, float* out,
                                 const EmbeddingShape& s) = 0;
  // Its backward, a segment sum onto the unique rows: drows[u, j] = the sum
  // over the occurrences o = s*k + t of row u, in the order `by_row` lists
  // them, of the gradient of o's columns (dout[s, j] for a bag, dout[s,
  // t*dim + j] else), times ew::pool_scale(k, mean) for a bag. by_row holds
  // the occurrences grouped by row, row u's at [offsets[u], offsets[u+1]).
  // Every row is written; no atomics, so every backend gives the same bits.
  virtual void embedding_backward(const float* dout, const std::int32_t* by_row,
                                  const std::int32_t* offsets, float* drows,
                                  const EmbeddingShape& s) = 0;
  // dst[r, c] = src[r, c] for r < rows, c < cols, rows `src_stride` and
  // `dst_stride` floats apart: a batch's features into the columns of a
  // wider activation.
  virtual void copy_columns(const float* src, std::size_t src_stride, float* dst,
                            std::size_t dst_stride, std::size_t rows, std::size_t cols) = 0;

  // Sync mode: x *= a (averaging all-reduced gradients), and the shared
  // optimizer step on backend memory (state slot-major, as in Optimizer).
  virtual void scale(float* x, float a, std::size_t n) = 0;
  virtual void apply_optimizer(const OptimizerConfig& config, float* w, const float* g,
                               float* state, std::size_t n, std::uint64_t step, float lr_scale) = 0;
  // The same step on every tensor of `tensors` (disjoint memory), with the
  // bits apply_optimizer gives each: a replica's whole update in one call.
  // The default calls apply_optimizer per tensor; the CUDA backend launches
  // one kernel over all of them, with nothing to allocate or synchronize.
  virtual void apply_optimizers(const OptimizerConfig& config,
                                std::span<const OptimizerTensor> tensors, std::uint64_t step,
                                float lr_scale);

  // Gradient accumulation (train.accumulate_steps): y = a x + b y; b == 0
  // ignores y's old contents (a fresh buffer may hold NaNs). The default
  // goes through host memory and synchronizes: correct on any backend, slow
  // on a device (the CPU and CUDA backends override it).
  virtual void axpby(float a, const float* x, float b, float* y, std::size_t n);

  // Mixed precision (train.precision). The arithmetic asked of a backend at
  // precision p != fp32: every GEMM (dense_forward, dense_backward and the
  // convolutions' products) takes its operands rounded to p to nearest even,
  // exactly as shared/low_precision.h rounds, accumulates in float32 and
  // writes float32; everything else, the optimizer included, stays float32
  // (the master weights). Where activations are stored in p, storing
  // rounds the same way, so the results agree with the CPU's up to the
  // order of float32 accumulation.
  //
  // precision_unavailable: "" when the backend can compute at p, else why
  // not ("OpenBLAS and oneDNN lack fp16 GEMMs"); the default: only fp32.
  virtual std::string precision_unavailable(Precision p) const;
  // Switches the GEMMs to p (for the whole backend, between steps). Throws
  // std::invalid_argument when precision_unavailable(p) is not empty; the
  // default accepts only fp32.
  virtual void set_precision(Precision p);
  // Whether none of the n floats at x is an infinity or a NaN: the fp16
  // loss scaler's overflow check (client/train/loss_scaler.h). Waits for the work
  // issued before it. The default downloads x and checks on the host.
  virtual bool all_finite(const float* x, std::size_t n);

  // Whether make_step_graph records (false: its graphs run the work eagerly,
  // which gains nothing). The default: false.
  virtual bool records_steps() const { return false; }

  // Which implementation served the ops issued so far, and how often: the
  // fast paths a backend takes where it can and the paths it falls back to
  // ("conv2d cudnn" or "conv2d im2col", "dense cublaslt" beside "dense
  // cublaslt refused", "step_graph recorded" and "step_graph replayed"), so
  // the worker's log and metrics, and tests, can tell a fast path that ran
  // from one that fell back in silence. A captured op counts once, when it
  // is recorded; its replays count as "step_graph replayed". Read it from
  // the thread that drives the backend. The default counts nothing.
  virtual PathCounts path_counts() const { return {}; }
  // A StepGraph of `work`; the default issues the work on every run().
  virtual std::unique_ptr<StepGraph> make_step_graph(StepWork work);
};

// The defaults are inline: libpstrain_cuda.so links none of the client's
// objects.
inline void Backend::axpby(float a, const float* x, float b, float* y, std::size_t n) {
  std::vector<float> hx(n), hy(n);
  download(x, hx.data(), n * sizeof(float));
  if (b != 0) download(y, hy.data(), n * sizeof(float));
  synchronize();
  for (std::size_t i = 0; i < n; ++i) hy[i] = b != 0 ? a * hx[i] + b * hy[i] : a * hx[i];
  upload(hy.data(), y, n * sizeof(float));
  synchronize();
}

inline void Backend::conv2d_relu_forward(const float* x, const float* w, const float* b, float* y,
                                         float* workspace, float* columns, const ConvShape& s) {
  conv2d_forward(x, w, b, y, workspace, columns, s);
  relu_forward(y, y, std::size_t(s.n) * s.filters * s.out_h() * s.out_w());
}

inline void Backend::apply_optimizers(const OptimizerConfig& config,
                                      std::span<const OptimizerTensor> tensors, std::uint64_t step,
                                      float lr_scale) {
  for (const OptimizerTensor& t : tensors)
    apply_optimizer(config, t.w, t.g, t.state, t.n, step, lr_scale);
}

inline std::string Backend::precision_unavailable(Precision p) const {
  return p == Precision::fp32 ? ""
                              : "its GEMMs compute in fp32 only, not " + std::string(to_string(p));
}

inline void Backend::set_precision(Precision p) {
  const std::string why = precision_unavailable(p);
  if (!why.empty())
    throw std::invalid_argument("train.precision=" + std::string(to_string(p)) +
                                " is not available on " + name() + ": " + why);
}

inline bool Backend::all_finite(const float* x, std::size_t n) {
  std::vector<float> host(n);
  download(x, host.data(), n * sizeof(float));
  synchronize();
  return pstrain::all_finite(host);
}

inline std::unique_ptr<StepGraph> Backend::make_step_graph(StepWork work) {
  class Eager final : public StepGraph {
   public:
    explicit Eager(StepWork work) : work_(std::move(work)) {}
    void run(const StepScalars& scalars) override { work_(scalars); }

   private:
    StepWork work_;
  };
  return std::make_unique<Eager>(std::move(work));
}

template <MemoryKind Kind>
BackendMemory<Kind>::~BackendMemory() {
  if (!ptr_) return;
  if constexpr (Kind == MemoryKind::device) {
    owner_->release(ptr_);
  } else {
    owner_->release_host(ptr_);
  }
}

}  // namespace pstrain
