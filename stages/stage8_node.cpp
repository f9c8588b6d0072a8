// Stage 8's backward as a C++ autograd node: the backward of stages.autograd.attention(...,
// forward=6) when it applies (stages/autograd_node.py says when, builds this file at first use and
// makes the plans; FA_AUTOGRAD_NODE=0 runs the Python autograd.Function instead). Training
// plumbing, not a stage: the kernels are stage 8's, compiled and loaded by stages/stage8.py.
//
// Why C++: a training step through the Python autograd.Function (stages/stage8.py `_Attention`)
// runs its backward in Python on the autograd engine's device thread: about 35 µs a step for the
// Python Function itself and 70 µs of Python in the backward (experiments/train_step_host). This
// node does the same work without Python on that thread: three allocations (one float32
// workspace, dq, dk, dv), two tensor-map retargets when q or dO moved, and three launches through
// the driver's cuLaunchKernel of the kernels stage 8 compiled and loaded (their handles, launch
// configurations and scalar arguments come from stage 8's own plan, stages/stage8.py
// `_make_launch`, once per layout: stages/autograd_node.py). The probe that measured it:
// experiments/cpp_autograd_node. Where it applies, stage 6's forward is launched here too (one
// allocation each of the output and lse, the maps retargeted when moved, one cuLaunchKernel, the
// node attached: forward() below), from stage 6's own plan for the layout: a step's forward then
// costs the host no Python either (stages/autograd_node.py, _add_forward).
//
// No CUDA headers and no link to CUDA: the driver is reached through dlopen("libcuda.so.1") and
// dlsym, and the current stream through c10's device-guard interface (DeviceGuardImplInterface::
// getStream + getStreamNativeHandle, which a CPU build of torch declares too), so the extension
// compiles against a CPU torch (checked there) and a CUDA one alike. (With NODE_C10_CUDA_STREAM
// defined the stream comes from c10::cuda::getCurrentCUDAStream instead: CUDA's headers and
// libc10_cuda needed, a CUDA build of torch only.)
//
// The node works with both spellings of autograd's node pointer: std::shared_ptr<Node> (torch up
// to 2.11 at least) and c10::intrusive_ptr<Node> (pytorch/pytorch#181782, April 2026; torch 2.13's
// headers): NodePtr below.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/utils/pybind.h>

#ifdef NODE_C10_CUDA_STREAM  // the alternative (autograd_node.py: FA_AUTOGRAD_NODE_STREAM=c10_cuda): CUDA headers, libc10_cuda
#include <c10/cuda/CUDAStream.h>
#endif

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using at::Tensor;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// ---------------------------------------------------------------------------------------------
// The driver, by dlsym. Types as the C ABI has them: enums are ints, handles are pointers.

using CUresult = int;
constexpr CUresult kInvalidHandle = 400;  // CUDA_ERROR_INVALID_HANDLE
// CUtensorMap's enums (cuda.h), as lib/tma.tensor_map asks cuda.core for them
constexpr int kUint16 = 1;       // CU_TENSOR_MAP_DATA_TYPE_UINT16: fp16 and bf16 moved as bits
constexpr int kInterleaveNone = 0;
constexpr int kSwizzle128B = 3;  // CU_TENSOR_MAP_SWIZZLE_128B
constexpr int kL2None = 0;       // cuda.core's default L2 promotion (lib/tma.py says why it is kept)
constexpr int kOobNone = 0;      // rows past the end come back as zeros

struct Driver {
  using LaunchKernel = CUresult (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    void*, void**, void**);
  using EncodeTiled = CUresult (*)(void*, int, uint32_t, void*, const uint64_t*, const uint64_t*, const uint32_t*,
                                   const uint32_t*, int, int, int, int);
  using ReplaceAddress = CUresult (*)(void*, void*);
  using CtxGetCurrent = CUresult (*)(void**);
  using CtxSetCurrent = CUresult (*)(void*);
  using GetErrorName = CUresult (*)(CUresult, const char**);
  using KernelGetFunction = CUresult (*)(void**, void*);

