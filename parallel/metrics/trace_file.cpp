#include "parallel/metrics/trace_file.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/trace.hpp"
#include "kernels/check.hpp"

namespace adgt {

namespace {
// A string as I32 words (the transports move tensors of I32/F32/F64): the
// byte count first, then the bytes, zero-padded to a whole word.
std::vector<int32_t> to_words(const std::string& s) {
  std::vector<int32_t> w(1 + (s.size() + 3) / 4, 0);
  w[0] = int32_t(s.size());
  std::memcpy(w.data() + 1, s.data(), s.size());
  return w;
}
}  // namespace

void write_trace_file(Comm& world, int world_rank, const Layout& lay, const RankCoords& coords,
                      const std::string& path, const std::string& about) {
  trace::Recorder& rec = trace::recorder();
  rec.stop();
  const std::string mine =
      trace::chrome_events(world_rank, trace::rank_name(world_rank, lay, coords), world_rank, rec.take(),
                           {{trace::kMainTrack, "step"}, {trace::kCommTrack, "collectives"}});
  // Rank r's part to rank 0: its length in words, then the words.
  const int n = world.size(), me = world.rank();
  std::vector<std::string> parts;
  if (me == 0) {
    parts.push_back(mine);
    for (int r = 1; r < n; ++r) {
      int32_t len[1] = {0};
      world.recv(Tensor(len, DType::I32, {1}), r, 7301);
      std::vector<int32_t> w(size_t(std::max(len[0], 1)), 0);
      world.recv(Tensor(w.data(), DType::I32, {int64_t(w.size())}), r, 7302);
      parts.emplace_back(reinterpret_cast<const char*>(w.data() + 1), size_t(w[0]));
    }
  } else {
    std::vector<int32_t> w = to_words(mine);
    int32_t len[1] = {int32_t(w.size())};
    world.send(Tensor(len, DType::I32, {1}), 0, 7301);
    world.send(Tensor(w.data(), DType::I32, {int64_t(w.size())}), 0, 7302);
  }
  if (me != 0) return;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp";
  const std::string text = trace::chrome_trace(parts, about);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  ADGT_CHECK(f, "log.trace: cannot write " << tmp);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ADGT_CHECK(std::fclose(f) == 0 && ok, "log.trace: writing " << tmp << " failed");
  std::filesystem::rename(tmp, path);
}

}  // namespace adgt
