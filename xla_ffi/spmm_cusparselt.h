// Host-side interface of the cuSPARSELt backend (implemented in spmm_cusparselt.cu).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace jax_sparse24 {

// Loads libcusparseLt once (`hint`: a directory holding libcusparseLt.so.0, or a file; may be
// empty). Returns true and the path loaded, or false and why (every path tried).
bool CusparseltLoad(const std::string& hint, std::string* message);

// Bytes of the compressed A of the plan (device, m, n, k, dtype 0 = bf16 / 1 = fp16, a_layout,
// b_layout); creates the plan (and the device's handle) if needed. False + *error on failure.
bool CusparseltCompressedSize(int device, int64_t m, int64_t n, int64_t k, int dtype, int a_layout, int b_layout,
                              int64_t* size, std::string* error);

// The cached plans: (device, m, n, k, dtype, a_layout, b_layout, searched, algorithm config id).
std::vector<std::tuple<int, int64_t, int64_t, int64_t, int, int, int, bool, int>> CusparseltPlans();

// cusparseLtGetVersion of the loaded library (0 before the first handle).
int CusparseltVersion();

}  // namespace jax_sparse24
