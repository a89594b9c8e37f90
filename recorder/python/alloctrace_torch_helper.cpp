// alloctrace's PyTorch helper for the default back-end: PyTorch's caching allocator runs the
// job, and this forwards each entry of its allocator trace, as it happens, to the recorder's C
// ABI (`alloctrace_torch_event`): the action, device, address, size and stream, PyTorch's own
// time stamp counter reading of the entry (so the recorder reads no clock of its own) and the
// entry's memory pool (a CUDA graph's private pool, a torch.cuda.MemPool). The tracker is
// attached once; `attach` called again only changes where entries go.
//
// Call sites (`attach_sites`, with --stacks). Where PyTorch's history records context
// (`_record_memory_history(context="alloc", stacks="python")`), PyTorch gathers each
// allocation's Python stack before it takes its allocator's lock and hands it to trackers with
// the entry (`context_`, a CapturedTraceback: code objects and instruction offsets, no names).
// Under the lock this only gives the stack an id, the same for the same frames (a hash and a
// table under a lock of its own; never the GIL), keeping one traceback of each new stack, and
// forwards the entry with that id (`alloctrace_torch_event_at`). A background thread of the
// shim takes the GIL and resolves the new stacks in batches (`resolve_sites`: file, function
// and line of each frame, as PyTorch's own `symbolize` reads them, cached per code object and
// offset), giving their frames to the recorder (`alloctrace_define_callsite`), whose trace
// writer writes each definition before the first event that uses it.
//
// Backward. Allocations made by autograd's engine on its own thread have no Python stack in
// PyTorch's context (nothing there links them to the forward's frames unless anomaly mode is
// on). Where this PyTorch declares `torch::autograd::get_current_node` (2.11 does), such an
// allocation is named by the autograd node running it, the backward of the forward op that
// made it (`MmBackward0`): a thread-local read and the node's type, under the lock.
//
// Built at first use against the installed torch (torch.utils.cpp_extension, cached).
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <c10/util/Type.h>

#include <pthread.h>

#include <string>
#include <typeinfo>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

// Chosen only where this PyTorch declares no `get_current_node` of its own (a non-template
// function is preferred to a template): no backward node is known.
namespace torch {
namespace autograd {
template <int = 0>
std::nullptr_t get_current_node() {
  return nullptr;
}
}  // namespace autograd
}  // namespace torch

namespace {

namespace A = c10::cuda::CUDACachingAllocator;
using EventFn = void (*)(int, int, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);
using EventAtFn = void (*)(int, int, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint32_t);
using DefineFn = void (*)(uint32_t, uint64_t, const char* const*, const uint32_t*, const char* const*);

std::atomic<EventFn> event_fn{nullptr};
std::atomic<EventAtFn> event_at_fn{nullptr};
std::atomic<DefineFn> define_fn{nullptr};
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


// ---------------------------------------------------------------- call sites

using torch::CapturedTraceback;
using PyFrames = std::vector<CapturedTraceback::PyFrame>;

// A traceback's Python frames (code object, instruction offset), innermost first. PyTorch keeps
// them private (its own `symbolize` is their reader); an explicit instantiation may name a
// private member, so this reads them without a change to PyTorch. Read only, and only frames
// PyTorch wrote before handing the entry over.
struct FramesTag {
  using type = PyFrames CapturedTraceback::*;
  friend type frames_member(FramesTag);
};
template <class Tag, typename Tag::type M>
struct Expose {
  friend typename Tag::type frames_member(Tag) { return M; }
};
template struct Expose<FramesTag, &CapturedTraceback::frames_>;

const PyFrames& frames_of(const CapturedTraceback& tb) {
  return tb.*frames_member(FramesTag{});
}

struct Site {
  // One traceback of the stack, kept for good: it holds references to its code objects, so
  // that no other code object can take one of their addresses while the table keys on them.
  std::shared_ptr<c10::GatheredContext> keep;
  const CapturedTraceback* tb;  // null for a backward node's site
  const std::type_info* node;   // the autograd node's type, for a backward node's site
  uint32_t id;
};

struct Sites {
  // Taken under PyTorch's allocator lock (by the tracker) and with the GIL held (by
  // `resolve_sites`); whoever holds it waits for nothing else.
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<uint64_t, std::vector<Site>> by_hash;
  std::unordered_map<const std::type_info*, uint32_t> by_node;
  std::vector<Site> unresolved;
  uint32_t next = 0;
  bool stopping = false;
};

// Never destroyed: the tracebacks it keeps are released through PyTorch's own statics, which may
// be gone at exit.
Sites& sites() {
  static Sites* s = new Sites();
  return *s;
}

std::atomic<bool> collecting{false};

// `torch::autograd::get_current_node()` returns the node autograd's engine runs on this thread
// as a pointer or a shared pointer, depending on the release.
torch::autograd::Node* raw_node(torch::autograd::Node* n) {
  return n;
}
torch::autograd::Node* raw_node(const std::shared_ptr<torch::autograd::Node>& n) {
  return n.get();
}
torch::autograd::Node* raw_node(std::nullptr_t) {
  return nullptr;
}

// The site of an allocation with no Python frames: the backward node running it, if any.
uint32_t node_site() {
  auto current = torch::autograd::get_current_node();
  torch::autograd::Node* node = raw_node(current);
  if (node == nullptr) {
    return 0;
  }
  const std::type_info* ti = &typeid(*node);
  Sites& s = sites();
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.by_node.find(ti);
  if (it != s.by_node.end()) {
    return it->second;
  }
  if (s.next == UINT32_MAX) {
    return 0;
  }
  Site site{nullptr, nullptr, ti, ++s.next};
  s.by_node.emplace(ti, site.id);
  s.unresolved.push_back(site);
  s.cv.notify_one();
  return site.id;
}

uint64_t hash_frames(const PyFrames& fr) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& f : fr) {
    h = (h ^ static_cast<uint64_t>(reinterpret_cast<uintptr_t>(f.code))) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(static_cast<uint32_t>(f.lasti))) * 1099511628211ull;
  }
  return h;
}

