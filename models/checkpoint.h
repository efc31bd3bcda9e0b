// Checkpoints in the safetensors format, readable by PyTorch's
// safetensors.torch.load_file, and able to read what its save_file writes:
//
//   8 bytes   N, the header length, little-endian unsigned
//   N bytes   JSON: {"<name>": {"dtype": "F32"|"F64", "shape": [...], "data_offsets": [begin, end]},
//                    ..., "__metadata__": {"<key>": "<string>", ...}}
//   the rest  raw little-endian tensor data; offsets count from its start
//
// Loading checks the whole header against the file before allocating any
// tensor, so a truncated, corrupt or hostile file is a tg::Error naming the
// file and the key at fault, never a crash or an allocation larger than the file.
#pragma once
#include <map>
#include <string>

#include "models/module.h"
#include "models/optim.h"

namespace tg::safetensors {

using Metadata = std::map<std::string, std::string>;

// Writes float32/float64 tensors (any device, any strides), in the dict's
// order, to path + ".tmp"; flushes and fsyncs it, then renames it over `path`,
// so a crash mid-save leaves any earlier file at `path` whole.
void save_file(const StateDict& tensors, const std::string& path, const Metadata& metadata = {});

struct File {
  StateDict tensors;  // in the header's order
  Metadata metadata;
};

// Reads F32 and F64 tensors onto `device`. Headers are at most 100 MB (the
// format's own limit); data sections may have holes between tensors, but
// tensors may not overlap.
File load_file(const std::string& path, Device device = Device::CPU);
// The metadata alone, from a header checked as load_file checks it (the data is not read).
Metadata load_metadata(const std::string& path);

}  // namespace tg::safetensors

namespace tg {

// A training checkpoint as one safetensors file: "model.<key>" for each
// entry of the model's state_dict, "optimizer.<key>" for the optimizer's
// (step counts and moments), and metadata "format" =
// "tapegrad.training_checkpoint.v1", "step", and "rng_seed" / "rng_offset",
// tg::default_generator()'s state, as decimal strings, plus the caller's
// `extra` metadata (e.g. the options of the run; its keys may not be those
// four). With the same model and optimizer options, training resumes bit for bit.
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                     int64_t step, const safetensors::Metadata& extra = {});

// Restores the model, the optimizer and the generator; returns the step. On
// error the model and the optimizer are as they were.
int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer);

}  // namespace tg
