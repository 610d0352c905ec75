#include "client/model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "client/data/click_metrics.h"
#include "shared/init.h"
#include "shared/trace.h"

namespace pstrain {

namespace {

enum class LayerKind { dense, relu, conv2d, maxpool2d, flatten, concat, dot_interaction };

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
  if (type == "concat") return LayerKind::concat;
  if (type == "dot_interaction") return LayerKind::dot_interaction;
  throw ConfigError("model: layer " + std::to_string(index) + ": unknown type '" + type +
                    "' (expected dense, relu, conv2d, maxpool2d, flatten, concat or "
                    "dot_interaction)");
}

bool is_embedding(const ModelLayer& spec) {
  return spec.type == "embedding" || spec.type == "embedding_bag";
}

ModelLayer dense(int units) { return {"dense", units, 0, 0}; }
ModelLayer relu() { return {"relu", 0, 0, 0}; }
ModelLayer conv(int filters, int kernel) { return {"conv2d", 0, filters, kernel}; }
ModelLayer pool(int kernel) { return {"maxpool2d", 0, 0, kernel}; }
ModelLayer flatten() { return {"flatten", 0, 0, 0}; }
ModelLayer joining(std::string type, std::string name, std::vector<std::string> inputs) {
  ModelLayer layer{std::move(type)};
  layer.name = std::move(name);
  layer.inputs = std::move(inputs);
  return layer;
}
ModelLayer lookup(std::string type, std::string_view table, std::string name, int first_id) {
  ModelLayer layer{std::move(type)};
  layer.table = std::string(table);
  layer.ids = kCtrFields;
  layer.first_id = first_id;
  layer.name = std::move(name);
  return layer;
}

// Dense layers of `hidden` units, each followed by a relu, reading `input`
// (the layer before when empty); the last relu is named `name`.
void append_mlp(std::vector<ModelLayer>& layers, const std::vector<int>& hidden,
                const std::string& input, const std::string& name) {
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    layers.push_back(dense(hidden[i]));
    if (i == 0 && !input.empty()) layers.back().inputs = {input};
    layers.push_back(relu());
  }
  layers.back().name = name;
}

}  // namespace

std::vector<ModelLayer> model_layers(const ModelConfig& config) {
  if (config.preset == "mlp") {
    return {dense(256), relu(), dense(128), relu(), dense(10)};
  }
  if (config.preset == "cnn") {
    return {conv(32, 3), relu(),    pool(2),    conv(64, 3), relu(),
            pool(2),     flatten(), dense(128), relu(),      dense(10)};
  }
  if (config.preset == "dlrm") {
    // Naumov et al. 2019: a bottom MLP turns the dense features into one
    // more vector of the embeddings' width; the top MLP reads it and the
    // dot products of every pair of the 27 vectors.
    std::vector<ModelLayer> layers = {lookup("embedding", kCtrTable, "embeddings", 0)};
    std::vector<int> bottom = config.bottom_mlp;
    bottom.push_back(config.embedding_dim);
    append_mlp(layers, bottom, "input", "bottom");
    layers.push_back(joining("dot_interaction", "interaction", {"bottom", "embeddings"}));
    if (!config.top_mlp.empty()) append_mlp(layers, config.top_mlp, "", "top");
    layers.push_back(dense(1));
    return layers;
  }
  if (config.preset == "wide_deep") {
    // Cheng et al. 2016: one logistic unit over the wide part (a linear model
    // of the ids: a bag of their one-float rows) and the deep MLP's last
    // hidden layer, over the embeddings and the dense features.
    std::vector<ModelLayer> layers = {
        lookup("embedding", kCtrTable, "deep_embeddings", 0),
        lookup("embedding_bag", kCtrWideTable, "wide", 0),
        joining("concat", "deep_input", {"input", "deep_embeddings"})};
    append_mlp(layers, config.deep_mlp, "", "deep");
    layers.push_back(joining("concat", "joint", {"wide", "deep"}));
    layers.push_back(dense(1));
    return layers;
  }
  if (config.preset == "custom") {
    if (config.layers.empty()) {
      throw ConfigError("model.layers: a custom model needs at least one layer");
    }
    return config.layers;
  }
  throw ConfigError("model.preset: unknown preset '" + config.preset +
                    "' (expected mlp, cnn, dlrm, wide_deep or custom)");
}

std::size_t embedding_ids_per_sample(const std::vector<EmbeddingInput>& layers) {
  std::size_t ids = 0;
  for (const auto& e : layers)
    ids = std::max(ids, static_cast<std::size_t>(e.first_id) + static_cast<std::size_t>(e.ids));
  return ids;
}

