#pragma once
// ReceivedValues: a variable's new values as a push_pull brought them,
// read where they arrived. Each chunk's float32 values stay in the ZeroMQ
// message they came in, kept here until the caller has read them
// (release()), instead of being copied on arrival into a buffer that is
// read once more later (PsDataClient::push_pull with ReceivedValues: the
// pipelined step, client/train/ps_step.h, reads them once, into the
// model). Values that cannot be read in place go into a buffer of this
// object's own, allocated (whole) only once one does: 16-bit values on the
// wire (widened) and a frame that ZeroMQ placed at an address not aligned
// for floats (copied).
//
// Memory: at most one message per chunk of the variable is kept (a chunk
// received again replaces its message), and nothing after release().
// kept_in_process() counts the messages every instance keeps, for the
// tests and the worker's metrics to check that none outlives its step.
//
// Thread rules: the ps client's (one thread); kept_in_process() from any.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace zmq {
class message_t;
}  // namespace zmq

namespace pstrain {

class ReceivedValues {
 public:
  explicit ReceivedValues(std::size_t size);
  ~ReceivedValues();
  ReceivedValues(ReceivedValues&&) noexcept;
  ReceivedValues& operator=(ReceivedValues&&) noexcept;

  std::size_t size() const { return size_; }
  // The variable's values in order, as contiguous pieces (a kept message's,
  // or a run of the buffer's). Valid until release(), or until a reply of
  // a later push_pull into this object is received. Throws
  // std::logic_error when values were never received and no buffer exists
  // (once one does, a range no reply filled reads as what it held before).
  std::vector<std::span<const float>> pieces() const;
  // Lets every kept message go.
  void release();
  std::size_t kept() const;
  // Bytes of the buffer: 0 until values that could not be kept came.
  std::size_t buffer_bytes() const { return buffer_.size() * sizeof(float); }
  static std::uint64_t kept_in_process();

  // For PsDataClient: the values at [offset, offset + count) came as the
  // float32 payload of `message`; keeps (takes) it and returns true when
  // they can be read there, else leaves it and returns false.
  bool keep(std::size_t offset, std::size_t count, zmq::message_t& message);
  // For PsDataClient: where values that cannot be kept go; forgets a kept
  // message for [offset, offset + count).
  std::span<float> buffer_for(std::size_t offset, std::size_t count);

 private:
  struct Kept {
    std::size_t offset = 0, count = 0;
    std::unique_ptr<zmq::message_t> message;
  };
  // Checks that [offset, offset + count) is inside, and drops a message
  // kept for it.
  void forget(std::size_t offset, std::size_t count);

  std::size_t size_;
  std::vector<float> buffer_;  // size_ values once needed, else empty
  std::vector<Kept> kept_;     // by offset
};

}  // namespace pstrain