  LaunchKernel launch = nullptr;
  EncodeTiled encode = nullptr;
  ReplaceAddress replace = nullptr;
  CtxGetCurrent ctx_get = nullptr;
  CtxSetCurrent ctx_set = nullptr;
  GetErrorName error_name = nullptr;
  KernelGetFunction kernel_function = nullptr;  // optional: a CUkernel's CUfunction in this context
  std::string problem;                          // empty when every required symbol was found

  Driver() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      problem = std::string("dlopen(\"libcuda.so.1\") failed: ") + (e ? e : "?");
      return;
    }
    auto sym = [&](const char* name, bool required) -> void* {
      void* p = dlsym(lib, name);
      if (p == nullptr && required) {
        problem += std::string(problem.empty() ? "" : "; ") + "libcuda.so.1 has no " + name;
      }
      return p;
    };
    launch = reinterpret_cast<LaunchKernel>(sym("cuLaunchKernel", true));
    encode = reinterpret_cast<EncodeTiled>(sym("cuTensorMapEncodeTiled", true));
    replace = reinterpret_cast<ReplaceAddress>(sym("cuTensorMapReplaceAddress", true));
    ctx_get = reinterpret_cast<CtxGetCurrent>(sym("cuCtxGetCurrent", true));
    ctx_set = reinterpret_cast<CtxSetCurrent>(sym("cuCtxSetCurrent", true));
    error_name = reinterpret_cast<GetErrorName>(sym("cuGetErrorName", false));
    kernel_function = reinterpret_cast<KernelGetFunction>(sym("cuKernelGetFunction", false));
  }

  void require() const {
    TORCH_CHECK(problem.empty(), "stage 8's C++ autograd node (stages/stage8_node.cpp): the CUDA driver is not usable: ", problem);
  }

  void check(CUresult r, const char* what) const {
    if (r == 0) return;
    const char* name = nullptr;
    if (error_name != nullptr) error_name(r, &name);
    TORCH_CHECK(false, "stage 8's C++ autograd node (stages/stage8_node.cpp): ", what, " failed: ", name ? name : "CUresult", " (", r, ")");
  }
};

const Driver& driver() {
  static const Driver d;  // thread-safe, once
  return d;
}

// ---------------------------------------------------------------------------------------------
// lib/tma.tensor_map's description of a [B, H, S, D] 16-bit tensor, in the driver's order
// (innermost dimension first): boxes of `rows` x 64 elements, 128-byte swizzle, and every stride a
// multiple of 16 bytes, a dimension of size 1 getting the stride 8·(numel + 1) elements, which is
// never used (lib/tma.py says why).

struct MapParams {
  uint64_t dims[4];
  uint64_t strides[3];  // bytes, of dimensions 1..3 in the driver's order
  uint32_t box[4];
  uint32_t elem[4];
};

MapParams map_params(const Tensor& t, int64_t rows) {
  TORCH_CHECK(t.dim() == 4 && t.element_size() == 2 && t.stride(3) == 1,
              "a tensor map describes a [B, H, S, D] 16-bit tensor with unit last stride");
  TORCH_CHECK(rows >= 1 && rows <= 256, "box rows must be 1..256");
  const int64_t n = t.numel();
  int64_t st[4];
  for (int i = 0; i < 4; ++i) st[i] = t.size(i) > 1 ? t.stride(i) : 8 * (n + 1);
  st[3] = 1;
  MapParams p{};
  for (int i = 0; i < 4; ++i) p.dims[i] = static_cast<uint64_t>(t.size(3 - i));
  for (int i = 0; i < 3; ++i) p.strides[i] = static_cast<uint64_t>(st[2 - i]) * 2;
  p.box[0] = 64;
  p.box[1] = static_cast<uint32_t>(rows);
  p.box[2] = 1;
  p.box[3] = 1;
  for (int i = 0; i < 4; ++i) p.elem[i] = 1;
  return p;
}

// ---------------------------------------------------------------------------------------------
// The plan: everything about a backward of one input layout but the data pointers.

