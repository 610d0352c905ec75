#include "client/model/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "shared/init.h"

namespace pstrain {

namespace {

enum class LayerKind { dense, relu, conv2d, maxpool2d, flatten };

// An activation's shape per sample; `flat` after a dense or flatten layer,
// when only c (the width) is meaningful and convolutions no longer apply.
struct Dims {
  int c = 0, h = 1, w = 1;
  bool flat = false;
  std::size_t size() const { return static_cast<std::size_t>(c) * h * w; }
  std::string text() const {
    return flat ? "[" + std::to_string(c) + "]"
                : "[" + std::to_string(c) + ", " + std::to_string(h) + ", " + std::to_string(w) +
                      "]";
  }
};

LayerKind parse_kind(const std::string& type, std::size_t index) {
  if (type == "dense") return LayerKind::dense;
  if (type == "relu") return LayerKind::relu;
  if (type == "conv2d") return LayerKind::conv2d;
  if (type == "maxpool2d") return LayerKind::maxpool2d;
  if (type == "flatten") return LayerKind::flatten;
  throw ConfigError("model: layer " + std::to_string(index) + ": unknown type '" + type +
                    "' (expected dense, relu, conv2d, maxpool2d or flatten)");
}

ModelLayer dense(int units) { return {"dense", units, 0, 0}; }
ModelLayer relu() { return {"relu", 0, 0, 0}; }
ModelLayer conv(int filters, int kernel) { return {"conv2d", 0, filters, kernel}; }
ModelLayer pool(int kernel) { return {"maxpool2d", 0, 0, kernel}; }
ModelLayer flatten() { return {"flatten", 0, 0, 0}; }

}  // namespace

std::vector<ModelLayer> model_layers(const ModelConfig& config) {
  if (config.preset == "mlp") {
    return {dense(256), relu(), dense(128), relu(), dense(10)};
  }
  if (config.preset == "cnn") {
    return {conv(32, 3), relu(),    pool(2),    conv(64, 3), relu(),
            pool(2),     flatten(), dense(128), relu(),      dense(10)};
  }
  if (config.preset == "custom") {
    if (config.layers.empty()) {
      throw ConfigError("model.layers: a custom model needs at least one layer");
    }
    return config.layers;
  }
  throw ConfigError("model.preset: unknown preset '" + config.preset +
                    "' (expected mlp, cnn or custom)");
}

void check_ids_for_embeddings(const Model& model, const Dataset& data) {
  std::size_t ids = 0;
  for (const auto& e : model.embeddings()) ids += static_cast<std::size_t>(e.ids);
  if (ids != data.ids_per_sample)
    throw ConfigError("model: the embedding layers take " + std::to_string(ids) +
                      " ids per sample, and " + data.name + " has " +
                      std::to_string(data.ids_per_sample) +
                      (data.ids_per_sample == 0 ? " (a data set with ids: synthetic-ids)" : ""));
}

struct Model::Embedding {
  EmbeddingInput input;
  std::size_t column = 0;                 // its first column in the joined activation
  int width = 0;                          // its columns: dim, or ids x dim
  int unique = 0;                         // rows of the current batch
  int n = 0;                              // samples of the current batch
  DeviceMemory rows, row_grads;           // max_batch x ids rows at most
  DeviceMemory inverse, by_row, offsets;  // int32
  HostMemory staging;  // rows, inverse, by_row, offsets of a batch on their way up
  EmbeddingShape shape(std::size_t stride) const {
    return {n, input.ids, input.dim, static_cast<int>(stride), unique, input.bag, input.mean};
  }
};

struct Model::Layer {
  LayerKind kind = LayerKind::dense;
  ModelLayer spec;
  std::string name;  // "conv0", "relu2", ...
  Dims in, out;
  std::size_t weight = 0;    // variable index of the weights; the bias follows
  DeviceMemory output;       // empty when the layer works in place
  DeviceMemory argmax;       // maxpool2d
  DeviceMemory columns;      // conv2d: its im2col matrix from forward, if the backend keeps it
  const float* x = nullptr;  // input, for the whole batch
  float* y = nullptr;        // output

