// Fused fake-quant CPU kernels for trtqat (built as the Python module ``trtqat._C``).
//
// Exactly the arithmetic of the pure-PyTorch reference (trtqat/quant/_fused.py), in float32:
//
//   scale = max(amax / qmax, FLT_MIN)
//   y     = clamp(round_half_even(x / scale), qmin, qmax) * scale
//   mask  = qmin <= round_half_even(x / scale) <= qmax
//
// * forward: ONE pass that writes y and reduces "was any element clipped" (no mask tensor).
// * grad_input: ONE pass that recomputes the mask from x and writes grad * mask.
//
// Rounding: since qmin/qmax are integers and rounding is monotone,
// clamp(round(v), a, b) == round(clamp(v, a, b)). After clamping to [qmin - 1, qmax + 1]
// (|v| <= 2^16 + 1 < 2^22) the magic-number trick (v + 1.5*2^23) - 1.5*2^23 rounds half to
// even in the default rounding mode and vectorises; NaN stays NaN through the ternary clamps.
// The division is kept (x * (1/scale) would differ in the last bit and move ties).
//
// * apply: the quantizer's hot path in one call - the forward above and, when x requires a
//   gradient, a C++ autograd node (no Python autograd.Function): its backward is the identity
//   when nothing was clipped, else grad_input. Saves nothing, or x and amax. The node is a
//   plain torch::autograd::Node, as torch's generated ops build theirs.
//
// Accepted inputs (anything else returns None and the caller uses the PyTorch path):
// plain float32 or bfloat16 CPU tensors (bfloat16, as autocast hands activations over, is
// computed in float32 and rounded to bfloat16 once, as the reference's .to(x.dtype) does); x
// contiguous (or, per tensor, any dense layout); amax float32 CPU with one element (per
// tensor) or keep-dim broadcastable to x with a single non-1 dim equal to x's size there (per
// channel along one axis); grad of x's dtype and layout.

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

// Runtime dispatch to the widest vector ISA the CPU has (GCC ifunc), no -march needed.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(TRTQAT_NO_CLONES)
#define TRTQAT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TRTQAT_CLONES
#endif

namespace {

constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
constexpr int64_t kGrain = 1 << 16;    // elements per parallel task (smaller: one thread)

// ----------------------------------------------------------------- element loops
// x/s clamped a step beyond [lo, hi] (so the float->int rounding by kMagic is exact) and
// rounded half to even: a value in [lo - 1, hi + 1], outside [lo, hi] where x was clipped
// (NaN stays NaN).
inline float rounded(float x, float s, float lo, float hi) {
  const float v = x / s;
  float w = v < lo - 1.0f ? lo - 1.0f : v;
  w = w > hi + 1.0f ? hi + 1.0f : w;
  return (w + kMagic) - kMagic;
}

// One element: rounded, clipped to [lo, hi] and scaled back; ``clipped`` records an element
// outside [lo, hi] (or NaN).
inline float fq_one(float x, float s, float lo, float hi, int& clipped) {
  const float r = rounded(x, s, lo, hi);
  clipped |= !((r >= lo) & (r <= hi));
  float q = r < lo ? lo : r;
  q = q > hi ? hi : q;
  return q * s;
}

// Storage types: float32 as float, bfloat16 as its bits (uint16_t). Loads widen to float;
// bfloat16 stores round to nearest even as torch's float -> bfloat16 conversion does (any
// NaN becomes a quiet NaN).
#define TRTQAT_INLINE inline __attribute__((always_inline))

#if defined(__has_builtin)
#if __has_builtin(__builtin_bit_cast)
#define TRTQAT_BIT_CAST 1  // vectorises where memcpy may not
#endif
#endif

template <typename To, typename From>
TRTQAT_INLINE To bit_cast(From v) {
#ifdef TRTQAT_BIT_CAST
  return __builtin_bit_cast(To, v);
#else
  To out;
  std::memcpy(&out, &v, sizeof out);
  return out;
#endif
}

TRTQAT_INLINE float load(float v) { return v; }
TRTQAT_INLINE float load(uint16_t b) { return bit_cast<float>(static_cast<uint32_t>(b) << 16); }
TRTQAT_INLINE void store(float* d, float v) { *d = v; }
TRTQAT_INLINE void store(uint16_t* d, float v) {
  const uint32_t u = bit_cast<uint32_t>(v);
  const uint32_t r = (u + ((u >> 16) & 1u) + 0x7FFFu) >> 16;
  *d = v != v ? static_cast<uint16_t>(0x7FC0) : static_cast<uint16_t>(r);
}

// grad * keep (keep 0 or 1) in grad's storage type: for bfloat16 without a round trip through
// float, grad itself or a zero of its sign (NaN where grad is NaN or infinite, as inf * 0 is)
TRTQAT_INLINE float grad_keep(float g, float keep) { return g * keep; }
TRTQAT_INLINE uint16_t grad_keep(uint16_t g, float keep) {
  const bool special = (g & 0x7FFFu) >= 0x7F80u;
  const uint16_t zero = special ? static_cast<uint16_t>(0x7FC0) : static_cast<uint16_t>(g & 0x8000u);
  return keep != 0.0f ? g : zero;
}

// The loops below: one scale for the whole run (scalar) or one per element (vector: the
// channel is the innermost dimension, s[i] goes with x[i]). The forward returns nonzero if
// any element was clipped (or NaN).
template <typename T>
TRTQAT_INLINE int fwd_scalar(const T* __restrict x, T* __restrict y, int64_t n, float s, float lo,
                             float hi) {
  int clipped = 0;
  for (int64_t i = 0; i < n; ++i) store(y + i, fq_one(load(x[i]), s, lo, hi, clipped));
  return clipped;
}

template <typename T>
TRTQAT_INLINE int fwd_vector(const T* __restrict x, T* __restrict y, int64_t n,
                             const float* __restrict s, float lo, float hi) {
  int clipped = 0;
  for (int64_t i = 0; i < n; ++i) store(y + i, fq_one(load(x[i]), s[i], lo, hi, clipped));
  return clipped;
}

// 1 where round(x / s) lies in [lo, hi] (x kept its gradient), else 0
TRTQAT_INLINE float keep_one(float x, float s, float lo, float hi) {
  const float r = rounded(x, s, lo, hi);
  return ((r >= lo) & (r <= hi)) ? 1.0f : 0.0f;
}

template <typename T>
TRTQAT_INLINE void bwd_scalar(const T* __restrict g, const T* __restrict x, T* __restrict out,
                              int64_t n, float s, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) out[i] = grad_keep(g[i], keep_one(load(x[i]), s, lo, hi));
}

