// A CPU allocator for PyTorch that keeps freed large blocks and hands them out again (sparse_runner/training/cpu_block_cache.py
// says when and why).  Written by hand because neither PyTorch nor glibc offers it: PyTorch's CPU allocator caches
// nothing, glibc maps every block above 32 MiB afresh (so each new n x n score tensor is page-faulted in and zeroed
// by the kernel, 4 kB at a time), and raising glibc's mmap threshold instead fragments its heap, because PyTorch's
// 64-byte posix_memalign asks for a little more than a freed block of the same size holds.
//
// Every block carries a 64-byte header with its size (the alignment PyTorch's own allocator gives is kept), so the
// one deleter tells cached blocks from small ones without a lookup.  Blocks of at least kMinCached bytes go back to a
// size-ordered free list when freed; an allocation takes the smallest cached block that fits and wastes at most an
// eighth of it.  The cache holds at most `limit` bytes; beyond that the smallest cached blocks are released first.
// Small blocks go straight to c10::alloc_cpu / free_cpu, as PyTorch's default CPU allocator does (without its
// memory-profiler reports: torch.profiler's profile_memory does not see CPU tensors while this allocator is set).

// Only c10 and pybind11: torch/extension.h (all of ATen) would triple the build time.
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace {

constexpr size_t kHeader = 64;            // keeps the 64-byte alignment of c10::alloc_cpu
constexpr size_t kMinCached = 1 << 20;    // smaller blocks are glibc's business (its bins reuse them)

struct Stats {
  int64_t hits = 0, misses = 0, released = 0;
  size_t cached_bytes = 0;
};

class BlockCache final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &Delete, c10::Device(c10::DeviceType::CPU)};
    void* base = n >= kMinCached ? take(n) : nullptr;
    if (base == nullptr) {
      base = c10::alloc_cpu(n + kHeader);  // throws on failure, as PyTorch's allocator
      *static_cast<size_t*>(base) = n;
    }
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &Delete, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static void Delete(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeader;
    if (*static_cast<size_t*>(base) < kMinCached || !instance().put(base)) c10::free_cpu(base);
  }

  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache();  // never destroyed: tensors may be freed during interpreter exit
    return *cache;
  }

  void set_limit(size_t limit) {
    std::lock_guard<std::mutex> guard(mu_);
    limit_ = limit;
    evict_to(limit_);
  }

  Stats stats() {
    std::lock_guard<std::mutex> guard(mu_);
    return stats_;
  }

 private:
  // The smallest cached block of at least n bytes, if it wastes at most n / 8; nullptr otherwise.
  void* take(size_t n) {
    std::lock_guard<std::mutex> guard(mu_);
    auto it = free_.lower_bound(n);
    if (it == free_.end() || it->first > n + n / 8) {
      ++stats_.misses;
      return nullptr;
    }
    void* base = it->second;
    stats_.cached_bytes -= it->first;
    free_.erase(it);
    ++stats_.hits;
    return base;  // its header keeps the block's own size, so it returns to the cache whole
  }

  // Caches a freed block; false if it does not fit under the limit (the caller frees it).
  bool put(void* base) {
    size_t size = *static_cast<size_t*>(base);
    std::lock_guard<std::mutex> guard(mu_);
    if (size > limit_) return false;
    evict_to(limit_ - size);
    free_.emplace(size, base);
    stats_.cached_bytes += size;
    return true;
  }

  void evict_to(size_t bytes) {  // holds mu_
    while (stats_.cached_bytes > bytes && !free_.empty()) {
      auto it = free_.begin();
      stats_.cached_bytes -= it->first;
      ++stats_.released;
      c10::free_cpu(it->second);
      free_.erase(it);
    }
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t limit_ = 0;
  Stats stats_;
};

// Makes the cache PyTorch's CPU allocator (for every later allocation; blocks allocated before keep their own
// deleter), holding at most limit_bytes of freed blocks.  Idempotent; a new limit applies at once.
void install(int64_t limit_bytes) {
  TORCH_CHECK(limit_bytes >= 0, "cpu block cache: the limit must be >= 0, got ", limit_bytes);
  BlockCache& cache = BlockCache::instance();
  cache.set_limit(static_cast<size_t>(limit_bytes));
  if (c10::GetCPUAllocator() != &cache) c10::SetCPUAllocator(&cache, /*priority=*/1);
}

std::map<std::string, int64_t> stats() {
  Stats s = BlockCache::instance().stats();
  return {{"hits", s.hits}, {"misses", s.misses}, {"released", s.released}, {"cached_bytes", static_cast<int64_t>(s.cached_bytes)}};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "make the block cache PyTorch's CPU allocator, caching up to limit_bytes of freed blocks");
  m.def("stats", &stats, "hits, misses, released blocks and cached bytes");
}