  bool has_params() const { return kind == LayerKind::dense || kind == LayerKind::conv2d; }
  ConvShape conv(int n) const { return {n, in.c, in.h, in.w, spec.filters, spec.kernel}; }
  PoolShape pool(int n) const { return {n, in.c, in.h, in.w, spec.kernel}; }
};

Model::Model(const ModelConfig& config, Backend& backend, InputShape input, int classes,
             int max_batch, const std::vector<TableSpec>& tables)
    : backend_(backend),
      preset_(config.preset),
      input_shape_(input),
      classes_(classes),
      max_batch_(max_batch) {
  if (max_batch < 1) {
    throw std::invalid_argument("model: max_batch must be >= 1, got " + std::to_string(max_batch));
  }
  std::vector<ModelLayer> specs = model_layers(config);
  // The embedding layers open the list; the rest see their joined output.
  std::size_t opening = 0;
  while (opening < specs.size() &&
         (specs[opening].type == "embedding" || specs[opening].type == "embedding_bag"))
    ++opening;
  if (input.c < (opening > 0 ? 0 : 1) || input.h < 1 || input.w < 1 || classes < 2) {
    throw std::invalid_argument("model: bad input shape or class count");
  }
  features_ = input.c * input.h * input.w;
  joined_width_ = static_cast<std::size_t>(features_);
  for (std::size_t i = 0; i < opening; ++i) {
    const ModelLayer& spec = specs[i];
    const std::string where = "model: layer " + std::to_string(i) + " (" + spec.type + "): ";
    const auto table = std::ranges::find(tables, spec.table, &TableSpec::name);
    if (table == tables.end())
      throw ConfigError(where + "table '" + spec.table + "' is not among the run's tables:");
    if (spec.ids < 1) throw ConfigError(where + "ids must be >= 1");
    Embedding e;
    e.input = {spec.table, spec.ids, static_cast<int>(table->dim), spec.type == "embedding_bag",
               spec.pool == "mean"};
    e.column = joined_width_;
    e.width = e.input.bag ? e.input.dim : e.input.ids * e.input.dim;
    joined_width_ += static_cast<std::size_t>(e.width);
    embedding_inputs_.push_back(e.input);
    embeddings_.push_back(std::move(e));
  }
  specs.erase(specs.begin(), specs.begin() + static_cast<std::ptrdiff_t>(opening));
  if (specs.empty())
    throw ConfigError("model: the layers after the embedding layers must end in a dense layer");

  Dims dims = opening > 0 ? Dims{static_cast<int>(joined_width_), 1, 1, true}
                          : Dims{input.c, input.h, input.w, false};
  int dense_count = 0, conv_count = 0, other_count = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ModelLayer& spec = specs[i];
    const std::size_t at = i + opening;
    if (spec.type == "embedding" || spec.type == "embedding_bag")
      throw ConfigError("model: layer " + std::to_string(at) + " (" + spec.type +
                        "): embedding layers must come first, before any other layer");
    const LayerKind kind = parse_kind(spec.type, at);
    const std::string where = "model: layer " + std::to_string(at) + " (" + spec.type + "): ";
    auto need_positive = [&](int value, const char* what) {
      if (value < 1) {
        throw ConfigError(where + what + " must be >= 1, got " + std::to_string(value));
      }
    };
    auto need_image = [&] {
      if (dims.flat) {
        throw ConfigError(where +
                          "needs an image input (channels x height x "
                          "width), got the flat " +
                          dims.text() + " output of the layer before");
      }
    };
    Layer layer;
    layer.kind = kind;
    layer.spec = spec;
    layer.in = layer.out = dims;
    switch (kind) {
      case LayerKind::dense:
        need_positive(spec.units, "units");
        layer.name = "dense" + std::to_string(dense_count++);
        // A dense layer reads an image as its flattened NCHW vector.
        layer.out = {spec.units, 1, 1, true};
        break;
      case LayerKind::conv2d:
        need_positive(spec.filters, "filters");
        need_positive(spec.kernel, "kernel");
        need_image();
        if (spec.kernel > dims.h || spec.kernel > dims.w) {
          throw ConfigError(where + "kernel " + std::to_string(spec.kernel) +
                            " does not fit its input " + dims.text());
        }
        layer.name = "conv" + std::to_string(conv_count++);
        layer.out = {spec.filters, dims.h - spec.kernel + 1, dims.w - spec.kernel + 1, false};
        break;
      case LayerKind::maxpool2d:
        need_positive(spec.kernel, "kernel");
        need_image();
        if (spec.kernel > dims.h || spec.kernel > dims.w) {
          throw ConfigError(where + "window " + std::to_string(spec.kernel) +
                            " does not fit its input " + dims.text());
        }
        layer.name = "maxpool" + std::to_string(other_count++);
        layer.out = {dims.c, dims.h / spec.kernel, dims.w / spec.kernel, false};
        break;
      case LayerKind::relu:
        layer.name = "relu" + std::to_string(other_count++);
        break;
      case LayerKind::flatten:
        layer.name = "flatten" + std::to_string(other_count++);
        layer.out = {static_cast<int>(dims.size()), 1, 1, true};
        break;
    }
    dims = layer.out;
    layers_.push_back(std::move(layer));
  }
  if (layers_.back().kind != LayerKind::dense || dims.c != classes) {
    throw ConfigError("model: layer " + std::to_string(opening + layers_.size() - 1) + " (" +
                      specs.back().type + "): the last layer must be dense with " +
                      std::to_string(classes) + " units (the number of classes), got output " +
                      dims.text());
  }