// What a launch argument is: a fixed scalar (its bits in `value`), a pointer the node fills on
// each call (`value` = a slot), or one of the plan's two tensor maps (`value` = 0: q, 1: dO).
enum ArgKind : int { kI32 = 0, kI64 = 1, kF32 = 2, kSlot = 3, kMap = 4 };
enum Slot : int { kQ = 0, kK, kV, kDout, kOut, kLse, kDelta, kLse2, kAcc, kDq, kDk, kDv, kNumSlots };
const char* const kSlotNames[kNumSlots] = {"q", "k", "v", "dout", "out", "lse", "delta", "lse2", "acc", "dq", "dk", "dv"};

struct Launch {
  std::string name;
  void* func = nullptr;  // cuda.core's Kernel.handle: a CUkernel (launched as a CUfunction, as cuda.core does)
  bool tried_function = false;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, smem = 0;
  // The argument bytes: one 8-byte word per argument (a 4-byte scalar in its low bytes: the driver
  // copies as many bytes as the kernel's parameter has), and the pointers cuLaunchKernel takes.
  std::vector<uint64_t> words;
  std::vector<void*> params;
  std::vector<std::pair<size_t, int>> slots;  // (argument, slot) filled per call
};

constexpr int kMaps = 6;

struct Plan {
  Plan() {
    // 128-byte CUtensorMaps, 64-byte aligned as the driver wants them: the backward's q and dO
    // (0, 1), the forward's q, k, v and output (2-5)
    maps_ = static_cast<uint8_t*>(std::aligned_alloc(64, 128 * kMaps));
    TORCH_CHECK(maps_ != nullptr, "out of memory");
    std::memset(maps_, 0, 128 * kMaps);
  }
  ~Plan() { std::free(maps_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // The current context of the calling thread (the primary context torch and cuda.core use),
  // bound again on whichever thread runs the backward (the engine's may have none bound).
  void capture_context() {
    const Driver& d = driver();
    d.require();
    void* ctx = nullptr;
    d.check(d.ctx_get(&ctx), "cuCtxGetCurrent");
    TORCH_CHECK(ctx != nullptr, "no CUDA context is current: load stage 8's kernels first");
    ctx_ = ctx;
  }

  void set_layout(std::vector<int64_t> q_shape, std::vector<int64_t> k_shape, int64_t work_floats, int64_t delta_at,
                  int64_t lse2_at, int64_t acc_at) {
    q_shape_ = std::move(q_shape);
    k_shape_ = std::move(k_shape);
    work_floats_ = work_floats;
    at_[0] = delta_at;
    at_[1] = lse2_at;
    at_[2] = acc_at;
  }

  void add_launch(const std::string& name, int64_t func, std::vector<int64_t> grid, std::vector<int64_t> block,
                  int64_t smem, const std::vector<std::pair<int64_t, int64_t>>& args) {
    TORCH_CHECK(grid.size() <= 3 && block.size() <= 3, "grid and block have at most 3 dimensions");
    auto l = std::make_unique<Launch>();
    l->name = name;
    l->func = reinterpret_cast<void*>(static_cast<intptr_t>(func));
    for (size_t i = 0; i < grid.size(); ++i) l->grid[i] = static_cast<unsigned>(grid[i]);
    for (size_t i = 0; i < block.size(); ++i) l->block[i] = static_cast<unsigned>(block[i]);
    l->smem = static_cast<unsigned>(smem);
    l->words.assign(args.size(), 0);
    l->params.assign(args.size(), nullptr);
    for (size_t i = 0; i < args.size(); ++i) {
      const auto kind = args[i].first;
      const auto value = args[i].second;
      switch (kind) {
        case kI32: {
          const int32_t x = static_cast<int32_t>(value);
          std::memcpy(&l->words[i], &x, 4);
          break;
        }
        case kI64:
          l->words[i] = static_cast<uint64_t>(value);
          break;
        case kF32: {  // the float's bits, as Python's numpy float32 view gives them
          const uint32_t x = static_cast<uint32_t>(value);
          std::memcpy(&l->words[i], &x, 4);
          break;
        }
        case kSlot:
          TORCH_CHECK(value >= 0 && value < kNumSlots, "unknown slot ", value);
          l->slots.emplace_back(i, static_cast<int>(value));
          break;
        case kMap:
          TORCH_CHECK(value >= 0 && value < kMaps, "map index must be 0-5 (the backward's q, dO; the forward's q, k, v, o)");
          break;
        default:
          TORCH_CHECK(false, "unknown argument kind ", kind);
      }
      l->params[i] = kind == kMap ? static_cast<void*>(maps_ + 128 * value) : static_cast<void*>(&l->words[i]);
    }
    (name == "forward" ? forward_ : launches_).push_back(std::move(l));
  }

  // The forward's launch (add_launch named "forward") runs on this stream alone: its work queue
  // (stage 6's DYNAMIC_WORK counter, made per stream) is the one in its arguments.
  void set_forward_stream(int64_t stream) { forward_stream_ = reinterpret_cast<void*>(static_cast<intptr_t>(stream)); }
  bool has_forward() const { return !forward_.empty(); }

  // Stage 6's forward of q, k, v into new out and lse tensors, by the plan's forward launch on the
  // current stream; false (nothing launched) on another stream than the plan's.
  bool run_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse) {
    const Driver& d = driver();
    d.require();
    TORCH_CHECK(ctx_ != nullptr && !forward_.empty(), "stage 8's C++ autograd node (stages/stage8_node.cpp): no forward in the plan");
    TORCH_CHECK(q.sizes() == at::IntArrayRef(q_shape_) && k.sizes() == at::IntArrayRef(k_shape_) &&
                    v.sizes() == at::IntArrayRef(k_shape_),
                "stage 8's C++ autograd node (stages/stage8_node.cpp): shapes differ from the plan's");
    c10::DeviceGuard device_guard(q.device());
    bind_context(d);
    void* stream = current_stream(q.device());
    if (stream != forward_stream_) return false;
    out = at::empty(q.sizes(), q.options());  // contiguous, as lib.inputs.new_output makes it
    lse = at::empty({q_shape_[0], q_shape_[1], q_shape_[2]}, q.options().dtype(at::kFloat));
    const uint64_t slots[kNumSlots] = {ptr(q), ptr(k), ptr(v), 0, ptr(out), ptr(lse), 0, 0, 0, 0, 0, 0};
    std::lock_guard<std::mutex> lock(mutex_);
    retarget(d, 2, slots[kQ]);
    retarget(d, 3, slots[kK]);
    retarget(d, 4, slots[kV]);
    retarget(d, 5, slots[kOut]);  // (a map only where stage 6 stores the output by TMA)
    for (auto& l : forward_) launch(d, *l, slots, stream);
    return true;
  }

  // A map encoded for `t` (its layout; its address until retargeted), as lib/tma.tensor_map does.
  void encode_map(int64_t index, const Tensor& t, int64_t rows) {
    TORCH_CHECK(index >= 0 && index < kMaps, "map index must be 0-5 (the backward's q, dO; the forward's q, k, v, o)");
    const Driver& d = driver();
    d.require();
    const MapParams p = map_params(t, rows);
    d.check(d.encode(maps_ + 128 * index, kUint16, 4, t.data_ptr(), p.dims, p.strides, p.box, p.elem, kInterleaveNone,
                     kSwizzle128B, kL2None, kOobNone),
            "cuTensorMapEncodeTiled");
    map_ptrs_[index] = reinterpret_cast<uint64_t>(t.data_ptr());
    has_map_[index] = true;
  }

  pybind11::bytes map_bytes(int64_t index) const {
    TORCH_CHECK(index >= 0 && index < kMaps, "map index must be 0-5");
    return pybind11::bytes(reinterpret_cast<const char*>(maps_ + 128 * index), 128);
  }

  std::vector<uint64_t> words(int64_t launch) const {
    TORCH_CHECK(launch >= 0 && launch < static_cast<int64_t>(launches_.size()), "no launch ", launch);
    return launches_[launch]->words;
  }

  // dq, dk, dv: the plan's launches on these tensors, on the current stream of q's device.
  std::tuple<Tensor, Tensor, Tensor> run(const Tensor& q, const Tensor& k, const Tensor& v, Tensor out, Tensor dout,
                                         const Tensor& lse) {
    const Driver& d = driver();
    d.require();
    TORCH_CHECK(ctx_ != nullptr && !launches_.empty(), "stage 8's C++ autograd node (stages/stage8_node.cpp): the plan is not complete");
    TORCH_CHECK(q.sizes() == at::IntArrayRef(q_shape_) && k.sizes() == at::IntArrayRef(k_shape_) &&
                    v.sizes() == at::IntArrayRef(k_shape_) && dout.sizes() == q.sizes() && out.sizes() == q.sizes(),
                "stage 8's C++ autograd node (stages/stage8_node.cpp): shapes differ from the plan's");
    TORCH_CHECK(dout.scalar_type() == q.scalar_type() && dout.device() == q.device(),
                "stage 8's C++ autograd node (stages/stage8_node.cpp): dout must have q's dtype and device");
    c10::DeviceGuard device_guard(q.device());
    bind_context(d);
    // The plan was made for a contiguous dO and output (stage 8 reads any aligned layout, but its
    // scalar arguments and map are per layout): anything else is copied, as stage 8 copies an
    // unaligned one. Autograd's dO is mostly contiguous (randn_like of a contiguous output).
    if (!dout.is_contiguous()) dout = dout.contiguous();
    if (reinterpret_cast<uintptr_t>(dout.data_ptr()) % 16) dout = dout.clone(at::MemoryFormat::Contiguous);
    if (!out.is_contiguous()) out = out.contiguous();
    const auto opts = q.options();
    Tensor work = at::empty({work_floats_}, opts.dtype(at::kFloat));
    Tensor dq = at::empty(q_shape_, opts);
    Tensor dk = at::empty(k_shape_, opts);
    Tensor dv = at::empty(k_shape_, opts);
    const uint64_t base = reinterpret_cast<uint64_t>(work.data_ptr());
    const uint64_t slots[kNumSlots] = {ptr(q),          ptr(k),          ptr(v),          ptr(dout),
                                       ptr(out),        ptr(lse),        base + 4 * at_[0], base + 4 * at_[1],
                                       base + 4 * at_[2], ptr(dq),       ptr(dk),         ptr(dv)};
    void* stream = current_stream(q.device());
    std::lock_guard<std::mutex> lock(mutex_);  // the argument words and maps are the plan's
    // A launch copies the maps' bytes, so they may be pointed elsewhere right after; a training
    // loop's allocator mostly hands q and dO the same addresses every step: then nothing to do.
    retarget(d, 0, slots[kQ]);
    retarget(d, 1, slots[kDout]);
    for (auto& l : launches_) launch(d, *l, slots, stream);
    return {dq, dk, dv};
  }

  // The raw cudaStream_t of the calling thread's current stream on `device`: on the engine's
  // thread, the stream the forward ran on (the engine sets it from the node's input metadata,
  // recorded by set_history). Through c10's device-guard interface, which every build of torch
  // declares (a CPU build too) and the CUDA build implements (CUDAGuardImpl: getCurrentCUDAStream,
  // then CUDAStream::stream()). Stream::id() is not the handle for torch's pooled streams.
  static void* current_stream(c10::Device device) {
#ifdef NODE_C10_CUDA_STREAM
    return reinterpret_cast<void*>(c10::cuda::getCurrentCUDAStream(device.index()).stream());
#else
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device.type());
    return impl->getStreamNativeHandle(impl->getStream(device));
#endif
  }

