// The figures of examples/train_edit_diffusion: sample grids as PNG
// (stb_image_write) and the loss curve (gnuplot, run as a process).
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace figures {

// One row per example, four columns: input | edit mask (the region in the
// requested colour, black outside) | model's edit | target. Images are
// [n,3,32,32] in [-1, 1] (clamped), shown 4x larger; mask [n,64]; colour [n].
void write_sample_grid(const std::string& path, const tg::Tensor& source, const tg::Tensor& edit_mask,
                       const std::vector<int64_t>& colour, const tg::Tensor& edited, const tg::Tensor& target);

// Plots the loss column of train.csv (step, loss, ...) to `png_path` with
// gnuplot. Returns false, having written nothing, when gnuplot is not on the PATH.
bool plot_loss(const std::string& csv_path, const std::string& png_path);

}  // namespace figures
