#include "ops/edit_bias.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/copy.h"
#include "ops/reduce.h"

namespace tg {

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
  return {e.shape()[0], H, e.shape()[1], M};
}

}  // namespace

Tensor edit_bias(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& e_in) {
  const EditBiasDims d = check_edit_bias_args(E, within, cross, e_in);
  const Tensor e = materialize(e_in);
  Tensor out = empty({d.B, d.H, d.S, d.S}, {E.dtype(), E.device()});
  TG_DISPATCH_DEVICE(E, edit_bias_forward, materialize(E), materialize(within), materialize(cross), e, out, d);
  return autograd::record("edit_bias", out, {E, within, cross}, {e}, [d](const Tensor& g, const auto& s) {
    const TensorOptions opts{g.dtype(), g.device()};
    Tensor dE = empty({d.H, d.M, d.M}, opts);
    Tensor within_rows = empty({d.H, d.M}, opts), cross_rows = empty({d.H, d.M}, opts);
    TG_DISPATCH_DEVICE(g, edit_bias_backward, materialize(g), s[0], dE, within_rows, cross_rows, d);
    return std::vector<Tensor>{dE, sum(within_rows, {1}).view({d.H, 1, 1}), sum(cross_rows, {1}).view({d.H, 1, 1})};
  });
}

namespace cpu {

void edit_bias_forward(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& e,
                       const Tensor& out, EditBiasDims d) {
  edit_bias_forward_with(Loop{"edit_bias"}, E, within, cross, e, out, d);
}

void edit_bias_backward(const Tensor& g, const Tensor& e, const Tensor& dE, const Tensor& within_rows,
                        const Tensor& cross_rows, EditBiasDims d) {
  const bool vector = edit_bias_quads_fit(d, g, dE);
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    parallel_for(d.H * d.M, [&](int64_t row) {  // row = (h, i)
      const int64_t h = row / d.M, i = row % d.M;
      T within = 0, cross = 0;
      for (int64_t j0 = 0; j0 < d.M; j0 += 4) {
        const EditBiasGradQuad<T> r = edit_bias_grad_quad(g.data<T>(), e.data<T>(), d, h, i, j0, vector);
        store_edit_bias_quad(dE.data<T>() + row * d.M, j0, r.dE, d.M, vector);
        within += r.within;
        cross += r.cross;
      }
      within_rows.data<T>()[row] = within;
      cross_rows.data<T>()[row] = cross;
    });
  });
}

}  // namespace cpu

}  // namespace tg
