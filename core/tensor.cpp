#include "core/tensor.h"

#include <iomanip>
#include <ostream>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/dispatch.h"
#include "core/random.h"
#include "ops/copy.h"
#include "ops/untracked.h"
#include "ops/elementwise.h"
#include "ops/random.h"
#include "ops/views.h"

namespace tg {

// ---- metadata

const TensorImpl& Tensor::checked_impl() const {
  TG_CHECK(impl_, "Tensor: use of an undefined tensor");
  return *impl_;
}
const Shape& Tensor::shape() const { return checked_impl().shape; }
const Shape& Tensor::strides() const { return checked_impl().strides; }
int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim("size", d, dim())]; }
int64_t Tensor::numel() const { return tg::numel(shape()); }
int64_t Tensor::offset() const { return checked_impl().offset; }
DType Tensor::dtype() const { return checked_impl().dtype; }
Device Tensor::device() const { return checked_impl().storage->device(); }
uint64_t Tensor::version() const { return checked_impl().storage->version(); }
bool Tensor::same_storage(const Tensor& o) const { return impl_ && o.impl_ && impl_->storage == o.impl_->storage; }

bool Tensor::is_contiguous() const {
  const Shape expected = contiguous_strides(shape());
  for (size_t i = 0; i < shape().size(); ++i)
    if (shape()[i] != 1 && strides()[i] != expected[i]) return false;
  return true;
}

void* Tensor::raw_data() const {
  const auto& t = checked_impl();
  return static_cast<char*>(t.storage->data()) + t.offset * element_size(t.dtype);
}

template <class T>
T* Tensor::data() const {
  TG_CHECK(dtype() == dtype_of<T>(), "Tensor::data: tensor is ", dtype(), ", asked for ",
           dtype_of<T>());
  return static_cast<T*>(raw_data());
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;

// ---- element access

std::vector<double> Tensor::to_vector() const {
  const Tensor c = to(Device::CPU).contiguous();
  std::vector<double> out(c.numel());
  TG_DISPATCH_FLOAT(c.dtype(), T, [&] {
    const T* p = c.data<T>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(p[i]);
  });
  return out;
}

double Tensor::item() const {
  TG_CHECK(numel() == 1, "item: tensor of shape ", shape(), " has ", numel(), " elements, not 1");
  return to_vector()[0];
}

double Tensor::at(std::initializer_list<int64_t> index) const {
  TG_CHECK(static_cast<int64_t>(index.size()) == dim(), "at: ", index.size(),
           " indices given for a tensor of shape ", shape());
  int64_t off = offset();
  int d = 0;
  for (int64_t i : index) {
    TG_CHECK(i >= 0 && i < shape()[d], "at: index ", i, " out of range for dim ", d, " of shape ",
             shape());
    off += i * strides()[d++];
  }
  return make_view(*this, {}, {}, off).item();
}

// ---- conversions

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  return cast(*this, t);
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  return to_device(*this, d);
}

Tensor Tensor::clone() const { return tg::clone(*this); }
Tensor Tensor::contiguous() const { return tg::contiguous(*this); }

// ---- views

Tensor Tensor::view(const Shape& s) const { return tg::view(*this, s); }
Tensor Tensor::reshape(const Shape& s) const { return tg::reshape(*this, s); }
Tensor Tensor::permute(const std::vector<int64_t>& d) const { return tg::permute(*this, d); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return tg::transpose(*this, a, b); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return tg::narrow(*this, d, s, l); }
Tensor Tensor::expand(const Shape& s) const { return tg::expand(*this, s); }
Tensor Tensor::unsqueeze(int64_t d) const { return tg::unsqueeze(*this, d); }
Tensor Tensor::squeeze(int64_t d) const { return tg::squeeze(*this, d); }

// ---- autograd

bool Tensor::requires_grad() const { return checked_impl().requires_grad; }

Tensor& Tensor::requires_grad_(bool on) {
  TG_CHECK(is_leaf() || on, "requires_grad_: only leaf tensors can stop requiring grad; use detach()");
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  std::lock_guard<std::mutex> lock(checked_impl().grad_mutex);  // backward() may be accumulating on another thread
  return Tensor(impl_->grad);
}
void Tensor::zero_grad() {
  std::lock_guard<std::mutex> lock(checked_impl().grad_mutex);
  impl_->grad.reset();
}
bool Tensor::is_leaf() const { return checked_impl().grad_fn == nullptr; }
const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const { return checked_impl().grad_fn; }