 private:
  static uint64_t ptr(const Tensor& t) { return reinterpret_cast<uint64_t>(t.data_ptr()); }

  void bind_context(const Driver& d) const {
    void* cur = nullptr;
    d.check(d.ctx_get(&cur), "cuCtxGetCurrent");
    if (cur != ctx_) d.check(d.ctx_set(ctx_), "cuCtxSetCurrent");
  }

  void retarget(const Driver& d, int i, uint64_t address) {
    if (!has_map_[i] || map_ptrs_[i] == address) return;
    d.check(d.replace(maps_ + 128 * i, reinterpret_cast<void*>(address)), "cuTensorMapReplaceAddress");
    map_ptrs_[i] = address;
  }

  void launch(const Driver& d, Launch& l, const uint64_t* slots, void* stream) {
    for (const auto& s : l.slots) l.words[s.first] = slots[s.second];
    CUresult r = d.launch(l.func, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem, stream,
                          l.params.data(), nullptr);
    if (r == kInvalidHandle && !l.tried_function && d.kernel_function != nullptr) {
      // a driver that takes no CUkernel here: its CUfunction in this context, once
      l.tried_function = true;
      void* f = nullptr;
      if (d.kernel_function(&f, l.func) == 0 && f != nullptr) {
        l.func = f;
        r = d.launch(l.func, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem, stream,
                     l.params.data(), nullptr);
      }
    }
    d.check(r, ("cuLaunchKernel (" + l.name + ")").c_str());
  }