void check_ids_for_embeddings(const std::vector<EmbeddingInput>& layers, const Dataset& data) {
  const std::size_t ids = embedding_ids_per_sample(layers);
  if (ids != data.ids_per_sample)
    throw ConfigError(
        "model: the embedding layers take " + std::to_string(ids) + " ids per sample, and " +
        data.name + " has " + std::to_string(data.ids_per_sample) +
        (data.ids_per_sample == 0 ? " (data sets with ids: synthetic-ids, synthetic-ctr, criteo)"
                                  : ""));
}

// A sample's ids, at most: far beyond any data set's, and small enough that
// the ids of a batch fit an int.
constexpr int kMaxIdsPerSample = 1 << 16;

// A value of the data flow: the input's features, an embedding layer's
// columns or a layer's output, n x out.size() floats sample-major.
struct Model::Node {
  Node(std::string node_name, Dims dims) : name(std::move(node_name)), out(dims) {}
  std::string name;
  Dims out;
  float* y = nullptr;
  // Its gradient; null unless a parameter or an embedding lies at or below
  // it, which is all a backward pass must reach.
  float* dy = nullptr;
  bool needs_grad = false;
  int readers = 0;
  // The width of the vectors it holds side by side, for a dot interaction:
  // an embedding layer's rows, else the whole output.
  int vector_width = 0;
  // Whether a layer may overwrite its values in place: a layer's own output
  // (or one aliasing it), not the data's features or an embedding's columns.
  bool writable = false;
  DeviceMemory output, grad;  // empty when the node shares its input's
};

struct Model::Embedding {
  EmbeddingInput input;
  std::size_t node = 0;
  int width = 0;                          // its columns: dim, or ids x dim
  int unique = 0;                         // rows of the current batch
  int n = 0;                              // samples of the current batch
  DeviceMemory rows, row_grads;           // max_batch x ids rows at most
  DeviceMemory inverse, by_row, offsets;  // int32
  HostMemory staging;  // rows, inverse, by_row, offsets of a batch on their way up
  EmbeddingShape shape() const {
    return {n, input.ids, input.dim, width, unique, input.bag, input.mean};
  }
};

struct Model::Layer {
  LayerKind kind = LayerKind::dense;
  ModelLayer spec;
  std::size_t at = 0;  // its place in the configured list, for messages
  std::size_t node = 0;
  std::vector<std::size_t> inputs;  // nodes
  Dims in;                          // single-input layers: the input's shape
  std::size_t weight = 0;           // variable index of the weights; the bias follows
  DeviceMemory argmax;              // maxpool2d
  DeviceMemory columns;  // conv2d: its im2col matrix from forward, if the backend keeps it
  // dot_interaction with several inputs: them side by side, and their gradient.
  DeviceMemory gathered, gathered_grad;
  InteractionShape interaction{};
  bool fused_relu = false;  // conv2d: the relu after it is applied in its forward

  bool has_params() const { return kind == LayerKind::dense || kind == LayerKind::conv2d; }
  ConvShape conv(int n) const { return {n, in.c, in.h, in.w, spec.filters, spec.kernel}; }
  PoolShape pool(int n) const { return {n, in.c, in.h, in.w, spec.kernel}; }
  InteractionShape interaction_of(int n) const {
    InteractionShape s = interaction;
    s.n = n;
    return s;
  }
};

Model::Model(const ModelConfig& config, Backend& backend, InputShape input, int classes,
             int max_batch, const std::vector<TableSpec>& tables)
    : Model(config, &backend, input, classes, max_batch, tables) {}

std::vector<EmbeddingInput> Model::check(const ModelConfig& config, InputShape input, int classes,
                                         const std::vector<TableSpec>& tables) {
  const Model plan(config, nullptr, input, classes, 1, tables);
  return plan.embedding_inputs_;
}

std::vector<VariableSpec> Model::variables_of(const ModelConfig& config, InputShape input,
                                              int classes, const std::vector<TableSpec>& tables) {
  const Model plan(config, nullptr, input, classes, 1, tables);
  return plan.variables_;
}

Model::Model(const ModelConfig& config, Backend* backend, InputShape input, int classes,
             int max_batch, const std::vector<TableSpec>& tables)
    : backend_(backend),
      preset_(config.preset),
      input_shape_(input),
      classes_(classes),
      max_batch_(max_batch),
      bce_(config.uses_bce()) {
  if (max_batch < 1) {
    throw std::invalid_argument("model: max_batch must be >= 1, got " + std::to_string(max_batch));
  }
  std::vector<ModelLayer> specs = model_layers(config);
  // The embedding layers open the list.
  std::size_t opening = 0;
  while (opening < specs.size() && is_embedding(specs[opening])) ++opening;
  if (input.c < (opening > 0 ? 0 : 1) || input.h < 1 || input.w < 1 || classes < 2) {
    throw std::invalid_argument("model: bad input shape or class count");
  }
  if (bce_ && classes != 2)
    throw ConfigError("model.loss: bce needs a data set of 2 classes (click or not), got " +
                      std::to_string(classes));
  features_ = input.c * input.h * input.w;
  build_graph(std::move(specs), opening, tables);
  declare_variables();
  if (backend_) allocate();
}