  // Variables, memory and the data flow of forward.
  const auto batch = static_cast<std::size_t>(max_batch);
  std::size_t widest = dims.size();
  std::size_t workspace = 0;
  if (features_ > 0)
    input_ = backend_.alloc(batch * static_cast<std::size_t>(features_) * sizeof(float));
  float* current = input_.data();
  if (!embeddings_.empty()) {
    joined_ = backend_.alloc(batch * joined_width_ * sizeof(float));
    current = joined_.data();
    for (Embedding& e : embeddings_) {
      // At most one row per id of a full batch.
      const std::size_t ids = batch * static_cast<std::size_t>(e.input.ids);
      const std::size_t floats = ids * static_cast<std::size_t>(e.input.dim);
      e.rows = backend_.alloc(floats * sizeof(float));
      e.row_grads = backend_.alloc(floats * sizeof(float));
      e.inverse = backend_.alloc(ids * sizeof(std::int32_t));
      e.by_row = backend_.alloc(ids * sizeof(std::int32_t));
      e.offsets = backend_.alloc((ids + 1) * sizeof(std::int32_t));
      e.staging =
          backend_.alloc_host(floats * sizeof(float) + (3 * ids + 1) * sizeof(std::int32_t));
    }
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    layer.x = current;
    widest = std::max({widest, layer.in.size(), layer.out.size()});
    if (layer.has_params()) {
      // He for layers whose output goes through a relu (pools and flattens
      // in between do not change that), Glorot otherwise.
      bool before_relu = false;
      for (std::size_t j = i + 1; j < layers_.size(); ++j) {
        if (layers_[j].kind == LayerKind::maxpool2d || layers_[j].kind == LayerKind::flatten) {
          continue;
        }
        before_relu = layers_[j].kind == LayerKind::relu;
        break;
      }
      const bool is_conv = layer.kind == LayerKind::conv2d;
      const std::size_t taps =
          is_conv ? static_cast<std::size_t>(layer.spec.kernel) * layer.spec.kernel : 1;
      const std::size_t fan_in = (is_conv ? layer.in.c : layer.in.size()) * taps;
      const std::size_t fan_out = static_cast<std::size_t>(layer.out.c) * taps;
      const double limit = before_relu ? std::sqrt(6.0 / static_cast<double>(fan_in))
                                       : std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
      layer.weight = variables_.size();
      variables_.push_back({layer.name + "/w", fan_in * layer.out.c,
                            InitSpec{InitKind::uniform, static_cast<float>(limit)}});
      variables_.push_back({layer.name + "/b", static_cast<std::uint64_t>(layer.out.c),
                            InitSpec{InitKind::zeros, 0.0f}});
      if (is_conv) {
        workspace = std::max(workspace, backend_.conv2d_workspace(layer.conv(max_batch)));
        if (const std::size_t kept = backend_.conv2d_columns(layer.conv(max_batch)); kept > 0)
          layer.columns = backend_.alloc(kept * sizeof(float));
      }
    }
    const bool in_place =
        layer.kind == LayerKind::flatten || (layer.kind == LayerKind::relu && i > 0);
    if (in_place) {
      layer.y = current;
    } else {
      layer.output = backend_.alloc(batch * layer.out.size() * sizeof(float));
      layer.y = layer.output.data();
    }
    if (layer.kind == LayerKind::maxpool2d) {
      layer.argmax = backend_.alloc(batch * layer.out.size() * sizeof(std::int32_t));
    }
    current = layer.y;
  }
  for (const VariableSpec& v : variables_) {
    parameter_count_ += v.size;
    params_.push_back(backend_.alloc(v.size * sizeof(float)));
    grads_.push_back(backend_.alloc(v.size * sizeof(float)));
  }
  labels_ = backend_.alloc(batch * sizeof(std::int32_t));
  loss_ = backend_.alloc(batch * sizeof(float));
  correct_ = backend_.alloc(batch * sizeof(float));
  grad_a_ = backend_.alloc(batch * widest * sizeof(float));
  grad_b_ = backend_.alloc(batch * widest * sizeof(float));
  if (workspace > 0) workspace_ = backend_.alloc(workspace * sizeof(float));
}