Tensor Tensor::detach() const {
  const auto& t = checked_impl();
  return make_view(*this, t.shape, t.strides, t.offset);
}

void Tensor::backward(const Tensor& seed, bool retain_graph) const {
  autograd::backward(*this, seed, retain_graph);
}

// ---- in-place

void check_inplace(const char* op, const Tensor& t, const Tensor& src) {
  TG_CHECK(!(t.requires_grad() && t.is_leaf() && autograd::GradMode::enabled()), op,
           ": in-place write to a leaf tensor of shape ", t.shape(),
           " that requires grad; wrap it in tg::NoGradGuard");
  TG_CHECK(!(t.grad_fn() && autograd::GradMode::enabled()), op, ": in-place write to a tensor of shape ", t.shape(),
           " produced by op '", autograd::node_name(*t.grad_fn()),
           "' is not recorded, so its gradient would be wrong; wrap it in tg::NoGradGuard if that is meant");
  TG_CHECK(!has_internal_overlap(t.shape(), t.strides()), op, ": cannot write into a tensor of shape ", t.shape(),
           " with strides ", t.strides(), ": several of its elements share one memory location (an expanded view); "
           "clone() it first");
  TG_CHECK(!(src.defined() && src.requires_grad() && autograd::GradMode::enabled()), op, ": the source tensor of shape ",
           src.shape(), " requires grad, but an in-place ", op, " is not recorded on the tape, so its gradient would be "
           "lost; use the out-of-place op, or wrap the update in tg::NoGradGuard");
}

void bump_version(const Tensor& t) { t.impl()->storage->bump_version(); }

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_defined("add_", "other", other);
  check_inplace("add_", *this, other);
  TG_CHECK(broadcast_shapes("add_", shape(), other.shape()) == shape(), "add_: other ", other.shape(),
           " does not broadcast to this tensor's shape ", shape());
  autograd::NoGradGuard guard;
  return copy_(add(*this, alpha == 1.0 ? other : mul(other, alpha)));
}

Tensor& Tensor::mul_(double factor) {
  check_inplace("mul_", *this);
  autograd::NoGradGuard guard;
  return copy_(mul(*this, factor));
}

Tensor& Tensor::fill_(double value) {
  check_inplace("fill_", *this);
  fill_into(*this, value);
  bump_version(*this);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace("copy_", *this, src);
  copy_into(*this, src);
  bump_version(*this);
  return *this;
}

// ---- factories

namespace {
std::shared_ptr<Storage> allocate_storage(const char* op, const Shape& shape, DType dtype, Device device) {
  const int64_t nbytes = checked_nbytes(op, shape, element_size(dtype));
  if (device == Device::CUDA && !built_with_cuda()) no_cuda_backend();
  try {
    return std::make_shared<Storage>(static_cast<std::size_t>(nbytes), device);
  } catch (const Error& e) {
    TG_FAIL(op, ": cannot allocate ", nbytes, " bytes for ", shape, " on ", device, " (", e.what(), ")");
  } catch (const std::bad_alloc&) {
    TG_FAIL(op, ": cannot allocate ", nbytes, " bytes for ", shape, " on ", device);
  }
}

Tensor empty_named(const char* op, const Shape& shape, TensorOptions opts) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = allocate_storage(op, shape, opts.dtype, opts.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  impl->requires_grad = opts.requires_grad;
  return Tensor(std::move(impl));
}
}  // namespace

Tensor empty(const Shape& shape, TensorOptions opts) { return empty_named("empty", shape, opts); }

Tensor empty_like(const Tensor& t) { return empty(t.shape(), {t.dtype(), t.device()}); }

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  const bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty_named("full", shape, opts);
  fill_into(t, value);
  return t.requires_grad_(rg);
}

Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), {t.dtype(), t.device()}); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  const int64_t n = checked_numel("from_vector", shape);
  TG_CHECK(static_cast<int64_t>(values.size()) == n, "from_vector: ", values.size(), " values do not fill shape ", shape,
           " (", n, " elements)");
  Tensor t = empty_named("from_vector", shape, {opts.dtype, Device::CPU});
  TG_DISPATCH_FLOAT(opts.dtype, T, [&] {
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(values[i]);
  });
  return t.to(opts.device).requires_grad_(opts.requires_grad);
}

