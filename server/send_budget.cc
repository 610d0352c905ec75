#include "server/send_budget.h"

namespace pstrain::ps {

SendBudget::SendBudget(std::size_t per_peer, std::size_t total)
    : per_peer_(per_peer),
      total_limit_(total),
      total_(std::make_shared<std::atomic<std::size_t>>(0)) {}

SendBudget::Claim::Claim(std::shared_ptr<std::atomic<std::size_t>> peer,
                         std::shared_ptr<std::atomic<std::size_t>> total, std::size_t bytes)
    : peer_(std::move(peer)), total_(std::move(total)), bytes_(bytes) {}

SendBudget::Claim::~Claim() {
  peer_->fetch_sub(bytes_);
  total_->fetch_sub(bytes_);
}

std::size_t SendBudget::cost(std::size_t header_bytes, const ReplyPayload& payload) {
  // The identity, header and payload frames.
  std::size_t bytes = header_bytes + 2 * kFrameOverhead;
  if (std::holds_alternative<ValueBuffer>(payload)) bytes += kFrameOverhead;
  if (const auto* b = std::get_if<SharedBytes>(&payload)) bytes += kFrameOverhead + (*b)->size();
  // A reply's own copy in 16 bits, unlike a chunk's buffer, is memory the
  // peer's reading holds.
  if (const auto* h = std::get_if<HalfValues>(&payload))
    bytes += kFrameOverhead + h->bits->size() * sizeof(std::uint16_t);
  return bytes;
}

std::unique_ptr<SendBudget::Claim> SendBudget::claim(const Peer& peer, std::size_t bytes) {
  auto& count = peers_[peer];
  if (!count) count = std::make_shared<std::atomic<std::size_t>>(0);
  // Only this thread adds, so what is read here can only shrink meanwhile.
  if (count->load() + bytes > per_peer_ || total_->load() + bytes > total_limit_) return nullptr;
  count->fetch_add(bytes);
  total_->fetch_add(bytes);
  return std::unique_ptr<Claim>(new Claim(count, total_, bytes));
}

std::size_t SendBudget::queued(const Peer& peer) const {
  const auto it = peers_.find(peer);
  return it == peers_.end() ? 0 : it->second->load();
}

std::size_t SendBudget::queued() const { return total_->load(); }

void SendBudget::forget_idle() {
  std::erase_if(peers_, [](const auto& entry) { return entry.second->load() == 0; });
}

}  // namespace pstrain::ps
