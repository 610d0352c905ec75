#include "client/ps/received_values.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <zmq.hpp>

namespace pstrain {
namespace {

std::atomic<std::uint64_t> g_kept{0};

}  // namespace

ReceivedValues::ReceivedValues(std::size_t size) : size_(size) {}

ReceivedValues::~ReceivedValues() { release(); }

ReceivedValues::ReceivedValues(ReceivedValues&& other) noexcept
    : size_(other.size_), buffer_(std::move(other.buffer_)), kept_(std::move(other.kept_)) {
  other.kept_.clear();
}

ReceivedValues& ReceivedValues::operator=(ReceivedValues&& other) noexcept {
  if (this == &other) return *this;
  release();
  size_ = other.size_;
  buffer_ = std::move(other.buffer_);
  kept_ = std::move(other.kept_);
  other.kept_.clear();
  return *this;
}

std::vector<std::span<const float>> ReceivedValues::pieces() const {
  std::vector<std::span<const float>> out;
  const std::span<const float> buffer(buffer_);
  const auto from_buffer = [&](std::size_t at, std::size_t count) {
    if (buffer.empty())
      throw std::logic_error("received values: " + std::to_string(count) + " values at " +
                             std::to_string(at) + " were never received");
    out.push_back(buffer.subspan(at, count));
  };
  std::size_t at = 0;
  for (const auto& k : kept_) {
    if (k.offset > at) from_buffer(at, k.offset - at);
    out.emplace_back(k.message->data<float>(), k.count);
    at = k.offset + k.count;
  }
  if (at < size_) from_buffer(at, size_ - at);
  return out;
}

void ReceivedValues::release() {
  g_kept -= kept_.size();
  kept_.clear();
}

std::size_t ReceivedValues::kept() const { return kept_.size(); }

std::uint64_t ReceivedValues::kept_in_process() { return g_kept.load(); }

void ReceivedValues::forget(std::size_t offset, std::size_t count) {
  if (offset > size_ || count > size_ - offset)
    throw std::out_of_range("received values: [" + std::to_string(offset) + ", +" +
                            std::to_string(count) + ") outside " + std::to_string(size_) +
                            " values");
  const auto it = std::ranges::find_if(kept_, [&](const Kept& k) { return k.offset == offset; });
  if (it != kept_.end()) {
    kept_.erase(it);
    --g_kept;
  }
}

std::span<float> ReceivedValues::buffer_for(std::size_t offset, std::size_t count) {
  forget(offset, count);
  if (buffer_.empty()) buffer_.resize(size_);
  return std::span<float>(buffer_).subspan(offset, count);
}

bool ReceivedValues::keep(std::size_t offset, std::size_t count, zmq::message_t& message) {
  forget(offset, count);  // checks the range
  if (message.size() != count * sizeof(float)) return false;
  // Checked where the values will be read: a small message holds them
  // inside itself, so moving it moves them.
  auto taken = std::make_unique<zmq::message_t>(std::move(message));
  if (reinterpret_cast<std::uintptr_t>(taken->data()) % alignof(float) != 0) {
    message = std::move(*taken);
    return false;
  }
  const auto at = std::ranges::lower_bound(kept_, offset, {}, &Kept::offset);
  kept_.insert(at, Kept{offset, count, std::move(taken)});
  ++g_kept;
  return true;
}

}  // namespace pstrain