bool same_frames(const PyFrames& a, const PyFrames& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].code != b[k].code || a[k].lasti != b[k].lasti) {
      return false;
    }
  }
  return true;
}

// The id of an allocation's stack (0: none). Runs under PyTorch's allocator lock: no GIL, no
// Python, no PyTorch call.
uint32_t site_of(const std::shared_ptr<c10::GatheredContext>& ctx) {
  if (!ctx || !collecting.load(std::memory_order_relaxed)) {
    return 0;
  }
  const auto* tb = dynamic_cast<const CapturedTraceback*>(ctx.get());
  if (tb == nullptr || frames_of(*tb).empty()) {
    return node_site();  // no Python frames: a thread of PyTorch's own (autograd's, in backward)
  }
  const PyFrames& fr = frames_of(*tb);
  uint64_t h = hash_frames(fr);
  Sites& s = sites();
  std::lock_guard<std::mutex> g(s.mu);
  auto& bucket = s.by_hash[h];
  for (const auto& site : bucket) {
    if (same_frames(frames_of(*site.tb), fr)) {
      return site.id;
    }
  }
  if (s.next == UINT32_MAX) {
    return 0;
  }
  Site site{ctx, tb, nullptr, ++s.next};
  bucket.push_back(site);
  s.unresolved.push_back(site);
  s.cv.notify_one();
  return site.id;
}

void before_fork() {
  sites().mu.lock();
}
void after_fork_parent() {
  sites().mu.unlock();
}
void after_fork_child() {
  // The child has no resolver thread and records nothing.
  collecting.store(false, std::memory_order_relaxed);
  sites().mu.unlock();
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
    EventAtFn fa = event_at_fn.load(std::memory_order_acquire);
    if (fa != nullptr) {
      uint32_t site = c == 0 ? site_of(te.context_) : 0;
      fa(c, static_cast<int>(te.device_), as_u64(te.addr_), as_u64(te.size_), as_u64(te.stream_), ticks(te), p.first,
         p.second, site);
      return;
    }
    f(c, static_cast<int>(te.device_), as_u64(te.addr_), as_u64(te.size_), as_u64(te.stream_), ticks(te), p.first,
      p.second);
  });
}

// `event_at`, `define`: the addresses of alloctrace_torch_event_at and
// alloctrace_define_callsite. From now on allocations carry their stack's id.
void attach_sites(uint64_t event_at, uint64_t define) {
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers, [] { pthread_atfork(before_fork, after_fork_parent, after_fork_child); });
  define_fn.store(reinterpret_cast<DefineFn>(define), std::memory_order_release);
  {
    std::lock_guard<std::mutex> g(sites().mu);
    sites().stopping = false;
  }
  collecting.store(true, std::memory_order_relaxed);
  event_at_fn.store(reinterpret_cast<EventAtFn>(event_at), std::memory_order_release);
}

