// tg::Tensor: a strided view (shape, strides, offset) onto shared Storage, plus
// the autograd fields (requires_grad, grad, grad_fn). Copying a Tensor copies a
// handle; views share storage; ops live in ops/ and are mirrored here as methods.
// Any rank; a kernel over a strided view takes at most 8 dims once adjacent
// dims are collapsed (core/indexing.h's kMaxDims), and a clear error past that.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace tg {

namespace autograd {
struct Node;
}

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;            // filled by backward() for leaves
  std::shared_ptr<autograd::Node> grad_fn;     // the op that produced this tensor
  mutable std::mutex grad_mutex;               // backward() on several threads into one leaf
};

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::CPU;
  bool requires_grad = false;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t size(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  bool is_cuda() const { return device() == Device::CUDA; }
  bool is_contiguous() const;
  uint64_t version() const;
  bool same_storage(const Tensor& other) const;
  void* raw_data() const;  // pointer to the first element (storage + offset)
  template <class T> T* data() const;

  // ---- element access for tests and printing (copies from the GPU if needed)
  double item() const;
  double at(std::initializer_list<int64_t> index) const;
  std::vector<double> to_vector() const;

  // ---- conversions
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor cpu() const { return to(Device::CPU); }
  Tensor cuda() const { return to(Device::CUDA); }
  Tensor clone() const;
  Tensor contiguous() const;

  // ---- views (ops/views.h)
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor expand(const Shape& shape) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  // ---- autograd
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;
  void zero_grad();  // drops .grad(), like PyTorch's set_to_none=True
  bool is_leaf() const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  Tensor detach() const;
  void backward(const Tensor& seed = Tensor(), bool retain_graph = false) const;

  // ---- in-place (bump the version counter). They are not recorded on the
  // tape: writing into a tensor that autograd tracks, into an expanded view
  // (several elements share memory), or from a source that requires grad
  // while grad mode is on is a tg::Error (see docs/derivations.md, "In-place writes").
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double factor);
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& src);

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  const TensorImpl& checked_impl() const;
  std::shared_ptr<TensorImpl> impl_;
};

// The rules every in-place write follows (the methods above), for ops that
// write into their arguments (ops/foreach.h): t must not be a leaf that
// requires grad or a tracked result while grad mode is on, nor an expanded
// view; src (when given) must not require grad while grad mode is on.
void check_inplace(const char* op, const Tensor& t, const Tensor& src = Tensor());
// Marks an in-place write into t: a tensor saved for backward before it then
// fails the engine's version check rather than giving a wrong gradient.
void bump_version(const Tensor& t);

// ---- factories
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor arange(int64_t n, TensorOptions opts = {});
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {});
Tensor scalar_tensor(double value, TensorOptions opts = {});
// Random tensors draw from the global Philox generator (core/random.h).
Tensor randn(const Shape& shape, TensorOptions opts = {});
Tensor rand(const Shape& shape, TensorOptions opts = {});

// A contiguous tensor over memory someone else owns and frees (like
// torch::from_blob); `data` must stay valid while the tensor lives.
Tensor from_blob(void* data, const Shape& shape, TensorOptions opts = {});

// A new tensor (shape, strides, offset) over t's storage; no copy. Throws
// when the view reaches outside the storage or has a negative stride.
// Untracked, for implementing ops and kernels: the view records nothing on
// the tape and does not require grad, like torch's t.detach().as_strided(...).
// User code wants the tracked views (narrow, transpose, permute, expand, view).
Tensor make_view(const Tensor& t, Shape shape, Shape strides, int64_t offset);

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// t's data, or nullptr for an undefined (optional) tensor.
template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Throws naming `op` and `arg` unless t is defined.
void check_defined(const char* op, const char* arg, const Tensor& t);
// Throws naming `op` unless a and b share dtype and device.
void check_same_dtype_device(const char* op, const Tensor& a, const Tensor& b);

}  // namespace tg
