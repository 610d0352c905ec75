#pragma once
// Steps through the parameter servers (modes async, ssp and backup; the ps's
// consistency policy tells them apart, server/consistency/): pull, forward
// and backward on one batch (or train.accumulate_steps micro-batches, their
// gradients averaged: client/train/grad_accumulator.h), push, never waiting
// for other workers. A step is one push of every variable; the ps's clocks
// (ssp) and a restart's resume point count them.
//
// Each variable's gradient goes out as a push_pull the moment backward has
// produced it, so the ps applies it (and the reply brings the new weights)
// while backward still runs on earlier layers; the next step starts once
// every reply has landed. On backends whose memory the host cannot reach
// (CUDA), gradients are downloaded into pinned buffers and pushed as each
// download's fence completes, and the pulled weights are uploaded before the
// next forward.
//
// train.precision fp16 (where the backend computes it) scales the loss
// (client/train/loss_scaler.h): the step's gradients are pushed after
// backward, once all are known to be finite, and a step with an overflow
// pushes nothing (the ps sees a late step: ssp's clock moves on, backup waits
// for others).
//
// train.pipeline: 1 (modes async and ssp) takes the wait off the step. Each gradient is copied
// out of the model's memory and sent from there, its reply stays in the
// ZeroMQ messages it came in (client/ps/received_values.h) until the
// landing reads it into the model, and the step ends without waiting for it: step t+1
// computes on the weights step t-1's replies brought (waited for at the end
// of step t), while step t's requests travel and the ps applies them. Each
// update is one step staler, which the pushes' versions carry to the ps
// (the staleness metrics and optimizer.staleness_lr count it). The
// weights it computes on are predicted (train.weight_prediction,
// client/train/weight_predictor.h): the landed ones continued along their
// last change, standing in for the update still in flight. The last step
// waits for everything and keeps the landed weights as they are.
//
// A ps that restarts (client/ps/ps_restarts.h) is met before the next step:
// the worker says hello again and re-pulls every variable, or stops with an
// error naming a ps that restarted without its checkpoint.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "client/ps/data_client.h"
#include "client/train/grad_accumulator.h"
#include "client/train/host_views.h"
#include "client/train/loss_scaler.h"
#include "client/train/step_strategy.h"
#include "client/train/weight_predictor.h"

namespace pstrain {

class PsStep final : public StepStrategy {
 public:
  PsStep(const TrainContext& context, StepMetrics& metrics);

  std::uint64_t start(std::uint64_t resume_step) override;
  void begin(std::uint64_t step) override;
  void accumulate(int n) override;
  void issue(std::uint64_t step, int n) override;
  void finish(std::uint64_t step, bool last) override;
  // Nothing to recover: no peer is all-reduced with.
  bool recover(const CommError&) override { return false; }
  // Tells the ps this worker pushes no more (backup stops waiting for it).
  void end() override;

 private:
  using Clock = std::chrono::steady_clock;
  void pull_all();
  void upload_weights();
  // Pushes variable i's gradient and pulls its new weights.
  void send(std::size_t variable);
  // train.pipeline: one step's requests, sent from buffers of their own
  // and received where they arrive (per variable), so the next step
  // computes meanwhile.
  struct InFlight {
    std::vector<std::vector<float>> grads;
    std::vector<ReceivedValues> weights;
    std::vector<std::vector<std::uint64_t>> versions;  // of the weights received
    std::vector<std::size_t> sent;                     // the variables
    std::vector<PsDataClient::Ticket> tickets;
    Clock::time_point first_send{};  // {}: nothing sent
  };
  // Waits for `f`'s replies and puts the weights they brought into the
  // model's host memory (versions adopted: the next pushes are computed on
  // them), predicted where `predict`.
  void land(InFlight& f, bool predict);
  // Runs `wait` (for replies), saying what a ps that restarted without its
  // checkpoint is rather than the errors it answers with.
  void await(const std::function<void()>& wait);
  // Variable i's gradient is in the model's memory: on its way to the ps
  // (not yet where fp16 checks the whole step first).
  void grad_issued(std::size_t variable);

  const TrainContext& context_;
  const HostViews host_;
  const bool pipelined_;
  std::array<InFlight, 2> flights_;  // by the parity of the step
  WeightPredictor predictor_;        // used by pipelined steps only
  std::uint64_t step_ = 0;
  // After host_ and flights_: abandons requests that would outlive their buffers.
  const PsRequestsGuard requests_;
  GradAccumulator accumulator_;
  std::optional<LossScaler> scaler_;
  // Gradients downloading into host_ (backends the host cannot reach), in
  // the order backward issued them.
  struct Pending {
    std::size_t variable;
    Backend::Fence fence;
  };
  std::deque<Pending> pending_;
  Clock::time_point first_send_{};  // of the current step; {}: none yet
  Histogram& push_pull_;
  Histogram& wait_;
  Histogram& staleness_;
  Gauge& max_staleness_;
  Gauge& kept_messages_;
  Counter& ps_restarts_;
};

}  // namespace pstrain
