// safetensors files and training checkpoints: bit-exact round trips, the
// file layout, atomic saves, every check of a hostile header, thousands of
// mutated files, exact resume of training, and files shared with PyTorch.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "helpers.h"

using namespace tgtest;
namespace nn = tg::nn;
namespace optim = tg::optim;
namespace st = tg::safetensors;
using Json = nlohmann::ordered_json;

namespace {

const tg::TensorOptions kF64{tg::DType::Float64};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

std::string u64_le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

std::string file_of(const std::string& header, const std::string& data) { return u64_le(header.size()) + header + data; }

// A tensor's bytes, for bit-exact comparisons (NaN payloads and -0 included).
std::string raw_bytes(const tg::Tensor& t) {
  const tg::Tensor c = t.detach().contiguous();
  return {static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.numel()) * tg::element_size(c.dtype())};
}

void check_bit_equal(const tg::StateDict& a, const tg::StateDict& b) {
  REQUIRE(keys_of(a) == keys_of(b));
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].second.dtype() == b[i].second.dtype());
    CHECK(a[i].second.shape() == b[i].second.shape());
    CHECK(raw_bytes(a[i].second) == raw_bytes(b[i].second));
  }
}

// load_file's message for a file of these bytes, less its "safetensors: '<path>'" prefix.
std::string load_error(const std::string& bytes) {
  const std::string path = temp_path("hostile.safetensors");
  write_bytes(path, bytes);
  const std::string message = error_of([&] { st::load_file(path); });
  const std::string prefix = "safetensors: '" + path + "'";
  REQUIRE_MESSAGE(message.starts_with(prefix), message);
  return message.substr(prefix.size());
}

std::string one_tensor(const std::string& entry) { return file_of("{\"t\": " + entry + "}", std::string(16, '\0')); }

}  // namespace

TEST_CASE("checkpoint/safetensors round trip is bit-exact, in order, with metadata") {
  tg::manual_seed(1);
  const tg::StateDict tensors = {
      {"z.first", tg::randn({2, 3})},
      {"a.special64", tg::from_vector({NAN, INFINITY, -INFINITY, -0.0, 1e-310, 5e-324}, {6}, kF64)},
      {"special32", tg::from_vector({NAN, -INFINITY, -0.0, 1e-40}, {2, 2})},
      {"scalar", tg::scalar_tensor(2.5)},
      {"empty", tg::zeros({0, 3}, kF64)},
      {"transposed", tg::randn({3, 4}).transpose(0, 1)},
      {"requires_grad", tg::randn({2}).requires_grad_()}};
  const st::Metadata metadata = {{"key", "value"}, {"unicode", "\xce\xb4"}};
  const std::string path = temp_path("roundtrip.safetensors");
  st::save_file(tensors, path, metadata);
  const st::File file = st::load_file(path);
  check_bit_equal(tensors, file.tensors);
  CHECK(file.metadata == metadata);
  for (const auto& [name, t] : file.tensors) CHECK_FALSE(t.requires_grad());
}

TEST_CASE("checkpoint/the file is laid out as the safetensors format says") {
  const std::string path = temp_path("layout.safetensors");
  st::save_file({{"b", tg::from_vector({1, 2, 3}, {3})}, {"a", tg::from_vector({4.5}, {1, 1}, kF64)}}, path, {{"m", "x"}});
  const std::string bytes = read_bytes(path);
  const uint64_t n = header_length(bytes);
  CHECK(n % 8 == 0);  // padded with spaces so the data is 8-byte aligned
  REQUIRE(bytes.size() == 8 + n + 3 * 4 + 8);
  const Json header = Json::parse(bytes.substr(8, n));
  CHECK(header["b"] == Json({{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 12}}}));
  CHECK(header["a"] == Json({{"dtype", "F64"}, {"shape", {1, 1}}, {"data_offsets", {12, 20}}}));
  CHECK(header["__metadata__"] == Json({{"m", "x"}}));
  float f[3];
  double d;
  std::memcpy(f, bytes.data() + 8 + n, sizeof f);
  std::memcpy(&d, bytes.data() + 8 + n + 12, sizeof d);
  CHECK((f[0] == 1 && f[1] == 2 && f[2] == 3 && d == 4.5));
}

