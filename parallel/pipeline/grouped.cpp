#include "parallel/pipeline/grouped.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

namespace adgt::pp {
namespace {

size_t U(int i) { return static_cast<size_t>(i); }

struct P2p {
  bool send;
  int peer;
  int instr;  // index in the rank's list
  int group;  // index of its group on the rank
  int nth;    // its position among the rank's sends to (receives from) peer
  bool done = false;
};

std::string at(const Schedule& s, int r, int i) {
  return "#" + std::to_string(i) + " " + to_string(s.ranks[U(r)][U(i)]);
}

}  // namespace

void validate_grouped(const Schedule& s) {
  // Each rank's operations and groups, in issue order.
  std::vector<std::vector<P2p>> ops(U(s.pp));
  std::vector<int> groups(U(s.pp), 0);
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::pair<bool, int>, int> count;  // (send, peer) -> operations so far
    std::vector<size_t> queued;                 // sends not yet in a group
    const auto& list = s.ranks[U(r)];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Instr& in = list[U(i)];
      // A rank's message to itself (the vee placement's turn) is a copy in
      // memory (the executor's hand-over), no transport operation.
      if ((is_send(in.op) || is_recv(in.op)) && in.peer == r) continue;
      if (is_send(in.op)) {
        ops[U(r)].push_back({true, in.peer, i, -1, count[{true, in.peer}]++});
        queued.push_back(ops[U(r)].size() - 1);
      } else if (is_recv(in.op) || (in.op == Op::WaitSends && !queued.empty())) {
        if (is_recv(in.op)) {
          ops[U(r)].push_back({false, in.peer, i, -1, count[{false, in.peer}]++});
          queued.push_back(ops[U(r)].size() - 1);
        }
        for (size_t q : queued) ops[U(r)][q].group = groups[U(r)];
        ++groups[U(r)];
        queued.clear();
      }
    }
  }
  // Order: the n-th send a -> b carries the message of the n-th receive on b from a.
  std::map<std::tuple<int, int, int>, size_t> recv_at;  // (b, a, n) -> index in ops[b]
  for (int b = 0; b < s.pp; ++b)
    for (size_t k = 0; k < ops[U(b)].size(); ++k)
      if (!ops[U(b)][k].send) recv_at[{b, ops[U(b)][k].peer, ops[U(b)][k].nth}] = k;
  std::vector<std::vector<size_t>> partner(U(s.pp));
  for (int a = 0; a < s.pp; ++a) {
    partner[U(a)].assign(ops[U(a)].size(), 0);
    for (size_t k = 0; k < ops[U(a)].size(); ++k) {
      const P2p& o = ops[U(a)][k];
      if (o.send) {
        auto it = recv_at.find({o.peer, a, o.nth});
        if (it == recv_at.end())
          throw ScheduleError("rank " + std::to_string(a) + "'s send " + std::to_string(o.nth) +
                              " to rank " + std::to_string(o.peer) + " (" + at(s, a, o.instr) +
                              ") has no receive " + std::to_string(o.nth) + " from rank " +
                              std::to_string(a) + " on rank " + std::to_string(o.peer));
        const P2p& q = ops[U(o.peer)][it->second];
        if (message_of(s, a, s.ranks[U(a)][U(o.instr)]) != message_of(s, o.peer, s.ranks[U(o.peer)][U(q.instr)]))
          throw ScheduleError("NCCL matches messages by order: rank " + std::to_string(a) + "'s send " +
                              std::to_string(o.nth) + " to rank " + std::to_string(o.peer) + " is " +
                              at(s, a, o.instr) + ", but rank " + std::to_string(o.peer) +
                              "'s receive " + std::to_string(o.nth) + " from rank " +
                              std::to_string(a) + " is " + at(s, o.peer, q.instr));
        partner[U(a)][k] = it->second;
      }
    }
  }
  for (int a = 0; a < s.pp; ++a)  // and each receive's send
    for (size_t k = 0; k < ops[U(a)].size(); ++k)
      if (ops[U(a)][k].send) partner[U(ops[U(a)][k].peer)][partner[U(a)][k]] = k;
  // Progress: a rank's running group is the first with an operation not done;
  // a pair completes when both ends are in their ranks' running groups.
  std::vector<int> head(U(s.pp), 0);
  auto running = [&](int r) {
    while (head[U(r)] < groups[U(r)]) {
      bool open = false;
      for (const P2p& o : ops[U(r)])
        if (o.group == head[U(r)] && !o.done) open = true;
      if (open) break;
      ++head[U(r)];
    }
    return head[U(r)];
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      const int g = running(r);
      for (size_t k = 0; k < ops[U(r)].size(); ++k) {
        P2p& o = ops[U(r)][k];
        if (o.group != g || o.done) continue;
        P2p& q = ops[U(o.peer)][partner[U(r)][k]];
        if (q.group != running(o.peer)) continue;
        o.done = q.done = true;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < s.pp; ++r) {
    const int g = running(r);
    if (g >= groups[U(r)]) continue;
    for (size_t k = 0; k < ops[U(r)].size(); ++k) {
      const P2p& o = ops[U(r)][k];
      if (o.group != g || o.done) continue;
      const P2p& q = ops[U(o.peer)][partner[U(r)][k]];
      const int pg = running(o.peer);
      std::string where = "whose running group ";
      if (pg >= groups[U(o.peer)]) {
        where += "has finished";
      } else {
        for (const P2p& x : ops[U(o.peer)])
          if (x.group == pg) {
            where += "is at " + at(s, o.peer, x.instr);
            break;
          }
      }
      stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
               "'s group at " + at(s, r, o.instr) + " waits for " + at(s, o.peer, q.instr) +
               " on rank " + std::to_string(o.peer) + ", " + where;
      break;
    }
  }
  if (!stuck.empty())
    throw ScheduleError("deadlock with grouped rendezvous sends (NCCL): " + stuck);
}

