#include "models/edit_data.h"

#include <array>
#include <cmath>

#include "core/error.h"
#include "ops/random.h"

namespace tg::toy {

namespace {

// Saturated colours, as 0-255 RGB; every one has a channel >= 190, which no
// background has (see draw_example), so shape and background never blend.
constexpr std::array<std::array<double, 3>, kNumColours> kPalette = {
    {{230, 40, 40}, {240, 210, 40}, {40, 190, 60}, {40, 200, 220}, {50, 80, 235}, {215, 50, 210}}};
constexpr std::array<const char*, kNumColours> kColourNames = {"red", "yellow", "green", "cyan", "blue", "magenta"};

double from_byte(double v) { return v / 127.5 - 1.0; }

void check_colour(const char* op, int64_t k) {
  TG_CHECK(k >= 0 && k < kNumColours, op, ": colour index must be in [0, ", kNumColours, "), got ", k);
}

// The random choices that make one example.
struct ExampleSpec {
  ShapeKind shape;
  double half_size, centre_x, centre_y;  // in pixels
  int64_t source_colour, target_colour;
  std::array<double, 3> background;      // in [-1, 1]
};

// The data's Philox key: the stream's seed with its top bit set, so no
// example shares a key with the global generator that manual_seed(seed)
// starts (its draws for t, the noise and the initialisation would otherwise
// be the uniforms of some example: data and training noise correlated).
constexpr uint64_t kDataKey = 0xD1B54A32D192ED03ull;

ExampleSpec draw_example(uint64_t seed, int64_t index) {
  const PhiloxState state{seed ^ kDataKey, static_cast<uint64_t>(index)};
  auto u = [&](int64_t draw) { return static_cast<double>(philox_uniform(state, draw)); };
  ExampleSpec s;
  s.shape = static_cast<ShapeKind>(static_cast<int>(u(0) * 3));
  s.half_size = 4 + 4 * u(1);
  s.centre_x = s.half_size + (kImageSize - 2 * s.half_size) * u(2);  // the shape stays inside the image
  s.centre_y = s.half_size + (kImageSize - 2 * s.half_size) * u(3);
  s.source_colour = static_cast<int64_t>(u(4) * kNumColours);
  // One of the other kNumColours - 1 colours, so every edit changes the image.
  s.target_colour = (s.source_colour + 1 + static_cast<int64_t>(u(5) * (kNumColours - 1))) % kNumColours;
  for (int c = 0; c < 3; ++c) s.background[c] = from_byte(20 + 90 * u(6 + c));  // dark and muted
  return s;
}

// Whether pixel (x, y) is part of the shape (judged at the pixel's centre).
bool covers(const ExampleSpec& s, int64_t x, int64_t y) {
  const double dx = static_cast<double>(x) + 0.5 - s.centre_x, dy = static_cast<double>(y) + 0.5 - s.centre_y;
  const double h = s.half_size;
  switch (s.shape) {
    case ShapeKind::Square: return std::abs(dx) <= h && std::abs(dy) <= h;
    case ShapeKind::Circle: return dx * dx + dy * dy <= h * h;
    case ShapeKind::Triangle: return dy <= h && std::abs(dx) <= (dy + h) / 2;  // apex up, base 2h wide, height 2h
  }
  return false;
}

// Example b of a batch: its source and target images ([B, 3, 32, 32]) and
// its edit mask ([B, 64], zeros before) written in place.
template <class T>
void paint_example(const ExampleSpec& s, int64_t b, T* source, T* target, T* mask) {
  constexpr int64_t pixels = kImageSize * kImageSize;
  for (int64_t y = 0; y < kImageSize; ++y)
    for (int64_t x = 0; x < kImageSize; ++x) {
      const bool inside = covers(s, x, y);
      if (inside) mask[b * kTokens + (y / kPatchSize) * kGridSize + x / kPatchSize] = T(1);
      for (int64_t c = 0; c < kChannels; ++c) {
        const int64_t i = (b * kChannels + c) * pixels + y * kImageSize + x;
        source[i] = static_cast<T>(inside ? from_byte(kPalette[s.source_colour][c]) : s.background[c]);
        target[i] = static_cast<T>(inside ? from_byte(kPalette[s.target_colour][c]) : s.background[c]);
      }
    }
}

}  // namespace

std::vector<double> palette_colour(int64_t k) {
  check_colour("palette_colour", k);
  std::vector<double> rgb(3);
  for (int c = 0; c < 3; ++c) rgb[c] = from_byte(kPalette[k][c]);
  return rgb;
}

const char* colour_name(int64_t k) {
  check_colour("colour_name", k);
  return kColourNames[k];
}

EditBatch make_edit_batch(uint64_t seed, int64_t first_index, int64_t count, TensorOptions opts) {
  TG_CHECK(first_index >= 0 && count > 0 && count <= INT64_MAX - first_index,
           "make_edit_batch: need first_index >= 0, count > 0 and first_index + count <= 2^63 - 1, got first_index ",
           first_index, " and count ", count);
  const Shape image_shape{count, kChannels, kImageSize, kImageSize};
  checked_nbytes("make_edit_batch", image_shape, element_size(opts.dtype));  // a clear error, not an overflow
  const TensorOptions host{opts.dtype, Device::CPU};
  const Tensor source = empty(image_shape, host), target = empty(image_shape, host);
  const Tensor mask = zeros({count, kTokens}, host);
  EditBatch batch;
  TG_DISPATCH_FLOAT(opts.dtype, T, [&] {
    for (int64_t b = 0; b < count; ++b) {
      const ExampleSpec s = draw_example(seed, first_index + b);
      paint_example(s, b, source.data<T>(), target.data<T>(), mask.data<T>());
      batch.colour.push_back(s.target_colour);
      batch.shape_kind.push_back(s.shape);
    }
  });
  batch.source = source.to(opts.device).requires_grad_(opts.requires_grad);
  batch.target = target.to(opts.device).requires_grad_(opts.requires_grad);
  batch.edit_mask = mask.to(opts.device).requires_grad_(opts.requires_grad);
  return batch;
}

Tensor normal_noise(const Shape& shape, PhiloxState state, TensorOptions opts) {
  checked_nbytes("normal_noise", shape, element_size(opts.dtype));
  Tensor noise = empty(shape, {opts.dtype, opts.device});
  fill_normal_into(noise, state);
  return noise.requires_grad_(opts.requires_grad);
}

}  // namespace tg::toy
