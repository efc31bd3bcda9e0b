// The edit-bias kernels: forward written once for both devices, backward per device.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/indexing.h"
#include "core/pack.h"
#include "core/tensor.h"

namespace tg {

struct EditBiasDims {
  int64_t B, H, S, M;
  bool narrow() const { return B * H * S * S < (int64_t(1) << 31) && H * M * M < (int64_t(1) << 31); }
};

// Exactly one of e_i, e_j is 1 (for 0/1 masks).
template <class T>
TG_HD T cross_term(T ei, T ej) { return ei * (T(1) - ej) + (T(1) - ei) * ej; }

// One work item = four consecutive j of one row (b, h, i): a quarter of the
// index arithmetic, and E read / the output written as Quads when aligned.
template <class T>
struct EditBiasForward {
  const T *E, *within, *cross, *e;
  T* out;
  EditBiasDims d;
  int64_t quads_per_row;  // ceil(S / 4)
  bool narrow, vector;    // vector: see edit_bias_quads_fit

  TG_HD T value(int64_t b, int64_t h, T ei, int64_t j, T Eij) const {
    const T ej = e[b * d.S + j];
    return Eij + within[h] * ei * ej + cross[h] * cross_term(ei, ej);
  }

  TG_HD void operator()(int64_t item) const {
    int64_t rest = item;
    const int64_t j0 = pop_index(rest, quads_per_row, narrow) * 4, i = pop_index(rest, d.S, narrow),
                  h = pop_index(rest, d.H, narrow), b = rest;
    const T ei = e[b * d.S + i];
    const T* E_row = E + (h * d.M + i) * d.M;
    T* out_row = out + ((b * d.H + h) * d.S + i) * d.S;
    if (vector) {
      const Quad<T> Eq = reinterpret_cast<const Quad<T>*>(E_row)[j0 / 4];
      Quad<T> o;
      for (int l = 0; l < 4; ++l) o.v[l] = value(b, h, ei, j0 + l, Eq.v[l]);
      reinterpret_cast<Quad<T>*>(out_row)[j0 / 4] = o;
      return;
    }
    for (int64_t j = j0; j < j0 + 4 && j < d.S; ++j) out_row[j] = value(b, h, ei, j, E_row[j]);
  }
};

// Rows of S (the [B,H,S,S] side) and of M (the [H,M,M] side) can be read and
// written as Quads: both are multiples of 4 and both base pointers are aligned.
// An undefined [H,M,M] tensor (dE not wanted) does not stop them.
inline bool edit_bias_quads_fit(EditBiasDims d, const Tensor& bsss, const Tensor& hmm) {
  return d.S % 4 == 0 && d.M % 4 == 0 && aligned16(bsss.raw_data()) && (!hmm.defined() || aligned16(hmm.raw_data()));
}

// Kernels on contiguous tensors. Backward writes dE [H,M,M] (when defined) and,
// per row (h, i), partial sums of the within/cross gradients into [H, M] tensors.
template <Device Dev>
struct EditBiasKernels {
  static void forward(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& e, const Tensor& out,
                      EditBiasDims d);
  static void backward(const Tensor& g, const Tensor& e, const Tensor& dE, const Tensor& within_rows,
                       const Tensor& cross_rows, EditBiasDims d);
};
TG_EXTERN_CUDA_KERNELS(EditBiasKernels);

template <Device Dev>
void EditBiasKernels<Dev>::forward(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& e,
                                   const Tensor& out, EditBiasDims d) {
  const Loop<Dev> loop{"edit_bias"};
  const int64_t quads = (d.S + 3) / 4;
  TG_DISPATCH_FLOAT(E.dtype(), T, [&] {
    loop(d.B * d.H * d.S * quads, EditBiasForward<T>{E.data<T>(), within.data<T>(), cross.data<T>(), e.data<T>(),
                                                     out.data<T>(), d, quads, d.narrow(),
                                                     edit_bias_quads_fit(d, out, E)});
  });
}

// The gradient at positions (h, i, j0 .. j0+3) of [H, M, M], summed over the
// batch: dE for each of the four (0 outside the S x S corner) and their shares
// of the within/cross sums. With `vector` (edit_bias_quads_fit(d, g, dE)) each
// batch's four g values are one Quad load.
template <class T>
struct EditBiasGradQuad {
  Quad<T> dE{};
  T within = 0, cross = 0;
};

template <class T>
TG_HD EditBiasGradQuad<T> edit_bias_grad_quad(const T* g, const T* e, EditBiasDims d, int64_t h, int64_t i, int64_t j0,
                                              bool vector) {
  EditBiasGradQuad<T> r;
  if (i >= d.S || j0 >= d.S) return r;
  TG_UNROLL(4)
  for (int64_t b = 0; b < d.B; ++b) {
    const T* g_row = g + ((b * d.H + h) * d.S + i) * d.S;
    Quad<T> gq;
    if (vector) gq = reinterpret_cast<const Quad<T>*>(g_row)[j0 / 4];
    else for (int l = 0; l < 4; ++l) gq.v[l] = j0 + l < d.S ? g_row[j0 + l] : T(0);
    const T ei = e[b * d.S + i];
    for (int l = 0; l < 4; ++l) {  // past S, gq is 0 and so is every contribution
      const T ej = j0 + l < d.S ? e[b * d.S + j0 + l] : T(0);
      r.dE.v[l] += gq.v[l];
      r.within += gq.v[l] * ei * ej;
      r.cross += gq.v[l] * cross_term(ei, ej);
    }
  }
  return r;
}

// Writes the four dE values at row[j0 ..], those inside the row of M (nothing when dE is not wanted).
template <class T>
TG_HD void store_edit_bias_quad(T* row, int64_t j0, const Quad<T>& q, int64_t M, bool vector) {
  if (!row) return;
  if (vector) {
    reinterpret_cast<Quad<T>*>(row)[j0 / 4] = q;
    return;
  }
  for (int l = 0; l < 4 && j0 + l < M; ++l) row[j0 + l] = q.v[l];
}

}  // namespace tg