  void* ctx_ = nullptr;
  std::vector<int64_t> q_shape_, k_shape_;
  int64_t work_floats_ = 0;
  int64_t at_[3] = {0, 0, 0};  // float offsets of delta, lse·log2 e and dQ's float32 sum in the workspace
  std::vector<std::unique_ptr<Launch>> launches_, forward_;
  void* forward_stream_ = nullptr;
  uint8_t* maps_ = nullptr;
  uint64_t map_ptrs_[kMaps] = {};
  bool has_map_[kMaps] = {};
  std::mutex mutex_;
};

// ---------------------------------------------------------------------------------------------
// The autograd node.

using torch::autograd::Node;
using NodePtr = decltype(std::declval<torch::autograd::Edge>().function);  // shared_ptr or intrusive_ptr

template <typename P>
struct IsShared : std::false_type {};
template <typename T>
struct IsShared<std::shared_ptr<T>> : std::true_type {};

// torch <= 2.11 deletes nodes through torch::autograd::deleteNode (no deep recursion when a
// long chain of nodes dies), found here by argument-dependent lookup: 2.13 has none, and this is
// instantiated only where nodes are shared_ptrs.
template <typename T>
struct NodeDeleter {
  void operator()(T* n) const { deleteNode(n); }
};

template <typename T, typename... A>
NodePtr make_node(A&&... a) {
  if constexpr (IsShared<NodePtr>::value) {
    return std::shared_ptr<T>(new T(std::forward<A>(a)...), NodeDeleter<T>{});
  } else {
    return c10::make_intrusive<T>(std::forward<A>(a)...);
  }
}