Model::~Model() = default;

void Model::initialize(std::uint64_t seed) {
  std::vector<float> values;
  for (std::size_t i = 0; i < variables_.size(); ++i) {
    values.resize(variables_[i].size);
    init_fill(values, seed, variables_[i].name, 0, variables_[i].init);
    backend_.upload(values.data(), params_[i].data(), values.size() * sizeof(float));
    backend_.synchronize();
  }
}

const float* Model::logits() const { return layers_.back().y; }

void Model::set_embedding_batch(std::size_t index, int n, std::span<const float> rows,
                                std::span<const std::uint32_t> inverse) {
  Embedding& e = embeddings_.at(index);
  const auto dim = static_cast<std::size_t>(e.input.dim);
  const std::size_t ids = static_cast<std::size_t>(n) * static_cast<std::size_t>(e.input.ids);
  if (n < 1 || n > max_batch_ || inverse.size() != ids || rows.size() % dim != 0 ||
      rows.size() / dim > ids || rows.empty())
    throw std::invalid_argument("model: embedding layer " + std::to_string(index) + " (table '" +
                                e.input.table + "'): " + std::to_string(rows.size()) +
                                " row floats and " + std::to_string(inverse.size()) + " ids for " +
                                std::to_string(n) + " samples");
  const auto unique = rows.size() / dim;
  // The occurrences grouped by row, in ascending order within each (a
  // counting sort), which the backward sums in: the same bits everywhere.
  float* staged_rows = e.staging.data();
  auto* staged_inverse = reinterpret_cast<std::int32_t*>(staged_rows + rows.size());
  std::int32_t* by_row = staged_inverse + ids;
  std::int32_t* offsets = by_row + ids;
  std::copy(rows.begin(), rows.end(), staged_rows);
  std::fill_n(offsets, unique + 1, 0);
  for (std::size_t o = 0; o < ids; ++o) {
    if (inverse[o] >= unique)
      throw std::invalid_argument("model: embedding layer " + std::to_string(index) + ": id " +
                                  std::to_string(o) + " names row " + std::to_string(inverse[o]) +
                                  " of " + std::to_string(unique));
    staged_inverse[o] = static_cast<std::int32_t>(inverse[o]);
    ++offsets[inverse[o] + 1];
  }
  for (std::size_t u = 0; u < unique; ++u) offsets[u + 1] += offsets[u];
  std::vector<std::int32_t> next(offsets, offsets + unique);
  for (std::size_t o = 0; o < ids; ++o) by_row[next[inverse[o]]++] = static_cast<std::int32_t>(o);
  backend_.upload(staged_rows, e.rows.data(), rows.size() * sizeof(float));
  backend_.upload(staged_inverse, e.inverse.data(), ids * sizeof(std::int32_t));
  backend_.upload(by_row, e.by_row.data(), ids * sizeof(std::int32_t));
  backend_.upload(offsets, e.offsets.data(), (unique + 1) * sizeof(std::int32_t));
  e.unique = static_cast<int>(unique);
  e.n = n;
}

void Model::embedding_grads(std::size_t index, std::span<float> out) {
  const Embedding& e = embeddings_.at(index);
  const std::size_t floats = static_cast<std::size_t>(e.unique) * e.input.dim;
  if (out.size() != floats)
    throw std::invalid_argument("model: embedding layer " + std::to_string(index) + ": " +
                                std::to_string(out.size()) + " floats for " +
                                std::to_string(floats) + " row gradients");
  // Through the staging buffer: `out` is ordinary host memory.
  backend_.download(e.row_grads.data(), e.staging.data(), floats * sizeof(float));
  backend_.synchronize();
  std::copy_n(e.staging.data(), floats, out.data());
}

