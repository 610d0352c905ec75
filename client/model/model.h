#pragma once
// A feed-forward classifier over a Backend: a list of layers (dense, relu,
// conv2d, maxpool2d, flatten) ending in a dense layer to the classes, trained
// with softmax cross-entropy.
//
// Memory: every parameter and its gradient is a separate backend allocation
// (variables() order), so the ps client can pull and push each one on its
// own; activations, the batch and the loss live in backend memory sized for
// max_batch. Layer outputs are kept for backward; a relu overwrites its
// input in place, since the layers below it need only their own inputs.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "client/compute/backend.h"
#include "client/data/dataset.h"
#include "shared/config.h"
#include "shared/shard_map.h"

namespace pstrain {

struct InputShape {
  int c = 1, h = 28, w = 28;
};

// The layers of a preset ("mlp", "cnn") or the config's own list ("custom").
// Throws ConfigError for an unknown preset or an empty custom list.
std::vector<ModelLayer> model_layers(const ModelConfig& config);

struct EvalResult {
  double loss = 0;      // mean per-sample cross-entropy
  double accuracy = 0;  // fraction classified correctly
  std::size_t samples = 0;
};

class Model {
 public:
  // Validates the layer list against the input shape and throws ConfigError
  // naming the layer ("model: layer 3 (conv2d): ..."): a conv or pool that
  // does not fit its input or follows a flat layer, non-positive sizes, or a
  // last layer that is not a dense layer to `classes` units.
  Model(const ModelConfig& config, Backend& backend, InputShape input, int classes, int max_batch);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // One per parameter tensor, named "<type><k>/w" and "<type><k>/b" with k
  // counting the layers of that type from 0 ("conv0/w", "dense1/b").
  // Weights start He-uniform (layers followed by a relu) or Glorot-uniform,
  // biases at zero.
  const std::vector<VariableSpec>& variables() const { return variables_; }
  std::uint64_t parameter_count() const { return parameter_count_; }
  DeviceMemory& param(std::size_t variable) { return params_.at(variable); }
  DeviceMemory& grad(std::size_t variable) { return grads_.at(variable); }

  // Fills every parameter with its initial value (shared/init.h), as the ps
  // would create it: for local training and tests.
  void initialize(std::uint64_t seed);

  int max_batch() const { return max_batch_; }
  int classes() const { return classes_; }
  InputShape input_shape() const { return input_shape_; }
  // Backend memory for one batch: max_batch images (NCHW) and labels.
  float* input_buffer() { return input_.data(); }
  std::int32_t* label_buffer() { return labels_.data<std::int32_t>(); }

  // Logits of the first n samples of the input buffer (n <= max_batch).
  void forward(int n);
  // forward, then the loss (loss_buffer, correct_buffer) and every gradient.
  // on_grad_issued(i) runs as soon as variable i's gradient has been issued,
  // in decreasing order of i, so a caller can send a layer's gradient while
  // the layers below it still compute (after a fence on async backends).
  void forward_backward(int n, const std::function<void(std::size_t variable)>& on_grad_issued);

  // fp16 loss scaling (client/train/loss_scaler.h): forward_backward multiplies
  // the loss gradient by `scale`, so every gradient comes out scaled by it
  // (GradAccumulator divides it out again).
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  float loss_scale() const { return loss_scale_; }

  const float* logits() const;                                     // n x classes
  const float* loss_buffer() const { return loss_.data(); }        // n
  const float* correct_buffer() const { return correct_.data(); }  // n: 1 or 0

  // Mean loss and accuracy over the first `limit` samples of `data` (all by
  // default), in batches of max_batch; the parameters must be in place.
  EvalResult evaluate(const Dataset& data, std::size_t limit = SIZE_MAX);

  // The layers as YAML (type, sizes, output shape, parameters), for the saved
  // model and logs.
  std::string describe() const;

 private:
  struct Layer;
  void loss(int n);

  Backend& backend_;
  std::string preset_;
  InputShape input_shape_;
  int classes_;
  int max_batch_;
  std::vector<Layer> layers_;
  std::vector<VariableSpec> variables_;
  std::uint64_t parameter_count_ = 0;
  float loss_scale_ = 1;
  std::vector<DeviceMemory> params_, grads_;
  DeviceMemory input_, labels_, loss_, correct_;
  DeviceMemory grad_a_, grad_b_, workspace_;
};

}  // namespace pstrain
