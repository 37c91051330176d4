// Opening cuBLAS at its first use (cublas_lib.hpp).
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

namespace adgt::cuda {

namespace {

struct Lib {
  const char* soname;
  void* handle = nullptr;
  std::string error;  // why it did not open (empty while not tried or opened)
  std::once_flag once;
};

// The CUDA major version and the toolkit's library directory of the build
// (kernels/CMakeLists.txt).
#define ADGT_SONAME(base) base ".so." ADGT_CUDA_MAJOR
Lib g_lt{ADGT_SONAME("libcublasLt")}, g_blas{ADGT_SONAME("libcublas")};

void open(Lib& lib) {
  std::call_once(lib.once, [&] {
    lib.handle = dlopen(lib.soname, RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) return;
    lib.error = dlerror();
    const std::string path = std::string(ADGT_CUDA_LIB_DIR) + "/" + lib.soname;
    lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib.handle) lib.error += "; " + std::string(dlerror());
  });
}

}  // namespace

void* cublas_symbol(const char* name) {
  Lib& lib = std::strncmp(name, "cublasLt", 8) == 0 ? g_lt : g_blas;
  open(lib);
  if (!lib.handle)
    throw std::runtime_error(std::string("cuda backend: cannot open ") + lib.soname + " (" +
                             lib.error + "): put the directory holding the CUDA toolkit's " +
                             lib.soname + " on LD_LIBRARY_PATH");
  void* f = dlsym(lib.handle, name);
  if (!f)
    throw std::runtime_error(std::string("cuda backend: ") + lib.soname + " has no " + name +
                             " (a cuBLAS older than the CUDA " ADGT_CUDA_MAJOR
                             " toolkit of the build?)");
  return f;
}

}  // namespace adgt::cuda