void Model::forward(int n) {
  if (n < 1 || n > max_batch_) {
    throw std::invalid_argument("model: batch of " + std::to_string(n) +
                                " samples, expected 1 to " + std::to_string(max_batch_));
  }
  if (!embeddings_.empty()) {
    backend_.copy_columns(input_.data(), static_cast<std::size_t>(features_), joined_.data(),
                          joined_width_, static_cast<std::size_t>(n),
                          static_cast<std::size_t>(features_));
    for (std::size_t index = 0; index < embeddings_.size(); ++index) {
      const Embedding& e = embeddings_[index];
      if (e.n != n)
        throw std::invalid_argument("model: embedding layer " + std::to_string(index) +
                                    " was given " + std::to_string(e.n) +
                                    " samples' ids for a batch of " + std::to_string(n));
      backend_.embedding_forward(e.rows.data(), e.inverse.data<std::int32_t>(),
                                 joined_.data() + e.column, e.shape(joined_width_));
    }
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    const std::size_t outputs = static_cast<std::size_t>(n) * layer.out.size();
    switch (layer.kind) {
      case LayerKind::dense:
        backend_.dense_forward(layer.x, params_[layer.weight].data(),
                               params_[layer.weight + 1].data(), layer.y, n,
                               static_cast<int>(layer.in.size()), layer.out.c);
        break;
      case LayerKind::conv2d:
        // A relu right after a convolution works in place on its output, so
        // the backend may fuse it into the convolution; the relu is then done.
        if (i + 1 < layers_.size() && layers_[i + 1].kind == LayerKind::relu) {
          backend_.conv2d_relu_forward(layer.x, params_[layer.weight].data(),
                                       params_[layer.weight + 1].data(), layer.y, workspace_.data(),
                                       layer.columns.data(), layer.conv(n));
          ++i;
        } else {
          backend_.conv2d_forward(layer.x, params_[layer.weight].data(),
                                  params_[layer.weight + 1].data(), layer.y, workspace_.data(),
                                  layer.columns.data(), layer.conv(n));
        }
        break;
      case LayerKind::relu:
        backend_.relu_forward(layer.x, layer.y, outputs);
        break;
      case LayerKind::maxpool2d:
        backend_.maxpool_forward(layer.x, layer.y, layer.argmax.data<std::int32_t>(),
                                 layer.pool(n));
        break;
      case LayerKind::flatten:
        break;
    }
  }
}

void Model::loss(int n) {
  backend_.softmax_xent(logits(), label_buffer(), grad_a_.data(), loss_.data(), correct_.data(), n,
                        classes_);
}

void Model::forward_backward(int n,
                             const std::function<void(std::size_t variable)>& on_grad_issued) {
  forward(n);
  loss(n);
  if (loss_scale_ != 1)
    backend_.scale(grad_a_.data(), loss_scale_, static_cast<std::size_t>(n) * classes_);
  // Layers below the first one with parameters need no gradient at all,
  // unless embedding layers below them do.
  std::size_t first = 0;
  if (embeddings_.empty())
    while (!layers_[first].has_params()) ++first;
  float* dy = grad_a_.data();
  float* spare = grad_b_.data();
  for (std::size_t i = layers_.size(); i-- > first;) {
    Layer& layer = layers_[i];
    float* dx = i == first && embeddings_.empty() ? nullptr : spare;
    switch (layer.kind) {
      case LayerKind::dense:
        backend_.dense_backward(layer.x, params_[layer.weight].data(), dy, dx,
                                grads_[layer.weight].data(), grads_[layer.weight + 1].data(), n,
                                static_cast<int>(layer.in.size()), layer.out.c);
        break;
      case LayerKind::conv2d:
        backend_.conv2d_backward(layer.x, params_[layer.weight].data(), dy, dx,
                                 grads_[layer.weight].data(), grads_[layer.weight + 1].data(),
                                 workspace_.data(), layer.columns.data(), layer.conv(n));
        break;
      case LayerKind::relu:
        backend_.relu_backward(layer.y, dy, dy, static_cast<std::size_t>(n) * layer.out.size());
        continue;
      case LayerKind::maxpool2d:
        backend_.maxpool_backward(dy, layer.argmax.data<std::int32_t>(), spare, layer.pool(n));
        break;
      case LayerKind::flatten:
        continue;
    }
    std::swap(dy, spare);
    if (layer.has_params()) {
      on_grad_issued(layer.weight + 1);
      on_grad_issued(layer.weight);
    }
  }
  // dy is now the gradient of the joined activation.
  for (Embedding& e : embeddings_)
    backend_.embedding_backward(dy + e.column, e.by_row.data<std::int32_t>(),
                                e.offsets.data<std::int32_t>(), e.row_grads.data(),
                                e.shape(joined_width_));
}