template <typename N>
NodePtr self_ptr(N* n) {
  if constexpr (IsShared<NodePtr>::value) {
    return n->shared_from_this();
  } else {
    return n->getptr();
  }
}

struct AttentionBackward final : Node {
  AttentionBackward(std::shared_ptr<Plan> plan, torch::autograd::edge_list&& edges)
      : Node(std::move(edges)), plan_(std::move(plan)) {}

  std::string name() const override { return "StagesAttentionBackward"; }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(grads.size() == 1, "one output, one gradient");
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    Tensor q, k, v, out, lse;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      q = q_.unpack();
      k = k_.unpack();
      v = v_.unpack();
      out = out_.unpack(self_ptr(this));
      lse = lse_.unpack();
    }
    variable_list g(3);
    {
      at::AutoGradMode no_graph(false);  // the kernels' outputs: plain tensors, as once_differentiable makes them
      std::tie(g[0], g[1], g[2]) = plan_->run(q, k, v, out, grads[0], lse);
    }
    // The engine runs a backward with grad mode on only for create_graph=True. Then, as the
    // Python Function's once_differentiable does when dO requires grad, the gradients get a
    // grad_fn whose own backward raises: differentiating them again is an error, never a
    // silently missing term.
    if (at::GradMode::is_enabled() && grads[0].requires_grad()) {
      NodePtr error = make_node<torch::autograd::Error>(
          std::string("stage 8's backward is differentiable once (as @once_differentiable): no double backward "
                      "through stages.autograd.attention's gradients (create_graph=True)"),
          torch::autograd::edge_list{});
      for (auto& t : g) torch::autograd::set_history(t, error);
    }
    return g;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    q_.reset_data();
    k_.reset_data();
    v_.reset_data();
    out_.reset_data();
    lse_.reset_data();
  }

  SavedVariable q_, k_, v_, out_, lse_;
  std::shared_ptr<Plan> plan_;
};

