#include "parallel/switch/reshard.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace adgt {

namespace {
using nlohmann::json;

json spec_json(const ParamSpec& p) {
  return {{"name", p.name},           {"shape", p.shape},
          {"global_shape", p.global_shape}, {"shard_dim", p.shard_dim},
          {"shard_start", p.shard_start}, {"shard_valid", p.shard_valid},
          {"numel", p.numel},         {"offset", p.offset},
          {"is_matrix", p.is_matrix}, {"is_embedding", p.is_embedding},
          {"expert", p.expert},       {"is_router", p.is_router}};
}

ParamSpec spec_from(const json& j) {
  ParamSpec p;
  p.name = j.at("name");
  p.shape = j.at("shape").get<std::vector<int64_t>>();
  p.global_shape = j.at("global_shape").get<std::vector<int64_t>>();
  p.shard_dim = j.at("shard_dim");
  p.shard_start = j.at("shard_start");
  p.shard_valid = j.at("shard_valid");
  p.numel = j.at("numel");
  p.offset = j.at("offset");
  p.is_matrix = j.at("is_matrix");
  p.is_embedding = j.at("is_embedding");
  p.expert = j.at("expert");
  p.is_router = j.at("is_router");
  return p;
}

std::vector<float>& group_buffer(RankState& s, int g) {
  return g == 0 ? s.params : g == 1 ? s.exp_avg : s.exp_avg_sq;
}

// Calls f(index of the row's first element, elements) for each row of m.r
// in the buffer rank `s` holds for the move's group: a row of a 2-D region is
// contiguous in a shard (C order), and a 1-D region is one run.
template <class F>
void for_each_run(const RankShards& s, int group, size_t param, const Region& r, F f) {
  if (r.nd == 1 || (r.count[1] == 1 && s.local[param].shape.size() == 1)) {
    f(held_index(s, group, param, r.start[0], 0), r.count[0]);
    return;
  }
  for (int64_t row = 0; row < r.count[0]; ++row)
    f(held_index(s, group, param, r.start[0] + row, r.start[1]), r.count[1]);
}

void check_range(int64_t size, int64_t at, int64_t n, const char* side, const std::string& name) {
  if (at < 0 || n < 0 || at + n > size)
    throw std::logic_error(std::string("reshard: ") + side + " " + name + " elements [" +
                           std::to_string(at) + ", " + std::to_string(at + n) +
                           ") outside a buffer of " + std::to_string(size));
}

// The elements of the moves from `s` (to `dst_filter`, or any) packed in plan
// order into `out` (room for them all); returns how many.
int64_t pack_into(const std::vector<RegionMove>& moves, int s, const RankShards& shards,
                  const StateView& from, int dst_filter, float* out) {
  int64_t k = 0;
  for (const RegionMove& m : moves) {
    if (m.src != s || (dst_filter >= 0 && m.dst != dst_filter)) continue;
    const float* buf = from.buf[m.group];
    const std::string& name = shards.local[m.src_param].name;
    for_each_run(shards, m.group, m.src_param, m.r, [&](int64_t at, int64_t n) {
      check_range(from.size[m.group], at, n, "source", name);
      std::memcpy(out + k, buf + at, size_t(n) * sizeof(float));
      k += n;
    });
  }
  return k;
}

int64_t planned_elems(const std::vector<RegionMove>& moves, int s, int d) {
  int64_t n = 0;
  for (const RegionMove& m : moves)
    if (m.src == s && m.dst == d) n += move_elems(m);
  return n;
}
}  // namespace

std::string rank_shards_json(const RankShards& s) {
  const ShardLayout& l = s.lay;
  json j = {{"tp", l.tp},       {"tp_rank", l.tp_rank}, {"dp", l.dp},
            {"dp_rank", l.dp_rank}, {"description", l.description}, {"state_lo", l.state_lo},
            {"state_hi", l.state_hi}, {"pp", l.pp}, {"pp_rank", l.pp_rank},
            {"ep", l.ep},       {"ep_rank", l.ep_rank}};
  json t = json::array();
  for (const ParamSpec& p : s.local) t.push_back(spec_json(p));
  j["table"] = std::move(t);
  return j.dump();
}

RankShards rank_shards_from_json(const std::string& text) {
  const json j = json::parse(text);
  RankShards s;
  ShardLayout& l = s.lay;
  l.tp = j.at("tp");
  l.tp_rank = j.at("tp_rank");
  l.dp = j.at("dp");
  l.dp_rank = j.at("dp_rank");
  l.description = j.at("description");
  l.state_lo = j.at("state_lo");
  l.state_hi = j.at("state_hi");
  l.pp = j.at("pp");
  l.pp_rank = j.at("pp_rank");
  l.ep = j.at("ep");
  l.ep_rank = j.at("ep_rank");
  for (const json& p : j.at("table")) s.local.push_back(spec_from(p));
  return s;
}

