#include "models/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "core/random.h"

namespace tg::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian, as this host must be");

namespace {

using Json = nlohmann::ordered_json;  // keeps the header's order

constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const char* dtype_code(DType t) {
  switch (t) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
  }
  unknown_dtype("safetensors", t);
}

// ---- writing

// A file written through a POSIX descriptor, so that it can be fsynced.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
    TG_CHECK(fd_ >= 0, "safetensors: cannot create '", path_, "': ", std::strerror(errno));
  }
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t written = ::write(fd_, p, n);
      if (written < 0 && errno == EINTR) continue;
      TG_CHECK(written > 0, "safetensors: cannot write '", path_, "': ", std::strerror(errno));
      p += written;
      n -= static_cast<size_t>(written);
    }
  }

  void sync_and_close() {
    TG_CHECK(::fsync(fd_) == 0, "safetensors: cannot fsync '", path_, "': ", std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    TG_CHECK(::close(fd) == 0, "safetensors: cannot close '", path_, "': ", std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_;
};

// Makes a rename in the folder durable. Some file systems refuse fsync on a
// folder; the file itself is synced already, so that is not an error.
void sync_folder_of(const std::string& path) {
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  const int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string header_text(const StateDict& tensors, const Metadata& metadata) {
  Json header = Json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TG_CHECK(!name.empty() && name != "__metadata__", "safetensors::save_file: '", name,
             "' cannot name a tensor");
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * element_size(t.dtype());
    header[name] = {{"dtype", dtype_code(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {  // a name or metadata string that is not UTF-8
    TG_FAIL("safetensors::save_file: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as safetensors pads it
  return text;
}

// ---- reading

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Everything a header says is checked against `data_bytes`, the size of the data section.
class HeaderChecker {
 public:
  HeaderChecker(std::string path, uint64_t data_bytes) : file_("safetensors: '" + path + "'"), data_bytes_(data_bytes) {}

  Metadata metadata(const Json& value) const {
    TG_CHECK(value.is_object(), file_, ": __metadata__ must be a JSON object, got ", value.type_name());
    Metadata out;
    for (const auto& [key, v] : value.items()) {
      TG_CHECK(v.is_string(), file_, ": __metadata__ '", key, "' must be a string, got ", v.type_name());
      out[key] = v.get<std::string>();
    }
    return out;
  }

  Entry entry(const std::string& name, const Json& value) const {
    const std::string where = file_ + ": tensor '" + name + "'";
    TG_CHECK(value.is_object(), where, ": the entry must be a JSON object, got ", value.type_name());
    Entry e{name, parse_dtype(where, field(where, value, "dtype")), {}, 0, 0};
    int64_t numel = 1;
    for (const Json& size : array_field(where, value, "shape")) {
      const uint64_t n = whole_number(where, "shape", size);
      TG_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                   !__builtin_mul_overflow(numel, static_cast<int64_t>(n), &numel),
               where, ": shape overflows int64");
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const Json& offsets = array_field(where, value, "data_offsets");
    TG_CHECK(offsets.size() == 2, where, ": data_offsets must be [begin, end], got ", offsets.dump());
    e.begin = whole_number(where, "data_offsets", offsets[0]);
    e.end = whole_number(where, "data_offsets", offsets[1]);
    TG_CHECK(e.begin <= e.end && e.end <= data_bytes_, where, ": data_offsets [", e.begin, ", ", e.end,
             "] are not a range within the ", data_bytes_, " bytes of data");
    uint64_t nbytes = 0;
    TG_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(numel), element_size(e.dtype), &nbytes) &&
                 nbytes == e.end - e.begin,
             where, ": shape ", e.shape, " of ", dtype_code(e.dtype), " needs ", numel, " x ", element_size(e.dtype),
             " bytes, but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin);
    return e;
  }

  // Tensors may leave holes in the data, but no byte may belong to two.
  void check_disjoint(std::vector<Entry> entries) const {
    std::erase_if(entries, [](const Entry& e) { return e.begin == e.end; });
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < entries.size(); ++i)
      TG_CHECK(entries[i - 1].end <= entries[i].begin, file_, ": tensors '", entries[i - 1].name, "' and '",
               entries[i].name, "' overlap in the data section");
  }

  const std::string& file() const { return file_; }

 private:
  static const Json& field(const std::string& where, const Json& object, const char* key) {
    const auto it = object.find(key);
    TG_CHECK(it != object.end(), where, ": the entry has no \"", key, "\"");
    return *it;
  }

  static const Json& array_field(const std::string& where, const Json& object, const char* key) {
    const Json& v = field(where, object, key);
    TG_CHECK(v.is_array(), where, ": \"", key, "\" must be an array, got ", v.type_name());
    return v;
  }

  static uint64_t whole_number(const std::string& where, const char* key, const Json& v) {
    TG_CHECK(v.is_number_unsigned(), where, ": \"", key, "\" must hold whole numbers >= 0, got ", v.dump());
    return v.get<uint64_t>();
  }

  static DType parse_dtype(const std::string& where, const Json& v) {
    if (v == "F32") return DType::Float32;
    if (v == "F64") return DType::Float64;
    TG_FAIL(where, ": dtype ", v.dump(), " is not supported (tapegrad reads \"F32\" and \"F64\")");
  }

  std::string file_;
  uint64_t data_bytes_;
};

uint64_t read_u64_le(std::istream& in) {
  unsigned char bytes[8] = {};
  in.read(reinterpret_cast<char*>(bytes), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  return n;
}

}  // namespace

void save_file(const StateDict& tensors, const std::string& path, const Metadata& metadata) {
  by_name("safetensors::save_file", tensors);  // unique names, defined tensors
  NoGradGuard no_grad;
  StateDict host;
  for (const auto& [name, t] : tensors) host.emplace_back(name, t.detach().cpu().contiguous());
  const std::string header = header_text(host, metadata);
  const std::string tmp = path + ".tmp";
  try {
    OutputFile out(tmp);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    out.write(length, 8);
    out.write(header.data(), header.size());
    for (const auto& [name, t] : host) out.write(t.raw_data(), static_cast<size_t>(t.numel()) * element_size(t.dtype()));
    out.sync_and_close();
    TG_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "safetensors: cannot rename '", tmp, "' to '", path,
             "': ", std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  sync_folder_of(path);
}

namespace {

// A file's checked header: its metadata, its tensors' entries and where the data starts.
struct Header {
  Metadata metadata;
  std::vector<Entry> entries;
  uint64_t data_start;
};

// Opens `path` and reads and checks its header; `in` is left open for the data.
Header read_header(std::ifstream& in, const std::string& path) {
  in.open(path, std::ios::binary);
  TG_CHECK(in, "safetensors: cannot open '", path, "'");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0);
  TG_CHECK(in && end >= 0, "safetensors: cannot read '", path, "'");
  const uint64_t file_bytes = static_cast<uint64_t>(end);
  TG_CHECK(file_bytes >= 8, "safetensors: '", path, "' has ", file_bytes, " bytes, fewer than the 8 of the header length");
  const uint64_t header_bytes = read_u64_le(in);
  TG_CHECK(in, "safetensors: cannot read '", path, "'");
  TG_CHECK(header_bytes <= kMaxHeaderBytes && header_bytes <= file_bytes - 8, "safetensors: '", path,
           "': header length ", header_bytes, " exceeds the ", file_bytes - 8, " bytes after it (or the ",
           kMaxHeaderBytes, "-byte limit)");
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  TG_CHECK(in, "safetensors: '", path, "': cannot read the header");
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::exception& e) {
    TG_FAIL("safetensors: '", path, "': the header is not valid JSON (", e.what(), ")");
  }
  const HeaderChecker checker(path, file_bytes - 8 - header_bytes);
  TG_CHECK(json.is_object(), checker.file(), ": the header must be a JSON object, got ", json.type_name());

  Header header{{}, {}, 8 + header_bytes};
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      header.metadata = checker.metadata(value);
    } else {
      header.entries.push_back(checker.entry(key, value));
    }
  }
  checker.check_disjoint(header.entries);
  return header;
}

}  // namespace

File load_file(const std::string& path, Device device) {
  std::ifstream in;
  Header header = read_header(in, path);
  File file{{}, std::move(header.metadata)};
  for (const Entry& e : header.entries) {
    Tensor t = empty(e.shape, {e.dtype, Device::CPU});
    in.seekg(static_cast<std::streamoff>(header.data_start + e.begin));
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(e.end - e.begin));
    TG_CHECK(in, "safetensors: '", path, "': tensor '", e.name, "': cannot read its data");
    file.tensors.emplace_back(e.name, t.to(device));
  }
  return file;
}

Metadata load_metadata(const std::string& path) {
  std::ifstream in;
  return read_header(in, path).metadata;
}

}  // namespace tg::safetensors

namespace tg {

namespace {

constexpr const char* kCheckpointFormat = "tapegrad.training_checkpoint.v1";

uint64_t metadata_number(const std::string& where, const safetensors::Metadata& metadata, const std::string& key) {
  const auto it = metadata.find(key);
  TG_CHECK(it != metadata.end(), where, ": metadata has no '", key, "'");
  const std::string& s = it->second;
  uint64_t n = 0;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), n);
  TG_CHECK(error == std::errc() && end == s.data() + s.size() && !s.empty(), where, ": metadata '", key,
           "' must be a whole number >= 0, got '", s, "'");
  return n;
}

void append_prefixed(StateDict& out, const std::string& prefix, const StateDict& dict) {
  for (const auto& [name, t] : dict) out.emplace_back(prefix + name, t);
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                     int64_t step, const safetensors::Metadata& extra) {
  TG_CHECK(step >= 0, "save_checkpoint: step must be >= 0, got ", step);
  StateDict tensors;
  append_prefixed(tensors, "model.", model.state_dict());
  append_prefixed(tensors, "optimizer.", optimizer.state_dict());
  const PhiloxState rng = default_generator().state();
  safetensors::Metadata metadata{{"format", kCheckpointFormat},
                                 {"step", std::to_string(step)},
                                 {"rng_seed", std::to_string(rng.seed)},
                                 {"rng_offset", std::to_string(rng.offset)}};
  for (const auto& [key, value] : extra)
    TG_CHECK(metadata.emplace(key, value).second, "save_checkpoint: extra metadata key '", key,
             "' is one the checkpoint writes itself");
  safetensors::save_file(tensors, path, metadata);
}

int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer) {
  const safetensors::File file = safetensors::load_file(path);
  const std::string where = "load_checkpoint: '" + path + "'";
  const auto format = file.metadata.find("format");
  TG_CHECK(format != file.metadata.end() && format->second == kCheckpointFormat, where,
           ": not a training checkpoint (metadata 'format' is not '", kCheckpointFormat, "')");
  const uint64_t step = metadata_number(where, file.metadata, "step");
  TG_CHECK(step <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where, ": step ", step,
           " overflows int64");
  const PhiloxState rng{metadata_number(where, file.metadata, "rng_seed"),
                        metadata_number(where, file.metadata, "rng_offset")};
  StateDict model_state, optimizer_state;
  for (const auto& [name, t] : file.tensors) {
    if (name.starts_with("model.")) {
      model_state.emplace_back(name.substr(6), t);
    } else if (name.starts_with("optimizer.")) {
      optimizer_state.emplace_back(name.substr(10), t);
    } else {
      TG_FAIL(where, ": tensor '", name, "' is neither model.* nor optimizer.*");
    }
  }
  const StateDict previous = optimizer.state_dict();
  try {
    optimizer.load_state_dict(optimizer_state);
    model.load_state_dict(model_state);  // checks everything before it copies anything
  } catch (const Error& e) {
    optimizer.load_state_dict(previous);
    TG_FAIL(where, ": ", e.what());
  }
  default_generator().set_state(rng);
  return static_cast<int64_t>(step);
}

}  // namespace tg