// out.grad_fn becomes a new node whose backward is the plan's, with edges to q, k and v.
void attach(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
            std::shared_ptr<Plan> plan) {
  TORCH_CHECK(plan != nullptr, "no plan");
  NodePtr node = make_node<AttentionBackward>(std::move(plan), torch::autograd::collect_next_edges(q, k, v));
  torch::autograd::set_history(out, node);  // out's grad_fn: the node, its input 0
  auto* n = static_cast<AttentionBackward*>(node.get());
  n->q_ = SavedVariable(q, /*is_output=*/false);
  n->k_ = SavedVariable(k, false);
  n->v_ = SavedVariable(v, false);
  n->lse_ = SavedVariable(lse, false);
  n->out_ = SavedVariable(out, /*is_output=*/true);  // after set_history: saved without its grad_fn (no cycle)
}

// Stage 6's forward by the plan, its output's grad_fn the node: the output, or None where the plan
// has no forward or the current stream is not the plan's (the caller then runs stage 6's Python path).
std::optional<Tensor> forward(std::shared_ptr<Plan> plan, const Tensor& q, const Tensor& k, const Tensor& v) {
  TORCH_CHECK(plan != nullptr, "no plan");
  if (!plan->has_forward()) return std::nullopt;
  Tensor out, lse;
  {
    at::AutoGradMode no_graph(false);  // the kernel's outputs, before the node is attached
    if (!plan->run_forward(q, k, v, out, lse)) return std::nullopt;
  }
  attach(out, q, k, v, lse, std::move(plan));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "stage 8's backward as a C++ autograd node (stages/autograd_node.py builds and uses it)";
  pybind11::class_<Plan, std::shared_ptr<Plan>>(m, "Plan")
      .def(pybind11::init<>())
      .def("capture_context", &Plan::capture_context)
      .def("set_layout", &Plan::set_layout)
      .def("add_launch", &Plan::add_launch)
      .def("encode_map", &Plan::encode_map)
      .def("map_bytes", &Plan::map_bytes)
      .def("words", &Plan::words)
      .def("run", &Plan::run)
      .def("set_forward_stream", &Plan::set_forward_stream)
      .def("has_forward", &Plan::has_forward);
  m.def("attach", &attach);
  m.def("forward", &forward);
  m.def("map_params", [](const Tensor& t, int64_t rows) {
    const MapParams p = map_params(t, rows);
    return std::make_tuple(std::vector<uint64_t>(p.dims, p.dims + 4), std::vector<uint64_t>(p.strides, p.strides + 3),
                           std::vector<uint32_t>(p.box, p.box + 4), std::vector<uint32_t>(p.elem, p.elem + 4));
  });
  m.def("current_stream", [](int64_t index) {
    return reinterpret_cast<intptr_t>(Plan::current_stream(c10::Device(c10::DeviceType::CUDA, index)));
  });
  m.def("driver_problem", []() { return driver().problem; });
  m.def("node_pointer", []() { return std::string(IsShared<NodePtr>::value ? "std::shared_ptr" : "c10::intrusive_ptr"); });
  pybind11::dict kinds;
  kinds["i32"] = static_cast<int>(kI32);
  kinds["i64"] = static_cast<int>(kI64);
  kinds["f32"] = static_cast<int>(kF32);
  kinds["slot"] = static_cast<int>(kSlot);
  kinds["map"] = static_cast<int>(kMap);
  m.attr("KINDS") = kinds;
  pybind11::dict slots;
  for (int i = 0; i < kNumSlots; ++i) slots[kSlotNames[i]] = i;
  m.attr("SLOTS") = slots;
}
