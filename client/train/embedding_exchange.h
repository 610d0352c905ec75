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
// this worker before it. Every wait has the client's deadline.
//
// Thread rules: one thread uses an exchange, the one that drives the model.
#include <cstdint>
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

  // A batch of n samples: ids[e] holds layer e's n x ids ids, sample-major.
  // Waits for the previous push, pulls the rows and hands them to the model.
  void pull(int n, std::span<const std::span<const std::uint64_t>> ids);
  // After the model's forward_backward: pushes every layer's row gradients
  // (waited for by the next pull or by wait()).
  void push();
  void wait();

  // Unique rows of the last batch, over all layers (metrics, tests).
  std::size_t last_unique_rows() const;

 private:
  struct Layer {
    const TableSpec* table;
    UniqueRows rows;
    std::vector<float> values, grads;
  };
  Model& model_;
  PsDataClient& client_;
  std::vector<Layer> layers_;
  std::vector<PsDataClient::Ticket> pushes_;
};

}  // namespace pstrain
