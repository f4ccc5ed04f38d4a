// cuSPARSELt 2:4 sparse GEMM (the second backend, backend="cusparselt") as XLA FFI handlers.
//
// Formulation (every array row-major, as the CUTLASS handlers): d (N, M) = A (M x K, 2:4 along K) * B
//   a_layout 0: A stored (M, K)  (e.g. W~ (I, O) for dx: M = I, K = O)
//   a_layout 1: A stored (K, M)  (e.g. W~ (I, O) for y: M = O, K = I; MVUE(dy) (T, O) for dW: M = O, K = T)
//   b_layout 0: B stored (N, K)  (x for y, dy for dx: K-major, read in place)
//   b_layout 1: B stored (K, N)  (x (T, I) for dW: N-major, read in place)
// In cuSPARSELt's column-major terms: D (M x N, ld M); A (K x M, ld K) with opA = T for layout 0 or
// (M x K, ld M) with opA = N for layout 1; B (K x N, ld K) with opB = N for layout 0 or (N x K, ld N)
// with opB = T for layout 1. bf16/fp16 in and out, fp32 accumulation (CUSPARSE_COMPUTE_32F).
//
// Handlers (NOT command-buffer compatible: the first call of a shape creates its plan and runs
// cusparseLtMatmulSearch, which synchronises; XLA never captures these calls in a command buffer):
//   Sparse24CusparseltCompress: a (dense, 2:4 along K) -> compressed (opaque uint8 bytes)
//   Sparse24CusparseltSpmm:     compressed, b -> d (N, M)
// State: one cuSPARSELt handle per device; one plan per (device, m, n, k, dtype, a_layout, b_layout),
// created once under a mutex (at trace time through CusparseltCompressedSize, or on first use) and
// kept for the life of the process; the algorithm is chosen once by cusparseLtMatmulSearch on the
// plan's first matmul and kept in the plan. Workspaces come from the XLA FFI scratch allocator.
//
// The library is loaded with dlopen on first use (libcusparseLt.so.0 from the nvidia-cusparselt-cu13
// wheel: the path Python passes through CusparseltLoad — it searches both wheel layouts, 0.8.x
// nvidia/cusparselt/lib and 0.10.x nvidia/cu13/lib, see cuda_cusparselt_ops.library_candidates —
// then $JAX_SPARSE24_CUSPARSELT_LIB, SP24_CUSPARSELT_LIBDIR if defined at build time, then the default
// search path), so the extension builds and loads without it; requesting the backend without the
// library gives an error naming what is missing. The declarations below are the ABI subset of
// cusparseLt.h (0.6 - 0.8; not yet run against 0.10) this file uses: opaque 512-byte structs, C
// enums passed as int, the library's exported C functions.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <library_types.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ffi_common.h"
#include "spmm_cusparselt.h"

