#include "client/compute/cpu/onednn_conv.h"

#include <omp.h>

#include <dnnl.hpp>
#include <optional>

namespace pstrain {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

// One operand of a primitive: `user` wraps the caller's buffer in the
// backend's layout, `inner` is what the primitive reads or writes. They are
// the same memory where oneDNN chose the caller's layout; otherwise `inner`
// is a buffer of this shape and the reorders between the two are kept.
struct Operand {
  memory user, inner;
  dnnl::reorder to_inner, to_user;

  Operand(const memory::desc& user_desc, const memory::desc& wanted, const dnnl::engine& engine)
      : user(user_desc, engine, nullptr) {
    if (wanted == user_desc) {
      inner = user;
    } else {
      inner = memory(wanted, engine);
      to_inner = dnnl::reorder(user, inner);
      to_user = dnnl::reorder(inner, user);
    }
  }
  bool reordered() const { return bool(to_inner); }

  // The primitive's input, from the caller's `data`.
  const memory& in(const float* data, dnnl::stream& stream) {
    user.set_data_handle(const_cast<float*>(data));
    if (reordered()) to_inner.execute(stream, user, inner);
    return inner;
  }
  // The primitive's output, to land in the caller's `data` after finish().
  const memory& out(float* data) {
    user.set_data_handle(data);
    return inner;
  }
  void finish(dnnl::stream& stream) {
    if (reordered()) to_user.execute(stream, inner, user);
  }
};

}  // namespace

struct OnednnConv::Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

struct OnednnConv::Shape {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  // Forward: x, w, y; backward: x and dy for the weights gradient, dy and w
  // for the data gradient, dx, dw. Biases are plain vectors in every layout.
  // The data gradient reads the weights gradient's reordered dy where both
  // want the same layout (bd_dy is then empty), since dy is reordered from
  // the caller's layout once rather than twice.
  Operand x, w, y, bw_x, bw_dy;
  std::optional<Operand> bd_dy;
  Operand bd_w, dx, dw;
  memory b, db;

  Shape(const ConvShape& s, const dnnl::engine& engine) : Shape(descs(s, engine), engine) {}

 private:
  struct Descs {
    memory::desc x, w, b, y;
    dnnl::convolution_forward::primitive_desc fwd;
    dnnl::convolution_backward_data::primitive_desc bd;
    dnnl::convolution_backward_weights::primitive_desc bw;
  };

  // The caller's layouts, and the primitives': channels-last from 16 input
  // channels (a vector's worth, over which oneDNN's brgemm kernels run),
  // else "any", where oneDNN picks its blocked layout (16 channels a block).
  // Measured on the CNN preset's shapes with AVX-512 (a step's forward and
  // backward, reorders included, best of 7): its second convolution
  // (32->64) took 9.5-10 ms channels-last against 11-14 ms blocked, its
  // first (1->32) 1.5-1.8 ms blocked against 2.7 ms channels-last. The
  // caller's own layout gets a GEMM-based kernel, slower than either (4.2
  // and 18 ms).
  static Descs descs(const ConvShape& s, const dnnl::engine& engine) {
    const memory::dims xd = {s.n, s.c, s.h, s.w}, wd = {s.filters, s.c, s.kernel, s.kernel},
                       bd = {s.filters}, yd = {s.n, s.filters, s.out_h(), s.out_w()};
    const memory::dims strides = {1, 1}, padding = {0, 0};
    Descs d{{xd, kF32, Tag::nchw},
            {wd, kF32, Tag::oihw},
            {bd, kF32, Tag::x},
            {yd, kF32, Tag::nchw},
            {},
            {},
            {}};
    const Tag layout = s.c >= 16 ? Tag::nhwc : Tag::any;
    const memory::desc x(xd, kF32, layout), w(wd, kF32, Tag::any), y(yd, kF32, layout);
    const auto algo = dnnl::algorithm::convolution_direct;
    d.fwd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, x, w, d.b, y,
                                        strides, padding, padding),
        engine);
    d.bd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(algo, x, w, y, strides, padding, padding), engine,
        d.fwd);
    d.bw = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(algo, x, w, d.b, y, strides, padding, padding),
        engine, d.fwd);
    return d;
  }

  Shape(const Descs& d, const dnnl::engine& engine)
      : forward(d.fwd),
        backward_data(d.bd),
        backward_weights(d.bw),
        x(d.x, d.fwd.src_desc(), engine),
        w(d.w, d.fwd.weights_desc(), engine),
        y(d.y, d.fwd.dst_desc(), engine),
        bw_x(d.x, d.bw.src_desc(), engine),
        bw_dy(d.y, d.bw.diff_dst_desc(), engine),
        bd_w(d.w, d.bd.weights_desc(), engine),
        dx(d.x, d.bd.diff_src_desc(), engine),
        dw(d.w, d.bw.diff_weights_desc(), engine),
        b(d.b, engine, nullptr),
        db(d.b, engine, nullptr) {
    if (d.bd.diff_dst_desc() != d.bw.diff_dst_desc())
      bd_dy.emplace(d.y, d.bd.diff_dst_desc(), engine);
  }
};

OnednnConv::OnednnConv(int threads) : threads_(threads), engine_(std::make_unique<Engine>()) {}
OnednnConv::~OnednnConv() = default;

OnednnConv::Shape& OnednnConv::shape(const ConvShape& s) {
  omp_set_num_threads(threads_);
  auto& slot = shapes_[{s.n, s.c, s.h, s.w, s.filters, s.kernel}];
  if (!slot) slot = std::make_unique<Shape>(s, engine_->engine);
  return *slot;
}

void OnednnConv::forward(const float* x, const float* w, const float* b, float* y,
                         const ConvShape& s) {
  Shape& p = shape(s);
  auto& stream = engine_->stream;
  p.b.set_data_handle(const_cast<float*>(b));
  p.forward.execute(stream, {{DNNL_ARG_SRC, p.x.in(x, stream)},
                             {DNNL_ARG_WEIGHTS, p.w.in(w, stream)},
                             {DNNL_ARG_BIAS, p.b},
                             {DNNL_ARG_DST, p.y.out(y)}});
  p.y.finish(stream);
  stream.wait();
}

void OnednnConv::backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                          float* db, const ConvShape& s) {
  Shape& p = shape(s);
  auto& stream = engine_->stream;
  p.db.set_data_handle(db);
  const memory& dy_for_weights = p.bw_dy.in(dy, stream);
  p.backward_weights.execute(stream, {{DNNL_ARG_SRC, p.bw_x.in(x, stream)},
                                      {DNNL_ARG_DIFF_DST, dy_for_weights},
                                      {DNNL_ARG_DIFF_WEIGHTS, p.dw.out(dw)},
                                      {DNNL_ARG_DIFF_BIAS, p.db}});
  p.dw.finish(stream);
  if (dx) {
    p.backward_data.execute(
        stream, {{DNNL_ARG_DIFF_DST, p.bd_dy ? p.bd_dy->in(dy, stream) : dy_for_weights},
                 {DNNL_ARG_WEIGHTS, p.bd_w.in(w, stream)},
                 {DNNL_ARG_DIFF_SRC, p.dx.out(dx)}});
    p.dx.finish(stream);
  }
  stream.wait();
}

}  // namespace pstrain
