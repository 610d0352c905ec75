#include "client/train/embedding_exchange.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pstrain {

EmbeddingExchange::EmbeddingExchange(Model& model, PsDataClient& client,
                                     const std::vector<TableSpec>& tables)
    : model_(model), client_(client) {
  for (const auto& input : model.embeddings()) {
    const auto table = std::ranges::find(tables, input.table, &TableSpec::name);
    if (table == tables.end())
      throw std::invalid_argument("embedding layer of table '" + input.table +
                                  "', which the run does not have");
    layers_.push_back({&*table, {}, {}, {}});
  }
}

void EmbeddingExchange::pull(int n, std::span<const std::span<const std::uint64_t>> ids) {
  if (ids.size() != layers_.size())
    throw std::invalid_argument("embedding exchange: ids for " + std::to_string(ids.size()) +
                                " layers, the model has " + std::to_string(layers_.size()));
  wait();
  std::vector<PsDataClient::Ticket> pulls;
  for (std::size_t e = 0; e < layers_.size(); ++e) {
    Layer& layer = layers_[e];
    layer.rows = unique_rows(*layer.table, ids[e]);
    layer.values.resize(layer.rows.keys.size() * layer.table->dim);
    pulls.push_back(client_.sparse_pull(layer.table->name, layer.rows.keys, layer.values));
  }
  for (const auto ticket : pulls) client_.wait(ticket);
  for (std::size_t e = 0; e < layers_.size(); ++e)
    model_.set_embedding_batch(e, n, layers_[e].values, layers_[e].rows.inverse);
}

void EmbeddingExchange::push() {
  for (std::size_t e = 0; e < layers_.size(); ++e) {
    Layer& layer = layers_[e];
    layer.grads.resize(layer.values.size());
    model_.embedding_grads(e, layer.grads);
    pushes_.push_back(client_.sparse_push(layer.table->name, layer.rows.keys, layer.grads));
  }
}

void EmbeddingExchange::wait() {
  // Each ticket is waited for even when one throws, so none is left behind.
  std::exception_ptr first;
  for (const auto ticket : pushes_) try {
      client_.wait(ticket);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  pushes_.clear();
  if (first) std::rethrow_exception(first);
}

std::size_t EmbeddingExchange::last_unique_rows() const {
  std::size_t rows = 0;
  for (const auto& layer : layers_) rows += layer.rows.keys.size();
  return rows;
}

}  // namespace pstrain
