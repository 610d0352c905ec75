#include "client/ps/ps_restarts.h"

#include <string>

#include "client/ps/ps_client.h"
#include "shared/log.h"

namespace pstrain {
namespace {

std::string refusal(std::uint32_t server) {
  return "ps " + std::to_string(server) +
         " restarted without its checkpoint: it serves fresh values while the run is under "
         "way, and mixing them with the other servers' trained ones would corrupt the model "
         "(restart it with --restore latest; tools/launch does)";
}

}  // namespace

void refuse_fresh_servers(const PsClient& ps, const std::vector<std::uint64_t>& state_updates,
                          bool run_under_way) {
  if (!run_under_way) return;
  std::string refused;
  for (std::uint32_t s = 0; s < state_updates.size(); ++s)
    if (state_updates[s] == 0 && ps.map().bytes_on(s) > 0)
      refused += (refused.empty() ? "" : "; ") + refusal(s);
  if (!refused.empty()) throw PsError(refused);
}

bool rejoin_restarted_servers(PsClient& ps) {
  bool restarted = false;
  for (std::uint32_t s = 0; s < ps.map().servers(); ++s) {
    if (!ps.take_generation_change(s)) continue;
    restarted = true;
    const auto updates = ps.hello(s);
    if (updates == 0 && ps.acked_updates(s) > 0) throw PsError(refusal(s));
    log("ps ", s, " restarted (generation ", ps.generation(s), ", its chunks hold ", updates,
        " updates); re-pulling the weights");
  }
  return restarted;
}

}  // namespace pstrain
