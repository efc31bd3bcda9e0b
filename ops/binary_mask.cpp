#include "ops/binary_mask.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "ops/binary_mask_kernels.h"

namespace tg {

template <>
void BinaryMaskKernels<Device::CPU>::count_non_binary(const Tensor& mask, const Tensor& counts, int64_t slot) {
  TG_DISPATCH_FLOAT(mask.dtype(), T, [&] {
    const T* m = mask.data<T>();
    counts.data<double>()[slot] += static_cast<double>(std::count_if(m, m + mask.numel(), non_binary<T>));
  });
}

TG_INSTANTIATE_KERNELS(BinaryMaskKernels, Device::CPU);

namespace {

// A CUDA mask found binary: its storage (not kept alive), the storage's
// version then, and the view.
struct CheckedMask {
  std::weak_ptr<Storage> storage;
  uint64_t version;
  int64_t offset;
  Shape shape, strides;
  // Same storage: owners compared, no shared_ptr made (an expired weak_ptr
  // matches no live storage, even one at the same address).
  bool same_storage(const std::shared_ptr<Storage>& s) const {
    return !storage.owner_before(s) && !s.owner_before(storage);
  }
  bool matches(const Tensor& t) const {
    const std::shared_ptr<Storage>& now = t.impl()->storage;
    return same_storage(now) && version == now->version() && offset == t.offset() && shape == t.shape() &&
           strides == t.strides();
  }
  bool stale() const {
    const std::shared_ptr<Storage> s = storage.lock();
    return !s || s->version() != version;
  }
};

// The CUDA masks found binary lately, the latest used last; past kRemembered
// the least recently used is forgotten (a model's masks fit; a fresh mask
// each step, such as a dropout mask, takes one slot at a time).
class CheckedMasks {
 public:
  bool contains(const Tensor& t) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto found = std::find_if(masks_.begin(), masks_.end(), [&](const CheckedMask& m) { return m.matches(t); });
    if (found == masks_.end()) return false;
    std::rotate(found, found + 1, masks_.end());
    return true;
  }
  // t found binary at its storage's `version`. Only CUDA masks: on the CPU
  // the count costs no synchronisation, and a host mask is commonly refilled
  // through data<T>(), which no version sees.
  void add(const Tensor& t, uint64_t version) {
    const std::shared_ptr<Storage>& s = t.impl()->storage;
    if (s->device() != Device::CUDA || !s->owned()) return;  // borrowed memory is written by its owner, unseen
    const std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(masks_, [](const CheckedMask& m) { return m.stale(); });
    if (masks_.size() == kRemembered) masks_.erase(masks_.begin());
    masks_.push_back({s, version, t.offset(), t.shape(), t.strides()});
  }

 private:
  static constexpr size_t kRemembered = 32;
  std::mutex mutex_;
  std::vector<CheckedMask> masks_;
};

CheckedMasks& checked_masks() {
  static CheckedMasks masks;
  return masks;
}

}  // namespace

void check_binary_masks(const char* op, std::initializer_list<NamedMask> masks) {
  if (masks.size() == 0) return;
  const NamedMask& first = *masks.begin();
  for (const NamedMask& m : masks) check_defined(op, m.arg, m.mask);
  for (const NamedMask& m : masks)
    TG_CHECK(m.mask.device() == first.mask.device(), op, ": ", m.arg, " is on ", m.mask.device(), ", ", first.arg,
             " on ", first.mask.device());
  // The masks not found binary before, each with its storage's version now, which the count below vouches for.
  std::vector<std::pair<const NamedMask*, uint64_t>> unchecked;
  for (const NamedMask& m : masks)
    if (!checked_masks().contains(m.mask)) unchecked.emplace_back(&m, m.mask.impl()->storage->version());
  if (unchecked.empty()) return;
  NoGradGuard no_grad;
  const Tensor counts = zeros({static_cast<int64_t>(unchecked.size())}, {DType::Float64, first.mask.device()});
  for (size_t slot = 0; slot < unchecked.size(); ++slot) {
    const Tensor& mask = unchecked[slot].first->mask;
    TG_DISPATCH_DEVICE(mask, BinaryMaskKernels, count_non_binary, mask.contiguous(), counts, int64_t(slot));
  }
  const std::vector<double> found = counts.to_vector();  // the one device sync
  for (size_t slot = 0; slot < unchecked.size(); ++slot) {
    if (found[slot] == 0) continue;
    const NamedMask& m = *unchecked[slot].first;
    const std::vector<double> values = m.mask.to_vector();
    const auto bad = std::find_if(values.begin(), values.end(), non_binary<double>);
    TG_CHECK(bad != values.end(), op, ": ", m.arg, " ", m.mask.shape(), ": the device counted ", found[slot],
             " elements that are not 0 or 1, the host none (was the mask written meanwhile?)");
    TG_FAIL(op, ": ", m.arg, " ", m.mask.shape(), " must hold only 0 and 1; element ", bad - values.begin(), " is ",
            *bad);
  }
  for (const auto& [m, version] : unchecked) checked_masks().add(m->mask, version);
}

void check_binary_mask(const char* op, const char* arg, const Tensor& mask) { check_binary_masks(op, {{arg, mask}}); }

}  // namespace tg
