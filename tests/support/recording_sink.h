#pragma once
// A ReplySink for unit tests of the ps's handlers: keeps every reply, and
// every update a handler says it took while holding its reply, and every
// step mode backup says it applied.
#include <cstdint>
#include <vector>

#include "server/request.h"

namespace pstrain::ps {

struct Sent {
  Peer to;
  wire::Header header;
  ReplyPayload payload;
};

class RecordingSink : public ReplySink {
 public:
  void send(const Peer& to, Reply reply) override {
    sent.push_back({to, std::move(reply.header), std::move(reply.payload)});
  }
  void accepted(const wire::Header& request, std::uint64_t version) override {
    accepted_ids.push_back(request.request_id);
    (void)version;
  }
  struct Step {
    wire::StepRequest step;
    std::vector<float> mean;
    std::vector<std::uint64_t> contributors;  // request ids
  };
  void applied_step(const wire::StepRequest& step, std::span<const float> mean,
                    std::span<const Request> contributors) override {
    Step s{step, {mean.begin(), mean.end()}, {}};
    for (const auto& c : contributors) s.contributors.push_back(c.header.request_id);
    steps.push_back(std::move(s));
  }
  std::vector<Sent> sent;
  std::vector<std::uint64_t> accepted_ids;  // request ids, in order
  std::vector<Step> steps;
};

}  // namespace pstrain::ps