TEST_CASE("checkpoint/save_file renames a synced temporary over the old file") {
  const std::string path = temp_path("atomic.safetensors");
  st::save_file({{"x", tg::ones({2})}}, path);
  st::save_file({{"x", tg::full({2}, 3.0)}}, path);
  CHECK(st::load_file(path).tensors[0].second.to_vector() == std::vector<double>{3, 3});
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  // A save that fails leaves the old file whole and no temporary behind.
  CHECK(error_of([&] { st::save_file({{"x", tg::ones({2})}, {"x", tg::ones({1})}}, path); }) ==
        "safetensors::save_file: key 'x' appears twice");
  CHECK(contains(error_of([&] { st::save_file({{std::string(1, '\xff'), tg::ones({1})}}, path); }),
                 "safetensors::save_file: [json.exception.type_error.316]"));
  CHECK(error_of([&] { st::save_file({{"__metadata__", tg::ones({1})}}, path); }) ==
        "safetensors::save_file: '__metadata__' cannot name a tensor");
  const std::string folder = temp_path("a_folder");
  std::filesystem::create_directories(folder + "/inside");
  CHECK(contains(error_of([&] { st::save_file({{"x", tg::ones({2})}}, folder); }), "safetensors: cannot rename '"));
  CHECK_FALSE(std::filesystem::exists(folder + ".tmp"));
  std::filesystem::remove_all(folder);
  CHECK(contains(error_of([&] { st::save_file({{"x", tg::ones({2})}}, folder + "/missing/x.safetensors"); }),
                 "safetensors: cannot create '"));
  CHECK(st::load_file(path).tensors[0].second.to_vector() == std::vector<double>{3, 3});
}

TEST_CASE("checkpoint/hostile files give errors naming the file and the key") {
  CHECK(load_error("1234") == " has 4 bytes, fewer than the 8 of the header length");
  CHECK(load_error(u64_le(1000) + "{}") ==
        ": header length 1000 exceeds the 2 bytes after it (or the 100000000-byte limit)");
  CHECK(load_error(u64_le(uint64_t{1} << 62) + "{}") ==
        ": header length 4611686018427387904 exceeds the 2 bytes after it (or the 100000000-byte limit)");
  CHECK(load_error(file_of("{\"t\": ", "")).starts_with(": the header is not valid JSON ("));
  CHECK(load_error(file_of("[1, 2]", "")) == ": the header must be a JSON object, got array");
  CHECK(load_error(file_of("{\"__metadata__\": [1]}", "")) == ": __metadata__ must be a JSON object, got array");
  CHECK(load_error(file_of("{\"__metadata__\": {\"k\": 1}}", "")) == ": __metadata__ 'k' must be a string, got number");

  const std::pair<const char*, const char*> bad_entries[] = {
      {"5", "the entry must be a JSON object, got number"},
      {R"({"shape": [1], "data_offsets": [0, 4]})", "the entry has no \"dtype\""},
      {R"({"dtype": "F16", "shape": [1], "data_offsets": [0, 2]})",
       "dtype \"F16\" is not supported (tapegrad reads \"F32\" and \"F64\")"},
      {R"({"dtype": 3, "shape": [1], "data_offsets": [0, 4]})",
       "dtype 3 is not supported (tapegrad reads \"F32\" and \"F64\")"},
      {R"({"dtype": "F32", "shape": 4, "data_offsets": [0, 4]})", "\"shape\" must be an array, got number"},
      {R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})", "\"shape\" must hold whole numbers >= 0, got -1"},
      {R"({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]})", "\"shape\" must hold whole numbers >= 0, got 1.5"},
      {R"({"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 4]})", "shape overflows int64"},
      {R"({"dtype": "F32", "shape": [2305843009213693952, 2], "data_offsets": [0, 4]})",
       "shape [2305843009213693952,2] of F32 needs 4611686018427387904 x 4 bytes, but data_offsets [0, 4] hold 4"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]})",
       "shape [2] of F32 needs 2 x 4 bytes, but data_offsets [0, 4] hold 4"},
      {R"({"dtype": "F32", "shape": [1], "data_offsets": [8, 4]})",
       "data_offsets [8, 4] are not a range within the 16 bytes of data"},
      {R"({"dtype": "F32", "shape": [1], "data_offsets": [16, 20]})",
       "data_offsets [16, 20] are not a range within the 16 bytes of data"},
      {R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]})", "data_offsets must be [begin, end], got [0,4,8]"},
      {R"({"dtype": "F32", "shape": [1], "data_offsets": [0, -4]})",
       "\"data_offsets\" must hold whole numbers >= 0, got -4"}};
  for (const auto& [entry, message] : bad_entries) {
    INFO(entry);
    CHECK(load_error(one_tensor(entry)) == std::string(": tensor 't': ") + message);
  }
  CHECK(load_error(file_of(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                           std::string(16, '\0'))) == ": tensors 'a' and 'b' overlap in the data section");
  CHECK(error_of([] { st::load_file(temp_path("does_not_exist")); }) ==
        "safetensors: cannot open '" + temp_path("does_not_exist") + "'");
}

