// The edit-bias gather of region-aware attention: the position-bias corner
// E[:, :S, :S] plus the within/cross edit-region terms, for every batch:
//
//   bias[b,h,i,j] = E[h,i,j] + w_in[h] e_i e_j + w_x[h] (e_i (1-e_j) + (1-e_i) e_j)   (e = e[b, :])
//
//   E    <- dE[h,i,j] = sum_b g[b,h,i,j] for i,j < S, 0 elsewhere in [H,M,M]
//   w_in <- sum_{b,i,j} g e_i e_j
//   w_x  <- sum_{b,i,j} g (e_i (1-e_j) + (1-e_i) e_j)
//
// The backward reduces over the batch in one pass over g and writes all of dE
// (zeros included) without any extra S x S tensor. Saves the edit mask.
#pragma once
#include "core/tensor.h"

namespace tg {

// E [H,M,M], within [H,1,1], cross [H,1,1], edit_mask [B,S] of 0/1 with S <= M  ->  [B,H,S,S]
Tensor edit_bias(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& edit_mask);

}  // namespace tg
