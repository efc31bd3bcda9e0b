// A tiny graph: loss = mean(tanh(x W^T + b)^2), then backward and one SGD step. Prints the gradients.
#include <iostream>

#include "tapegrad.h"

int main() {
  tg::manual_seed(0);
  tg::Tensor x = tg::randn({4, 3});
  tg::Tensor w = tg::randn({2, 3}).requires_grad_();
  tg::Tensor b = tg::zeros({2}).requires_grad_();

  tg::Tensor h = tg::tanh(tg::linear(x, w, b));  // [4, 2], recorded on the tape
  tg::Tensor loss = tg::mean(h * h);              // a 0-d tensor
  loss.backward();                                // walks the recorded graph back from loss

  std::cout << "loss = " << loss.item() << "\n";
  std::cout << "dL/dW = " << w.grad() << "\n";
  std::cout << "dL/db = " << b.grad() << "\n";

  {
    tg::NoGradGuard no_grad;                      // like torch.no_grad()
    w.add_(w.grad(), -0.1);                       // one SGD step
  }
  w.zero_grad();
  return 0;
}