namespace jax_sparse24 {
namespace lt {
namespace {

// ---- ABI subset of cusparseLt.h ----------------------------------------------------------------
struct alignas(16) Opaque {
  uint8_t data[512];
};
using Handle = Opaque;       // cusparseLtHandle_t
using MatDescr = Opaque;     // cusparseLtMatDescriptor_t
using MatmulDescr = Opaque;  // cusparseLtMatmulDescriptor_t
using AlgSel = Opaque;       // cusparseLtMatmulAlgSelection_t
using Plan = Opaque;         // cusparseLtMatmulPlan_t
using Status = int;          // cusparseStatus_t

constexpr Status kSuccess = 0;      // CUSPARSE_STATUS_SUCCESS
constexpr int kOpN = 0;             // CUSPARSE_OPERATION_NON_TRANSPOSE
constexpr int kOpT = 1;             // CUSPARSE_OPERATION_TRANSPOSE
constexpr int kOrderCol = 1;        // CUSPARSE_ORDER_COL
constexpr int kSparsity50 = 0;      // CUSPARSELT_SPARSITY_50_PERCENT
constexpr int kCompute32F = 2;      // CUSPARSE_COMPUTE_32F
constexpr int kAlgDefault = 0;      // CUSPARSELT_MATMUL_ALG_DEFAULT
constexpr int kAttrAlgConfigId = 0; // CUSPARSELT_MATMUL_ALG_CONFIG_ID
// dtype codes: 0 bfloat16, 1 float16 (in = out)
constexpr uint32_t kAlignment = 16; // bytes

struct Api {
  Status (*Init)(Handle*);
  Status (*GetVersion)(const Handle*, int*);
  const char* (*GetErrorName)(Status);
  const char* (*GetErrorString)(Status);
  Status (*DenseDescriptorInit)(const Handle*, MatDescr*, int64_t, int64_t, int64_t, uint32_t, cudaDataType, int);
  Status (*StructuredDescriptorInit)(const Handle*, MatDescr*, int64_t, int64_t, int64_t, uint32_t, cudaDataType,
                                     int, int);
  Status (*MatmulDescriptorInit)(const Handle*, MatmulDescr*, int, int, const MatDescr*, const MatDescr*,
                                 const MatDescr*, const MatDescr*, int);
  Status (*MatmulAlgSelectionInit)(const Handle*, AlgSel*, const MatmulDescr*, int);
  Status (*MatmulAlgGetAttribute)(const Handle*, const AlgSel*, int, void*, size_t);
  Status (*MatmulGetWorkspace)(const Handle*, const Plan*, size_t*);
  Status (*MatmulPlanInit)(const Handle*, Plan*, const MatmulDescr*, const AlgSel*);
  Status (*Matmul)(const Handle*, const Plan*, const void*, const void*, const void*, const void*, const void*, void*,
                   void*, cudaStream_t*, int32_t);
  Status (*MatmulSearch)(const Handle*, Plan*, const void*, const void*, const void*, const void*, const void*, void*,
                         void*, cudaStream_t*, int32_t);
  Status (*SpMMACompressedSize)(const Handle*, const Plan*, size_t*, size_t*);
  Status (*SpMMACompress)(const Handle*, const Plan*, const void*, void*, void*, cudaStream_t);
};

std::mutex g_mu;  // guards everything below
void* g_lib = nullptr;
Api g_api{};
std::string g_load_error;
std::string g_loaded_from;
int g_version = 0;

template <class F>
bool Sym(void* lib, const char* name, F* out, std::string* missing) {
  void* p = dlsym(lib, name);
  if (p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

bool TryOpen(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    g_load_error += "\n  " + path + ": " + (e ? e : "dlopen failed");
    return false;
  }
  Api api{};
  std::string missing;
  bool ok = true;
  ok &= Sym(lib, "cusparseLtInit", &api.Init, &missing);
  ok &= Sym(lib, "cusparseLtGetVersion", &api.GetVersion, &missing);
  ok &= Sym(lib, "cusparseLtGetErrorName", &api.GetErrorName, &missing);
  ok &= Sym(lib, "cusparseLtGetErrorString", &api.GetErrorString, &missing);
  ok &= Sym(lib, "cusparseLtDenseDescriptorInit", &api.DenseDescriptorInit, &missing);
  ok &= Sym(lib, "cusparseLtStructuredDescriptorInit", &api.StructuredDescriptorInit, &missing);
  ok &= Sym(lib, "cusparseLtMatmulDescriptorInit", &api.MatmulDescriptorInit, &missing);
  ok &= Sym(lib, "cusparseLtMatmulAlgSelectionInit", &api.MatmulAlgSelectionInit, &missing);
  ok &= Sym(lib, "cusparseLtMatmulAlgGetAttribute", &api.MatmulAlgGetAttribute, &missing);
  ok &= Sym(lib, "cusparseLtMatmulGetWorkspace", &api.MatmulGetWorkspace, &missing);
  ok &= Sym(lib, "cusparseLtMatmulPlanInit", &api.MatmulPlanInit, &missing);
  ok &= Sym(lib, "cusparseLtMatmul", &api.Matmul, &missing);
  ok &= Sym(lib, "cusparseLtMatmulSearch", &api.MatmulSearch, &missing);
  ok &= Sym(lib, "cusparseLtSpMMACompressedSize", &api.SpMMACompressedSize, &missing);
  ok &= Sym(lib, "cusparseLtSpMMACompress", &api.SpMMACompress, &missing);
  if (!ok) {
    g_load_error += "\n  " + path + ": missing symbols " + missing + " (cuSPARSELt >= 0.6 needed)";
    dlclose(lib);
    return false;
  }
  g_lib = lib;
  g_api = api;
  g_loaded_from = path;
  return true;
}

// Loads the library once (g_mu held). `hint`: a directory or file from Python (may be empty).
bool LoadLocked(const std::string& hint) {
  if (g_lib != nullptr) return true;
  std::vector<std::string> candidates;
  auto add_dir_or_file = [&](const std::string& p) {
    if (p.empty()) return;
    if (p.size() > 3 && (p.find(".so") != std::string::npos)) {
      candidates.push_back(p);
    } else {
      candidates.push_back(p + "/libcusparseLt.so.0");
    }
  };
  add_dir_or_file(hint);
  if (const char* env = std::getenv("JAX_SPARSE24_CUSPARSELT_LIB")) add_dir_or_file(env);
#ifdef SP24_CUSPARSELT_LIBDIR
  add_dir_or_file(SP24_CUSPARSELT_LIBDIR);
#endif
  candidates.push_back("libcusparseLt.so.0");
  candidates.push_back("libcusparseLt.so");
  g_load_error.clear();
  for (const std::string& c : candidates) {
    if (TryOpen(c)) return true;
  }
  return false;
}

std::string LoadErrorMessage() {
  return "the cuSPARSELt library (libcusparseLt.so.0) could not be loaded; install the nvidia-cusparselt-cu13 "
         "wheel or set JAX_SPARSE24_CUSPARSELT_LIB to its path. Tried:" + g_load_error;
}

std::string StatusText(Status s) {
  std::string out = std::to_string(s);
  if (g_api.GetErrorName != nullptr) {
    const char* n = g_api.GetErrorName(s);
    const char* d = g_api.GetErrorString != nullptr ? g_api.GetErrorString(s) : nullptr;
    out = std::string(n ? n : "?") + " (" + (d ? d : "") + ")";
  }
  return out;
}

#define SP24_LT_CHECK(call, name)                                                                   \
  do {                                                                                              \
    const Status sp24_st_ = (call);                                                                 \
    if (sp24_st_ != kSuccess) return Internal(std::string(name) + " failed: " + StatusText(sp24_st_)); \
  } while (0)

// ---- per-device handles and plans ---------------------------------------------------------------
struct DeviceGuard {
  int prev = -1;
  bool changed = false;
  ffi::Error Set(int device) {
    SP24_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) {
      SP24_CUDA_CHECK(cudaSetDevice(device));
      changed = true;
    }
    return ffi::Error::Success();
  }
  ~DeviceGuard() {
    if (changed) cudaSetDevice(prev);
  }
};

struct PlanKey {
  int device;
  int64_t m, n, k;
  int dtype, a_layout, b_layout;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, m, n, k, dtype, a_layout, b_layout) <
           std::tie(o.device, o.m, o.n, o.k, o.dtype, o.a_layout, o.b_layout);
  }
};

struct PlanEntry {
  MatDescr a, b, c;
  MatmulDescr matmul;
  AlgSel alg;
  Plan plan;
  size_t workspace = 0;
  size_t compressed_size = 0, compress_buffer = 0;
  bool searched = false;
  int alg_id = -1;
  std::mutex mu;  // serialises the one-time search
};

std::map<int, std::unique_ptr<Handle>> g_handles;
std::map<PlanKey, std::unique_ptr<PlanEntry>> g_plans;

// g_mu held; the device is current.
ffi::Error HandleLocked(int device, const Handle** out) {
  auto it = g_handles.find(device);
  if (it == g_handles.end()) {
    auto h = std::make_unique<Handle>();
    SP24_LT_CHECK(g_api.Init(h.get()), "cusparseLtInit");
    if (g_version == 0) {
      int v = 0;
      if (g_api.GetVersion(h.get(), &v) == kSuccess) g_version = v;
    }
    it = g_handles.emplace(device, std::move(h)).first;
  }
  *out = it->second.get();
  return ffi::Error::Success();
}

ffi::Error CheckShape(int64_t m, int64_t n, int64_t k, int dtype, int a_layout, int b_layout) {
  if (dtype != 0 && dtype != 1) {
    return InvalidArgument("cusparselt: dtype must be bfloat16 or float16");
  }
  if (a_layout != 0 && a_layout != 1) return InvalidArgument("cusparselt: a_layout must be 0 ((M, K)) or 1 ((K, M))");
  if (b_layout != 0 && b_layout != 1) return InvalidArgument("cusparselt: b_layout must be 0 ((N, K)) or 1 ((K, N))");
  if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || k % 16) {
    return InvalidArgument("cusparselt: m, n, k must be positive multiples of 16, got m=" + std::to_string(m) +
                           " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  return ffi::Error::Success();
}

// The plan of `key` (created on first use). Loads the library. The caller must have made
// key.device current.
ffi::Error GetPlan(const PlanKey& key, const Handle** handle, PlanEntry** entry) {
  SP24_RETURN_IF_ERROR(CheckShape(key.m, key.n, key.k, key.dtype, key.a_layout, key.b_layout));
  std::lock_guard<std::mutex> lock(g_mu);
  if (!LoadLocked("")) return Internal(LoadErrorMessage());
  SP24_RETURN_IF_ERROR(HandleLocked(key.device, handle));
  auto it = g_plans.find(key);
  if (it != g_plans.end()) {
    *entry = it->second.get();
    return ffi::Error::Success();
  }
  auto e = std::make_unique<PlanEntry>();
  const Handle* h = *handle;
  const cudaDataType type = key.dtype == 0 ? CUDA_R_16BF : CUDA_R_16F;
  const int64_t m = key.m, n = key.n, k = key.k;
  // A: layout 0 = (M, K) row-major = col-major K x M (ld K), opA = T; layout 1 = (K, M) row-major =
  // col-major M x K (ld M), opA = N.
  const int op_a = key.a_layout == 0 ? kOpT : kOpN;
  const int64_t a_rows = key.a_layout == 0 ? k : m, a_cols = key.a_layout == 0 ? m : k;
  SP24_LT_CHECK(g_api.StructuredDescriptorInit(h, &e->a, a_rows, a_cols, a_rows, kAlignment, type, kOrderCol,
                                               kSparsity50),
                "cusparseLtStructuredDescriptorInit (A)");
  // B: layout 0 = (N, K) row-major = col-major K x N (ld K), opB = N; layout 1 = (K, N) row-major =
  // col-major N x K (ld N), opB = T.
  const int op_b = key.b_layout == 0 ? kOpN : kOpT;
  const int64_t b_rows = key.b_layout == 0 ? k : n, b_cols = key.b_layout == 0 ? n : k;
  SP24_LT_CHECK(g_api.DenseDescriptorInit(h, &e->b, b_rows, b_cols, b_rows, kAlignment, type, kOrderCol),
                "cusparseLtDenseDescriptorInit (B)");
  // C = D: (N, M) row-major = col-major M x N (ld M).
  SP24_LT_CHECK(g_api.DenseDescriptorInit(h, &e->c, m, n, m, kAlignment, type, kOrderCol),
                "cusparseLtDenseDescriptorInit (C/D)");
  SP24_LT_CHECK(g_api.MatmulDescriptorInit(h, &e->matmul, op_a, op_b, &e->a, &e->b, &e->c, &e->c, kCompute32F),
                "cusparseLtMatmulDescriptorInit");
  SP24_LT_CHECK(g_api.MatmulAlgSelectionInit(h, &e->alg, &e->matmul, kAlgDefault), "cusparseLtMatmulAlgSelectionInit");
  SP24_LT_CHECK(g_api.MatmulPlanInit(h, &e->plan, &e->matmul, &e->alg), "cusparseLtMatmulPlanInit");
  SP24_LT_CHECK(g_api.MatmulGetWorkspace(h, &e->plan, &e->workspace), "cusparseLtMatmulGetWorkspace");
  SP24_LT_CHECK(g_api.SpMMACompressedSize(h, &e->plan, &e->compressed_size, &e->compress_buffer),
                "cusparseLtSpMMACompressedSize");
  *entry = e.get();
  g_plans.emplace(key, std::move(e));
  return ffi::Error::Success();
}

int DtypeCode(ffi::DataType t) {
  if (t == ffi::DataType::BF16) return 0;
  if (t == ffi::DataType::F16) return 1;
  return -1;
}


ffi::Error Scratch(ffi::ScratchAllocator& scratch, size_t bytes, void** out, const char* what) {
  *out = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  // XLA's FFI scratch allocator rejects alignments above 16 bytes ("Unsupported alignment"); its
  // blocks are 256-byte aligned in practice, and cuSPARSELt needs 16.
  std::optional<void*> p = scratch.Allocate(bytes, 16);
  if (!p.has_value() || *p == nullptr) {
    return Internal("could not allocate " + std::to_string(bytes) + " bytes of " + what +
                    " from the XLA scratch allocator");
  }
  *out = *p;
  return ffi::Error::Success();
}

ffi::Error CompressImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device, ffi::AnyBuffer a,
                        ffi::Result<ffi::AnyBuffer> out, int64_t m, int64_t n, int64_t k, int64_t a_layout,
                        int64_t b_layout) {
  const int dtype = DtypeCode(a.element_type());
  if (dtype < 0) return InvalidArgument(std::string("cusparselt_compress: a must be bfloat16 or float16, got ") +
                                        DataTypeName(a.element_type()));
  const bool a_mk = a_layout == 0;
  if (!Is2D(a.dimensions(), a_mk ? m : k, a_mk ? k : m)) {
    return InvalidArgument("cusparselt_compress: a must have shape " +
                           std::string(a_mk ? "(m, k)" : "(k, m)") + " for m=" + std::to_string(m) +
                           " k=" + std::to_string(k) + ", got " + DimsString(a.dimensions()));
  }
  if (out->element_type() != ffi::DataType::U8 || out->dimensions().size() != 1) {
    return InvalidArgument("cusparselt_compress: the output must be a 1-D uint8 array");
  }
  DeviceGuard guard;
  SP24_RETURN_IF_ERROR(guard.Set(device));
  const Handle* h = nullptr;
  PlanEntry* e = nullptr;
  SP24_RETURN_IF_ERROR(GetPlan(PlanKey{device, m, n, k, dtype, int(a_layout), int(b_layout)}, &h, &e));
  if (static_cast<size_t>(out->dimensions()[0]) != e->compressed_size) {
    return InvalidArgument("cusparselt_compress: the output must have cuSPARSELt's compressed size " +
                           std::to_string(e->compressed_size) + " bytes, got " + DimsString(out->dimensions()));
  }
  void* buffer = nullptr;
  SP24_RETURN_IF_ERROR(Scratch(scratch, e->compress_buffer, &buffer, "cuSPARSELt compression buffer"));
  SP24_LT_CHECK(g_api.SpMMACompress(h, &e->plan, a.untyped_data(), out->untyped_data(), buffer, stream),
                "cusparseLtSpMMACompress");
  SP24_CHECK_LAUNCH("cusparseLtSpMMACompress");
  return ffi::Error::Success();
}

// The GEMM of a plan on checked operands. alpha: a host float.
ffi::Error RunPlan(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device, const PlanKey& key,
                   ffi::AnyBuffer compressed, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer>& d, const void* alpha) {
  DeviceGuard guard;
  SP24_RETURN_IF_ERROR(guard.Set(device));
  const Handle* h = nullptr;
  PlanEntry* e = nullptr;
  SP24_RETURN_IF_ERROR(GetPlan(key, &h, &e));
  if (compressed.element_type() != ffi::DataType::U8 || compressed.dimensions().size() != 1 ||
      static_cast<size_t>(compressed.dimensions()[0]) != e->compressed_size) {
    return InvalidArgument("cusparselt_spmm: compressed must be a uint8 array of cuSPARSELt's compressed size " +
                           std::to_string(e->compressed_size) + ", got " + DataTypeName(compressed.element_type()) +
                           " " + DimsString(compressed.dimensions()));
  }
  const float beta = 0.0f;
  cudaStream_t streams[1] = {stream};
  {
    // The algorithm is chosen once per plan, by cusparseLtMatmulSearch on its first matmul (it runs
    // and times the candidates on these buffers; the matmul below then overwrites d).
    std::lock_guard<std::mutex> lock(e->mu);
    if (!e->searched) {
      void* ws = nullptr;
      const size_t search_ws = std::max<size_t>(e->workspace, size_t(32) << 20);
      SP24_RETURN_IF_ERROR(Scratch(scratch, search_ws, &ws, "cuSPARSELt search workspace"));
      SP24_LT_CHECK(g_api.MatmulSearch(h, &e->plan, alpha, compressed.untyped_data(), b.untyped_data(), &beta,
                                       d->untyped_data(), d->untyped_data(), ws, streams, 1),
                    "cusparseLtMatmulSearch");
      int id = -1;
      if (g_api.MatmulAlgGetAttribute(h, &e->alg, kAttrAlgConfigId, &id, sizeof(id)) == kSuccess) e->alg_id = id;
      SP24_LT_CHECK(g_api.MatmulGetWorkspace(h, &e->plan, &e->workspace), "cusparseLtMatmulGetWorkspace");
      e->searched = true;
    }
  }
  void* ws = nullptr;
  SP24_RETURN_IF_ERROR(Scratch(scratch, e->workspace, &ws, "cuSPARSELt workspace"));
  SP24_LT_CHECK(g_api.Matmul(h, &e->plan, alpha, compressed.untyped_data(), b.untyped_data(), &beta,
                             d->untyped_data(), d->untyped_data(), ws, streams, 1),
                "cusparseLtMatmul");
  SP24_CHECK_LAUNCH("cusparseLtMatmul");
  return ffi::Error::Success();
}

ffi::Error CheckB(const char* op, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer>& d, int64_t m, int64_t n, int64_t k,
                  int64_t b_layout) {
  const bool b_nk = b_layout == 0;
  if (!Is2D(b.dimensions(), b_nk ? n : k, b_nk ? k : n)) {
    return InvalidArgument(std::string(op) + ": b must have shape " + std::string(b_nk ? "(n, k)" : "(k, n)") +
                           " for n=" + std::to_string(n) + " k=" + std::to_string(k) + ", got " +
                           DimsString(b.dimensions()));
  }
  if (!Is2D(d->dimensions(), n, m)) {
    return InvalidArgument(std::string(op) + ": d must have shape (n, m), got " + DimsString(d->dimensions()));
  }
  return ffi::Error::Success();
}

ffi::Error SpmmImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device, ffi::AnyBuffer compressed,
                    ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> d, int64_t m, int64_t n, int64_t k, int64_t a_layout,
                    int64_t b_layout) {
  const int dtype = DtypeCode(b.element_type());
  if (dtype < 0 || d->element_type() != b.element_type()) {
    return InvalidArgument(std::string("cusparselt_spmm: b and d must both be bfloat16 or both float16, got ") +
                           DataTypeName(b.element_type()) + " and " + DataTypeName(d->element_type()));
  }
  SP24_RETURN_IF_ERROR(CheckB("cusparselt_spmm", b, d, m, n, k, b_layout));
  const float alpha = 1.0f;
  return RunPlan(stream, scratch, device, PlanKey{device, m, n, k, dtype, int(a_layout), int(b_layout)}, compressed,
                 b, d, &alpha);
}

}  // namespace
}  // namespace lt

