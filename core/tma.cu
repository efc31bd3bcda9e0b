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

CUtensorMap encode(const void* base, CUtensorMapDataType type, const TensorShape& shape, const char* op) {
  TG_CHECK(shape.rank >= 1 && shape.rank <= 3, op, ": a tensor map of rank ", shape.rank, " (1 to 3 here)");
  CUtensorMap map{};
  cuuint64_t dims[3], strides[2];
  cuuint32_t box[3];
  const cuuint32_t element_strides[3] = {1, 1, 1};
  for (int i = 0; i < shape.rank; ++i) dims[i] = shape.dims[i], box[i] = shape.box[i];
  for (int i = 0; i + 1 < shape.rank; ++i) strides[i] = shape.strides[i];
  const CUresult r = encoder(op)(&map, type, static_cast<cuuint32_t>(shape.rank), const_cast<void*>(base), dims,
                                 strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TG_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a ",
           shape.rank, "-d tensor of dims (", shape.dims[0], ", ", shape.dims[1], ", ", shape.dims[2],
           ") and strides (", shape.strides[0], ", ", shape.strides[1], ") bytes in boxes of (", shape.box[0], ", ",
           shape.box[1], ", ", shape.box[2], ")");
  return map;
}

CUtensorMap encode_2d(const __half* base, int64_t rows, int64_t cols, int box_rows, int box_cols, const char* op) {
  const TensorShape shape{2,
                          {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), 1},
                          {static_cast<uint64_t>(cols) * sizeof(__half), 0},
                          {static_cast<uint32_t>(box_cols), static_cast<uint32_t>(box_rows), 1}};
  return encode(base, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, shape, op);
}

}  // namespace tg::cuda::tma
