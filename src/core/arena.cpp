#include "core/arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace mt {

Arena::Arena(size_t capacity, Device device, const char* name)
    : storage_(std::make_shared<Storage>(arena_footprint(capacity), device)), name_(name) {}

Tensor Arena::alloc(const Shape& shape, DType dtype) {
  size_t need = arena_footprint(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  MT_CHECK(used_ + need <= capacity(), MemoryError, "arena '", name_, "' cannot hold ", shape, " ",
           dtype_name(dtype), " (", need, " bytes): ", used_, " of ", capacity(), " in use");
  void* p = static_cast<char*>(storage_ ? storage_->data : nullptr) + used_;
  used_ += need;
  peak_ = std::max(peak_, used_);
  return Tensor(p, shape, dtype, storage_ ? storage_->device : Device::CPU);
}

Tensor Arena::zeros(const Shape& shape, DType dtype) {
  Tensor t = alloc(shape, dtype);
  t.zero_();
  return t;
}

void Arena::discard() {
  used_ = 0;
  if (!storage_ || storage_->device != Device::CPU) return;
  // Whole pages inside the block only: the rest of a page may belong to another allocation.
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(storage_->data);
  const uintptr_t first = (begin + page - 1) / page * page,
                  end = (begin + storage_->bytes) / page * page;
  if (end > first) madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
}

}  // namespace mt
