// The shortest program with the region-aware attention layer: build the
// module, run forward and backward, print the gradient norms.
#include <cmath>
#include <iostream>

#include "models/layers.h"
#include "tapegrad.h"

int main() {
  tg::manual_seed(0);
  tg::nn::RegionAwareSelfAttention attn({/*hidden=*/64, /*heads=*/2, /*max_positions=*/16});
  const tg::Tensor x = tg::randn({2, 10, 64});                            // [B, S, C]
  const tg::Tensor edit = tg::dropout_mask({2, 10}, 0.5, {1, 1});         // 1 = token in the edit region
  const tg::Tensor keys = tg::ones({2, 10});                              // 0 = masked key
  const tg::Tensor y = attn.forward(x, edit, keys);                      // [B, S, C]
  const tg::Tensor loss = tg::mean(tg::mul(y, y));
  loss.backward();
  std::cout << "loss " << loss.item() << "\n";
  for (const auto& [name, p] : attn.named_parameters())
    std::cout << name << " " << tg::to_string(p.shape()) << " |grad| = " << std::sqrt(tg::sum(tg::mul(p.grad(), p.grad())).item())
              << "\n";
  return 0;
}
