#pragma once
// What a worker's backend does for a run: the precision its GEMMs compute
// at, whether the loss is scaled, whether steps are recorded (CUDA graphs),
// and how to say which implementations its ops took.
#include <string>

#include "client/compute/backend.h"
#include "shared/config.h"

namespace pstrain {

// Sets the backend's GEMMs to `wanted` (train.precision) and returns it, or,
// where the backend cannot compute at it, logs "train.precision=P is not
// available on BACKEND: WHY; training in fp32" and returns fp32: a run
// configured for a GPU still trains on a CPU, and says how.
Precision apply_precision(Backend& backend, Precision wanted);

// Whether a worker of `config` on `backend` scales its loss: fp16 where the
// backend computes it (apply_precision falls back to fp32 elsewhere).
bool scales_loss(const ClusterConfig& config, const Backend& backend);

// Whether a worker of `config` records its steps on `backend`
// (train.cuda_graphs; Backend::make_step_graph): where the backend records
// (CUDA), at fp32 and with one micro-batch per step. A replay repeats
// recorded calls, so none of a step's host decisions may change between
// steps: not fp16's loss scale and overflow checks, not accumulation's
// sums (a step's first micro-batch starts them, the later ones add), not
// the reduced-precision GEMMs' scratch memory, which grows as needed, and
// not embedding layers' unique rows, whose count each batch decides.
bool records_steps(const ClusterConfig& config, const Backend& backend);

// The batch size whose steps a worker of `config` records: train.batch_size
// where records_steps, else 0 (none).
int recorded_batch(const ClusterConfig& config, const Backend& backend);

// "conv2d cudnn 480, dense cublaslt 960, step_graph replayed 239": which
// implementations a backend's ops took (Backend::path_counts), for the log.
std::string describe_paths(const PathCounts& paths);

}  // namespace pstrain
