// The toy edit task, made on the fly: a 32x32 RGB image of one coloured
// shape (square, circle or triangle) on a coloured background; the edit is
// "recolour the shape to palette colour k"; the edit region is the set of 4x4
// patches the shape touches. Example i of the stream `seed` is a pure function
// of (seed, i), drawn from tg's Philox generator, so a training batch needs
// no generator state (resuming at step s re-creates batch s) and a held-out
// set is just another seed.
#pragma once
#include <cstdint>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"

namespace tg::toy {

constexpr int64_t kImageSize = 32;
constexpr int64_t kPatchSize = 4;
constexpr int64_t kGridSize = kImageSize / kPatchSize;  // 8x8 = 64 patch tokens
constexpr int64_t kTokens = kGridSize * kGridSize;
constexpr int64_t kChannels = 3;
constexpr int64_t kPatchDim = kChannels * kPatchSize * kPatchSize;  // 48 values per token
constexpr int64_t kNumColours = 6;

enum class ShapeKind { Square, Circle, Triangle };

struct EditBatch {
  Tensor source;                // [B, 3, 32, 32], values in [-1, 1]
  Tensor target;                // [B, 3, 32, 32]: the source with the shape in colour k
  Tensor edit_mask;             // [B, 64]: 1 for every patch the shape touches, row-major
  std::vector<int64_t> colour;  // [B]: k, the palette index of the new colour
  std::vector<ShapeKind> shape_kind;
};

// Examples first_index ... first_index + count - 1 of the stream `seed`.
EditBatch make_edit_batch(uint64_t seed, int64_t first_index, int64_t count, TensorOptions opts = {});

// The palette colour k as RGB in [-1, 1], and its name ("red", ...).
std::vector<double> palette_colour(int64_t k);
const char* colour_name(int64_t k);

// N(0, 1) noise of `shape` from an explicit Philox state (tg::randn draws
// from the global generator, which training owns).
Tensor normal_noise(const Shape& shape, PhiloxState state, TensorOptions opts = {});

}  // namespace tg::toy