std::string place_record(int src_rank, const RankShards& src, int dst_rank, const RankShards& dst) {
  return std::to_string(src_rank) + " " + std::to_string(dst_rank) + "\n" + rank_shards_json(src) +
         "\n" + rank_shards_json(dst);
}

StateView view_of(const RankState& s) {
  StateView v;
  v.present = true;
  int g = 0;
  for (const std::vector<float>* b : {&s.params, &s.exp_avg, &s.exp_avg_sq}) {
    v.buf[g] = b->data();
    v.size[g++] = int64_t(b->size());
  }
  return v;
}

void pack_moves(const std::vector<RegionMove>& moves, int s, const RankState& from, std::vector<float>& out,
                int dst_filter) {
  int64_t n = 0;
  for (const RegionMove& m : moves)
    if (m.src == s && (dst_filter < 0 || m.dst == dst_filter)) n += move_elems(m);
  const size_t k = out.size();
  out.resize(k + size_t(n));
  pack_into(moves, s, from.shards, view_of(from), dst_filter, out.data() + k);
}

void unpack_moves(const std::vector<RegionMove>& moves, int s, int d, RankState& to, const float* in,
                  int64_t n) {
  int64_t k = 0;
  for (const RegionMove& m : moves) {
    if (m.src != s || m.dst != d) continue;
    std::vector<float>& buf = group_buffer(to, m.group);
    const std::string& name = to.shards.local[m.dst_param].name;
    for_each_run(to.shards, m.group, m.dst_param, m.r, [&](int64_t at, int64_t c) {
      check_range(int64_t(buf.size()), at, c, "destination", name);
      if (k + c > n)
        throw std::logic_error("reshard: the payload from rank " + std::to_string(s) + " is short");
      std::memcpy(buf.data() + at, in + k, size_t(c) * sizeof(float));
      k += c;
    });
  }
  if (k != n)
    throw std::logic_error("reshard: " + std::to_string(n - k) + " elements from rank " +
                           std::to_string(s) + " left over");
}

namespace {
// Copies of (to, from, elements), done as a batch: memcpy within this
// process, process_vm_readv (up to IOV_MAX pieces a call) from another.
class Copier {
 public:
  explicit Copier(int pid) : pid_(pid) {}
  void add(float* to, const float* from, int64_t n) {
    if (pid_ == 0) {
      std::memcpy(to, from, size_t(n) * sizeof(float));
      return;
    }
    local_.push_back({to, size_t(n) * sizeof(float)});
    remote_.push_back({const_cast<float*>(from), size_t(n) * sizeof(float)});
    if (local_.size() == kBatch) flush();
  }
  void flush() {
    size_t i = 0;
    while (i < local_.size()) {
      const size_t k = std::min(local_.size() - i, kBatch);
      size_t want = 0;
      for (size_t j = i; j < i + k; ++j) want += local_[j].iov_len;
      const ssize_t got = process_vm_readv(pid_, local_.data() + i, k, remote_.data() + i, k, 0);
      if (got != ssize_t(want))  // a whole batch or an error: pieces are never split
        throw std::runtime_error("reshard: reading " + std::to_string(want) +
                                 " bytes from process " + std::to_string(pid_) + " returned " +
                                 std::to_string(got) + ": " + std::strerror(errno));
      i += k;
    }
    local_.clear();
    remote_.clear();
  }

 private:
  static constexpr size_t kBatch = 512;
  int pid_;
  std::vector<iovec> local_, remote_;
};
}  // namespace

int64_t copy_moves(const std::vector<RegionMove>& moves, int s, const RankShards& from_shards,
                   const StateView& from, int d, RankState& to) {
  int64_t k = 0;
  Copier copy(from.pid);
  std::vector<int64_t> at_src;
  for (const RegionMove& m : moves) {
    if (m.src != s || m.dst != d) continue;
    const float* in = from.buf[m.group];
    std::vector<float>& buf = group_buffer(to, m.group);
    const std::string& name = to.shards.local[m.dst_param].name;
    // Rows of the region pair up: the same count[1] elements, contiguous on both sides.
    at_src.clear();
    for_each_run(from_shards, m.group, m.src_param, m.r, [&](int64_t at, int64_t n) {
      check_range(from.size[m.group], at, n, "source", name);
      at_src.push_back(at);
    });
    size_t row = 0;
    for_each_run(to.shards, m.group, m.dst_param, m.r, [&](int64_t at, int64_t n) {
      check_range(int64_t(buf.size()), at, n, "destination", name);
      if (row >= at_src.size())
        throw std::logic_error("reshard: " + name + "'s region has more rows on the destination");
      copy.add(buf.data() + at, in + at_src[row++], n);
      k += n;
    });
    if (row != at_src.size())
      throw std::logic_error("reshard: " + name + "'s region has fewer rows on the destination");
  }
  copy.flush();
  return k;
}