Model::~Model() = default;

void Model::build_graph(std::vector<ModelLayer> specs, std::size_t opening,
                        const std::vector<TableSpec>& tables) {
  nodes_.push_back({"input", Dims{input_shape_.c, input_shape_.h, input_shape_.w, false}});
  const auto find_node = [&](const std::string& name) {
    return std::ranges::find(nodes_, name, &Node::name);
  };
  const auto name_node = [&](const std::string& where, Node node) {
    if (find_node(node.name) != nodes_.end())
      throw ConfigError(where + "the name '" + node.name + "' is taken by an earlier layer");
    nodes_.push_back(std::move(node));
    return nodes_.size() - 1;
  };

  int next_id = 0;
  for (std::size_t i = 0; i < opening; ++i) {
    const ModelLayer& spec = specs[i];
    const std::string where = "model: layer " + std::to_string(i) + " (" + spec.type + "): ";
    const auto table = std::ranges::find(tables, spec.table, &TableSpec::name);
    if (table == tables.end())
      throw ConfigError(where + "table '" + spec.table + "' is not among the run's tables:");
    if (spec.ids < 1) throw ConfigError(where + "ids must be >= 1");
    Embedding e;
    const int first = spec.first_id < 0 ? next_id : spec.first_id;
    if (static_cast<std::int64_t>(first) + spec.ids > kMaxIdsPerSample)
      throw ConfigError(where + "its ids end at id " +
                        std::to_string(static_cast<std::int64_t>(first) + spec.ids) +
                        " of a sample, past the most a sample may have, " +
                        std::to_string(kMaxIdsPerSample));
    next_id = first + spec.ids;
    e.input = {spec.table,
               first,
               spec.ids,
               static_cast<int>(table->dim),
               spec.type == "embedding_bag",
               spec.pool == "mean"};
    e.width = e.input.bag ? e.input.dim : e.input.ids * e.input.dim;
    e.node = name_node(where, {spec.name.empty() ? spec.type + std::to_string(i) : spec.name,
                               Dims{e.width, 1, 1, true}});
    nodes_[e.node].needs_grad = true;
    if (!e.input.bag) nodes_[e.node].vector_width = e.input.dim;
    embedding_inputs_.push_back(e.input);
    embeddings_.push_back(std::move(e));
  }
  if (opening == specs.size())
    throw ConfigError("model: the layers after the embedding layers must end in a dense layer");

  int dense_count = 0, conv_count = 0, other_count = 0;
  const auto add = [&](const ModelLayer& spec, std::size_t at, std::vector<std::size_t> inputs) {
    const std::string where = "model: layer " + std::to_string(at) + " (" + spec.type + "): ";
    const LayerKind kind = parse_kind(spec.type, at);
    auto need_positive = [&](int value, const char* what) {
      if (value < 1) {
        throw ConfigError(where + what + " must be >= 1, got " + std::to_string(value));
      }
    };
    const bool joins = kind == LayerKind::concat || kind == LayerKind::dot_interaction;
    if (!joins && inputs.size() != 1)
      throw ConfigError(where + "takes one input, got " + std::to_string(inputs.size()));
    if (joins && inputs.empty()) throw ConfigError(where + "needs its inputs");
    for (const std::size_t in : inputs) {
      if (in == 0 && features_ == 0)
        throw ConfigError(where + "reads the input, but the data has no features besides ids");
      // The input's features may feed several layers: no gradient flows
      // into them. Any other output feeds one, so no gradient needs a sum.
      if (in != 0 && ++nodes_[in].readers > 1)
        throw ConfigError(where + "reads '" + nodes_[in].name +
                          "', which an earlier layer reads already (each output feeds one layer)");
    }
    Layer layer;
    layer.kind = kind;
    layer.spec = spec;
    layer.at = at;
    layer.inputs = inputs;
    const Dims dims = nodes_[inputs[0]].out;
    layer.in = dims;
    Dims out = dims;
    std::string name;
    auto need_image = [&] {
      if (dims.flat) {
        throw ConfigError(where +
                          "needs an image input (channels x height x "
                          "width), got the flat " +
                          dims.text() + " output of '" + nodes_[inputs[0]].name + "'");
      }
    };
    switch (kind) {
      case LayerKind::dense:
        need_positive(spec.units, "units");
        name = "dense" + std::to_string(dense_count++);
        // A dense layer reads an image as its flattened NCHW vector.
        out = {spec.units, 1, 1, true};
        break;
      case LayerKind::conv2d:
        need_positive(spec.filters, "filters");
        need_positive(spec.kernel, "kernel");
        need_image();
        if (spec.kernel > dims.h || spec.kernel > dims.w) {
          throw ConfigError(where + "kernel " + std::to_string(spec.kernel) +
                            " does not fit its input " + dims.text());
        }
        name = "conv" + std::to_string(conv_count++);
        out = {spec.filters, dims.h - spec.kernel + 1, dims.w - spec.kernel + 1, false};
        break;
      case LayerKind::maxpool2d:
        need_positive(spec.kernel, "kernel");
        need_image();
        if (spec.kernel > dims.h || spec.kernel > dims.w) {
          throw ConfigError(where + "window " + std::to_string(spec.kernel) +
                            " does not fit its input " + dims.text());
        }
        name = "maxpool" + std::to_string(other_count++);
        out = {dims.c, dims.h / spec.kernel, dims.w / spec.kernel, false};
        break;
      case LayerKind::relu:
        name = "relu" + std::to_string(other_count++);
        break;
      case LayerKind::flatten:
        name = "flatten" + std::to_string(other_count++);
        out = {static_cast<int>(dims.size()), 1, 1, true};
        break;
      case LayerKind::concat: {
        std::size_t width = 0;
        for (const std::size_t in : inputs) width += nodes_[in].out.size();
        name = "concat" + std::to_string(other_count++);
        out = {static_cast<int>(width), 1, 1, true};
        break;
      }
      case LayerKind::dot_interaction: {
        // The first input sets the vectors' width and is passed through;
        // every input is whole vectors.
        const Node& first = nodes_[inputs.front()];
        const int dim = first.vector_width > 0 ? first.vector_width : static_cast<int>(dims.size());
        std::size_t width = 0;
        for (const std::size_t in : inputs) {
          if (nodes_[in].vector_width > 0 && nodes_[in].vector_width != dim)
            throw ConfigError(where + "input '" + nodes_[in].name + "' holds rows of " +
                              std::to_string(nodes_[in].vector_width) +
                              " floats, not vectors of the first input's width " +
                              std::to_string(dim));
          if (nodes_[in].out.size() % static_cast<std::size_t>(dim) != 0)
            throw ConfigError(where + "input '" + nodes_[in].name + "' has " +
                              std::to_string(nodes_[in].out.size()) +
                              " floats per sample, not a whole number of vectors of the first "
                              "input's width " +
                              std::to_string(dim));
          width += nodes_[in].out.size();
        }
        const int vectors = static_cast<int>(width / static_cast<std::size_t>(dim));
        if (vectors < 2)
          throw ConfigError(where + "needs at least two vectors of width " + std::to_string(dim) +
                            " among its inputs, got one");
        layer.interaction = {0, vectors, dim, static_cast<int>(dims.size())};
        name = "interaction" + std::to_string(other_count++);
        out = {layer.interaction.out_width(), 1, 1, true};
        break;
      }
    }
    Node node{spec.name.empty() ? name : spec.name, out};
    node.needs_grad = layer.has_params() || std::ranges::any_of(inputs, [&](std::size_t in) {
                        return nodes_[in].needs_grad;
                      });
    layer.node = name_node(where, std::move(node));
    layers_.push_back(std::move(layer));
  };

  for (std::size_t i = opening; i < specs.size(); ++i) {
    const ModelLayer& spec = specs[i];
    if (is_embedding(spec))
      throw ConfigError("model: layer " + std::to_string(i) + " (" + spec.type +
                        "): embedding layers must come first, before any other layer");
    std::vector<std::size_t> inputs;
    for (const std::string& name : spec.inputs) {
      const auto node = find_node(name);
      if (node == nodes_.end()) {
        std::string known;
        for (const Node& n : nodes_) known += (known.empty() ? "" : ", ") + n.name;
        throw ConfigError("model: layer " + std::to_string(i) + " (" + spec.type + "): input '" +
                          name + "' names no earlier layer (" + known + ")");
      }
      inputs.push_back(static_cast<std::size_t>(node - nodes_.begin()));
    }
    if (spec.inputs.empty() && !layers_.empty()) inputs = {layers_.back().node};
    if (spec.inputs.empty() && layers_.empty()) {
      // The first layer reads the features, then every embedding layer's
      // columns, joined when there are several.
      if (features_ > 0) inputs.push_back(0);
      for (const Embedding& e : embeddings_) inputs.push_back(e.node);
      if (inputs.size() > 1) {
        add(joining("concat", "(features and embeddings)", {}), i, inputs);
        inputs = {layers_.back().node};
      }
    }
    add(spec, i, inputs);
  }

  const Layer& last = layers_.back();
  const int units = bce_ ? 1 : classes_;
  if (last.kind != LayerKind::dense || nodes_[last.node].out.c != units) {
    throw ConfigError("model: layer " + std::to_string(last.at) + " (" + last.spec.type +
                      "): the last layer must be dense with " +
                      (bce_ ? std::string("1 unit (the logit of binary cross-entropy)")
                            : std::to_string(classes_) + " units (the number of classes)") +
                      ", got output " + nodes_[last.node].out.text());
  }
  for (std::size_t e = 0; e < embeddings_.size(); ++e)
    if (nodes_[embeddings_[e].node].readers == 0)
      throw ConfigError("model: layer " + std::to_string(e) + " (" + specs[e].type +
                        "): no layer reads its output");
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i)
    if (nodes_[layers_[i].node].readers == 0)
      throw ConfigError("model: layer " + std::to_string(layers_[i].at) + " (" +
                        layers_[i].spec.type + "): no layer reads its output");
}

