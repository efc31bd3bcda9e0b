// Every op the library records on the tape, listed once. A node's name comes
// from here, and the op table of the tests and benchmarks (tests/op_table.cpp)
// must give each one at least one case: the test `ops/every op of the list
// has a gradcheck row and a CUDA parity row` fails otherwise. docs/adding-an-op.md walks through adding a row.
#pragma once

#define TG_OP_LIST(X)                                                              \
  X(add) X(sub) X(mul) X(div)                                                      \
  X(add_scalar) X(mul_scalar) X(neg) X(exp) X(log) X(sqrt) X(tanh) X(relu) X(gelu) X(silu) \
  X(sum)                                                                           \
  X(view) X(permute) X(transpose) X(narrow) X(expand) X(unsqueeze) X(squeeze)      \
  X(contiguous) X(clone) X(cast) X(to_device)                                      \
  X(matmul) X(linear) X(linear_fp16)                                               \
  X(softmax) X(masked_fill) X(dropout) X(edit_bias) X(layer_norm) X(mse_loss)                       \
  X(fused_attention) X(fused_qkv_attention) X(fused_attention_layer)

namespace tg {

enum class OpId {
#define TG_OP_ENUM(name) name,
  TG_OP_LIST(TG_OP_ENUM)
#undef TG_OP_ENUM
};

inline constexpr const char* kOpNames[] = {
#define TG_OP_NAME(name) #name,
    TG_OP_LIST(TG_OP_NAME)
#undef TG_OP_NAME
};

inline constexpr int kOpCount = static_cast<int>(sizeof(kOpNames) / sizeof(kOpNames[0]));

constexpr const char* op_name(OpId op) { return kOpNames[static_cast<int>(op)]; }

}  // namespace tg
