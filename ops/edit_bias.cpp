#include "ops/edit_bias.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "ops/binary_mask.h"
#include "ops/edit_bias_kernels.h"
#include "ops/reduce.h"
#include "ops/untracked.h"

namespace tg {

template <>
void EditBiasKernels<Device::CPU>::backward(const Tensor& g, const Tensor& e, const Tensor& dE, const Tensor& within_rows,
                                            const Tensor& cross_rows, EditBiasDims d) {
  const bool vector = edit_bias_quads_fit(d, g, dE);
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    T* dE_data = data_or_null<T>(dE);
    cpu::parallel_for(d.H * d.M, [&](int64_t row) {  // row = (h, i)
      const int64_t h = row / d.M, i = row % d.M;
      T within = 0, cross = 0;
      for (int64_t j0 = 0; j0 < d.M; j0 += 4) {
        const EditBiasGradQuad<T> r = edit_bias_grad_quad(g.data<T>(), e.data<T>(), d, h, i, j0, vector);
        store_edit_bias_quad(dE_data ? dE_data + row * d.M : nullptr, j0, r.dE, d.M, vector);
        within += r.within;
        cross += r.cross;
      }
      within_rows.data<T>()[row] = within;
      cross_rows.data<T>()[row] = cross;
    });
  });
}

TG_INSTANTIATE_KERNELS(EditBiasKernels, Device::CPU);

namespace {

EditBiasDims check_edit_bias_args(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& e) {
  check_defined("edit_bias", "edit_region_bias", E);
  check_defined("edit_bias", "within_edit_bias", within);
  check_defined("edit_bias", "cross_edit_bias", cross);
  check_defined("edit_bias", "edit_mask", e);
  TG_CHECK(E.dim() == 3 && E.shape()[1] == E.shape()[2], "edit_bias: edit_region_bias must be [H,M,M], got ",
           E.shape());
  const int64_t H = E.shape()[0], M = E.shape()[1];
  TG_CHECK(within.shape() == Shape({H, 1, 1}), "edit_bias: within_edit_bias must be [", H, ",1,1], got ",
           within.shape());
  TG_CHECK(cross.shape() == Shape({H, 1, 1}), "edit_bias: cross_edit_bias must be [", H, ",1,1], got ",
           cross.shape());
  TG_CHECK(e.dim() == 2, "edit_bias: edit_mask must be [B,S], got ", e.shape());
  TG_CHECK(e.shape()[1] <= M, "edit_bias: sequence length ", e.shape()[1], " of edit_mask ", e.shape(),
           " exceeds the ", M, " positions of edit_region_bias ", E.shape());
  for (const Tensor* t : {&within, &cross, &e}) check_same_dtype_device("edit_bias", E, *t);
  check_binary_mask("edit_bias", "edit_mask", e);
  return {e.shape()[0], H, e.shape()[1], M};
}

}  // namespace

Tensor edit_bias(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& e_in) {
  const EditBiasDims d = check_edit_bias_args(E, within, cross, e_in);
  const Tensor e = materialize(e_in);
  Tensor out = empty({d.B, d.H, d.S, d.S}, {E.dtype(), E.device()});
  TG_DISPATCH_DEVICE(E, EditBiasKernels, forward, materialize(E), materialize(within), materialize(cross), e, out, d);
  return autograd::record(OpId::edit_bias, out, {E, within, cross}, {e},
                          [d](const Tensor& g, const auto& s, const autograd::GradMask& needs) {
    const TensorOptions opts{g.dtype(), g.device()};
    const Tensor dE = needs[0] ? empty({d.H, d.M, d.M}, opts) : Tensor();
    const Tensor within_rows = empty({d.H, d.M}, opts), cross_rows = empty({d.H, d.M}, opts);
    TG_DISPATCH_DEVICE(g, EditBiasKernels, backward, materialize(g), s[0], dE, within_rows, cross_rows, d);
    return std::vector<Tensor>{dE, autograd::grad_if(needs[1], [&] { return sum(within_rows, {1}).view({d.H, 1, 1}); }),
                               autograd::grad_if(needs[2], [&] { return sum(cross_rows, {1}).view({d.H, 1, 1}); })};
  });
}


}  // namespace tg