// Every layer's weight and bias, in layer order, with their initializers:
// what the ps holds, known without a backend (Model::variables_of).
void Model::declare_variables() {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    if (!layer.has_params()) continue;
    const Node& node = nodes_[layer.node];
    // He for layers whose output goes through a relu (pools and flattens
    // in between do not change that), Glorot otherwise.
    bool before_relu = false;
    std::size_t reader = layer.node;
    for (std::size_t j = i + 1; j < layers_.size(); ++j) {
      if (layers_[j].inputs.front() != reader) continue;
      if (layers_[j].kind == LayerKind::maxpool2d || layers_[j].kind == LayerKind::flatten) {
        reader = layers_[j].node;
        continue;
      }
      before_relu = layers_[j].kind == LayerKind::relu && layers_[j].inputs.size() == 1;
      break;
    }
    const bool is_conv = layer.kind == LayerKind::conv2d;
    const std::size_t taps =
        is_conv ? static_cast<std::size_t>(layer.spec.kernel) * layer.spec.kernel : 1;
    const std::size_t fan_in = (is_conv ? layer.in.c : layer.in.size()) * taps;
    const std::size_t fan_out = static_cast<std::size_t>(node.out.c) * taps;
    const double limit = before_relu ? std::sqrt(6.0 / static_cast<double>(fan_in))
                                     : std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
    layer.weight = variables_.size();
    variables_.push_back({node.name + "/w", fan_in * node.out.c,
                          InitSpec{InitKind::uniform, static_cast<float>(limit)}});
    variables_.push_back({node.name + "/b", static_cast<std::uint64_t>(node.out.c),
                          InitSpec{InitKind::zeros, 0.0f}});
  }
  for (const VariableSpec& v : variables_) parameter_count_ += v.size;
}

