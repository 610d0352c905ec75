#pragma once
// A feed-forward model over a Backend: a list of layers (dense, relu,
// conv2d, maxpool2d, flatten, concat, dot_interaction) ending in a dense
// layer, trained with softmax cross-entropy over classes or with binary
// cross-entropy on one logit (a click model).
//
// Each layer reads the layer before it, or the layers its `inputs` name
// (by `name`, or the default "<type><k>"; "input" is the data's features),
// so a list can branch and join as DLRM and Wide & Deep do (docs/ctr.md):
// `concat` joins its inputs' columns, `dot_interaction` passes its first
// input through and appends the dot products of every pair of vectors among
// all its inputs, vectors as wide as the first input (or as its rows, when
// it is an embedding layer). Every layer's output feeds at most one
// layer, and all but the last feed one.
//
// Embedding layers (embedding, embedding_bag; docs/embeddings.md) open the
// list: their tables live on the parameter servers, so the model holds only
// the rows of the current batch. Before each forward the caller hands each
// such layer the batch's unique rows and every id's place among them
// (set_embedding_batch); after backward it reads the unique rows'
// gradients (embedding_grads). A first layer without `inputs` sees one
// flat row per sample: the input's features, then each embedding layer's
// columns.
//
// Memory: every parameter and its gradient is a separate backend allocation
// (variables() order), so the ps client can pull and push each one on its
// own; activations, their gradients, the batch and the loss live in backend
// memory sized for max_batch. Layer outputs are kept for backward; a relu
// overwrites its input in place, since the layers below it need only their
// own inputs.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
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

// The layers of a preset ("mlp", "cnn", "dlrm", "wide_deep") or the config's
// own list ("custom"). Throws ConfigError for an unknown preset or an empty
// custom list.
std::vector<ModelLayer> model_layers(const ModelConfig& config);

// An embedding layer as the caller feeds it.
struct EmbeddingInput {
  std::string table;
  int first_id = 0;   // the sample's id its ids start at
  int ids = 1;        // ids per sample
  int dim = 0;        // the table's row width
  bool bag = false;   // pooled into one row (embedding_bag), else one row per id
  bool mean = false;  // a bag's pooling
};

// The ids per sample embedding layers read: up to the end of the layer
// whose ids end last (layers may share ids: first_id).
std::size_t embedding_ids_per_sample(const std::vector<EmbeddingInput>& layers);

// Throws ConfigError unless `data` has as many ids per sample as the
// model's embedding layers take (none when it has none).
void check_ids_for_embeddings(const std::vector<EmbeddingInput>& layers, const Dataset& data);

struct EvalResult {
  double loss = 0;      // mean per-sample cross-entropy (bce: the logloss)
  double accuracy = 0;  // fraction classified correctly
  std::size_t samples = 0;
  // bce models: the exact AUC over every sample (client/data/click_metrics.h);
  // NaN when one class is absent. Empty for softmax models.
  std::optional<double> auc;
};

class Model {
 public:
  // Validates the layer list against the input shape and throws ConfigError
  // naming the layer ("model: layer 3 (conv2d): ..."): a conv or pool that
  // does not fit its input or follows a flat layer, non-positive sizes, or a
  // last layer that is not a dense layer to `classes` units (1 under bce);
  // an embedding layer after another kind, or naming none of `tables`; an
  // input that names no earlier layer, an output read twice or never, a
  // dot_interaction whose inputs are not whole vectors. With embedding
  // layers the input may be empty (input.c == 0).
  Model(const ModelConfig& config, Backend& backend, InputShape input, int classes, int max_batch,
        const std::vector<TableSpec>& tables = {});
  ~Model();
  // Validates as the constructor does, without a backend or any memory
  // (what `pstrain --check` runs), and returns the embedding layers.
  static std::vector<EmbeddingInput> check(const ModelConfig& config, InputShape input, int classes,
                                           const std::vector<TableSpec>& tables = {});
  // The variables such a model has, validated as check() does, without
  // memory (what `pstrain --plan` counts the bytes of).
  static std::vector<VariableSpec> variables_of(const ModelConfig& config, InputShape input,
                                                int classes,
                                                const std::vector<TableSpec>& tables = {});
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

  // device: emulated (docs/scaling.md): from now on forward_backward
  // computes nothing and takes `step_ms` of wall time instead, a third for
  // the forward and the rest for the backward, which issues each variable's
  // gradient where a real backward spending its time in proportion to the
  // variables' sizes would. Every gradient is kEmulatedDecay x its parameter
  // (the gradient of kEmulatedDecay/2 x |w|^2), embedding rows' likewise, so
  // the ps receives and applies updates of the real size; the loss and the
  // correct counts are 0. For measuring the network and the ps with more
  // workers than this host has cores: accuracy means nothing.
  static constexpr float kEmulatedDecay = 1e-4f;
  void emulate(double step_ms);
  bool emulated() const { return emulated_step_ms_ > 0; }

  // fp16 loss scaling (client/train/loss_scaler.h): forward_backward multiplies
  // the loss gradient by `scale`, so every gradient comes out scaled by it
  // (GradAccumulator divides it out again).
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  float loss_scale() const { return loss_scale_; }

  bool binary() const { return bce_; }                       // trained with bce on one logit
  const float* logits() const;                               // n x classes, or n x 1 under bce
  const float* loss_buffer() const { return loss_.data(); }  // n
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
  struct Node;
  // Without a backend (null): the layers validated, nothing allocated.
  Model(const ModelConfig& config, Backend* backend, InputShape input, int classes, int max_batch,
        const std::vector<TableSpec>& tables);
  void build_graph(std::vector<ModelLayer> specs, std::size_t opening,
                   const std::vector<TableSpec>& tables);
  void declare_variables();
  void allocate();
  void loss(int n);
  void backward_layer(std::size_t index, int n,
                      const std::function<void(std::size_t variable)>& on_grad_issued);

  Backend* backend_;  // never null but in check()
  std::string preset_;
  InputShape input_shape_;
  int classes_;
  int max_batch_;
  bool bce_ = false;
  // The data flow: node 0 the input's features, then one per embedding layer,
  // then one per other layer (layers_[i] is node 1 + embeddings + i).
  std::vector<Node> nodes_;
  std::vector<Layer> layers_;
  std::vector<Embedding> embeddings_;
  std::vector<EmbeddingInput> embedding_inputs_;
  int features_ = 0;  // floats of the input per sample
  std::vector<VariableSpec> variables_;
  std::uint64_t parameter_count_ = 0;
  float loss_scale_ = 1;
  double emulated_step_ms_ = 0;  // 0: computed for real
  void emulated_forward_backward(int n,
                                 const std::function<void(std::size_t variable)>& on_grad_issued);
  std::vector<DeviceMemory> params_, grads_;
  DeviceMemory input_, labels_, loss_, correct_;
  DeviceMemory workspace_;
};

}  // namespace pstrain