// ---- host interface (spmm_cusparselt.h) ----------------------------------------------------------

bool CusparseltLoad(const std::string& hint, std::string* message) {
  std::lock_guard<std::mutex> lock(lt::g_mu);
  if (lt::LoadLocked(hint)) {
    *message = lt::g_loaded_from;
    return true;
  }
  *message = lt::LoadErrorMessage();
  return false;
}

bool CusparseltCompressedSize(int device, int64_t m, int64_t n, int64_t k, int dtype, int a_layout, int b_layout,
                              int64_t* size, std::string* error) {
  lt::DeviceGuard guard;
  ffi::Error st = guard.Set(device);
  const lt::Handle* h = nullptr;
  lt::PlanEntry* e = nullptr;
  if (st.success()) st = lt::GetPlan(lt::PlanKey{device, m, n, k, dtype, a_layout, b_layout}, &h, &e);
  if (st.failure()) {
    *error = st.message();
    return false;
  }
  *size = static_cast<int64_t>(e->compressed_size);
  return true;
}

std::vector<std::tuple<int, int64_t, int64_t, int64_t, int, int, int, bool, int>> CusparseltPlans() {
  std::lock_guard<std::mutex> lock(lt::g_mu);
  std::vector<std::tuple<int, int64_t, int64_t, int64_t, int, int, int, bool, int>> out;
  for (const auto& [key, e] : lt::g_plans) {
    std::lock_guard<std::mutex> elock(e->mu);
    out.emplace_back(key.device, key.m, key.n, key.k, key.dtype, key.a_layout, key.b_layout, e->searched, e->alg_id);
  }
  return out;
}

int CusparseltVersion() {
  std::lock_guard<std::mutex> lock(lt::g_mu);
  return lt::g_version;
}

}  // namespace jax_sparse24

// a (dense 2:4 operand; (m, k) for a_layout 0, (k, m) for 1) -> compressed (uint8, cuSPARSELt's size).
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24CusparseltCompress, jax_sparse24::lt::CompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::ScratchAllocator>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // a
                                  .Ret<::xla::ffi::AnyBuffer>()  // compressed
                                  .Attr<int64_t>("m")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("a_layout")
                                  .Attr<int64_t>("b_layout"));

// compressed A, b ((n, k) for b_layout 0, (k, n) for 1) -> d (n, m).
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24CusparseltSpmm, jax_sparse24::lt::SpmmImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::ScratchAllocator>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // compressed
                                  .Arg<::xla::ffi::AnyBuffer>()  // b
                                  .Ret<::xla::ffi::AnyBuffer>()  // d
                                  .Attr<int64_t>("m")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("a_layout")
                                  .Attr<int64_t>("b_layout"));