void Model::allocate() {
  const auto batch = static_cast<std::size_t>(max_batch_);
  std::size_t workspace = 0;
  const auto floats = [&](std::size_t per_sample) {
    return backend_->alloc(batch * per_sample * sizeof(float));
  };
  const auto own = [&](Node& node) {
    node.output = floats(node.out.size());
    node.y = node.output.data();
    if (node.needs_grad) {
      node.grad = floats(node.out.size());
      node.dy = node.grad.data();
    }
  };
  if (features_ > 0) {
    input_ = floats(static_cast<std::size_t>(features_));
    nodes_[0].y = input_.data();
  }
  for (Embedding& e : embeddings_) {
    own(nodes_[e.node]);
    // At most one row per id of a full batch.
    const std::size_t ids = batch * static_cast<std::size_t>(e.input.ids);
    const std::size_t row_floats = ids * static_cast<std::size_t>(e.input.dim);
    e.rows = backend_->alloc(row_floats * sizeof(float));
    e.row_grads = backend_->alloc(row_floats * sizeof(float));
    e.inverse = backend_->alloc(ids * sizeof(std::int32_t));
    e.by_row = backend_->alloc(ids * sizeof(std::int32_t));
    e.offsets = backend_->alloc((ids + 1) * sizeof(std::int32_t));
    e.staging =
        backend_->alloc_host(row_floats * sizeof(float) + (3 * ids + 1) * sizeof(std::int32_t));
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    Node& node = nodes_[layer.node];
    const Node& input = nodes_[layer.inputs[0]];
    if (layer.has_params() && layer.kind == LayerKind::conv2d) {
      workspace = std::max(workspace, backend_->conv2d_workspace(layer.conv(max_batch_)));
      if (const std::size_t kept = backend_->conv2d_columns(layer.conv(max_batch_)); kept > 0)
        layer.columns = backend_->alloc(kept * sizeof(float));
      // A relu right after a convolution works in place on its output, so
      // the backend may fuse it into the convolution.
      layer.fused_relu = i + 1 < layers_.size() && layers_[i + 1].kind == LayerKind::relu &&
                         layers_[i + 1].inputs.front() == layer.node;
    }
    // A relu of a layer's output overwrites it; the data's features and the
    // embedding rows' columns are kept (a flatten of them aliases them).
    const bool in_place =
        layer.kind == LayerKind::flatten || (layer.kind == LayerKind::relu && input.writable);
    if (in_place) {
      node.y = input.y;
      node.dy = input.dy;
      node.writable = input.writable;
    } else {
      own(node);
      node.writable = true;
    }
    if (layer.kind == LayerKind::maxpool2d) {
      layer.argmax = backend_->alloc(batch * node.out.size() * sizeof(std::int32_t));
    }
    if (layer.kind == LayerKind::dot_interaction && layer.inputs.size() > 1) {
      layer.gathered = floats(static_cast<std::size_t>(layer.interaction.in_width()));
      if (node.needs_grad)
        layer.gathered_grad = floats(static_cast<std::size_t>(layer.interaction.in_width()));
    }
  }
  for (const VariableSpec& v : variables_) {
    params_.push_back(backend_->alloc(v.size * sizeof(float)));
    grads_.push_back(backend_->alloc(v.size * sizeof(float)));
  }
  labels_ = backend_->alloc(batch * sizeof(std::int32_t));
  loss_ = backend_->alloc(batch * sizeof(float));
  correct_ = backend_->alloc(batch * sizeof(float));
  if (workspace > 0) workspace_ = backend_->alloc(workspace * sizeof(float));
}

