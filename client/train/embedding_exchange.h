#pragma once
// The rows a model's embedding layers need (client/model/model.h), moved
// between the parameter servers and the model (docs/embeddings.md): for a
// batch, each layer's ids become unique row keys and an inverse index
// (unique_rows), the rows are pulled from the ps that hold them (every layer
// and every ps at once), and the model gets them; after the backward, each
// layer's row gradients (the backend's segment sums) are pushed back.
//
// A push is waited for at the next pull, so it overlaps whatever the caller
// does in between (the next batch's loading), and a pull sees every push of
// this worker before it. With a prefetch (train.prefetch) the next batch's
// pull is issued before the current batch computes, so it does not see the
// current batch's push: the rows both batches touch are one update stale,
// and last_stale_rows() counts them. Every wait has the client's deadline.
//
// Thread rules: one thread uses an exchange, the one that drives the model.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "client/model/model.h"
#include "client/ps/data_client.h"
#include "shared/embedding.h"

namespace pstrain {

class EmbeddingExchange {
 public:
  // `tables`: the run's (ClusterConfig::tables), naming every table the
  // model's embedding layers use. `model` and `client` must outlive it.
  EmbeddingExchange(Model& model, PsDataClient& client, const std::vector<TableSpec>& tables);
  ~EmbeddingExchange();
  EmbeddingExchange(const EmbeddingExchange&) = delete;
  EmbeddingExchange& operator=(const EmbeddingExchange&) = delete;

  // Ids per sample the layers take together (embedding_ids_per_sample).
  std::size_t ids_per_sample() const;
  // A batch of n samples from a dataset's ids (n x ids_per_sample(),
  // sample-major): waits for the previous push, then takes the prefetched
  // rows when prefetch() was given this very batch, else pulls them, and
  // hands them to the model.
  void pull_samples(int n, std::span<const std::uint64_t> sample_ids);
  // The same with each layer's ids apart: ids[e] holds layer e's n x ids.
  void pull(int n, std::span<const std::span<const std::uint64_t>> ids);
  // Issues the pulls of the batch after the current one (given as to
  // pull_samples) without waiting for them or for the current batch's push.
  void prefetch(int n, std::span<const std::uint64_t> sample_ids);
  // After the model's forward_backward: pushes every layer's row gradients
  // times `scale` (1/k of k accumulated micro-batches), waited for by the
  // next pull or by wait().
  void push(float scale = 1.0f);
  // Waits for the pushes and any prefetch in flight.
  void wait();

  // Unique rows of the last batch, over all layers, and how many of them a
  // prefetch pulled before this worker's push of the batch before (which
  // also had them) was applied.
  std::size_t last_rows() const { return last_rows_; }
  std::size_t last_stale_rows() const { return last_stale_; }

 private:
  // One batch's rows per layer, and the pulls that fill them.
  struct Fetch {
    std::vector<UniqueRows> rows;
    std::vector<std::vector<float>> values;
    std::vector<PsDataClient::Ticket> pulls;
    std::vector<std::uint64_t> sample_ids;  // a prefetch's batch, to match it
    int n = 0;
  };
  // Issues the pulls of a batch's rows into `fetch`.
  void issue(Fetch& fetch, int n, std::span<const std::span<const std::uint64_t>> ids);
  // Per layer, a batch's ids apart from a dataset's sample-major ids.
  std::vector<std::span<const std::uint64_t>> split(int n, std::span<const std::uint64_t> ids);
  void wait_all(std::vector<PsDataClient::Ticket>& tickets);

  Model& model_;
  PsDataClient& client_;
  std::vector<const TableSpec*> tables_;   // per layer
  Fetch current_;                          // the batch the model holds
  std::optional<Fetch> next_;              // a prefetched batch
  std::vector<std::vector<float>> grads_;  // per layer
  std::vector<PsDataClient::Ticket> pushes_;
  std::vector<std::vector<std::uint64_t>> split_;  // split()'s per-layer ids
  std::size_t last_rows_ = 0, last_stale_ = 0;
};

}  // namespace pstrain