ReshardStats reshard(const RankShards& src_shards, const StateView& src, int src_rank,
                     RankState& dst, int dst_rank, Comm& world,
                     const std::vector<std::string>& all_places,
                     const std::vector<StateView>& mapped) {
  using clock = std::chrono::steady_clock;
  auto t = clock::now();
  const auto lap = [&t] {
    const auto now = clock::now();
    const double s = std::chrono::duration<double>(now - t).count();
    t = now;
    return s;
  };
  const int P = world.size(), me = world.rank();
  if (int(all_places.size()) != P)
    throw std::logic_error("reshard: " + std::to_string(all_places.size()) + " places for " +
                           std::to_string(P) + " ranks");
  // Every process's source and destination rank, and both layouts' tables.
  std::vector<int> src_of(static_cast<size_t>(P)), dst_of(static_cast<size_t>(P));
  std::vector<RankShards> from(static_cast<size_t>(P)), to(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    std::istringstream in(all_places[size_t(p)]);
    std::string head, a, b;
    std::getline(in, head);
    std::getline(in, a);
    std::getline(in, b);
    std::istringstream h(head);
    h >> src_of[size_t(p)] >> dst_of[size_t(p)];
    const int s = src_of[size_t(p)], d = dst_of[size_t(p)];
    if (s < 0 || s >= P || d < 0 || d >= P)
      throw std::logic_error("reshard: process " + std::to_string(p) + " has ranks " +
                             std::to_string(s) + " -> " + std::to_string(d) + " outside the world");
    from[size_t(s)] = rank_shards_from_json(a);
    to[size_t(d)] = rank_shards_from_json(b);
  }
  if (src_of[size_t(me)] != src_rank || dst_of[size_t(me)] != dst_rank)
    throw std::logic_error("reshard: this process's place record does not match its ranks");
  if (!mapped.empty() && int(mapped.size()) != P)
    throw std::logic_error("reshard: " + std::to_string(mapped.size()) + " mapped sources for " +
                           std::to_string(P) + " ranks");
  const std::vector<RegionMove> moves = plan_moves(from, to);
  // Processes whose moves to and from this one need no message.
  const auto direct = [&](int p) {
    return p == me || (!mapped.empty() && mapped[size_t(p)].present);
  };

  ReshardStats st;
  st.moves = int64_t(moves.size());
  st.plan_s = lap();
  std::vector<int64_t> send_counts(static_cast<size_t>(P), 0), recv_counts(static_cast<size_t>(P), 0);
  for (int p = 0; p < P; ++p) {
    const int64_t out = planned_elems(moves, src_rank, dst_of[size_t(p)]);
    (p == me ? st.local_bytes : st.sent_bytes) += out * 4;
    if (direct(p)) continue;
    send_counts[size_t(p)] = out;
    recv_counts[size_t(p)] = planned_elems(moves, src_of[size_t(p)], dst_rank);
  }
  std::vector<int64_t> send_displs(static_cast<size_t>(P), 0), recv_displs(static_cast<size_t>(P), 0);
  for (int p = 1; p < P; ++p) {
    send_displs[size_t(p)] = send_displs[size_t(p - 1)] + send_counts[size_t(p - 1)];
    recv_displs[size_t(p)] = recv_displs[size_t(p - 1)] + recv_counts[size_t(p - 1)];
  }
  // Payloads without zero-filling: every element is packed or received.
  const int64_t n_out = send_displs.back() + send_counts.back();
  const int64_t n_in = recv_displs.back() + recv_counts.back();
  std::unique_ptr<float[]> out(new float[size_t(std::max<int64_t>(n_out, 1))]);
  std::unique_ptr<float[]> in(new float[size_t(std::max<int64_t>(n_in, 1))]);
  for (int p = 0; p < P; ++p) {
    if (send_counts[size_t(p)] == 0) continue;
    const int64_t n = pack_into(moves, src_rank, src_shards, src, dst_of[size_t(p)],
                                out.get() + send_displs[size_t(p)]);
    if (n != send_counts[size_t(p)])
      throw std::logic_error("reshard: packed " + std::to_string(n) + " elements for rank " +
                             std::to_string(p) + ", planned " +
                             std::to_string(send_counts[size_t(p)]));
  }
  st.pack_s = lap();
  world.all_to_allv(Tensor(in.get(), DType::F32, {n_in}), recv_counts, recv_displs,
                    Tensor(out.get(), DType::F32, {n_out}), send_counts, send_displs);
  out.reset();
  st.transfer_s = lap();
  for (int p = 0; p < P; ++p) {
    if (direct(p)) {
      const StateView& v = p == me ? src : mapped[size_t(p)];
      const int64_t n =
          copy_moves(moves, src_of[size_t(p)], from[size_t(src_of[size_t(p)])], v, dst_rank, dst);
      if (p != me) st.shared_bytes += n * 4;
    } else {
      unpack_moves(moves, src_of[size_t(p)], dst_rank, dst, in.get() + recv_displs[size_t(p)],
                   recv_counts[size_t(p)]);
    }
  }
  st.unpack_s = lap();
  return st;
}

}  // namespace adgt