// Waits (without the GIL) until a new stack waits to be resolved, or `seconds` passed, or
// `stop_sites`. Whether one waits.
bool wait_sites(double seconds) {
  Sites& s = sites();
  std::unique_lock<std::mutex> g(s.mu);
  s.cv.wait_for(g, std::chrono::duration<double>(seconds), [&] { return !s.unresolved.empty() || s.stopping; });
  return !s.unresolved.empty();
}

struct Loc {
  std::string file;
  std::string function;
  uint32_t line;
};

struct FrameKeyHash {
  size_t operator()(const std::pair<void*, int>& k) const {
    return std::hash<void*>()(k.first) ^ (static_cast<size_t>(static_cast<uint32_t>(k.second)) * 0x9e3779b97f4a7c15ull);
  }
};

// A Python string attribute of `obj` as UTF-8; empty on any failure. With the GIL.
std::string attr_text(PyObject* obj, const char* name) {
  PyObject* v = PyObject_GetAttrString(obj, name);
  if (v == nullptr) {
    PyErr_Clear();
    return {};
  }
  const char* p = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : nullptr;
  if (p == nullptr) {
    PyErr_Clear();
  }
  std::string out = p != nullptr ? p : "";
  Py_DECREF(v);
  return out;
}

// A frame as PyTorch's `symbolize` reads it: the code object's file and name, and the line of
// the instruction offset. Cached by (code object, offset): the code objects of every cached
// frame stay alive, held by the tracebacks the site table keeps. With the GIL.
const Loc& locate(const CapturedTraceback::PyFrame& f) {
  static auto* cache = new std::unordered_map<std::pair<void*, int>, Loc, FrameKeyHash>();
  auto key = std::make_pair(f.code, f.lasti);
  auto it = cache->find(key);
  if (it != cache->end()) {
    return it->second;
  }
  auto* code = reinterpret_cast<PyObject*>(f.code);
  int line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(f.code), f.lasti);
  Loc loc{attr_text(code, "co_filename"), attr_text(code, "co_name"), line > 0 ? static_cast<uint32_t>(line) : 0};
  return cache->emplace(key, std::move(loc)).first->second;
}

// The name of a backward node's type: `MmBackward0` for torch::autograd::generated::MmBackward0.
std::string node_name(const std::type_info* ti) {
  std::string name = c10::demangle(ti->name());
  size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// Resolves the stacks waiting (with the GIL, which pybind11 holds here) and defines them in the
// recorder. Returns how many.
size_t resolve_sites() {
  Sites& s = sites();
  std::vector<Site> todo;
  {
    std::lock_guard<std::mutex> g(s.mu);
    todo.swap(s.unresolved);
  }
  DefineFn def = define_fn.load(std::memory_order_acquire);
  if (todo.empty() || def == nullptr) {
    return 0;
  }
  std::vector<const char*> files, functions;
  std::vector<uint32_t> lines;
  std::string node;
  static const char* const kAutograd = "<autograd>";
  size_t k = 0;
  try {
    for (; k < todo.size(); ++k) {
      const Site& site = todo[k];
      files.clear();
      functions.clear();
      lines.clear();
      if (site.tb != nullptr) {
        for (const auto& f : frames_of(*site.tb)) {
          const Loc& loc = locate(f);
          files.push_back(loc.file.c_str());
          functions.push_back(loc.function.c_str());
          lines.push_back(loc.line);
        }
      } else if (site.node != nullptr) {
        node = node_name(site.node);
        files.push_back(kAutograd);
        functions.push_back(node.c_str());
        lines.push_back(0);
      }
      def(site.id, files.size(), files.data(), lines.data(), functions.data());
    }
  } catch (...) {
    // Say that the rest will not come, so that the recorder waits for none of them.
    for (; k < todo.size(); ++k) {
      def(todo[k].id, 0, nullptr, nullptr, nullptr);
    }
    throw;
  }
  return todo.size();
}

// No more stacks are collected; a thread in `wait_sites` returns at once.
void stop_sites() {
  collecting.store(false, std::memory_order_relaxed);
  Sites& s = sites();
  {
    std::lock_guard<std::mutex> g(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
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
  m.def("attach_sites", &attach_sites, "Forward each allocation's call site id; define them once resolved");
  m.def("wait_sites", &wait_sites, "Wait for stacks to resolve (without the GIL)",
        py::call_guard<py::gil_scoped_release>());
  m.def("resolve_sites", &resolve_sites, "Resolve the stacks waiting and define them in the recorder");
  m.def("stop_sites", &stop_sites, "Stop collecting stacks, wake the waiting thread");
}
