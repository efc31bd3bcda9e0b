// What the C API's tests may ask beyond include/tapegrad/c_api.h.
#pragma once
#include <cstddef>

namespace tg::capi {

// Calls of tg_region_attention_backward served by launching a CUDA graph so far.
std::size_t graph_launches();

}  // namespace tg::capi
