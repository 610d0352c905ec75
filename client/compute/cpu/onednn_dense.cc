#include "client/compute/cpu/onednn_dense.h"

#include <omp.h>

#include <dnnl.hpp>

namespace pstrain {
namespace {

using dnnl::memory;
constexpr auto kF32 = memory::data_type::f32;

// A rows x cols matrix at a caller's pointer, row-major, or its transpose
// (the same memory read column-major).
memory::desc matrix(int rows, int cols, bool transposed = false) {
  return transposed ? memory::desc({rows, cols}, kF32, memory::dims{1, rows})
                    : memory::desc({rows, cols}, kF32, memory::dims{cols, 1});
}

// One product dst = src * weights (+ bias), with the memory objects whose
// handles each call points at the caller's buffers.
struct Product {
  dnnl::matmul primitive;
  memory src, weights, bias, dst;

  Product(const memory::desc& s, const memory::desc& w, const memory::desc& d,
          const dnnl::engine& engine, const memory::desc& b = {})
      : primitive(dnnl::matmul::primitive_desc(dnnl::matmul::desc(s, w, b, d), engine)),
        src(s, engine, nullptr),
        weights(w, engine, nullptr),
        bias(b, engine, nullptr),
        dst(d, engine, nullptr) {}

  void run(dnnl::stream& stream, const float* s, const float* w, float* d,
           const float* b = nullptr) {
    src.set_data_handle(const_cast<float*>(s));
    weights.set_data_handle(const_cast<float*>(w));
    dst.set_data_handle(d);
    if (b) {
      bias.set_data_handle(const_cast<float*>(b));
      primitive.execute(stream, {{DNNL_ARG_SRC, src},
                                 {DNNL_ARG_WEIGHTS, weights},
                                 {DNNL_ARG_BIAS, bias},
                                 {DNNL_ARG_DST, dst}});
    } else {
      primitive.execute(stream,
                        {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    }
  }
};

}  // namespace

struct OnednnDense::Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

// y = x w + b (the bias a 1 x out row, broadcast); dw = x^T dy; dx = dy w^T.
struct OnednnDense::Shape {
  Product forward, weights_grad, input_grad;

  Shape(int n, int in, int out, const dnnl::engine& engine)
      : forward(matrix(n, in), matrix(in, out), matrix(n, out), engine, matrix(1, out)),
        weights_grad(matrix(in, n, true), matrix(n, out), matrix(in, out), engine),
        input_grad(matrix(n, out), matrix(out, in, true), matrix(n, in), engine) {}
};

OnednnDense::OnednnDense(int threads) : threads_(threads), engine_(std::make_unique<Engine>()) {}
OnednnDense::~OnednnDense() = default;

OnednnDense::Shape& OnednnDense::shape(int n, int in, int out) {
  omp_set_num_threads(threads_);
  auto& slot = shapes_[{n, in, out}];
  if (!slot) slot = std::make_unique<Shape>(n, in, out, engine_->engine);
  return *slot;
}

void OnednnDense::forward(const float* x, const float* w, const float* b, float* y, int n, int in,
                          int out) {
  Shape& p = shape(n, in, out);
  p.forward.run(engine_->stream, x, w, y, b);
  engine_->stream.wait();
}

void OnednnDense::backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                           int n, int in, int out) {
  Shape& p = shape(n, in, out);
  p.weights_grad.run(engine_->stream, x, dy, dw);
  if (dx) p.input_grad.run(engine_->stream, dy, w, dx);
  engine_->stream.wait();
}

}  // namespace pstrain
