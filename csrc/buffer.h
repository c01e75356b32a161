// buffer.h: uninitialized, aligned heap buffers for packed operands; large ones asked to live on transparent huge pages.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace qmm {

struct FreeBuffer {
  void operator()(void* p) const { std::free(p); }
};

template <class T>
using Buffer = std::unique_ptr<T[], FreeBuffer>;

// count elements of T, uninitialized, 64-byte aligned. From 4 MiB on, 2 MiB aligned and advised as
// huge pages (Linux, where transparent huge pages are "madvise"): a fresh 64 MiB packed weight then
// takes 32 page faults instead of 16384, which cost more than packing it. Throws std::bad_alloc.
template <class T>
Buffer<T> alloc_buffer(size_t count) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = count * sizeof(T) > 0 ? count * sizeof(T) : 1;
  const size_t align = bytes >= 2 * kHuge ? kHuge : 64;
  void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHuge)
    madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return Buffer<T>(static_cast<T*>(p));
}

}  // namespace qmm