void Model::initialize(std::uint64_t seed) {
  std::vector<float> values;
  for (std::size_t i = 0; i < variables_.size(); ++i) {
    values.resize(variables_[i].size);
    init_fill(values, seed, variables_[i].name, 0, variables_[i].init);
    backend_->upload(values.data(), params_[i].data(), values.size() * sizeof(float));
    backend_->synchronize();
  }
}

const float* Model::logits() const { return nodes_[layers_.back().node].y; }
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
  backend_->upload(staged_rows, e.rows.data(), rows.size() * sizeof(float));
  backend_->upload(staged_inverse, e.inverse.data(), ids * sizeof(std::int32_t));
  backend_->upload(by_row, e.by_row.data(), ids * sizeof(std::int32_t));
  backend_->upload(offsets, e.offsets.data(), (unique + 1) * sizeof(std::int32_t));
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
  backend_->download(e.row_grads.data(), e.staging.data(), floats * sizeof(float));
  backend_->synchronize();
  std::copy_n(e.staging.data(), floats, out.data());
}

void Model::forward(int n) {
  if (n < 1 || n > max_batch_) {
    throw std::invalid_argument("model: batch of " + std::to_string(n) +
                                " samples, expected 1 to " + std::to_string(max_batch_));
  }
  for (std::size_t index = 0; index < embeddings_.size(); ++index) {
    const Embedding& e = embeddings_[index];
    if (e.n != n)
      throw std::invalid_argument("model: embedding layer " + std::to_string(index) +
                                  " was given " + std::to_string(e.n) +
                                  " samples' ids for a batch of " + std::to_string(n));
    const TraceSpan span("forward", "compute", nodes_[e.node].name);
    backend_->embedding_forward(e.rows.data(), e.inverse.data<std::int32_t>(), nodes_[e.node].y,
                                e.shape());
  }
  const auto rows = static_cast<std::size_t>(n);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    const Node& node = nodes_[layer.node];
    const float* x = nodes_[layer.inputs.front()].y;
    const TraceSpan span("forward", "compute", node.name);
    switch (layer.kind) {
      case LayerKind::dense:
        backend_->dense_forward(x, params_[layer.weight].data(), params_[layer.weight + 1].data(),
                                node.y, n, static_cast<int>(layer.in.size()), node.out.c);
        break;
      case LayerKind::conv2d:
        // The relu after it is then done.
        if (layer.fused_relu) {
          backend_->conv2d_relu_forward(x, params_[layer.weight].data(),
                                        params_[layer.weight + 1].data(), node.y, workspace_.data(),
                                        layer.columns.data(), layer.conv(n));
          ++i;
        } else {
          backend_->conv2d_forward(x, params_[layer.weight].data(),
                                   params_[layer.weight + 1].data(), node.y, workspace_.data(),
                                   layer.columns.data(), layer.conv(n));
        }
        break;
      case LayerKind::relu:
        backend_->relu_forward(x, node.y, rows * node.out.size());
        break;
      case LayerKind::maxpool2d:
        backend_->maxpool_forward(x, node.y, layer.argmax.data<std::int32_t>(), layer.pool(n));
        break;
      case LayerKind::flatten:
        break;
      case LayerKind::concat:
      case LayerKind::dot_interaction: {
        const bool concat = layer.kind == LayerKind::concat;
        if (!concat && layer.inputs.size() == 1) {
          backend_->dot_interaction_forward(x, node.y, layer.interaction_of(n));
          break;
        }
        float* joined = concat ? node.y : layer.gathered.data();
        const std::size_t width = concat ? node.out.size() : layer.interaction.in_width();
        std::size_t column = 0;
        for (const std::size_t in : layer.inputs) {
          const std::size_t w = nodes_[in].out.size();
          backend_->copy_columns(nodes_[in].y, w, joined + column, width, rows, w);
          column += w;
        }
        if (!concat) backend_->dot_interaction_forward(joined, node.y, layer.interaction_of(n));
        break;
      }
    }
  }
}

