#pragma once
// The shape of an embedding layer's lookups, apart from backend.h so that
// the CUDA kernels (nvcc) can take it without the rest of the interface.
namespace pstrain {

// An embedding layer's lookups (client/model/model.h): n samples of k ids
// each into `unique` rows of dim floats. A bag pools a sample's k rows into
// dim columns; otherwise each id has its own dim columns, id t's at t * dim.
// Sample s's columns start at out + s * stride (the layer's part of a wider
// activation).
struct EmbeddingShape {
  int n = 0, k = 1, dim = 0, stride = 0;
  int unique = 0;
  bool bag = false;
  bool mean = false;  // a bag's pooling: the mean of its rows; else their sum
  int width() const { return bag ? dim : k * dim; }
};

}  // namespace pstrain
