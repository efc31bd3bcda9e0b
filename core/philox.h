// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
// A counter-based generator: the random bits of element i are a pure function
// of (seed, offset, i), so a dropout mask can be regenerated anywhere (in a CPU
// loop now, inside a CUDA kernel later) without being stored.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace tg {

struct Philox4 {
  uint32_t v[4];
};

// The low and high halves of a * b. On the device as two 32-bit multiplies:
// written as one 64-bit product, nvcc carried the whole Philox state in
// 64-bit registers, which doubled the instructions of the attention kernels'
// dropout and made them spill (bench/NOTES.md, version 12).
TG_HD uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
#ifdef __CUDA_ARCH__
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
#endif
}

// The ten round keys of (key0, key1): round r's are key0 + r 0x9E3779B9 and
// key1 + r 0xBB67AE85, modulo 2^32. A kernel that draws many blocks under one key
// takes them as an argument, where its rounds read them as constant operands
// instead of adding them up again per block (bench/NOTES.md, version 12).
struct PhiloxKeys {
  uint32_t key[10][2];
};

TG_HD PhiloxKeys philox_keys(uint32_t key0, uint32_t key1) {
  PhiloxKeys k{};
  TG_UNROLL(10)
  for (uint32_t r = 0; r < 10; ++r) {
    k.key[r][0] = key0 + r * 0x9E3779B9u;
    k.key[r][1] = key1 + r * 0xBB67AE85u;
  }
  return k;
}

// Ten rounds of the Philox 4x32 bijection of `ctr`.
TG_HD Philox4 philox4x32_10(Philox4 ctr, const PhiloxKeys& k) {
  TG_UNROLL(10)
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo32(0xD2511F53u, ctr.v[0], &hi0);
    const uint32_t lo1 = mulhilo32(0xCD9E8D57u, ctr.v[2], &hi1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k.key[r][0], lo1, hi0 ^ ctr.v[3] ^ k.key[r][1], lo0}};
  }
  return ctr;
}
TG_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  return philox4x32_10(ctr, philox_keys(key0, key1));
}

// Where a random tensor's bits come from: the seed is the key, the offset is
// the high half of the counter and the element group index the low half.
struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

TG_HD PhiloxKeys philox_keys(PhiloxState s) {
  return philox_keys(static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32));
}

TG_HD Philox4 philox_counter(uint64_t offset, uint64_t group) {
  return {{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), static_cast<uint32_t>(offset),
           static_cast<uint32_t>(offset >> 32)}};
}

// A draw as kernels that take many blocks from it hold it: its round keys,
// computed once, and its offset.
struct PhiloxDraw {
  PhiloxKeys keys;
  uint64_t offset;
};
TG_HD PhiloxDraw philox_draw(PhiloxState s) { return {philox_keys(s), s.offset}; }
TG_HD Philox4 philox_block(const PhiloxDraw& d, uint64_t group) {
  return philox4x32_10(philox_counter(d.offset, group), d.keys);
}
TG_HD Philox4 philox_block(PhiloxState s, uint64_t group) { return philox_block(philox_draw(s), group); }

// Uniform in [0, 1) from the top 24 of 32 random bits: exact in float, so host and device agree bit for bit.
TG_HD float bits_to_uniform(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// Standard normal by Box-Muller (its cosine half) from two 32-bit draws.
TG_HD double box_muller(uint32_t a, uint32_t b) {
  const double u1 = (static_cast<double>(a) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  const double u2 = static_cast<double>(b) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A block's draws: uniform k (k < 4) is lane k; normal k (k < 2) takes lanes
// 2k and 2k + 1. Element i of a random tensor is draw i % per-block of block
// i / per-block (philox_uniform, philox_normal; ops/random_kernels.h fills a
// whole block's at once).
constexpr int kUniformsPerBlock = 4, kNormalsPerBlock = 2;
TG_HD float block_uniform(const Philox4& r, int k) { return bits_to_uniform(r.v[k]); }
TG_HD double block_normal(const Philox4& r, int k) {
  return k == 0 ? box_muller(r.v[0], r.v[1]) : box_muller(r.v[2], r.v[3]);
}

TG_HD float philox_uniform(PhiloxState s, int64_t i) {
  return block_uniform(philox_block(s, static_cast<uint64_t>(i) / kUniformsPerBlock),
                       static_cast<int>(i % kUniformsPerBlock));
}
TG_HD double philox_normal(PhiloxState s, int64_t i) {
  return block_normal(philox_block(s, static_cast<uint64_t>(i) / kNormalsPerBlock),
                      static_cast<int>(i % kNormalsPerBlock));
}

// Dropout draws 16 bits per element, eight elements per block: element (row,
// col) of a tensor seen as rows of its last dim (`cols` long) takes block
// row * ceil(cols / 8) + col / 8, lane (col % 8) / 2, the low half for an even
// col and the high half for an odd one. Every row starts a fresh block, so a
// kernel that holds a tile of a row draws its bits without reading another
// row's; 16 bits rather than 32 halve the Philox work of the attention kernels,
// which regenerate the mask (bench/NOTES.md, version 14).
constexpr int64_t kDropoutBlockCols = 8;
TG_HD uint64_t dropout_block(int64_t row, int64_t col, int64_t cols) {
  return static_cast<uint64_t>(row) * static_cast<uint64_t>((cols + kDropoutBlockCols - 1) / kDropoutBlockCols) +
         static_cast<uint64_t>(col / kDropoutBlockCols);
}
// Column col's 16-bit draw in its block: lane (col % 8) / 2 picked by
// selects, not an index (a register array indexed at run time goes to local
// memory on the GPU), then its low or high half.
TG_HD uint32_t dropout_draw(const Philox4& block, int64_t col) {
  const uint32_t lane = col & 4 ? (col & 2 ? block.v[3] : block.v[2]) : (col & 2 ? block.v[1] : block.v[0]);
  return col & 1 ? lane >> 16 : lane & 0xffffu;
}
TG_HD uint32_t dropout_bits(PhiloxState s, int64_t row, int64_t col, int64_t cols) {
  return dropout_draw(philox_block(s, dropout_block(row, col, cols)), col);
}

// Dropout keeps an element when its uniform u = n 2^-16 (n its 16-bit draw) is
// at least p: since n is an integer, n >= p 2^16 exactly when n >= ceil(p 2^16),
// one integer compare per element, the form every dropout (the op's, the fused
// kernels', their CPU loops) uses. The threshold of kMaxDropoutP, 2^16 - 1,
// is the largest a 16-bit lane compare can hold: it keeps 2^-16 of the
// elements. check_dropout_p admits no larger p; a larger one still gets
// 2^16 - 1 here, never a threshold that keeps none.
constexpr float kMaxDropoutP = 1.0f - 0x1p-16f;
TG_HD uint32_t dropout_keep_threshold(float p) {
  const uint32_t t = static_cast<uint32_t>(std::ceil(p * 65536.0f));
  return t < 0xffffu ? t : 0xffffu;
}

// Whether the two draws of one 32-bit lane (columns 2w and 2w + 1) are kept,
// given the threshold in the high half (dropout_keep_threshold(p) << 16): the
// high draw against it directly, the low one shifted up, two compares with no
// masking, where the kernels spend their dropout instructions.
struct KeepPair {
  bool even, odd;
};
TG_HD KeepPair dropout_keep_pair(uint32_t lane_bits, uint32_t high_threshold) {
  return {(lane_bits << 16) >= high_threshold, lane_bits >= high_threshold};
}

}  // namespace tg
