// `nvidia-smi topo -m` (gpu_topology.hpp).
#include "parallel/cluster/gpu_topology.hpp"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <vector>

namespace adgt::plan {

GpuTopology parse_nvidia_topology(const std::string& text) {
  // Rows "GPU<i> <n entries> ..." where the header names the GPU columns.
  std::istringstream in(text);
  std::string line;
  int columns = 0;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> f;
    for (std::string w; ls >> w;) f.push_back(w);
    if (f.empty()) continue;
    if (columns == 0 && f[0].rfind("GPU", 0) == 0 && f.size() > 1 && f[1].rfind("GPU", 0) == 0) {
      for (const auto& w : f)
        if (w.rfind("GPU", 0) == 0 && w.size() > 3 && std::isdigit(static_cast<unsigned char>(w[3])))
          ++columns;
      continue;
    }
    if (columns > 0 && f[0].rfind("GPU", 0) == 0 && int(f.size()) > columns) rows.push_back(f);
  }
  GpuTopology t;
  const int n = std::min<int>(columns, int(rows.size()));
  t.gpus = n;
  if (n == 0) return t;
  std::vector<int> parent(size_t(n), 0);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int a) {
    while (parent[size_t(a)] != a) a = parent[size_t(a)] = parent[size_t(parent[size_t(a)])];
    return a;
  };
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j && rows[size_t(i)][size_t(j + 1)].rfind("NV", 0) == 0)
        parent[size_t(find(i))] = find(j);
  std::vector<int> size(size_t(n), 0);
  for (int i = 0; i < n; ++i) ++size[size_t(find(i))];
  t.nvlink_domain = n;
  for (int i = 0; i < n; ++i)
    if (size[size_t(i)] > 0) t.nvlink_domain = std::min(t.nvlink_domain, size[size_t(i)]);
  return t;
}

std::string read_nvidia_topology() {
  std::string out;
  if (FILE* f = popen("nvidia-smi topo -m 2>/dev/null", "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    pclose(f);
  }
  return out;
}

}  // namespace adgt::plan
