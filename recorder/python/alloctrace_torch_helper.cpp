// alloctrace's PyTorch helper for the default back-end: PyTorch's caching allocator runs the
// job, and this forwards each entry of its allocator trace, as it happens, to the recorder's C
// ABI (`alloctrace_torch_entry`). PyTorch calls trace trackers only while its history recording
// is on; the shim turns it on with a ring buffer of one entry, so nothing accumulates.
// Built at first use against the installed torch (torch.utils.cpp_extension, cached).
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <type_traits>

namespace {

namespace A = c10::cuda::CUDACachingAllocator;
using EntryFn = void (*)(int, int, uint64_t, uint64_t, uint64_t);

EntryFn entry_fn = nullptr;

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

}  // namespace

// `fn`: the address of alloctrace_torch_entry in the recorder library.
void attach(uint64_t fn) {
  entry_fn = reinterpret_cast<EntryFn>(fn);
  A::attachAllocatorTraceTracker([](const auto& te) {
    using Entry = std::decay_t<decltype(te)>;
    int c = code<Entry>(te.action_);
    if (c >= 0 && entry_fn != nullptr) {
      entry_fn(c, static_cast<int>(te.device_), as_u64(te.addr_), as_u64(te.size_), as_u64(te.stream_));
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attach", &attach, "Forward PyTorch's allocator trace entries to alloctrace");
}