TEST_CASE("checkpoint/holes in the data section and empty tensors are fine") {
  float values[4] = {1, 2, 3, 4};
  std::string data(reinterpret_cast<const char*>(values), sizeof values);
  const std::string path = temp_path("holes.safetensors");
  write_bytes(path, file_of(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                "e": {"dtype": "F64", "shape": [0, 2], "data_offsets": [2, 2]},
                                "b": {"dtype": "F32", "shape": [], "data_offsets": [12, 16]}})",
                            data));
  const st::File file = st::load_file(path);
  REQUIRE(keys_of(file.tensors) == std::vector<std::string>{"a", "e", "b"});
  CHECK(file.tensors[0].second.to_vector() == std::vector<double>{1});
  CHECK(file.tensors[1].second.shape() == tg::Shape{0, 2});
  CHECK(file.tensors[2].second.item() == 4);
}

// ---- training checkpoints

namespace {

// A small denoiser with every kind of layer state: dropout draws, adaLN-Zero, AdamW moments.
struct TinyModel : nn::Module {
  TinyModel()
      : embed(register_module("embed", std::make_shared<nn::Linear>(3, 8))),
        block(register_module("block", std::make_shared<nn::DiTBlock>(tg::RegionAttentionConfig{8, 2, 4}, 2.0, 0.1))),
        head(register_module("head", std::make_shared<nn::Linear>(8, 3))) {}
  tg::Tensor forward(const tg::Tensor& x, const tg::Tensor& c) const {
    const tg::Tensor e = tg::from_vector({1, 1, 0, 0, 0, 1, 1, 0}, {2, 4});
    return head->forward(block->forward(embed->forward(x), c, e, tg::ones({2, 4})));
  }
  std::shared_ptr<nn::Linear> embed;
  std::shared_ptr<nn::DiTBlock> block;
  std::shared_ptr<nn::Linear> head;
};

// One step on fresh random data; returns the loss.
double train_step(TinyModel& model, optim::AdamW& adamw, int64_t step) {
  adamw.set_lr(optim::CosineSchedule(1e-2, 2, 6).lr(step));
  const tg::Tensor x = tg::randn({2, 4, 3}), c = tg::randn({2, 8}), target = tg::randn({2, 4, 3});
  const tg::Tensor loss = tg::mse_loss(model.forward(x, c), target);
  adamw.zero_grad();
  loss.backward();
  nn::utils::clip_grad_norm_(model.parameters(), 1.0);
  adamw.step();
  return loss.item();
}

}  // namespace

TEST_CASE("checkpoint/training resumes bit for bit") {
  tg::manual_seed(11);
  TinyModel straight;
  optim::AdamW straight_opt(straight.parameters());
  std::vector<double> expected;
  for (int64_t step = 0; step < 6; ++step) expected.push_back(train_step(straight, straight_opt, step));

  tg::manual_seed(11);
  TinyModel first;
  optim::AdamW first_opt(first.parameters());
  std::vector<double> losses;
  for (int64_t step = 0; step < 3; ++step) losses.push_back(train_step(first, first_opt, step));
  const std::string path = temp_path("training.safetensors");
  tg::save_checkpoint(path, first, first_opt, 3);

  tg::manual_seed(12);  // a different start, all of which the checkpoint replaces
  TinyModel resumed;
  optim::AdamW resumed_opt(resumed.parameters());
  const int64_t start = tg::load_checkpoint(path, resumed, resumed_opt);
  CHECK(start == 3);
  for (int64_t step = start; step < 6; ++step) losses.push_back(train_step(resumed, resumed_opt, step));

  CHECK(losses == expected);
  check_bit_equal(straight.state_dict(), resumed.state_dict());
  check_bit_equal(straight_opt.state_dict(), resumed_opt.state_dict());
  CHECK(keys_of(st::load_file(path).tensors).front() == "model.embed.weight");
}

TEST_CASE("checkpoint/extra metadata is saved beside the checkpoint's own; its keys cannot replace them") {
  tg::manual_seed(13);
  nn::Linear layer(3, 2);
  optim::SGD sgd(layer.parameters(), {.lr = 0.1});
  const std::string path = temp_path("extra.safetensors");
  tg::save_checkpoint(path, layer, sgd, 5, {{"run.options", "{\"batch\": 4}"}});
  const st::File file = st::load_file(path);
  CHECK(file.metadata.at("run.options") == "{\"batch\": 4}");
  CHECK(file.metadata.at("step") == "5");
  CHECK(st::load_metadata(path) == file.metadata);  // the header alone says the same
  CHECK(error_of([&] { tg::save_checkpoint(path, layer, sgd, 6, {{"step", "7"}}); }) ==
        "save_checkpoint: extra metadata key 'step' is one the checkpoint writes itself");
  CHECK(st::load_file(path).metadata.at("step") == "5");  // the refused save wrote nothing
}

