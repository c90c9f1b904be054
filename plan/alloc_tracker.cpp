// Replacement of every form of the global operator new and delete (plain, nothrow, array, sized and
// aligned) that counts requested bytes. Each block carries its size in a header in front of the
// pointer, so the unsized deletes know what they free; the header is as large as the alignment, so the
// returned pointer keeps it. Memory comes from malloc / aligned_alloc, which AddressSanitizer
// intercepts, so sanitizer builds still check every access.
#include "plan/alloc_tracker.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace touchstone::alloc_tracker {

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void count_allocation(size_t size) {
  const int64_t live =
      g_live.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed) + static_cast<int64_t>(size);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

constexpr size_t kDefaultAlignment = __STDCPP_DEFAULT_NEW_ALIGNMENT__;

void* allocate(size_t size, size_t alignment) {
  const size_t header = std::max(alignment, kDefaultAlignment);
  void* block = nullptr;
  if (alignment <= kDefaultAlignment) {
    block = std::malloc(size + header);
  } else {
    const size_t total = (size + header + alignment - 1) / alignment * alignment;  // aligned_alloc's rule
    block = std::aligned_alloc(alignment, total);
  }
  if (block == nullptr) return nullptr;
  auto* user = static_cast<unsigned char*>(block) + header;
  *reinterpret_cast<size_t*>(user - sizeof(size_t)) = size;
  count_allocation(size);
  return user;
}

void deallocate(void* pointer, size_t alignment) {
  if (pointer == nullptr) return;
  const size_t header = std::max(alignment, kDefaultAlignment);
  auto* user = static_cast<unsigned char*>(pointer);
  const size_t size = *reinterpret_cast<size_t*>(user - sizeof(size_t));
  g_live.fetch_sub(static_cast<int64_t>(size), std::memory_order_relaxed);
  std::free(user - header);
}

void* allocate_or_throw(size_t size, size_t alignment) {
  for (;;) {
    if (void* p = allocate(size, alignment)) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

}  // namespace

int64_t live_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace touchstone::alloc_tracker

namespace at = touchstone::alloc_tracker;

void* operator new(size_t size) { return at::allocate_or_throw(size, 0); }
void* operator new[](size_t size) { return at::allocate_or_throw(size, 0); }
void* operator new(size_t size, const std::nothrow_t&) noexcept { return at::allocate(size, 0); }
void* operator new[](size_t size, const std::nothrow_t&) noexcept { return at::allocate(size, 0); }
void* operator new(size_t size, std::align_val_t align) {
  return at::allocate_or_throw(size, static_cast<size_t>(align));
}
void* operator new[](size_t size, std::align_val_t align) {
  return at::allocate_or_throw(size, static_cast<size_t>(align));
}
void* operator new(size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  return at::allocate(size, static_cast<size_t>(align));
}
void* operator new[](size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  return at::allocate(size, static_cast<size_t>(align));
}

void operator delete(void* p) noexcept { at::deallocate(p, 0); }
void operator delete[](void* p) noexcept { at::deallocate(p, 0); }
void operator delete(void* p, size_t) noexcept { at::deallocate(p, 0); }
void operator delete[](void* p, size_t) noexcept { at::deallocate(p, 0); }
void operator delete(void* p, const std::nothrow_t&) noexcept { at::deallocate(p, 0); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { at::deallocate(p, 0); }
void operator delete(void* p, std::align_val_t align) noexcept {
  at::deallocate(p, static_cast<size_t>(align));
}
void operator delete[](void* p, std::align_val_t align) noexcept {
  at::deallocate(p, static_cast<size_t>(align));
}
void operator delete(void* p, size_t, std::align_val_t align) noexcept {
  at::deallocate(p, static_cast<size_t>(align));
}
void operator delete[](void* p, size_t, std::align_val_t align) noexcept {
  at::deallocate(p, static_cast<size_t>(align));
}
void operator delete(void* p, std::align_val_t align, const std::nothrow_t&) noexcept {
  at::deallocate(p, static_cast<size_t>(align));
}
void operator delete[](void* p, std::align_val_t align, const std::nothrow_t&) noexcept {
  at::deallocate(p, static_cast<size_t>(align));
}