template <typename T>
TRTQAT_INLINE void bwd_vector(const T* __restrict g, const T* __restrict x, T* __restrict out,
                              int64_t n, const float* __restrict s, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) out[i] = grad_keep(g[i], keep_one(load(x[i]), s[i], lo, hi));
}

// Each loop compiled once per vector ISA (the clones), for each storage type (overloads).
#define TRTQAT_LOOPS(T)                                                                            \
  TRTQAT_CLONES int fq_fwd_scalar(const T* x, T* y, int64_t n, float s, float lo, float hi) {      \
    return fwd_scalar(x, y, n, s, lo, hi);                                                         \
  }                                                                                                \
  TRTQAT_CLONES int fq_fwd_vector(const T* x, T* y, int64_t n, const float* s, float lo,           \
                                  float hi) {                                                      \
    return fwd_vector(x, y, n, s, lo, hi);                                                         \
  }                                                                                                \
  TRTQAT_CLONES void fq_bwd_scalar(const T* g, const T* x, T* out, int64_t n, float s, float lo,   \
                                   float hi) {                                                     \
    bwd_scalar(g, x, out, n, s, lo, hi);                                                           \
  }                                                                                                \
  TRTQAT_CLONES void fq_bwd_vector(const T* g, const T* x, T* out, int64_t n, const float* s,      \
                                   float lo, float hi) {                                           \
    bwd_vector(g, x, out, n, s, lo, hi);                                                           \
  }                                                                                                \
  TRTQAT_CLONES int any_negative(const T* x, int64_t n) {                                          \
    int neg = 0;                                                                                   \
    for (int64_t i = 0; i < n; ++i) neg |= load(x[i]) < 0.0f;                                      \
    return neg;                                                                                    \
  }

TRTQAT_LOOPS(float)
TRTQAT_LOOPS(uint16_t)
#undef TRTQAT_LOOPS

// ----------------------------------------------------------------- layout
struct Layout {
  bool ok = false;
  int64_t outer = 1, channels = 1, inner = 1;  // x viewed as (outer, channels, inner)
};