void Model::loss(int n) {
  const Node& last = nodes_[layers_.back().node];
  if (bce_) {
    backend_->bce_logits(last.y, label_buffer(), last.dy, loss_.data(), correct_.data(), n);
  } else {
    backend_->softmax_xent(last.y, label_buffer(), last.dy, loss_.data(), correct_.data(), n,
                           classes_);
  }
}

void Model::emulate(double step_ms) {
  if (!(step_ms > 0)) throw std::invalid_argument("model: an emulated step takes more than 0 ms");
  emulated_step_ms_ = step_ms;
}

void Model::emulated_forward_backward(
    int n, const std::function<void(std::size_t variable)>& on_grad_issued) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto at = [&](double fraction) {
    return start + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double, std::milli>(emulated_step_ms_ * fraction));
  };
  {
    const TraceSpan span("forward (emulated)", "compute");
    backend_->fill(loss_.data(), 0, static_cast<std::size_t>(n));
    backend_->fill(correct_.data(), 0, static_cast<std::size_t>(n));
    std::this_thread::sleep_until(at(1.0 / 3));
  }
  const TraceSpan span("backward (emulated)", "compute");
  const double total = static_cast<double>(std::max<std::uint64_t>(parameter_count_, 1));
  double done = 0;
  for (std::size_t i = variables_.size(); i-- > 0;) {
    const auto size = variables_[i].size;
    done += static_cast<double>(size);
    std::this_thread::sleep_until(at(1.0 / 3 + 2.0 / 3 * done / total));
    backend_->fill(grads_[i].data(), 0, size);
    backend_->axpby(kEmulatedDecay, params_[i].data(), 1, grads_[i].data(), size);
    on_grad_issued(i);
  }
  for (Embedding& e : embeddings_) {
    const auto floats = static_cast<std::size_t>(e.unique) * static_cast<std::size_t>(e.input.dim);
    backend_->fill(e.row_grads.data(), 0, floats);
    backend_->axpby(kEmulatedDecay, e.rows.data(), 1, e.row_grads.data(), floats);
  }
  std::this_thread::sleep_until(at(1));
}

void Model::forward_backward(int n,
                             const std::function<void(std::size_t variable)>& on_grad_issued) {
  if (emulated()) return emulated_forward_backward(n, on_grad_issued);
  forward(n);
  {
    const TraceSpan span("loss", "compute");
    loss(n);
  }
  const Node& last = nodes_[layers_.back().node];
  if (loss_scale_ != 1)
    backend_->scale(last.dy, loss_scale_, static_cast<std::size_t>(n) * last.out.size());
  for (std::size_t i = layers_.size(); i-- > 0;) backward_layer(i, n, on_grad_issued);
  for (Embedding& e : embeddings_) {
    const TraceSpan span("backward", "compute", nodes_[e.node].name);
    backend_->embedding_backward(nodes_[e.node].dy, e.by_row.data<std::int32_t>(),
                                 e.offsets.data<std::int32_t>(), e.row_grads.data(), e.shape());
  }
}

