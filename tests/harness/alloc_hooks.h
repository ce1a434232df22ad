// Counting allocation hooks for the tests proving that a training step allocates no heap memory
// after warm-up (tests/train/test_step_alloc.cpp, tests/parallel/mpi_alloc_check.cpp). Including
// this header replaces the global allocation functions (operator new and the C allocator) with
// counting ones over glibc's, so exactly one source file of a test binary includes it, and a
// sanitizer build (which owns malloc itself) leaves such binaries out. Allocations inside the BLAS
// library are not counted (inside_blas). MT_ALLOC_TRACE=1 prints the call stack of every counted
// allocation (diagnosis only).
#pragma once

#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace mt::test::alloc_hooks {

inline std::atomic<bool> g_counting{false};
inline std::atomic<int64_t> g_count{0};
// See allocations_in(): skip what the MPI library and its runtime allocate for themselves.
inline std::atomic<bool> g_skip_mpi{false};
inline thread_local bool t_in_hook = false;

// True when a frame of the stack lies in a library named by one of `prefixes` (a file name's
// start, e.g. "libmpi").
template <size_t N>
bool inside(void* const* frames, int n, const char* const (&prefixes)[N]) {
  for (int i = 0; i < n; ++i) {
    Dl_info info;
    if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
    const char* base = std::strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    for (const char* p : prefixes)
      if (std::strncmp(base, p, std::strlen(p)) == 0) return true;
  }
  return false;
}

// The MPI library and its runtime (Open MPI's components, PMIx, libevent, hwloc, the fabrics'
// libraries): an allocation with one of these on the stack is theirs, made inside an MPI call of
// ours or on one of their threads. A callback of ours that MPI runs (a user reduction) would be
// skipped too; none of ours allocates.
inline bool inside_mpi(void* const* frames, int n) {
  static constexpr const char* kPrefixes[] = {"libmpi",   "libopen-",   "libpmix",  "libevent",
                                              "libhwloc", "mca_",       "libuc",    "libfabric",
                                              "libpsm",   "libibverbs", "librdmacm"};
  return inside(frames, n, kPrefixes);
}

// The BLAS library's own scratch: OpenBLAS 0.3.21's small-matrix sgemm kernels for Cooper Lake
// (sgemm_small_kernel_*_COOPERLAKE) malloc on every call, so on such a CPU every CPU GEMM of a
// step allocated; the engine hands BLAS no allocator, and which kernel OpenBLAS picks depends on
// the CPU it finds. Left out always (the engine's own allocations are what the step contract
// covers, docs/architecture.md).
inline bool inside_blas(void* const* frames, int n) {
  static constexpr const char* kPrefixes[] = {"libopenblas", "libblas"};
  return inside(frames, n, kPrefixes);
}

inline void note_alloc() {
  if (!g_counting.load(std::memory_order_relaxed) || t_in_hook) return;
  static const bool trace = std::getenv("MT_ALLOC_TRACE") != nullptr;
  // backtrace and dladdr may allocate themselves (loading the unwinder): not counted.
  t_in_hook = true;
  void* frames[64];
  const int n = backtrace(frames, 64);
  if (!inside_blas(frames, n) &&
      (!g_skip_mpi.load(std::memory_order_relaxed) || !inside_mpi(frames, n))) {
    g_count.fetch_add(1, std::memory_order_relaxed);
    if (trace) {
      backtrace_symbols_fd(frames, n, STDERR_FILENO);
      const char sep[] = "----\n";
      (void)!write(STDERR_FILENO, sep, sizeof sep - 1);
    }
  }
  t_in_hook = false;
}

// Allocations made by f() on any thread. skip_mpi: leave out those made inside the MPI library
// or its runtime (see inside_mpi), which are beyond the engine's control.
template <typename F>
int64_t allocations_in(F&& f, bool skip_mpi = false) {
  g_skip_mpi = skip_mpi;
  g_count = 0;
  g_counting = true;
  f();
  g_counting = false;
  return g_count.load();
}

}  // namespace mt::test::alloc_hooks

extern "C" {
void* malloc(size_t n) {
  mt::test::alloc_hooks::note_alloc();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t s) {
  mt::test::alloc_hooks::note_alloc();
  return __libc_calloc(n, s);
}
void* realloc(void* p, size_t n) {
  mt::test::alloc_hooks::note_alloc();
  return __libc_realloc(p, n);
}
int posix_memalign(void** p, size_t a, size_t n) {
  mt::test::alloc_hooks::note_alloc();
  *p = __libc_memalign(a, n);
  return *p ? 0 : ENOMEM;
}
void* aligned_alloc(size_t a, size_t n) {
  mt::test::alloc_hooks::note_alloc();
  return __libc_memalign(a, n);
}
void free(void* p) {
  __libc_free(p);
}
}

void* operator new(size_t n) {
  mt::test::alloc_hooks::note_alloc();
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void* operator new(size_t n, std::align_val_t a) {
  mt::test::alloc_hooks::note_alloc();
  if (void* p = __libc_memalign(static_cast<size_t>(a), n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) {
  return operator new(n, a);
}
void operator delete(void* p) noexcept {
  __libc_free(p);
}
void operator delete[](void* p) noexcept {
  __libc_free(p);
}
void operator delete(void* p, size_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, size_t) noexcept {
  __libc_free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  __libc_free(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  __libc_free(p);
}