TEST_CASE("checkpoint/load_checkpoint errors leave the model and the optimizer as they were") {
  const std::string path = temp_path("other.safetensors");
  nn::Linear small(3, 2);
  optim::AdamW fresh(small.parameters());
  tg::save_checkpoint(path, small, fresh, 0);  // no optimizer state: loading it would clear one

  nn::Linear big(3, 4);
  optim::AdamW trained(big.parameters());
  tg::sum(big.forward(tg::randn({1, 3}))).backward();
  trained.step();
  const tg::StateDict model_before = big.state_dict(), opt_before = trained.state_dict();
  const std::string model_values = raw_bytes(big.weight);
  CHECK(error_of([&] { tg::load_checkpoint(path, big, trained); }) ==
        "load_checkpoint: '" + path + "': load_state_dict: 'weight' has shape [4,3] in the module but [2,3] in the "
        "state_dict");
  CHECK(raw_bytes(big.weight) == model_values);
  REQUIRE(keys_of(trained.state_dict()) == keys_of(opt_before));
  CHECK(raw_bytes(trained.state_dict()[1].second) == raw_bytes(opt_before[1].second));

  st::save_file({{"model.weight", tg::zeros({2, 3})}}, path);
  CHECK(error_of([&] { tg::load_checkpoint(path, small, fresh); }) ==
        "load_checkpoint: '" + path + "': not a training checkpoint (metadata 'format' is not "
        "'tapegrad.training_checkpoint.v1')");
  st::Metadata metadata = {{"format", "tapegrad.training_checkpoint.v1"}, {"step", "x"}};
  st::save_file({{"model.weight", tg::zeros({2, 3})}}, path, metadata);
  CHECK(error_of([&] { tg::load_checkpoint(path, small, fresh); }) ==
        "load_checkpoint: '" + path + "': metadata 'step' must be a whole number >= 0, got 'x'");
  metadata = {{"format", "tapegrad.training_checkpoint.v1"}, {"step", "1"}, {"rng_seed", "1"}, {"rng_offset", "2"}};
  st::save_file({{"weights", tg::zeros({2, 3})}}, path, metadata);
  CHECK(error_of([&] { tg::load_checkpoint(path, small, fresh); }) ==
        "load_checkpoint: '" + path + "': tensor 'weights' is neither model.* nor optimizer.*");
}

// ---- fuzzing

namespace {

using Rng = std::mt19937_64;

Json pick(Rng& rng, const std::vector<Json>& options) { return options[rng() % options.size()]; }

std::string flip_bytes(std::string s, Rng& rng) {
  for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) s[rng() % s.size()] ^= static_cast<char>(1 + rng() % 255);
  return s;
}

std::string truncated(std::string s, Rng& rng) {
  s.resize(rng() % s.size());
  return s;
}

std::string with_header_length(std::string s, Rng& rng) {
  const uint64_t n = header_length(s);
  const uint64_t lengths[] = {rng(), rng() % (s.size() + 16), n + rng() % 16 - 8, 0, ~uint64_t{0}, uint64_t{1} << 40};
  return u64_le(lengths[rng() % std::size(lengths)]) + s.substr(8);
}

// One edit of one field of one entry of the header, the rest of the file kept.
std::string json_edit(Json header, const std::string& data, Rng& rng) {
  auto it = header.begin();
  std::advance(it, static_cast<int64_t>(rng() % header.size()));
  const std::string key = it.key();
  Json& e = *it;
  const Json big = uint64_t{1} << 63;
  switch (rng() % 7) {
    case 0: e["dtype"] = pick(rng, {"F16", "BF16", "I64", "", 3, nullptr, "F32", "F64"}); break;
    case 1: e["shape"] = pick(rng, {Json::array({-1}), Json::array({big, 2}), Json::array({1.5}), Json::array({"2"}),
                                    Json::array({0}), Json::array({uint64_t{1} << 40}), Json::array(), "x"});
      break;
    case 2: e["data_offsets"] = pick(rng, {Json::array({8, 0}), Json::array({0, 1}), Json::array({0, big}),
                                           Json::array({0, 4, 8}), Json::array({-1, 4}), Json::array({0, 1000000}), 7});
      break;
    case 3: e.erase(pick(rng, {"dtype", "shape", "data_offsets", "step", "format", "rng_seed"}).get<std::string>()); break;
    case 4: e = pick(rng, {42, "x", Json::array(), nullptr, Json::object()}); break;
    case 5: header["__metadata__"][pick(rng, {"step", "rng_seed", "format"}).get<std::string>()] =
                pick(rng, {"-1", "1e3", "", "99999999999999999999", 7, "3"});
      break;
    default: {  // an unknown name: the entry moves to key + "x"
      const Json moved = e;
      header.erase(key);
      header[key + "x"] = moved;
      break;
    }
  }
  return file_of(header.dump(), data);
}

}  // namespace

