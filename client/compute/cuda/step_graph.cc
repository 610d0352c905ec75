#include "client/compute/cuda/step_graph.h"

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "client/compute/cuda/cuda_backend.h"

namespace pstrain::cuda {
namespace {

// Distinct optimizer configurations one step may apply (a trainer uses one).
constexpr std::size_t kMaxOptimizers = 8;

}  // namespace

CudaStepGraph::CudaStepGraph(CudaBackend& backend, StepWork work)
    : backend_(backend), work_(std::move(work)) {
  const DeviceScope scope(backend_.device_);
  cublas_workspace_ = device_buffer<std::byte>(CudaBackend::kCublasWorkspaceBytes);
  live_ = device_buffer<kernels::LiveStep>(kMaxOptimizers);
  ++backend_.step_graphs_;
}

CudaStepGraph::~CudaStepGraph() {
  --backend_.step_graphs_;
  try {
    const DeviceScope scope(backend_.device_);
    // A launch still in flight keeps the executable graph until it ends, but
    // not the workspaces it uses: those wait for the streams to drain.
    if (exec_) report_release_error(cudaGraphExecDestroy(exec_), "cudaGraphExecDestroy");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstrain cuda: %s\n", e.what());
  }
  backend_.free_when_idle(cublas_workspace_);
  backend_.free_when_idle(live_);
}

const kernels::LiveStep* CudaStepGraph::live_step(const OptimizerConfig& c) {
  for (std::size_t k = 0; k < configs_.size(); ++k) {
    const OptimizerConfig& o = configs_[k];
    // The only fields a LiveStep depends on, with the step and scale.
    if (o.lr == c.lr && o.beta1 == c.beta1 && o.beta2 == c.beta2) return live_.get() + k;
  }
  if (configs_.size() == kMaxOptimizers)
    throw std::length_error("a step graph applies more than " + std::to_string(kMaxOptimizers) +
                            " optimizer configurations");
  configs_.push_back(c);
  return live_.get() + configs_.size() - 1;
}

void CudaStepGraph::capture(const StepScalars& scalars) {
  cudaStream_t stream = backend_.order_.compute_stream();
  cublasHandle_t cublas = backend_.cublas_.get();
  configs_.clear();
  PSTRAIN_CUDA_CHECK(
      cublasSetWorkspace(cublas, cublas_workspace_.get(), CudaBackend::kCublasWorkspaceBytes));
  // Thread-local: another thread's CUDA calls (none of this backend's) do not
  // spoil the capture, while this thread's unsafe ones (a cudaMalloc, a
  // synchronization) fail it rather than run.
  cudaError_t began = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  cudaGraph_t graph = nullptr;
  cudaError_t ended = cudaSuccess;
  std::exception_ptr failure;
  if (began == cudaSuccess) {
    backend_.capturing_ = this;
    try {
      work_(scalars);
    } catch (...) {
      failure = std::current_exception();
    }
    backend_.capturing_ = nullptr;
    ended = cudaStreamEndCapture(stream, &graph);
  }
  // A failed launch inside the capture leaves its error behind as the last
  // one; clear it so that the next kernel's launch check does not report it.
  if (failure || began != cudaSuccess || ended != cudaSuccess) (void)cudaGetLastError();
  const cublasStatus_t restored = cublasSetWorkspace(cublas, backend_.cublas_workspace_.get(),
                                                     CudaBackend::kCublasWorkspaceBytes);
  if (failure) {
    if (graph) report_release_error(cudaGraphDestroy(graph), "cudaGraphDestroy");
    std::rethrow_exception(failure);
  }
  PSTRAIN_CUDA_CHECK(began);
  PSTRAIN_CUDA_CHECK(ended);
  const cudaError_t instantiated = cudaGraphInstantiate(&exec_, graph, 0);
  report_release_error(cudaGraphDestroy(graph), "cudaGraphDestroy");
  if (instantiated != cudaSuccess) exec_ = nullptr;
  PSTRAIN_CUDA_CHECK(instantiated);
  PSTRAIN_CUDA_CHECK(restored);
}

void CudaStepGraph::run(const StepScalars& scalars) {
  const DeviceScope scope(backend_.device_);
  check_dims(!backend_.capturing_, "step graph", "a step graph cannot run inside another");
  StreamOrder& order = backend_.order_;
  cudaStream_t stream = order.compute_stream();
  const bool replay = exec_ != nullptr;
  if (!replay) capture(scalars);
  order.before_compute_all();
  // Even a launch that fails may have queued work: later ops wait for it.
  struct Issued {
    StreamOrder& order;
    ~Issued() { order.after_compute_all(); }
  } issued{order};
  if (!configs_.empty()) {
    host_live_.clear();
    for (const OptimizerConfig& c : configs_)
      host_live_.push_back(
          kernels::LiveStep::of(opt::OptimizerStep::make(c, 1, scalars.step, scalars.lr_scale)));
    PSTRAIN_CUDA_CHECK(cudaMemcpyAsync(live_.get(), host_live_.data(),
                                       host_live_.size() * sizeof(kernels::LiveStep),
                                       cudaMemcpyHostToDevice, stream));
  }
  PSTRAIN_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
  backend_.count_path(replay ? "step_graph replayed" : "step_graph recorded");
}

}  // namespace pstrain::cuda