EvalResult Model::evaluate(const Dataset& data, std::size_t limit, const PrepareBatch& prepare) {
  const std::size_t count = std::min(limit, data.size());
  const std::size_t floats = data.sample_floats();
  if (floats != static_cast<std::size_t>(features_)) {
    throw std::invalid_argument("model: " + data.name + " samples do not match the model's input");
  }
  if (!embeddings_.empty() && !prepare)
    throw std::invalid_argument("model: evaluating embedding layers needs each batch's rows");
  const auto batch = static_cast<std::size_t>(max_batch_);
  HostMemory images = backend_.alloc_host(batch * floats * sizeof(float));
  HostMemory labels = backend_.alloc_host(batch * sizeof(std::int32_t));
  HostMemory losses = backend_.alloc_host(batch * sizeof(float));
  HostMemory correct = backend_.alloc_host(batch * sizeof(float));
  double loss_sum = 0, correct_sum = 0;
  for (std::size_t start = 0; start < count; start += batch) {
    const std::size_t n = std::min(batch, count - start);
    std::copy_n(data.image(start), n * floats, images.data());
    std::copy_n(data.labels.data() + start, n, labels.data<std::int32_t>());
    if (floats > 0) backend_.upload(images.data(), input_.data(), n * floats * sizeof(float));
    backend_.upload(labels.data(), labels_.data(), n * sizeof(std::int32_t));
    if (prepare) prepare(start, n);
    forward(static_cast<int>(n));
    loss(static_cast<int>(n));
    backend_.download(loss_.data(), losses.data(), n * sizeof(float));
    backend_.download(correct_.data(), correct.data(), n * sizeof(float));
    backend_.synchronize();
    for (std::size_t i = 0; i < n; ++i) {
      loss_sum += losses.data()[i];
      correct_sum += correct.data()[i];
    }
  }
  EvalResult result;
  result.samples = count;
  if (count > 0) {
    result.loss = loss_sum / static_cast<double>(count);
    result.accuracy = correct_sum / static_cast<double>(count);
  }
  return result;
}

std::string Model::describe() const {
  std::string text = "preset: " + preset_ + "\ninput: " +
                     Dims{input_shape_.c, input_shape_.h, input_shape_.w, false}.text() +
                     "\nclasses: " + std::to_string(classes_) +
                     "\nparameters: " + std::to_string(parameter_count_) + "\nlayers:\n";
  for (const Embedding& e : embeddings_)
    text += "  - {type: " + std::string(e.input.bag ? "embedding_bag" : "embedding") +
            ", table: " + e.input.table + ", ids: " + std::to_string(e.input.ids) +
            (e.input.bag ? std::string(", pool: ") + (e.input.mean ? "mean" : "sum") : "") +
            ", output: [" + std::to_string(e.width) + "]}\n";
  for (const Layer& layer : layers_) {
    text += "  - {name: " + layer.name + ", type: " + layer.spec.type;
    switch (layer.kind) {
      case LayerKind::dense:
        text += ", units: " + std::to_string(layer.spec.units);
        break;
      case LayerKind::conv2d:
        text += ", filters: " + std::to_string(layer.spec.filters) +
                ", kernel: " + std::to_string(layer.spec.kernel);
        break;
      case LayerKind::maxpool2d:
        text += ", kernel: " + std::to_string(layer.spec.kernel);
        break;
      case LayerKind::relu:
      case LayerKind::flatten:
        break;
    }
    text += ", output: " + layer.out.text();
    if (layer.has_params()) {
      text += ", parameters: " +
              std::to_string(variables_[layer.weight].size + variables_[layer.weight + 1].size);
    }
    text += "}\n";
  }
  return text;
}

}  // namespace pstrain
