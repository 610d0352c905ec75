#include "client/train/embedding_exchange.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>

namespace pstrain {
namespace {

// Keys two sorted unique lists share.
std::size_t common(const std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& b) {
  std::size_t both = 0;
  for (auto i = a.begin(), j = b.begin(); i != a.end() && j != b.end();) {
    if (*i < *j) {
      ++i;
    } else if (*j < *i) {
      ++j;
    } else {
      ++both, ++i, ++j;
    }
  }
  return both;
}

}  // namespace

EmbeddingExchange::EmbeddingExchange(Model& model, PsDataClient& client,
                                     const std::vector<TableSpec>& tables)
    : model_(model), client_(client) {
  for (const auto& input : model.embeddings()) {
    const auto table = std::ranges::find(tables, input.table, &TableSpec::name);
    if (table == tables.end())
      throw std::invalid_argument("embedding layer of table '" + input.table +
                                  "', which the run does not have");
    tables_.push_back(&*table);
  }
  grads_.resize(tables_.size());
}

// A pull still in flight writes its rows into this exchange's buffers when
// its reply arrives, so it is waited for (each wait has the client's
// deadline; a failure is the caller's recovery's to handle, not this
// destructor's). Pushes need no buffer of ours: the client copied them.
EmbeddingExchange::~EmbeddingExchange() {
  for (auto* pulls : {&current_.pulls, next_ ? &next_->pulls : nullptr}) {
    if (!pulls) continue;
    for (const auto ticket : *pulls) try {
        client_.wait(ticket);
      } catch (...) {
        // Failed or abandoned: the client holds nothing for it any more.
      }
  }
}

std::size_t EmbeddingExchange::ids_per_sample() const {
  return embedding_ids_per_sample(model_.embeddings());
}

std::vector<std::span<const std::uint64_t>> EmbeddingExchange::split(
    int n, std::span<const std::uint64_t> sample_ids) {
  const std::size_t per_sample = ids_per_sample();
  if (n < 1 || sample_ids.size() != static_cast<std::size_t>(n) * per_sample)
    throw std::invalid_argument("embedding exchange: " + std::to_string(sample_ids.size()) +
                                " ids for " + std::to_string(n) + " samples of " +
                                std::to_string(per_sample));
  split_.resize(tables_.size());
  std::vector<std::span<const std::uint64_t>> spans;
  for (std::size_t e = 0; e < tables_.size(); ++e) {
    const auto& input = model_.embeddings()[e];
    const auto k = static_cast<std::size_t>(input.ids);
    const auto column = static_cast<std::size_t>(input.first_id);
    auto& ids = split_[e];
    ids.clear();
    for (int s = 0; s < n; ++s) {
      const auto* first = sample_ids.data() + static_cast<std::size_t>(s) * per_sample + column;
      ids.insert(ids.end(), first, first + k);
    }
    spans.emplace_back(ids);
  }
  return spans;
}

void EmbeddingExchange::issue(Fetch& fetch, int n,
                              std::span<const std::span<const std::uint64_t>> ids) {
  if (ids.size() != tables_.size())
    throw std::invalid_argument("embedding exchange: ids for " + std::to_string(ids.size()) +
                                " layers, the model has " + std::to_string(tables_.size()));
  fetch.n = n;
  fetch.rows.resize(tables_.size());
  fetch.values.resize(tables_.size());
  fetch.pulls.clear();
  for (std::size_t e = 0; e < tables_.size(); ++e) {
    fetch.rows[e] = unique_rows(*tables_[e], ids[e]);
    fetch.values[e].resize(fetch.rows[e].keys.size() * tables_[e]->dim);
    fetch.pulls.push_back(
        client_.sparse_pull(tables_[e]->name, fetch.rows[e].keys, fetch.values[e]));
  }
}

void EmbeddingExchange::pull(int n, std::span<const std::span<const std::uint64_t>> ids) {
  wait_all(pushes_);
  if (next_) {  // a prefetch of another batch: its rows are of no use now
    wait_all(next_->pulls);
    next_.reset();
  }
  issue(current_, n, ids);
  wait_all(current_.pulls);
  last_rows_ = last_stale_ = 0;
  for (std::size_t e = 0; e < tables_.size(); ++e) {
    model_.set_embedding_batch(e, n, current_.values[e], current_.rows[e].inverse);
    last_rows_ += current_.rows[e].keys.size();
  }
}

void EmbeddingExchange::pull_samples(int n, std::span<const std::uint64_t> sample_ids) {
  if (!next_ || next_->n != n || !std::ranges::equal(next_->sample_ids, sample_ids))
    return pull(n, split(n, sample_ids));
  wait_all(pushes_);
  wait_all(next_->pulls);
  last_rows_ = last_stale_ = 0;
  for (std::size_t e = 0; e < tables_.size(); ++e) {
    const auto& now = next_->rows[e].keys;
    // Rows the batch before also pushed: pulled before that push applied.
    if (current_.rows.size() > e) last_stale_ += common(current_.rows[e].keys, now);
    last_rows_ += now.size();
  }
  current_ = std::move(*next_);
  next_.reset();
  for (std::size_t e = 0; e < tables_.size(); ++e)
    model_.set_embedding_batch(e, n, current_.values[e], current_.rows[e].inverse);
}

void EmbeddingExchange::prefetch(int n, std::span<const std::uint64_t> sample_ids) {
  if (next_) wait_all(next_->pulls);
  next_ = Fetch{};
  next_->sample_ids.assign(sample_ids.begin(), sample_ids.end());
  issue(*next_, n, split(n, sample_ids));
}

void EmbeddingExchange::push(float scale) {
  for (std::size_t e = 0; e < tables_.size(); ++e) {
    auto& grads = grads_[e];
    grads.resize(current_.values[e].size());
    model_.embedding_grads(e, grads);
    if (scale != 1.0f)
      for (float& g : grads) g *= scale;
    pushes_.push_back(client_.sparse_push(tables_[e]->name, current_.rows[e].keys, grads));
  }
}

void EmbeddingExchange::wait() {
  wait_all(pushes_);
  if (next_) wait_all(next_->pulls);
}

void EmbeddingExchange::wait_all(std::vector<PsDataClient::Ticket>& tickets) {
  // Each ticket is waited for even when one throws, so none is left behind.
  std::exception_ptr first;
  for (const auto ticket : tickets) try {
      client_.wait(ticket);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  tickets.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace pstrain
