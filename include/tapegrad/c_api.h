/* tapegrad's C API: the region-aware attention layer's backward (the
 * benchmark interface of shared/spec/region-attention.md) for callers in any
 * language (Python ctypes, Rust, the benchmark). Built as libtapegrad.so. */
#ifndef TAPEGRAD_C_API_H
#define TAPEGRAD_C_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TG_PRECISION_HIGHEST = 0, TG_PRECISION_HIGH = 1 } tg_precision;

/* inputs: the spec's 19 tensor inputs in the spec's order (grad_output ... dropout_mask), each a device
   pointer to contiguous float32; outputs: the 8 gradients in the spec's order, device pointers, none of
   them sharing memory with an input or another output (refused: nothing written).
   Returns 0 on success, nonzero on failure with the reason in tg_last_error(). stream may be NULL.
   The call is ordered on `stream` with no host synchronisation. Repeated calls with the same arguments
   (pointers, sizes, scalars, precision, stream) are replayed from a CUDA graph of tapegrad's own, on a
   private stream joined to `stream` by events: the third such call captures it, later ones launch it
   (TG_CUDA_GRAPHS=0 turns this off; it costs one call's temporaries kept for the private stream).
   The call can also be captured in the caller's own graph (on a stream other than NULL; it then runs
   every kernel on `stream`). Its temporaries come from tapegrad's caching allocator, which takes them
   back when the call returns: replay such a graph on the stream it was captured on, and not while
   tapegrad tensors allocated after the capture are alive (C API calls allocate none that outlive the
   call), or the replay writes memory handed on since. */
int tg_region_attention_backward(const float* const* inputs, float scale, float dropout_p,
                                 int64_t batch, int64_t seq_len, int64_t hidden, int64_t heads,
                                 int64_t max_positions, float* const* outputs, tg_precision precision,
                                 void* cuda_stream);

/* The reason the last failing call on this thread failed ("" if none did). */
const char* tg_last_error(void);

const char* tg_version(void);

#ifdef __cplusplus
}
#endif

#endif