// A plain dense CPU tensor of dtype `dtype` with memory behind it: no tensor subclass
// (FakeTensor, DTensor, ...), functorch wrapper, lazy conj/neg bit or other dispatch layer.
bool is_cpu_plain(const at::Tensor& t, at::ScalarType dtype) {
  static const c10::DispatchKeySet kExotic({c10::DispatchKey::Python,
                                            c10::DispatchKey::PythonTLSSnapshot,
                                            c10::DispatchKey::Functionalize,
                                            c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper,
                                            c10::DispatchKey::Conjugate,
                                            c10::DispatchKey::Negative,
                                            c10::DispatchKey::ZeroTensor});
  return t.defined() && t.device().is_cpu() && t.scalar_type() == dtype &&
         t.layout() == at::kStrided && !t.key_set().has_any(kExotic) && t.has_storage() &&
         (t.numel() == 0 || t.const_data_ptr() != nullptr);
}

bool is_cpu_f32(const at::Tensor& t) { return is_cpu_plain(t, at::kFloat); }

// x's dtype is one the loops store: float32 or bfloat16
bool is_cpu_input(const at::Tensor& t) {
  return is_cpu_f32(t) || is_cpu_plain(t, at::kBFloat16);
}

// How x and amax line up; ok=false when the kernel does not handle the combination.
Layout layout_of(const at::Tensor& x, const at::Tensor& amax) {
  Layout L;
  if (!is_cpu_input(x) || !is_cpu_f32(amax)) return L;
  const int64_t xd = x.dim(), ad = amax.dim();
  if (ad > xd) return L;  // broadcasting would grow the result
  if (amax.numel() == 1) {
    // per tensor: any dense layout is processed as its flat storage
    if (!x.is_contiguous() && !x.is_non_overlapping_and_dense()) return L;
    L.inner = x.numel();
    L.ok = true;
    return L;
  }
  if (!x.is_contiguous() || !amax.is_contiguous()) return L;
  int64_t axis = -1;
  for (int64_t d = 0; d < ad; ++d) {
    const int64_t size = amax.size(d);
    if (size == 1) continue;
    if (axis >= 0) return L;  // more than one channel axis
    axis = d + (xd - ad);
    if (size != x.size(axis)) return L;
  }
  if (axis < 0) return L;
  for (int64_t d = 0; d < axis; ++d) L.outer *= x.size(d);
  L.channels = x.size(axis);
  for (int64_t d = axis + 1; d < xd; ++d) L.inner *= x.size(d);
  L.ok = true;
  return L;
}

// scale = max(amax / qmax, FLT_MIN) as torch computes it (true division in float32,
// NaN propagates through the clamp)
std::vector<float> scales_of(const at::Tensor& amax, int64_t qmax) {
  const float* a = amax.data_ptr<float>();
  const int64_t n = amax.numel();
  std::vector<float> s(static_cast<size_t>(n));
  const float q = static_cast<float>(qmax);
  for (int64_t i = 0; i < n; ++i) {
    const float v = a[i] / q;
    s[static_cast<size_t>(i)] = v < FLT_MIN ? FLT_MIN : v;
  }
  return s;
}

bool bounds_ok(int64_t qmin, int64_t qmax) {
  // the magic-number rounding needs |qmin - 1|, |qmax + 1| well below 2^22
  return qmax > 0 && qmin <= qmax && qmin > -(1 << 20) && qmax < (1 << 20);
}

// Visits x's elements [begin, end) as runs sharing a scale (inner > 1) or as runs over the
// channel dimension (inner == 1).
template <typename ScalarFn, typename VectorFn>
void for_each_run(const Layout& L, const float* scales, int64_t begin, int64_t end,
                  ScalarFn&& scalar_fn, VectorFn&& vector_fn) {
  if (L.channels == 1) {
    scalar_fn(begin, end - begin, scales[0]);
    return;
  }
  if (L.inner == 1) {
    int64_t i = begin;
    while (i < end) {
      const int64_t c = i % L.channels;
      const int64_t n = std::min(end - i, L.channels - c);
      vector_fn(i, n, scales + c);
      i += n;
    }
    return;
  }
  int64_t i = begin;
  while (i < end) {
    const int64_t row = i / L.inner;
    const int64_t n = std::min(end, (row + 1) * L.inner) - i;
    scalar_fn(i, n, scales[row % L.channels]);
    i += n;
  }
}

