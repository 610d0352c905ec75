#pragma once
// A feed-forward classifier over a Backend: a list of layers (dense, relu,
// conv2d, maxpool2d, flatten) ending in a dense layer to the classes, trained
// with softmax cross-entropy.
//
// Embedding layers (embedding, embedding_bag; docs/embeddings.md) may open
// the list: their tables live on the parameter servers, so the model holds
// only the rows of the current batch. Before each forward the caller hands
// each such layer the batch's unique rows and every id's place among them
// (set_embedding_batch); after backward it reads the unique rows'
// gradients (embedding_grads). The layer after them sees one flat row per
// sample: the input's features, then each embedding layer's columns.
//
// Memory: every parameter and its gradient is a separate backend allocation
// (variables() order), so the ps client can pull and push each one on its
// own; activations, the batch and the loss live in backend memory sized for
// max_batch. Layer outputs are kept for backward; a relu overwrites its
// input in place, since the layers below it need only their own inputs.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "client/compute/backend.h"
#include "client/data/dataset.h"
#include "shared/config.h"
#include "shared/embedding.h"
#include "shared/shard_map.h"

namespace pstrain {

struct InputShape {
  int c = 1, h = 28, w = 28;
};

// The layers of a preset ("mlp", "cnn") or the config's own list ("custom").
// Throws ConfigError for an unknown preset or an empty custom list.
std::vector<ModelLayer> model_layers(const ModelConfig& config);

// An embedding layer as the caller feeds it.
struct EmbeddingInput {
  std::string table;
  int ids = 1;        // ids per sample
  int dim = 0;        // the table's row width
  bool bag = false;   // pooled into one row (embedding_bag), else one row per id
  bool mean = false;  // a bag's pooling
};

class Model;
// Throws ConfigError unless `data` has as many ids per sample as the
// model's embedding layers take (none when it has none).
void check_ids_for_embeddings(const Model& model, const Dataset& data);

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
  // last layer that is not a dense layer to `classes` units; an embedding
  // layer after another kind, or naming none of `tables`. With embedding
  // layers the input may be empty (input.c == 0).
  Model(const ModelConfig& config, Backend& backend, InputShape input, int classes, int max_batch,
        const std::vector<TableSpec>& tables = {});
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

  // The embedding layers, in order.
  const std::vector<EmbeddingInput>& embeddings() const { return embedding_inputs_; }
  // Layer e's part of the next batch of n samples: `rows`, the unique rows
  // its ids name (unique x dim, as the ps answered them), and `inverse`,
  // each id's row among them (n x ids, sample-major). Issues the uploads;
  // the previous step's work must have completed. Throws
  // std::invalid_argument when the sizes do not fit.
  void set_embedding_batch(std::size_t e, int n, std::span<const float> rows,
                           std::span<const std::uint32_t> inverse);
  // After forward_backward: layer e's unique rows' gradients (unique x dim),
  // downloaded into `out`; waits for the backward.
  void embedding_grads(std::size_t e, std::span<float> out);

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
  // `prepare(first, n)` runs before each batch's forward, for a model with
  // embedding layers to be given that batch's rows (required then).
  using PrepareBatch = std::function<void(std::size_t first, std::size_t n)>;
  EvalResult evaluate(const Dataset& data, std::size_t limit = SIZE_MAX,
                      const PrepareBatch& prepare = {});

  // The layers as YAML (type, sizes, output shape, parameters), for the saved
  // model and logs.
  std::string describe() const;

 private:
  struct Layer;
  struct Embedding;
  void loss(int n);

  Backend& backend_;
  std::string preset_;
  InputShape input_shape_;
  int classes_;
  int max_batch_;
  std::vector<Layer> layers_;
  std::vector<Embedding> embeddings_;
  std::vector<EmbeddingInput> embedding_inputs_;
  int features_ = 0;     // floats of the input per sample
  DeviceMemory joined_;  // with embeddings: features, then each layer's columns
  std::size_t joined_width_ = 0;
  std::vector<VariableSpec> variables_;
  std::uint64_t parameter_count_ = 0;
  float loss_scale_ = 1;
  std::vector<DeviceMemory> params_, grads_;
  DeviceMemory input_, labels_, loss_, correct_;
  DeviceMemory grad_a_, grad_b_, workspace_;
};

}  // namespace pstrain