Tensor arange(int64_t n, TensorOptions opts) {
  TG_CHECK(n >= 0, "arange: the number of elements must be >= 0, got ", n);
  Tensor host = empty_named("arange", {n}, {DType::Float64, Device::CPU});
  double* v = host.data<double>();
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i);
  return host.to(opts.dtype).to(opts.device).requires_grad_(opts.requires_grad);
}

namespace {
// Drawn on the tensor's own device (ops/random.h): one Philox state per tensor.
template <class Fill>
Tensor random_tensor(const char* op, const Shape& shape, TensorOptions opts, Fill fill) {
  Tensor t = empty_named(op, shape, {opts.dtype, opts.device});
  fill(t, default_generator().next());
  return t.requires_grad_(opts.requires_grad);
}
}  // namespace

Tensor randn(const Shape& shape, TensorOptions opts) { return random_tensor("randn", shape, opts, fill_normal_into); }
Tensor rand(const Shape& shape, TensorOptions opts) { return random_tensor("rand", shape, opts, fill_uniform_into); }

Tensor from_blob(void* data, const Shape& shape, TensorOptions opts) {
  const int64_t nbytes = checked_nbytes("from_blob", shape, element_size(opts.dtype));
  if (opts.device == Device::CUDA && !built_with_cuda()) no_cuda_backend();
  TG_CHECK(data || nbytes == 0, "from_blob: null data for a tensor of shape ", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, static_cast<std::size_t>(nbytes), opts.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  impl->requires_grad = opts.requires_grad;
  return Tensor(std::move(impl));
}

Tensor make_view(const Tensor& t, Shape shape, Shape strides, int64_t offset) {
  check_defined("make_view", "t", t);
  TG_CHECK(shape.size() == strides.size(), "make_view: shape ", shape, " and strides ", strides, " differ in rank");
  TG_CHECK(offset >= 0, "make_view: negative offset ", offset);
  int64_t last = offset;
  bool empty_view = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    TG_CHECK(shape[d] >= 0 && strides[d] >= 0, "make_view: shape ", shape, " with strides ", strides,
             " has a negative size or stride");
    empty_view = empty_view || shape[d] == 0;
    int64_t reach = 0;
    TG_CHECK(shape[d] == 0 || (!__builtin_mul_overflow(shape[d] - 1, strides[d], &reach) &&
                               !__builtin_add_overflow(last, reach, &last)),
             "make_view: shape ", shape, " with strides ", strides, " overflows int64 offsets");
  }
  const int64_t capacity = static_cast<int64_t>(t.impl()->storage->nbytes() / element_size(t.dtype()));
  TG_CHECK(empty_view || last < capacity, "make_view: shape ", shape, ", strides ", strides, " and offset ", offset,
           " reach element ", last, " of a storage of ", capacity, " elements");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

void check_defined(const char* op, const char* arg, const Tensor& t) {
  TG_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_same_dtype_device(const char* op, const Tensor& a, const Tensor& b) {
  TG_CHECK(a.device() == b.device(), op, ": tensors are on different devices (", a.device(), " ",
           a.shape(), " vs ", b.device(), " ", b.shape(), ")");
  TG_CHECK(a.dtype() == b.dtype(), op, ": tensors have different dtypes (", a.dtype(), " ",
           a.shape(), " vs ", b.dtype(), " ", b.shape(), ")");
}

// ---- printing

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  const std::vector<double> v = t.to_vector();
  os << "Tensor(shape=" << t.shape() << ", dtype=" << t.dtype() << ", device=" << t.device();
  if (t.requires_grad()) os << ", requires_grad";
  os << ")\n[";
  const size_t shown = std::min<size_t>(v.size(), 64);
  for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << std::setprecision(6) << v[i];
  if (shown < v.size()) os << ", ... (" << v.size() - shown << " more)";
  return os << "]";
}

}  // namespace tg