// ----------------------------------------------------------------- output pool
// The outputs of a training step (fake-quantized weights and activations, masked gradients)
// have the same sizes every step. Allocated afresh, glibc hands the large ones back to the
// OS when the step frees them (heap trimming) and page-faults them in again next step, which
// costs more than the kernels themselves. The pool keeps the storages it handed out and
// reuses one only once nothing else references it (no tensor, view, Python object or weak
// reference): the caller cannot tell a reused buffer from a new one.
class OutputPool {
 public:
  static OutputPool& get() {
    static OutputPool* pool = new OutputPool();  // leaked on purpose: no exit-order issues
    return *pool;
  }

  // A CPU tensor with x's sizes, strides and dtype (x dense, non-overlapping), allocated
  // without a trip through the dispatcher (which costs more than a small kernel's loop).
  static at::Tensor fresh_like(const at::Tensor& x) {
    return at::detail::empty_strided_cpu(x.sizes(), x.strides(), x.scalar_type());
  }

  at::Tensor empty_like(const at::Tensor& x) {
    const int64_t nbytes = x.numel() * static_cast<int64_t>(x.element_size());
    if (nbytes < kMinBytes || cap_bytes_ <= 0) return fresh_like(x);
    c10::intrusive_ptr<c10::StorageImpl> found;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& list = free_[nbytes];
      for (auto it = list.begin(); it != list.end();) {
        auto& impl = *it;
        if (impl.use_count() == 1 && impl.weak_use_count() == 1) {
          if (static_cast<int64_t>(impl->nbytes()) == nbytes && impl->data() != nullptr) {
            found = impl;
            break;
          }
          held_bytes_ -= nbytes;  // resized by someone (e.g. storage().resize_(0)): drop it
          it = list.erase(it);
          continue;
        }
        ++it;
      }
      if (!found && held_bytes_ + nbytes <= cap_bytes_) {
        at::Tensor fresh = fresh_like(x);
        list.push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
            fresh.storage().unsafeGetStorageImpl()));
        held_bytes_ += nbytes;
        return fresh;
      }
    }
    if (!found) return fresh_like(x);
    at::Tensor out = at::empty({0}, x.options());
    out.set_(c10::Storage(std::move(found)), 0, x.sizes(), x.strides());
    return out;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    free_.clear();
    held_bytes_ = 0;
  }

  py::dict stats() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t buffers = 0, in_use = 0;
    for (auto& kv : free_) {
      for (auto& impl : kv.second) {
        ++buffers;
        if (impl.use_count() > 1) ++in_use;
      }
    }
    py::dict d;
    d["held_bytes"] = held_bytes_;
    d["cap_bytes"] = cap_bytes_;
    d["buffers"] = buffers;
    d["in_use"] = in_use;
    return d;
  }

  void set_cap(int64_t cap_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    cap_bytes_ = cap_bytes;
    if (cap_bytes_ <= 0) {
      free_.clear();
      held_bytes_ = 0;
    }
  }

 private:
  OutputPool() {
    const char* env = std::getenv("TRTQAT_POOL_MB");
    if (env != nullptr && *env != '\0') cap_bytes_ = std::atoll(env) * (int64_t{1} << 20);
  }

  static constexpr int64_t kMinBytes = int64_t{1} << 16;  // small ones: malloc does fine
  std::mutex mu_;
  std::unordered_map<int64_t, std::vector<c10::intrusive_ptr<c10::StorageImpl>>> free_;
  int64_t held_bytes_ = 0;
  int64_t cap_bytes_ = int64_t{2} << 30;  // 2 GiB unless TRTQAT_POOL_MB says otherwise
};

// ----------------------------------------------------------------- ops
// The elements of t as storage type T (float, or bfloat16's bits)
template <typename T>
const T* elements(const at::Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}
template <typename T>
T* elements_mut(at::Tensor& t) {
  return static_cast<T*>(t.mutable_data_ptr());
}

// Calls f with a value of x's storage type (float32 or bfloat16; layout_of admitted it).
template <typename F>
decltype(auto) with_type(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kBFloat16) return f(uint16_t{});
  return f(float{});
}