void Model::backward_layer(std::size_t index, int n,
                           const std::function<void(std::size_t variable)>& on_grad_issued) {
  Layer& layer = layers_[index];
  const Node& node = nodes_[layer.node];
  // Nothing below it has parameters or rows.
  if (!node.needs_grad) return;
  const TraceSpan span("backward", "compute", node.name);
  const Node& input = nodes_[layer.inputs.front()];
  float* dx = input.dy;  // null where the input needs no gradient
  const auto rows = static_cast<std::size_t>(n);
  switch (layer.kind) {
    case LayerKind::dense:
      backend_->dense_backward(input.y, params_[layer.weight].data(), node.dy, dx,
                               grads_[layer.weight].data(), grads_[layer.weight + 1].data(), n,
                               static_cast<int>(layer.in.size()), node.out.c);
      break;
    case LayerKind::conv2d:
      backend_->conv2d_backward(input.y, params_[layer.weight].data(), node.dy, dx,
                                grads_[layer.weight].data(), grads_[layer.weight + 1].data(),
                                workspace_.data(), layer.columns.data(), layer.conv(n));
      break;
    case LayerKind::relu:
      // In place when the relu works in place: node.dy is input.dy then.
      if (dx) backend_->relu_backward(node.y, node.dy, dx, rows * node.out.size());
      break;
    case LayerKind::maxpool2d:
      if (dx)
        backend_->maxpool_backward(node.dy, layer.argmax.data<std::int32_t>(), dx, layer.pool(n));
      break;
    case LayerKind::flatten:
      break;
    case LayerKind::concat:
    case LayerKind::dot_interaction: {
      const bool concat = layer.kind == LayerKind::concat;
      if (!concat && layer.inputs.size() == 1) {
        backend_->dot_interaction_backward(input.y, node.dy, dx, layer.interaction_of(n));
        break;
      }
      const float* joined_grad = node.dy;
      std::size_t width = node.out.size();
      if (!concat) {
        backend_->dot_interaction_backward(layer.gathered.data(), node.dy,
                                           layer.gathered_grad.data(), layer.interaction_of(n));
        joined_grad = layer.gathered_grad.data();
        width = layer.interaction.in_width();
      }
      std::size_t column = 0;
      for (const std::size_t in : layer.inputs) {
        const std::size_t w = nodes_[in].out.size();
        if (nodes_[in].dy)
          backend_->copy_columns(joined_grad + column, width, nodes_[in].dy, w, rows, w);
        column += w;
      }
      break;
    }
  }
  if (layer.has_params()) {
    on_grad_issued(layer.weight + 1);
    on_grad_issued(layer.weight);
  }
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
  HostMemory images = backend_->alloc_host(batch * floats * sizeof(float));
  HostMemory labels = backend_->alloc_host(batch * sizeof(std::int32_t));
  HostMemory losses = backend_->alloc_host(batch * sizeof(float));
  HostMemory correct = backend_->alloc_host(batch * sizeof(float));
  HostMemory logits = backend_->alloc_host(bce_ ? batch * sizeof(float) : 0);
  std::vector<float> scores;  // bce: every sample's logit, for the AUC
  if (bce_) scores.reserve(count);
  double loss_sum = 0, correct_sum = 0;
  for (std::size_t start = 0; start < count; start += batch) {
    const std::size_t n = std::min(batch, count - start);
    std::copy_n(data.image(start), n * floats, images.data());
    std::copy_n(data.labels.data() + start, n, labels.data<std::int32_t>());
    if (floats > 0) backend_->upload(images.data(), input_.data(), n * floats * sizeof(float));
    backend_->upload(labels.data(), labels_.data(), n * sizeof(std::int32_t));
    if (prepare) prepare(start, n);
    forward(static_cast<int>(n));
    loss(static_cast<int>(n));
    backend_->download(loss_.data(), losses.data(), n * sizeof(float));
    backend_->download(correct_.data(), correct.data(), n * sizeof(float));
    if (bce_) backend_->download(this->logits(), logits.data(), n * sizeof(float));
    backend_->synchronize();
    for (std::size_t i = 0; i < n; ++i) {
      loss_sum += losses.data()[i];
      correct_sum += correct.data()[i];
    }
    if (bce_) scores.insert(scores.end(), logits.data(), logits.data() + n);
  }
  EvalResult result;
  result.samples = count;
  if (count > 0) {
    result.loss = loss_sum / static_cast<double>(count);
    result.accuracy = correct_sum / static_cast<double>(count);
  }
  if (bce_) result.auc = exact_auc(scores, std::span(data.labels).first(count));
  return result;
}

std::string Model::describe() const {
  std::string text = "preset: " + preset_ + "\ninput: " + nodes_[0].out.text() +
                     "\nclasses: " + std::to_string(classes_) +
                     "\nloss: " + (bce_ ? "bce" : "softmax") +
                     "\nparameters: " + std::to_string(parameter_count_) + "\nlayers:\n";
  for (const Embedding& e : embeddings_)
    text += "  - {name: " + nodes_[e.node].name +
            ", type: " + std::string(e.input.bag ? "embedding_bag" : "embedding") +
            ", table: " + e.input.table + ", first_id: " + std::to_string(e.input.first_id) +
            ", ids: " + std::to_string(e.input.ids) +
            (e.input.bag ? std::string(", pool: ") + (e.input.mean ? "mean" : "sum") : "") +
            ", output: " + nodes_[e.node].out.text() + "}\n";
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    const Node& node = nodes_[layer.node];
    text += "  - {name: " + node.name + ", type: " + layer.spec.type;
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
      case LayerKind::concat:
      case LayerKind::dot_interaction:
        break;
    }
    // Inputs other than the layer before are the graph's branches.
    const bool chained =
        i > 0 && layer.inputs.size() == 1 && layer.inputs.front() == layers_[i - 1].node;
    if (!chained) {
      text += ", inputs: [";
      for (std::size_t k = 0; k < layer.inputs.size(); ++k)
        text += (k > 0 ? ", " : "") + nodes_[layer.inputs[k]].name;
      text += "]";
    }
    text += ", output: " + node.out.text();
    if (layer.has_params()) {
      text += ", parameters: " +
              std::to_string(variables_[layer.weight].size + variables_[layer.weight + 1].size);
    }
    text += "}\n";
  }
  return text;
}

}  // namespace pstrain
