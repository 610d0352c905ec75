// Row-major matrices are their transposes in cuBLASLt's column-major view,
// so each GEMM is set up on the transposes:
//   forward:      y^T [out x n]  = w^T [out x in] x^T [in x n],   + b per row
//   weight_grad: dw^T [out x in] = dy^T [out x n] (x^T)^T [n x in], and the
//                bias gradient sums A = dy^T over k (BGRADA): db per row.
#include "client/compute/cuda/lt_dense.h"

#include <cstdint>
#include <cstdio>

namespace pstrain::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{4} << 20;
constexpr std::uint32_t kAlignment = 16;

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kAlignment == 0; }

}  // namespace

struct LtDense::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    // Destroying descriptors cannot fail in a way worth reporting.
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtDense::LtDense(cudaStream_t stream) : stream_(stream) {
  PSTRAIN_CUDA_CHECK(cublasLtCreate(&handle_));
  try {
    workspace_ = device_buffer<std::byte>(kWorkspaceBytes);
  } catch (...) {
    cublasLtDestroy(handle_);
    throw;
  }
}

LtDense::~LtDense() {
  plans_.clear();
  const cublasStatus_t status = cublasLtDestroy(handle_);
  if (status != CUBLAS_STATUS_SUCCESS)
    std::fprintf(stderr, "pstrain cuda: cublasLtDestroy failed: %s\n",
                 cublasGetStatusString(status));
}

LtDense::Plan* LtDense::plan(Kind kind, int n, int in, int out) {
  auto [it, fresh] = plans_.try_emplace({kind, n, in, out});
  if (!fresh) return it->second.get();
  const bool forward = kind == Kind::forward;
  auto p = std::make_unique<Plan>();
  PSTRAIN_CUDA_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_N;
  const cublasOperation_t trans_b = forward ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasLtEpilogue_t epilogue = forward ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADA;
  PSTRAIN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                    sizeof(trans_a)));
  PSTRAIN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                    sizeof(trans_b)));
  PSTRAIN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &epilogue, sizeof(epilogue)));
  // Stored matrices (before the op): A [out x k], B [in x n] or [in x k], D.
  const int k = forward ? in : n;
  PSTRAIN_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, out, k, out));
  PSTRAIN_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, in, n, in));
  PSTRAIN_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, out, forward ? n : in, out));

  cublasLtMatmulPreference_t preference = nullptr;
  PSTRAIN_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const std::uint64_t workspace = kWorkspaceBytes;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  for (auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &kAlignment,
                                                    sizeof(kAlignment));
  }
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d, preference, 1,
                                            &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  // No algorithm for this shape (or epilogue) here: the unfused path.
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return nullptr;
  p->algo = result.algo;
  it->second = std::move(p);
  return it->second.get();
}

bool LtDense::run(Plan& p, const void* a, const void* b, void* d, const void* bias) {
  PSTRAIN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof(bias)));
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(handle_, p.desc, &one, a, p.a, b, p.b, &zero, d, p.d, d, p.d, &p.algo,
                     workspace_.get(), kWorkspaceBytes, stream_);
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  // The heuristic offered an algorithm the call then refuses (an epilogue
  // this GPU or shape lacks): nothing was enqueued, and the caller's unfused
  // path serves this call. Other errors are errors.
  if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE)
    check(status, "cublasLtMatmul");
  return false;
}

bool LtDense::forward(const float* x, const float* w, const float* b, float* y, int n, int in,
                      int out) {
  if (!aligned(x) || !aligned(w) || !aligned(b) || !aligned(y)) return false;
  return call(Kind::forward, n, in, out, w, x, y, b);
}

bool LtDense::weight_grad(const float* x, const float* dy, float* dw, float* db, int n, int in,
                          int out) {
  if (!aligned(x) || !aligned(dy) || !aligned(dw) || !aligned(db)) return false;
  return call(Kind::weight_grad, n, in, out, dy, x, dw, db);
}

bool LtDense::call(Kind kind, int n, int in, int out, const void* a, const void* b, void* d,
                   const void* bias) {
  Plan* p = plan(kind, n, in, out);
  if (!p) return false;
  if (run(*p, a, b, d, bias)) return true;
  std::fprintf(stderr,
               "pstrain cuda: cuBLASLt refused its %s epilogue for n=%d in=%d out=%d; that shape "
               "takes the unfused path\n",
               kind == Kind::forward ? "bias" : "bias-gradient", n, in, out);
  plans_[{kind, n, in, out}].reset();
  return false;
}

}  // namespace pstrain::cuda