Schedule for_rendezvous(const Schedule& s) {
  // The buffered run (validate.hpp's progress check): the global number of
  // every send, in the order the sends are made.
  std::map<Message, int> seq;  // message -> global send number
  std::vector<size_t> pc(U(s.pp), 0);
  int next = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      const auto& list = s.ranks[U(r)];
      for (size_t& i = pc[U(r)]; i < list.size(); ++i) {
        const Instr& in = list[i];
        if (is_recv(in.op) && !seq.count(message_of(s, r, in))) break;
        if (is_send(in.op)) seq[message_of(s, r, in)] = next++;
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.pp; ++r)
    if (pc[U(r)] < s.ranks[U(r)].size())
      throw ScheduleError("for_rendezvous: rank " + std::to_string(r) + " cannot run past " +
                          at(s, r, int(pc[U(r)])) + " (the schedule does not pass validate())");
  Schedule out = s;
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.ranks[U(r)];
    std::vector<std::pair<int, size_t>> recvs;  // (message number, index), by number
    // A receive from the rank itself (a hand-over in memory) stays where it
    // is, after its send; it moves nothing and waits for nothing.
    const auto moves = [&](const Instr& in) { return is_recv(in.op) && in.peer != r; };
    for (size_t i = 0; i < list.size(); ++i)
      if (moves(list[i])) recvs.emplace_back(seq.at(message_of(s, r, list[i])), i);
    std::sort(recvs.begin(), recvs.end());
    std::vector<Instr> moved;
    moved.reserve(list.size());
    size_t k = 0;  // recvs[k..] not yet placed
    std::vector<char> placed(list.size(), 0);
    auto place_next = [&] {
      moved.push_back(list[recvs[k].second]);
      placed[recvs[k].second] = 1;
      ++k;
    };
    for (size_t i = 0; i < list.size(); ++i) {
      const Instr& in = list[i];
      if (moves(in)) {
        while (!placed[i]) place_next();  // it, after the receives numbered before it
        continue;
      }
      if (is_send(in.op) && in.peer != r) {
        const int q = seq.at(message_of(s, r, in));
        while (k < recvs.size() && recvs[k].first < q) place_next();
      }
      moved.push_back(in);
    }
    out.ranks[U(r)] = std::move(moved);
  }
  return out;
}

}  // namespace adgt::pp