// y = fake_quant(x) into a (pooled) new tensor of x's dtype; returns whether any element
// was clipped.
bool forward_into(const at::Tensor& x, const at::Tensor& amax, const Layout& L, int64_t qmin,
                  int64_t qmax, at::Tensor& y) {
  y = OutputPool::get().empty_like(x);
  const int64_t n = x.numel();
  const std::vector<float> scales = scales_of(amax, qmax);
  const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
  std::atomic<int> any{0};
  with_type(x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = elements<T>(x);
    T* yp = elements_mut<T>(y);
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      int c = 0;
      for_each_run(
          L, scales.data(), begin, end,
          [&](int64_t i, int64_t len, float s) {
            c |= fq_fwd_scalar(xp + i, yp + i, len, s, lo, hi);
          },
          [&](int64_t i, int64_t len, const float* s) {
            c |= fq_fwd_vector(xp + i, yp + i, len, s, lo, hi);
          });
      if (c) any.store(1, std::memory_order_relaxed);
    });
  });
  return any.load() != 0;
}

// grad where x was not clipped, 0 elsewhere (grad: x's dtype, sizes and strides)
at::Tensor grad_into(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& amax,
                     const Layout& L, int64_t qmin, int64_t qmax) {
  at::Tensor out = OutputPool::get().empty_like(x);
  const int64_t n = x.numel();
  const std::vector<float> scales = scales_of(amax, qmax);
  const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
  with_type(x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = elements<T>(x);
    const T* gp = elements<T>(grad);
    T* op = elements_mut<T>(out);
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      for_each_run(
          L, scales.data(), begin, end,
          [&](int64_t i, int64_t len, float s) {
            fq_bwd_scalar(gp + i, xp + i, op + i, len, s, lo, hi);
          },
          [&](int64_t i, int64_t len, const float* s) {
            fq_bwd_vector(gp + i, xp + i, op + i, len, s, lo, hi);
          });
    });
  });
  return out;
}

// grad has x's dtype, sizes and strides (what grad_into reads it as)
bool grad_fits(const at::Tensor& grad, const at::Tensor& x) {
  return is_cpu_plain(grad, x.scalar_type()) && grad.sizes() == x.sizes() &&
         grad.strides() == x.strides();
}

py::object forward(const at::Tensor& x, const at::Tensor& amax, int64_t qmin, int64_t qmax) {
  if (!bounds_ok(qmin, qmax)) return py::none();
  const Layout L = layout_of(x, amax);
  if (!L.ok) return py::none();
  at::Tensor y;
  bool clipped = false;
  {
    py::gil_scoped_release no_gil;
    clipped = forward_into(x, amax, L, qmin, qmax, y);
  }
  return py::make_tuple(y, clipped);
}

py::object grad_input(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& amax,
                      int64_t qmin, int64_t qmax) {
  if (!bounds_ok(qmin, qmax)) return py::none();
  const Layout L = layout_of(x, amax);
  if (!L.ok || !grad_fits(grad, x)) return py::none();
  at::Tensor out;
  {
    py::gil_scoped_release no_gil;
    out = grad_into(grad, x, amax, L, qmin, qmax);
  }
  return py::cast(out);
}

// Straight-through fake quantization's backward as a plain autograd node, as torch's own
// generated ops build theirs (no torch::autograd::Function: its CppNode keeps a saved-data
// map and wraps every output, a per-call cost a small tensor's step pays twice).
// Identity when nothing was clipped (then nothing is saved), else grad_input from x and amax.
struct FakeQuantBackward : public torch::autograd::Node {
  torch::autograd::SavedVariable x_, amax_;
  int64_t qmin_ = 0, qmax_ = 0;
  bool clipped_ = false;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor grad = std::move(grads[0]);
    if (!grad.defined() || !clipped_) return {grad};
    const at::Tensor x = x_.unpack(getptr());
    const at::Tensor amax = amax_.unpack(getptr());
    const Layout L = layout_of(x, amax);
    if (!grad_fits(grad, x)) {
      // e.g. the expanded ones of y.sum().backward(): same values in x's layout
      at::Tensor dense = at::empty_like(x);
      dense.copy_(grad);
      grad = dense;
    }
    return {grad_into(grad, x, amax, L, qmin_, qmax_)};
  }

  std::string name() const override { return "FakeQuantBackward"; }

  void release_variables() override {
    x_.reset_data();
    amax_.reset_data();
  }
};

// A new autograd node of type N, held as the Node pointer type of this torch (a
// std::shared_ptr before torch 2.14, a c10::intrusive_ptr since).
template <typename N>
auto make_node() {
  using Ptr = decltype(std::declval<torch::autograd::Node&>().getptr());
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<N>();
  } else {
    return c10::make_intrusive<N>();
  }
}

