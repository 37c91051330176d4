#include "core/checkpoint/hdf5_util.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace adgt::h5 {
namespace {

struct StackEntry {
  std::string func, desc, major, minor;
};

herr_t collect(unsigned /*n*/, const H5E_error2_t* e, void* out) {
  auto* v = static_cast<std::vector<StackEntry>*>(out);
  StackEntry s;
  s.func = e->func_name ? e->func_name : "";
  s.desc = e->desc ? e->desc : "";
  char buf[256];
  if (H5Eget_msg(e->maj_num, nullptr, buf, sizeof buf) > 0) s.major = buf;
  if (H5Eget_msg(e->min_num, nullptr, buf, sizeof buf) > 0) s.minor = buf;
  v->push_back(std::move(s));
  return 0;
}

}  // namespace

std::string process_label() {
  const char* rank = nullptr;
  for (const char* k : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if ((rank = std::getenv(k))) break;
  char host[256] = "?";
  if (gethostname(host, sizeof host) != 0) host[0] = '?', host[1] = 0;
  host[sizeof host - 1] = 0;
  return std::string("rank ") + (rank ? rank : "?") + " on host " + host;
}

void fail(const char* call, const char* file, int line) {
  // Walk from the API call down to where the error was first detected; the
  // innermost entries say what actually went wrong ("truncated file: eof = ...").
  std::vector<StackEntry> stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &stack);
  H5Eclear2(H5E_DEFAULT);
  std::ostringstream os;
  os << "HDF5 call `" << call << "` failed (" << process_label() << ", " << file << ":" << line
     << ")";
  if (!stack.empty()) {
    os << ": ";
    const size_t shown = std::min<size_t>(stack.size(), 3);
    for (size_t i = 0; i < shown; ++i) {
      const StackEntry& s = stack[stack.size() - 1 - i];
      if (i) os << " <- ";
      os << s.func << ": " << s.desc;
      if (!s.minor.empty()) os << " [" << s.major << ": " << s.minor << "]";
    }
  }
  throw Error(os.str());
}

QuietErrors::QuietErrors() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

QuietErrors::~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

}  // namespace adgt::h5
