#pragma once
// PsControlClient: a worker's control path to the parameter servers, in
// the spirit of ps-lite's Postoffice: the handshake, barriers, liveness,
// progress, the end of a worker, the key-value store on ps 0, snapshots and
// stats. Each call waits for its replies; none is resent (a heartbeat or a
// progress report must not count twice).
//
// Thread rules: the channel's (one thread).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "client/ps/kv_store.h"
#include "client/ps/ps_channel.h"

namespace pstrain {

class PsControlClient : public KvStore {
 public:
  explicit PsControlClient(PsChannel& channel);
  PsControlClient(const PsControlClient&) = delete;
  PsControlClient& operator=(const PsControlClient&) = delete;

  // Protocol version and run id handshake with every ps; throws PsError
  // naming the ps and what differs, or why the ps refuses this worker
  // index: held by another live process, asked again meanwhile for up to
  // takeover_grace_s (server/coordinator.h). Returns, per ps, the updates its
  // chunks hold (0: fresh values). Each hello also tells the ps how many
  // updates it acknowledged to this client, so a ps restored from a
  // checkpoint logs and counts the ones its restore lost.
  std::vector<std::uint64_t> hello();
  std::uint64_t hello(std::uint32_t server);  // the same with one ps
  // Chunk updates (push, push_pull, assign) ps `server` acknowledged.
  std::uint64_t acked_updates(std::uint32_t server) const;
  // The generation ps `server`'s replies carry, and whether it changed
  // since the last call (PsChannel: a ps restarted).
  std::uint64_t generation(std::uint32_t server) const;
  bool take_generation_change(std::uint32_t server);

  // Waits on ps 0 until `count` senders entered barrier `name`, with no
  // timeout of its own: it heartbeats every ps while it waits and calls
  // `while_waiting` with the global sample count each time.
  void barrier(const std::string& name, std::uint32_t count,
               const std::function<void(std::uint64_t global_samples)>& while_waiting = {});
  // Liveness, sent to every ps; returns the global samples counted by ps 0
  // so far.
  std::uint64_t heartbeat();
  // Progress to `servers`: ps 0 alone by default, which keeps the global
  // count (the heartbeat thread, client/ps/heartbeat.h, keeps every ps aware
  // the worker lives); returns the global samples so far as the first of
  // them counted, this report's included.
  std::uint64_t report_progress(std::uint64_t samples_since_last,
                                const std::vector<std::uint32_t>& servers = {0});
  // This worker's samples as ps 0 counted them (restored from a checkpoint
  // included): where a restarted worker resumes its shard.
  std::uint64_t samples_counted();
  // Tells every ps that this worker pushed its last step (a ps in mode
  // backup stops waiting for its gradients; wire::Progress).
  void finished_pushing();
  void done(std::uint64_t total_samples);  // tells every ps this worker finished

  // The key-value store on ps 0 (wire::kv_key); keep_alive() heartbeats.
  void kv_set(const std::string& key, std::span<const std::uint8_t> value) override;
  std::vector<std::uint8_t> kv_get(std::uint32_t writer, const std::string& key,
                                   double timeout_s) override;
  void keep_alive() override { heartbeat(); }

  std::string snapshot(std::uint32_t server);  // returns the snapshot's path
  std::string stats(std::uint32_t server);     // JSON
  void shutdown(std::uint32_t server);

 private:
  // A progress report to `servers`: (global samples, this worker's) as the
  // first of them counted.
  std::pair<std::uint64_t, std::uint64_t> progress(const std::vector<std::uint32_t>& servers,
                                                   std::uint64_t samples, bool finished_pushing);

  PsChannel& channel_;
};

}  // namespace pstrain
