// cuBLAS and cuBLASLt, opened when the CUDA backend first calls them rather
// than at program start. Loading libcublasLt.so maps and relocates ~200 MB
// (0.1 s of page faults in every process, measured with a program that links
// it and does nothing), which every adgt process paid on the CPU backend too;
// the binaries therefore do not link cuBLAS, and each call site names its
// function through ADGT_CUBLAS, which resolves it once (dlsym) from
// libcublasLt.so.<major> (names starting cublasLt) or libcublas.so.<major>:
//
//   ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasCreate)(&h), op);
//
// The declarations, and so the signatures the calls are checked against,
// are cuBLAS's own headers. The libraries are found as the dynamic linker
// would (LD_LIBRARY_PATH, the binary's runpath, the system's), then in the
// CUDA toolkit's library directory of the build; failing both, the first
// call throws, naming the library and the fix.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>

namespace adgt::cuda {

// The address of cuBLAS function `name` (after cuBLAS's own macros: e.g.
// cublasCreate_v2), loading its library on first use. Thread-safe; throws
// std::runtime_error when the library or the symbol is missing.
void* cublas_symbol(const char* name);

}  // namespace adgt::cuda

#define ADGT_CUBLAS_NAME2(f) #f
#define ADGT_CUBLAS_NAME(f) ADGT_CUBLAS_NAME2(f)  // expands cublasCreate to cublasCreate_v2 first
// The function f of cuBLAS(Lt), with its declared type, resolved once per call site.
#define ADGT_CUBLAS(f)                                                                    \
  ([] {                                                                                   \
    static const auto adgt_fn_ =                                                          \
        reinterpret_cast<decltype(&f)>(::adgt::cuda::cublas_symbol(ADGT_CUBLAS_NAME(f))); \
    return adgt_fn_;                                                                      \
  }())
