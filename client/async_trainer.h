#pragma once
// The asynchronous training loop of one worker: pull, forward and backward on
// one batch, push, never waiting for other workers.
//
// Each variable's gradient goes out as a push_pull the moment backward has
// produced it, so the ps applies it (and the reply brings the new weights)
// while backward still runs on earlier layers; the next step starts once
// every reply has landed. On backends whose memory the host cannot reach
// (CUDA), gradients are downloaded into pinned buffers and pushed as each
// download's fence completes, and the pulled weights are uploaded before the
// next forward.
#include <cstdint>

#include "client/dataset.h"
#include "client/train_loop.h"
#include "shared/config.h"
#include "shared/metrics.h"

namespace pstrain {

class Backend;
class Model;
class PsClient;

class AsyncTrainer {
 public:
  AsyncTrainer(const ClusterConfig& config, std::uint32_t index, Backend& backend,
               Model& model, PsClient& ps, WorkerShard& shard, MetricsFile& metrics);
  AsyncTrainer(const AsyncTrainer&) = delete;
  AsyncTrainer& operator=(const AsyncTrainer&) = delete;

  void on_progress(ProgressHook hook) { hook_ = std::move(hook); }
  TrainSummary run();

 private:
  const ClusterConfig& config_;
  std::uint32_t index_;
  Backend& backend_;
  Model& model_;
  PsClient& ps_;
  WorkerShard& shard_;
  MetricsFile& metrics_;
  ProgressHook hook_;
};

}  // namespace pstrain
