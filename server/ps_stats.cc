#include "server/ps_stats.h"

#include <sstream>

#include "shared/messages.h"

namespace pstrain::ps {

PsStats::PsStats(std::uint32_t ps_index, Clock::time_point started)
    : ps_index_(ps_index), started_(started) {}

std::string PsStats::json(const ChunkStore& store, const Coordinator::Figures& coordinator,
                          Clock::time_point now) const {
  std::ostringstream j;
  j << "{\"ps\":" << ps_index_ << ",\"requests\":{";
  for (std::uint8_t op = 1; op <= wire::kMaxOp; ++op)
    j << (op > 1 ? "," : "") << '"' << wire::to_string(static_cast<wire::Op>(op))
      << "\":" << requests_[op];
  const auto& s = store.stats();
  j << "},\"errors\":" << errors_ << ",\"malformed\":" << malformed_
    << ",\"bytes_in\":" << bytes_in_ << ",\"bytes_out\":" << bytes_out_
    << ",\"optimizer_seconds\":" << s.optimizer_seconds << ",\"updates\":" << s.updates
    << ",\"copies_on_write\":" << s.copies_on_write << ",\"chunks\":" << store.size()
    << ",\"elements\":" << store.elements() << ",\"version_sum\":" << store.version_sum()
    << ",\"version_max\":" << store.version_max()
    << ",\"global_samples\":" << coordinator.global_samples
    << ",\"parked_barrier\":" << coordinator.parked_barrier
    << ",\"parked_kv_get\":" << coordinator.parked_kv_get
    << ",\"uptime_seconds\":" << std::chrono::duration<double>(now - started_).count() << "}";
  return j.str();
}

void PsStats::add_handler(Handlers& handlers, ReplySink& sink, const ChunkStore& store,
                          const Coordinator& coordinator) const {
  handlers.on(wire::Op::stats, [this, &sink, &store, &coordinator](const Request& request) {
    Reply reply{wire::reply_to(request.header), {}};
    wire::StatsReply{json(store, coordinator.figures(), request.received)}.write(reply.header);
    sink.send(request.from, std::move(reply));
  });
}

}  // namespace pstrain::ps
