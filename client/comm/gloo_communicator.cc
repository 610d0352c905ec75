#include "client/comm/gloo_communicator.h"

#include <cstdio>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

namespace pstrain {
namespace {

std::string seconds_text(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", std::chrono::duration<double>(ms).count());
  return text;
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(seconds));
}

}  // namespace

GlooOptions gloo_options(const ClusterConfig& config, std::uint32_t index) {
  GlooOptions options;
  options.rank = static_cast<int>(index);
  for (const auto& w : config.workers) options.hosts.push_back(w.host);
  options.timeout = to_ms(config.net.request_timeout);
  options.roll_call = std::min(options.timeout, std::chrono::milliseconds(3000));
  return options;
}

GlooCommunicator::GlooCommunicator(GlooOptions options,
                                   std::shared_ptr<gloo::rendezvous::Store> store)
    : options_(std::move(options)), store_(std::move(store)) {
  if (options_.rank < 0 || options_.rank >= size())
    throw std::invalid_argument("gloo: rank " + std::to_string(options_.rank) +
                                " is not below the " + std::to_string(size()) + " workers");
  std::shared_ptr<gloo::transport::Device> device;
  const std::string& host = options_.hosts[static_cast<std::size_t>(options_.rank)];
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError("gloo: worker " + std::to_string(options_.rank) +
                    " cannot listen on its host '" + host + "' (workers." +
                    std::to_string(options_.rank) +
                    ".host must be an address of this machine): " + e.what());
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(options_.rank, size());
  context->setTimeout(options_.timeout);
  guarded("connect", [&] { context->connectFullMesh(*store_, device); });
  context_ = std::move(context);
}

GlooCommunicator::~GlooCommunicator() = default;

template <class Op>
void GlooCommunicator::guarded(const char* what, Op&& op) {
  if (!broken_.empty()) throw CommError(broken_);
  try {
    op();
  } catch (const std::exception& e) {
    fail(what, e.what());
  }
}

void GlooCommunicator::fail(const char* what, const std::string& cause) {
  // Every survivor announces itself and waits briefly for the others: the
  // ones that stay silent are dead or hung. Gloo's own error names at most a
  // socket address, which means nothing to the user.
  store_->set("failed/" + std::to_string(options_.rank), {1});
  const auto deadline = std::chrono::steady_clock::now() + options_.roll_call;
  std::string missing;
  for (int r = 0; r < size(); ++r) {
    if (r == options_.rank) continue;
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    try {
      store_->wait({"failed/" + std::to_string(r)}, left);
    } catch (const std::exception&) {
      missing += (missing.empty() ? "" : ", ") + std::string("worker ") + std::to_string(r) + " (" +
                 options_.hosts[static_cast<std::size_t>(r)] + ")";
    }
  }
  if (missing.empty()) missing = "a peer";
  broken_ = std::string("gloo ") + what + ": " + missing + " did not answer within " +
            seconds_text(options_.timeout) + " (net.request_timeout): " + cause;
  throw CommError(broken_);
}

void GlooCommunicator::allreduce_sum(float* data, std::size_t n) {
  guarded("all-reduce", [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
    opts.setTimeout(options_.timeout);
    gloo::allreduce(opts);
  });
}

void GlooCommunicator::broadcast(float* data, std::size_t n, int root) {
  guarded("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, n);
    opts.setRoot(root);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::barrier() {
  guarded("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace pstrain
