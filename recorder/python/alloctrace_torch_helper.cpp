// alloctrace's PyTorch helper for the default back-end: PyTorch's caching allocator runs the
// job, and this forwards each entry of its allocator trace, as it happens, to the recorder's C
// ABI (`alloctrace_torch_event`): the action, device, address, size and stream, PyTorch's own
// time stamp counter reading of the entry (so the recorder reads no clock of its own) and the
// entry's memory pool (a CUDA graph's private pool, a torch.cuda.MemPool). The tracker is
// attached once; `attach` called again only changes where entries go.
// Built at first use against the installed torch (torch.utils.cpp_extension, cached).
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace {

namespace A = c10::cuda::CUDACachingAllocator;
using EventFn = void (*)(int, int, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

std::atomic<EventFn> event_fn{nullptr};
std::atomic<bool> attached{false};
// Set by an entry that arrived while nothing was attached to forward it to (see `saw_entry`).
std::atomic<bool> unforwarded{false};

// The recorder's numbering (recorder::ffi::torch_action), whatever PyTorch's enum order is.
// `Entry` is PyTorch's TraceEntry, wherever this version declares it.
template <class Entry>
int code(typename Entry::Action a) {
  switch (a) {
    case Entry::ALLOC: return 0;
    case Entry::FREE_REQUESTED: return 1;
    case Entry::FREE_COMPLETED: return 2;
    case Entry::SEGMENT_ALLOC: return 3;
    case Entry::SEGMENT_FREE: return 4;
    case Entry::SEGMENT_MAP: return 5;
    case Entry::SEGMENT_UNMAP: return 6;
    case Entry::SNAPSHOT: return 7;
    case Entry::OOM: return 8;
    default: return -1;
  }
}

template <class T>
uint64_t as_u64(T* p) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}
template <class T>
uint64_t as_u64(T v) {
  return static_cast<uint64_t>(v);
}

// PyTorch's time of the entry where it is a time stamp counter reading (c10's approximate
// clock reads the counter on x86-64), else 0: the recorder then reads its own clock.
template <class E, class = void>
struct has_approx_time : std::false_type {};
template <class E>
struct has_approx_time<E, std::void_t<decltype(std::declval<const E&>().time_.approx_t_)>> : std::true_type {};

template <class E>
uint64_t ticks(const E& te) {
#if defined(C10_RDTSC)
  if constexpr (has_approx_time<E>::value) {
    return static_cast<uint64_t>(te.time_.approx_t_);
  }
#endif
  (void)te;
  return 0;
}

// The entry's memory pool (MempoolId_t, a pair of ids); (0, 0) where this version has none.
template <class E, class = void>
struct has_mempool : std::false_type {};
template <class E>
struct has_mempool<E, std::void_t<decltype(std::declval<const E&>().mempool_.first)>> : std::true_type {};

template <class E>
std::pair<uint64_t, uint64_t> pool(const E& te) {
  if constexpr (has_mempool<E>::value) {
    return {static_cast<uint64_t>(te.mempool_.first), static_cast<uint64_t>(te.mempool_.second)};
  }
  (void)te;
  return {0, 0};
}

}  // namespace

// `fn`: the address of alloctrace_torch_event in the recorder library (0: forward nothing).
void attach(uint64_t fn) {
  event_fn.store(reinterpret_cast<EventFn>(fn), std::memory_order_release);
  if (attached.exchange(true)) {
    return;
  }
  A::attachAllocatorTraceTracker([](const auto& te) {
    using Entry = std::decay_t<decltype(te)>;
    EventFn f = event_fn.load(std::memory_order_acquire);
    int c = code<Entry>(te.action_);
    if (c < 0) {
      return;
    }
    if (f == nullptr) {
      unforwarded.store(true, std::memory_order_relaxed);
      return;
    }
    auto p = pool(te);
    f(c, static_cast<int>(te.device_), as_u64(te.addr_), as_u64(te.size_), as_u64(te.stream_), ticks(te), p.first,
      p.second);
  });
}

// Whether an entry reached the tracker while `attach(0)` was in force, and forget it: the shim
// asks this after one allocation to learn whether this PyTorch calls trackers without its
// history recording on.
bool saw_entry() {
  return unforwarded.exchange(false);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attach", &attach, "Forward PyTorch's allocator trace entries to alloctrace");
  m.def("saw_entry", &saw_entry, "Whether an entry arrived with nothing attached (and forget it)");
}