TEST_CASE("checkpoint/thousands of mutated checkpoints each load or throw tg::Error") {
  tg::manual_seed(13);
  TinyModel model;
  optim::AdamW adamw(model.parameters());
  train_step(model, adamw, 0);
  const std::string valid = temp_path("valid.safetensors"), path = temp_path("mutated.safetensors");
  tg::save_checkpoint(valid, model, adamw, 1);
  const std::string original = read_bytes(valid);
  const uint64_t n = header_length(original);
  const Json header = Json::parse(original.substr(8, n));
  const std::string data = original.substr(8 + n);

  Rng rng(2024);
  int loaded = 0, rejected = 0;
  for (int i = 0; i < 4000; ++i) {
    switch (i % 4) {
      case 0: write_bytes(path, flip_bytes(original, rng)); break;
      case 1: write_bytes(path, truncated(original, rng)); break;
      case 2: write_bytes(path, with_header_length(original, rng)); break;
      default: write_bytes(path, json_edit(header, data, rng)); break;
    }
    try {
      tg::load_checkpoint(path, model, adamw);
      ++loaded;
    } catch (const tg::Error&) {
      ++rejected;
    }
  }
  MESSAGE(loaded << " mutated files loaded, " << rejected << " rejected");
  CHECK(loaded + rejected == 4000);
  CHECK(rejected > 2000);  // most mutations break something
  CHECK(loaded > 100);     // flips in the data section and harmless edits still load
}

// ---- files shared with PyTorch (tests/fixtures/check_safetensors.py)

namespace {

// The tensors both sides agree on: tapegrad writes them for check_safetensors.py
// to read, and the script writes the same ones with safetensors.torch.save_file.
tg::StateDict interop_tensors() {
  return {{"arange_f32", tg::arange(12).reshape({3, 4})},
          {"halves_f64", tg::mul(tg::arange(5, kF64), 0.5)},
          {"scalar_f32", tg::scalar_tensor(-2.5)},
          {"empty_f64", tg::zeros({0, 3}, kF64)},
          {"thirds_f64", tg::div(tg::arange(4, kF64), tg::full({4}, 3.0, kF64))}};
}

}  // namespace

TEST_CASE("checkpoint/writes tapegrad_written.safetensors for check_safetensors.py") {
  const std::string path = (std::filesystem::temp_directory_path() / "tapegrad_written.safetensors").string();
  const tg::StateDict tensors = interop_tensors();
  st::save_file(tensors, path, {{"writer", "tapegrad"}});
  Json expected = {{"__metadata__", {{"writer", "tapegrad"}}}};
  for (const auto& [name, t] : tensors)
    expected[name] = {{"dtype", t.dtype() == tg::DType::Float32 ? "F32" : "F64"}, {"shape", t.shape()},
                      {"values", t.to_vector()}};
  std::ofstream(path.substr(0, path.size() - 12) + ".json") << expected.dump(1);
  check_bit_equal(tensors, st::load_file(path).tensors);
  MESSAGE("wrote " << path << " and its .json: python3 tests/fixtures/check_safetensors.py check " << path);
}

TEST_CASE("checkpoint/reads tests/fixtures/torch_written.safetensors, written by safetensors.torch.save_file") {
  const std::string path = TG_FIXTURES_DIR "/torch_written.safetensors";
  REQUIRE_MESSAGE(std::filesystem::exists(path), "missing " << path << ": run "
                  "python3 tests/fixtures/check_safetensors.py write " << path << " where torch is installed");
  const st::File file = st::load_file(path);
  CHECK(file.metadata == st::Metadata{{"writer", "safetensors.torch"}});
  std::map<std::string, tg::Tensor> loaded(file.tensors.begin(), file.tensors.end());
  for (const auto& [name, t] : interop_tensors()) {
    INFO(name);
    REQUIRE(loaded.count(name) == 1);
    CHECK(loaded[name].dtype() == t.dtype());
    CHECK(loaded[name].shape() == t.shape());
    CHECK(raw_bytes(loaded[name]) == raw_bytes(t));
  }
  CHECK(loaded.size() == 5);
}
