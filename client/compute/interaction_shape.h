#pragma once
// The shape of a dot interaction (DLRM's feature interaction), apart from
// backend.h so that the CUDA kernels (nvcc) can take it.
#include "shared/host_device.h"

namespace pstrain {

// n samples of `vectors` vectors of `dim` floats each, side by side in one
// row of vectors * dim floats. The output row is the input's first `keep`
// floats followed by the dot product of every pair i < j of vectors, in
// row-major order of the upper triangle: (0,1), (0,2), ..., (1,2), ...
struct InteractionShape {
  int n = 0, vectors = 0, dim = 0, keep = 0;
  PSTRAIN_HD int in_width() const { return vectors * dim; }
  PSTRAIN_HD int pairs() const { return vectors * (vectors - 1) / 2; }
  PSTRAIN_HD int out_width() const { return keep + pairs(); }
};

}  // namespace pstrain
