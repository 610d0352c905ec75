// Every error type of pstrain's is a pstrain::Error (shared/error.h), so one
// catch holds any message meant for the user.
#include <doctest/doctest.h>

#include <type_traits>

#include "client/comm/communicator.h"
#include "client/compute/cuda_loader.h"
#include "client/data/idx_reader.h"
#include "client/ps/ps_client.h"
#include "server/request_loop.h"
#include "shared/config.h"
#include "shared/curve_keys.h"
#include "shared/error.h"
#include "shared/metrics_server.h"
#include "shared/protocol.h"
#include "shared/scheduler_env.h"
#include "shared/snapshot.h"

namespace {

template <class... E>
constexpr bool all_pstrain_errors = (std::is_base_of_v<pstrain::Error, E> && ...);

static_assert(all_pstrain_errors<pstrain::ConfigError, pstrain::PsError, pstrain::CommError,
                                 pstrain::DataError, pstrain::SnapshotError, pstrain::CurveKeyError,
                                 pstrain::MetricsServerError, pstrain::SchedulerError,
                                 pstrain::wire::ProtocolError, pstrain::ps::NetworkError,
                                 pstrain::cuda::CudaUnavailable>);

TEST_CASE("errors: a bad config is caught as a pstrain::Error naming the key") {
  CHECK_THROWS_WITH_AS(pstrain::parse_config("job: x\nps: [{host: 127.0.0.1, port: 1}]\n"
                                             "workers: {count: 1}\nmode: sometimes\n",
                                             {}, "t.yaml"),
                       doctest::Contains("mode"), pstrain::Error);
}

}  // namespace