// y = fake_quant(x) recorded for autograd with a FakeQuantBackward node (x requires grad).
at::Tensor forward_with_grad(const at::Tensor& x, const at::Tensor& amax, const Layout& L,
                             int64_t qmin, int64_t qmax) {
  auto node = make_node<FakeQuantBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  at::Tensor y;
  node->clipped_ = forward_into(x, amax, L, qmin, qmax, y);
  node->qmin_ = qmin;
  node->qmax_ = qmax;
  if (node->clipped_) {
    node->x_ = torch::autograd::SavedVariable(x, false);
    node->amax_ = torch::autograd::SavedVariable(amax, false);
  }
  torch::autograd::set_history(y, node);
  return y;
}

// The quantizer's hot path: fake_quant(x) with autograd, or None when the kernel does not
// take these inputs (not a plain float32 CPU tensor, amax that does not fit, bounds it cannot
// round, torch.jit.trace running) or, with check_negative, when x holds a negative value: the
// caller's general path then computes the result or raises its error.
py::object apply(const py::handle& obj, const at::Tensor& amax_in, int64_t qmin, int64_t qmax,
                 bool check_negative) {
  // torch.jit.trace would not see this call (and would bake its output in as a constant)
  if (!THPVariable_Check(obj.ptr()) || !bounds_ok(qmin, qmax) || torch::jit::tracer::isTracing())
    return py::none();
  const at::Tensor& x = THPVariable_Unpack(obj.ptr());
  const Layout L = layout_of(x, amax_in);
  // a forward-mode AD tangent: the node has no formula for it (the Python path says so)
  if (!L.ok || x._fw_grad(/*level=*/0).defined()) return py::none();
  at::Tensor y;
  {
    // the GIL is released for large tensors only: for small ones it costs more than the loop
    std::optional<py::gil_scoped_release> no_gil;
    if (x.numel() >= kGrain) no_gil.emplace();
    const bool negative = check_negative && with_type(x, [&](auto tag) {
      return any_negative(elements<decltype(tag)>(x), x.numel()) != 0;
    });
    if (!negative) {
      const at::Tensor amax = amax_in.requires_grad() ? amax_in.detach() : amax_in;
      if (at::GradMode::is_enabled() && x.requires_grad()) {
        y = forward_with_grad(x, amax, L, qmin, qmax);
      } else {
        forward_into(x, amax, L, qmin, qmax, y);
      }
    }
  }
  if (!y.defined()) return py::none();
  return py::cast(y);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {  // _C from setup.py, another name when built on first use
  m.doc() = "trtqat fused fake-quant CPU kernels (float32; None when the inputs do not qualify)";
  m.def("fake_quant_forward", &forward, py::arg("x"), py::arg("amax"), py::arg("qmin"),
        py::arg("qmax"),
        "(y, clipped) for float32 CPU x and per-tensor / single-axis amax, else None");
  m.def("fake_quant_grad_input", &grad_input, py::arg("grad"), py::arg("x"), py::arg("amax"),
        py::arg("qmin"), py::arg("qmax"),
        "grad where x was not clipped, 0 elsewhere; None when the inputs do not qualify");
  m.def("fake_quant_apply", &apply, py::arg("x"), py::arg("amax"), py::arg("qmin"),
        py::arg("qmax"), py::arg("check_negative"),
        "fake_quant(x) with a C++ autograd node when x requires grad; None when the inputs do "
        "not qualify (or, with check_negative, x holds a negative value)");
  m.def("empty_cache", [] { OutputPool::get().clear(); },
        "release the output buffers the kernels keep for reuse");
  m.def("pool_stats", [] { return OutputPool::get().stats(); },
        "{held_bytes, cap_bytes, buffers, in_use} of the output pool");
  m.def("set_pool_limit", [](int64_t cap_bytes) { OutputPool::get().set_cap(cap_bytes); },
        py::arg("cap_bytes"), "most bytes the output pool keeps (<= 0 disables it)");
  m.def("parallel_threads", [](int64_t tasks) {
          // how many of torch's intra-op threads a loop of the kernels' kind runs on (1 when
          // the extension was built without OpenMP: at::parallel_for is then serial)
          std::atomic<int> highest{0};
          py::gil_scoped_release no_gil;
          at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
            int tid = at::get_thread_num(), seen = highest.load();
            while (tid > seen && !highest.compare_exchange_weak(seen, tid)) {}
          });
          return highest.load() + 1;
        }, py::arg("tasks"), "threads a parallel loop of `tasks` tasks runs on");
}
