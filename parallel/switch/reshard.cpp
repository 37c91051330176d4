#include "parallel/switch/reshard.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
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
const std::vector<float>& group_buffer(const RankState& s, int g) {
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

void check_range(const std::vector<float>& buf, int64_t at, int64_t n, const char* side,
                 const std::string& name) {
  if (at < 0 || n < 0 || at + n > int64_t(buf.size()))
    throw std::logic_error(std::string("reshard: ") + side + " " + name + " elements [" +
                           std::to_string(at) + ", " + std::to_string(at + n) +
                           ") outside a buffer of " + std::to_string(buf.size()));
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

void pack_moves(const std::vector<RegionMove>& moves, int s, const RankState& from, std::vector<float>& out,
                int dst_filter) {
  for (const RegionMove& m : moves) {
    if (m.src != s || (dst_filter >= 0 && m.dst != dst_filter)) continue;
    const std::vector<float>& buf = group_buffer(from, m.group);
    const std::string& name = from.shards.local[m.src_param].name;
    size_t k = out.size();
    out.resize(k + size_t(move_elems(m)));
    for_each_run(from.shards, m.group, m.src_param, m.r, [&](int64_t at, int64_t n) {
      check_range(buf, at, n, "source", name);
      std::memcpy(out.data() + k, buf.data() + at, size_t(n) * sizeof(float));
      k += size_t(n);
    });
  }
}

void unpack_moves(const std::vector<RegionMove>& moves, int s, int d, RankState& to, const float* in,
                  int64_t n) {
  int64_t k = 0;
  for (const RegionMove& m : moves) {
    if (m.src != s || m.dst != d) continue;
    std::vector<float>& buf = group_buffer(to, m.group);
    const std::string& name = to.shards.local[m.dst_param].name;
    for_each_run(to.shards, m.group, m.dst_param, m.r, [&](int64_t at, int64_t c) {
      check_range(buf, at, c, "destination", name);
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

ReshardStats reshard(const RankState& src, int src_rank, RankState& dst, int dst_rank, Comm& world,
                     const std::vector<std::string>& all_places) {
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
  const std::vector<RegionMove> moves = plan_moves(from, to);

  ReshardStats st;
  st.moves = int64_t(moves.size());
  st.plan_s = lap();
  std::vector<int64_t> send_counts(static_cast<size_t>(P), 0), recv_counts(static_cast<size_t>(P), 0);
  for (const RegionMove& m : moves) {
    for (int p = 0; p < P; ++p) {
      if (m.src == src_rank && m.dst == dst_of[size_t(p)]) send_counts[size_t(p)] += move_elems(m);
      if (m.dst == dst_rank && m.src == src_of[size_t(p)]) recv_counts[size_t(p)] += move_elems(m);
    }
  }
  std::vector<int64_t> send_displs(static_cast<size_t>(P), 0), recv_displs(static_cast<size_t>(P), 0);
  for (int p = 1; p < P; ++p) {
    send_displs[size_t(p)] = send_displs[size_t(p - 1)] + send_counts[size_t(p - 1)];
    recv_displs[size_t(p)] = recv_displs[size_t(p - 1)] + recv_counts[size_t(p - 1)];
  }
  std::vector<float> out;
  out.reserve(size_t(send_displs.back() + send_counts.back()));
  for (int p = 0; p < P; ++p) {
    const size_t before = out.size();
    pack_moves(moves, src_rank, src, out, dst_of[size_t(p)]);
    if (int64_t(out.size() - before) != send_counts[size_t(p)])
      throw std::logic_error("reshard: packed " + std::to_string(out.size() - before) +
                             " elements for rank " + std::to_string(p) + ", planned " +
                             std::to_string(send_counts[size_t(p)]));
    (p == me ? st.local_bytes : st.sent_bytes) += int64_t(out.size() - before) * 4;
  }
  st.pack_s = lap();
  std::vector<float> in(size_t(recv_displs.back() + recv_counts.back()));
  float dummy_in = 0, dummy_out = 0;  // all_to_allv wants a buffer even when nothing moves
  world.all_to_allv(Tensor(in.empty() ? &dummy_out : in.data(), DType::F32, {int64_t(in.size())}),
                    recv_counts, recv_displs,
                    Tensor(out.empty() ? &dummy_in : out.data(), DType::F32, {int64_t(out.size())}),
                    send_counts, send_displs);
  st.transfer_s = lap();
  for (int p = 0; p < P; ++p)
    unpack_moves(moves, src_of[size_t(p)], dst_rank, dst, in.data() + recv_displs[size_t(p)],
                 recv_counts[size_t(p)]);
  st.unpack_s = lap();
  return st;
}

}  // namespace adgt
