#pragma once
// CudaStepGraph: Backend::make_step_graph on the CUDA backend. The first
// run() captures the step's work on the compute stream into a CUDA graph
// (nothing runs while it is captured) and launches it; later runs launch it
// again: one launch for the dozens of kernels and GEMMs of a step.
//
// What a replay must see afresh lives in device memory at addresses fixed
// when it was captured: the batch and the weights in their backend buffers
// (uploaded outside the graph, in issue order), and the optimizer's
// per-step fields (kernels::LiveStep, one slot per optimizer configuration
// the work used), which run() computes on the host exactly as an eager
// apply_optimizer does and copies in before each launch.
//
// cuBLAS gets a workspace of the graph's own while it captures (a captured
// GEMM keeps its workspace address); the backend's eager GEMMs use one of
// the same size, so both pick the same algorithms and compute the same bits.
// cuBLASLt's and cuDNN's workspaces are shared: everything that uses them
// runs on the one compute stream, one op after another.
//
// To StreamOrder a launch is one compute op on every allocation: it waits
// for all copies and side work issued before it, and every later op on any
// buffer waits for it. A graph must not outlive its backend.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "client/compute/backend.h"
#include "client/compute/cuda/cuda_memory.h"
#include "client/compute/cuda/kernels.h"

namespace pstrain::cuda {

class CudaBackend;

class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(CudaBackend& backend, StepWork work);
  ~CudaStepGraph() override;
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;

  void run(const StepScalars& scalars) override;

  // While this graph captures: where the kernels of apply_optimizer(config,
  // ...) read their LiveStep on each replay.
  const kernels::LiveStep* live_step(const OptimizerConfig& config);

 private:
  // Captures work_ into exec_; on failure ends the capture, restores the
  // backend and throws, with nothing issued.
  void capture(const StepScalars& scalars);

  CudaBackend& backend_;
  StepWork work_;
  DeviceBuffer<std::byte> cublas_workspace_;
  DeviceBuffer<kernels::LiveStep> live_;      // one slot per entry of configs_
  std::vector<OptimizerConfig> configs_;      // the optimizers the work applies
  std::vector<kernels::LiveStep> host_live_;  // pageable: reusable once copied
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace pstrain::cuda
