#include "core/tma.cuh"

#include <cudaTypedefs.h>

#include <mutex>

#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda::tma {

namespace {

// cuTensorMapEncodeTiled through the runtime's entry-point query: the
// library links cudart alone, not the driver's libcuda.
PFN_cuTensorMapEncodeTiled_v12000 encoder(const char* op) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [&] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    TG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found), op);
    if (found == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  TG_CHECK(fn != nullptr, op, ": the driver has no cuTensorMapEncodeTiled");
  return fn;
}

}  // namespace

CUtensorMap encode_2d(const __half* base, int64_t rows, int64_t cols, int box_rows, int box_cols, const char* op) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_bytes[1] = {static_cast<cuuint64_t>(cols) * sizeof(__half)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encoder(op)(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<__half*>(base), dims, row_bytes,
                                 box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TG_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a [", rows,
           ", ", cols, "] fp16 matrix in boxes of ", box_rows, " x ", box_cols);
  return map;
}

}  // namespace tg::cuda::tma
