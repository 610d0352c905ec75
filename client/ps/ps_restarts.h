#pragma once
// How a worker meets parameter servers that restarted (docs/failures.md,
// "Restarted servers").
//
// Every reply of a ps carries its generation, new at every process start
// (PsChannel::take_generation_change), and its hello reply says how many
// updates its chunks hold. A ps restored from its checkpoint holds that
// checkpoint's updates: the worker says hello again (which tells the ps how
// many updates it had acknowledged, so the ps logs and counts what its
// restore lost), re-pulls its weights and goes on. A ps that restarted
// without its checkpoint holds none: its chunks would be fresh values beside
// the other servers' trained ones, so the worker refuses it with an error
// naming it, and the run stops rather than silently mixing generations.
//
//   const auto updates = ps.hello();
//   refuse_fresh_servers(ps, updates, ps.report_progress(0) > 0);  // at start
//   ...
//   if (rejoin_restarted_servers(ps)) { re-pull every variable }  // each step
//
// Thread rules: the caller's PsClient, on the caller's thread.
#include <cstdint>
#include <vector>

namespace pstrain {

class PsClient;

// At start. Throws PsError naming each ps that holds no update although it
// owns chunks, when the run is already under way (`run_under_way`: ps 0 has
// counted samples): such a ps restarted without its checkpoint.
void refuse_fresh_servers(const PsClient& ps, const std::vector<std::uint64_t>& state_updates,
                          bool run_under_way);

// During training: says hello again to every ps whose generation changed
// since the last call. Throws PsError when such a ps holds no update
// although it had acknowledged some of this worker's. Returns whether any
// ps restarted, so the caller re-pulls before it pushes again.
bool rejoin_restarted_servers(PsClient& ps);

}  // namespace pstrain
