#include "parallel/pipeline/validate.hpp"

#include <algorithm>
#include <set>
#include <string>

namespace adgt::pp {
namespace {

size_t U(int i) { return static_cast<size_t>(i); }

// An instruction of rank r as text, with the peer its kind implies.
std::string describe(const Schedule& s, int r, Instr in) {
  const int st = s.stage(r, in.chunk);
  if (in.op == Op::SendAct || in.op == Op::RecvGrad) in.peer = s.rank_of_stage(st + 1);
  if (in.op == Op::RecvAct || in.op == Op::SendGrad) in.peer = s.rank_of_stage(st - 1);
  return to_string(in);
}

std::string at(const Schedule& s, int r, int i) {
  return "rank " + std::to_string(r) + " #" + std::to_string(i) + " " + to_string(s.ranks[U(r)][U(i)]);
}


// The instruction on the other end of a message, as text: "RecvAct(mb 1, chunk 0) on rank 1".
std::string counterpart(const Schedule& s, int r, const Instr& in) {
  const int st = s.stage(r, in.chunk);
  Instr o = in;
  int other_stage = st;
  switch (in.op) {
    case Op::SendAct: o.op = Op::RecvAct, other_stage = st + 1; break;
    case Op::RecvAct: o.op = Op::SendAct, other_stage = st - 1; break;
    case Op::SendGrad: o.op = Op::RecvGrad, other_stage = st - 1; break;
    default: o.op = Op::SendGrad, other_stage = st + 1; break;
  }
  o.chunk = s.chunk_of_stage(other_stage);
  o.peer = r;
  std::string t = op_name(o.op);
  t += "(mb " + std::to_string(o.microbatch) + ", chunk " + std::to_string(o.chunk) + ")";
  return t + " on rank " + std::to_string(s.rank_of_stage(other_stage));
}

void check_shape(const Schedule& s) {
  if (s.pp < 1 || s.microbatches < 1 || s.virtual_stages < 1)
    throw ScheduleError("schedule \"" + s.name + "\": pp=" + std::to_string(s.pp) + ", microbatches=" +
                        std::to_string(s.microbatches) + ", virtual_stages=" + std::to_string(s.virtual_stages) +
                        ": each must be >= 1");
  if (static_cast<int>(s.ranks.size()) != s.pp)
    throw ScheduleError("schedule \"" + s.name + "\" has " + std::to_string(s.ranks.size()) +
                        " rank lists for pp=" + std::to_string(s.pp));
  const int last = s.num_stages() - 1;
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.ranks[U(r)];
    const int n = static_cast<int>(list.size());
    if (n == 0 || list.back().op != Op::WaitSends)
      throw ScheduleError("rank " + std::to_string(r) + ": the list must end with WaitSends (#" +
                          std::to_string(n) + ")");
    for (int i = 0; i < n; ++i) {
      const Instr& in = list[U(i)];
      if (in.op == Op::WaitSends) {
        if (i != n - 1)
          throw ScheduleError(at(s, r, i) + ": WaitSends must be the last instruction of the rank (the list has " +
                              std::to_string(n) + ")");
        continue;
      }
      if (in.op == Op::ReduceGrads) {
        if (in.chunk < 0 || in.chunk >= s.virtual_stages || in.microbatch != -1 || in.peer != -1)
          throw ScheduleError(at(s, r, i) + ": ReduceGrads takes a chunk in 0.." +
                              std::to_string(s.virtual_stages - 1) + " and micro-batch and peer -1");
        continue;
      }
      if (in.microbatch < 0 || in.microbatch >= s.microbatches)
        throw ScheduleError(at(s, r, i) + ": micro-batch out of range 0.." + std::to_string(s.microbatches - 1));
      if (in.chunk < 0 || in.chunk >= s.virtual_stages)
        throw ScheduleError(at(s, r, i) + ": chunk out of range 0.." + std::to_string(s.virtual_stages - 1));
      if (is_compute(in.op)) continue;
      const int st = s.stage(r, in.chunk);
      const bool to_next = in.op == Op::SendAct || in.op == Op::RecvGrad;
      const int other = to_next ? st + 1 : st - 1;
      if (other < 0 || other > last)
        throw ScheduleError(at(s, r, i) + ": stage " + std::to_string(st) + " is the " +
                            (to_next ? "last" : "first") + " stage; it has no " + (to_next ? "next" : "previous") +
                            " stage to " + (is_send(in.op) ? "send to" : "receive from"));
      if (in.peer != s.rank_of_stage(other))
        throw ScheduleError(at(s, r, i) + ": stage " + std::to_string(st) + "'s " + (to_next ? "next" : "previous") +
                            " stage " + std::to_string(other) + " is on rank " +
                            std::to_string(s.rank_of_stage(other)) + ", not rank " + std::to_string(in.peer));
    }
  }
}

void check_matching(const Schedule& s) {
  const size_t n = 2 * U(s.num_stages()) * U(s.microbatches);
  struct Where {
    int rank = -1, index = -1, count = 0;
  };
  std::vector<Where> sends(n), recvs(n);
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.ranks[U(r)];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Instr& in = list[U(i)];
      if (!is_send(in.op) && !is_recv(in.op)) continue;
      Where& w = (is_send(in.op) ? sends : recvs)[message_slot(s, message_of(s, r, in))];
      if (w.count++ > 0)
        throw ScheduleError(at(s, r, i) + " duplicates rank " + std::to_string(w.rank) + " #" +
                            std::to_string(w.index) + ": every message is sent and received exactly once");
      w.rank = r, w.index = i;
    }
  }
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.ranks[U(r)];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Instr& in = list[U(i)];
      if (!is_send(in.op) && !is_recv(in.op)) continue;
      const size_t k = message_slot(s, message_of(s, r, in));
      if ((is_send(in.op) ? recvs : sends)[k].count == 0)
        throw ScheduleError(at(s, r, i) + " has no matching " + counterpart(s, r, in));
    }
  }
}

// Per (chunk, micro-batch) of one rank: where each instruction kind is (-1: absent).
struct Slot {
  int pos[kNumOps];
  int count[kNumOps];
};

void check_complete(const Schedule& s) {
  const int last = s.num_stages() - 1;
  for (int r = 0; r < s.pp; ++r) {
    std::vector<Slot> slots(U(s.virtual_stages) * U(s.microbatches), Slot{});
    const auto& list = s.ranks[U(r)];
    std::vector<int> reduced(U(s.virtual_stages), -1);  // position of the chunk's ReduceGrads
    int reductions = 0;
    for (int i = 0; i < static_cast<int>(list.size()) - 1; ++i) {
      const Instr& in = list[U(i)];
      if (in.op == Op::ReduceGrads) {
        if (reduced[U(in.chunk)] >= 0)
          throw ScheduleError(at(s, r, i) + " appears again (first at #" +
                              std::to_string(reduced[U(in.chunk)]) + "): once per chunk");
        reduced[U(in.chunk)] = i;
        ++reductions;
        continue;
      }
      Slot& sl = slots[U(in.chunk) * U(s.microbatches) + U(in.microbatch)];
      const int op = static_cast<int>(in.op);
      if (sl.count[op]++ > 0)
        throw ScheduleError(at(s, r, i) + " appears again (first at #" + std::to_string(sl.pos[op]) +
                            "): once per micro-batch and chunk");
      sl.pos[op] = i;
    }
    if (reductions > 0 && reductions < s.virtual_stages)
      for (int c = 0; c < s.virtual_stages; ++c)
        if (reduced[U(c)] < 0)
          throw ScheduleError("rank " + std::to_string(r) + ": ReduceGrads(chunk " + std::to_string(c) +
                              ") is missing: a schedule that reduces gradients does so once per chunk");
    for (int c = 0; c < s.virtual_stages; ++c) {
      const int st = s.stage(r, c);
      for (int mb = 0; mb < s.microbatches; ++mb) {
        const Slot& sl = slots[U(c) * U(s.microbatches) + U(mb)];
        auto need = [&](Op op, const char* why) {
          if (sl.count[static_cast<int>(op)] == 0)
            throw ScheduleError("rank " + std::to_string(r) + ": " + describe(s, r, Instr{op, mb, c, -1}) +
                                " is missing (stage " + std::to_string(st) + "): " + why);
        };
        need(Op::Forward, "every micro-batch runs one forward per chunk");
        const int fused = sl.count[static_cast<int>(Op::Backward)];
        const int bi = sl.count[static_cast<int>(Op::BackwardInput)];
        const int bw = sl.count[static_cast<int>(Op::BackwardWeight)];
        if (fused && (bi || bw))
          throw ScheduleError("rank " + std::to_string(r) + ": micro-batch " + std::to_string(mb) + ", chunk " +
                              std::to_string(c) + " has both a Backward and a split BackwardInput/BackwardWeight");
        if (!fused) {
          need(Op::BackwardInput, "every micro-batch runs one Backward, or one BackwardInput and one BackwardWeight");
          need(Op::BackwardWeight, "a split backward needs BackwardWeight after its BackwardInput");
        }
        if (st > 0) need(Op::RecvAct, "the forward of a non-first stage receives its input");
        if (st < last) need(Op::SendAct, "the forward of a non-last stage sends its output");
        if (st < last) need(Op::RecvGrad, "the backward of a non-last stage receives its output gradient");
        if (st > 0) need(Op::SendGrad, "the backward of a non-first stage sends its input gradient");
      }
    }
  }
}

void check_order(const Schedule& s, std::int64_t max_inflight) {
  const int last = s.num_stages() - 1;
  for (int r = 0; r < s.pp; ++r) {
    std::vector<Slot> seen(U(s.virtual_stages) * U(s.microbatches), Slot{});
    std::int64_t inflight = 0;
    const auto& list = s.ranks[U(r)];
    for (int i = 0; i < static_cast<int>(list.size()) - 1; ++i) {
      const Instr& in = list[U(i)];
      if (in.op == Op::ReduceGrads) {  // after every weight gradient of its chunk
        for (int mb = 0; mb < s.microbatches; ++mb) {
          const Slot& m = seen[U(in.chunk) * U(s.microbatches) + U(mb)];
          if (!m.count[static_cast<int>(Op::Backward)] && !m.count[static_cast<int>(Op::BackwardWeight)])
            throw ScheduleError(at(s, r, i) + " comes before the weight gradient of micro-batch " +
                                std::to_string(mb) + " (its Backward or BackwardWeight), which must come first");
        }
        continue;
      }
      Slot& sl = seen[U(in.chunk) * U(s.microbatches) + U(in.microbatch)];
      const int st = s.stage(r, in.chunk);
      auto after = [&](Op op) {
        if (sl.count[static_cast<int>(op)] == 0)
          throw ScheduleError(at(s, r, i) + " comes before its " + describe(s, r, Instr{op, in.microbatch, in.chunk, -1}) +
                              ", which must come first");
      };
      switch (in.op) {
        case Op::Forward:
          if (st > 0) after(Op::RecvAct);
          break;
        case Op::SendAct: after(Op::Forward); break;
        case Op::BackwardInput:
        case Op::Backward:
          after(Op::Forward);
          if (st < last) after(Op::RecvGrad);
          break;
        case Op::BackwardWeight: after(Op::BackwardInput); break;
        case Op::SendGrad:
          if (sl.count[static_cast<int>(Op::Backward)] == 0) after(Op::BackwardInput);
          break;
        default: break;
      }
      sl.count[static_cast<int>(in.op)] = 1;
      if (in.op == Op::Forward && ++inflight > max_inflight)
        throw ScheduleError(at(s, r, i) + ": " + std::to_string(inflight) +
                            " activations in flight on rank " + std::to_string(r) +
                            " (Forward done, backward not yet), above max_inflight=" + std::to_string(max_inflight));
      if (is_input_backward(in.op)) --inflight;
    }
  }
}

void check_progress(const Schedule& s) {
  const int S = s.num_stages();
  const size_t n = 2 * U(S) * U(s.microbatches);
  std::vector<char> sent(n, 0);
  // Done flags for F and B (input part) per (stage, micro-batch).
  std::vector<char> f_done(U(S) * U(s.microbatches), 0), b_done(U(S) * U(s.microbatches), 0);
  auto cell = [&](int st, int mb) { return U(st) * U(s.microbatches) + U(mb); };
  std::vector<int> pc(U(s.pp), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      const auto& list = s.ranks[U(r)];
      for (int& i = pc[U(r)]; i < static_cast<int>(list.size()); ++i) {
        const Instr& in = list[U(i)];
        if (in.op == Op::WaitSends) continue;
        const int st = s.stage(r, in.chunk);
        if (is_recv(in.op)) {
          if (!sent[message_slot(s, message_of(s, r, in))]) break;
        } else if (is_send(in.op)) {
          sent[message_slot(s, message_of(s, r, in))] = 1;
        } else if (in.op == Op::Forward) {
          if (st > 0 && !f_done[cell(st - 1, in.microbatch)])
            throw ScheduleError(at(s, r, i) + " runs before Forward(mb " + std::to_string(in.microbatch) +
                                ") of stage " + std::to_string(st - 1) + " (data dependency)");
          f_done[cell(st, in.microbatch)] = 1;
        } else if (is_input_backward(in.op)) {
          if (st < S - 1 && !b_done[cell(st + 1, in.microbatch)])
            throw ScheduleError(at(s, r, i) + " runs before the backward of micro-batch " +
                                std::to_string(in.microbatch) + " on stage " + std::to_string(st + 1) +
                                " (data dependency)");
          b_done[cell(st, in.microbatch)] = 1;
        }
        progress = true;
      }
    }
  }
  std::vector<int> stuck;
  for (int r = 0; r < s.pp; ++r)
    if (pc[U(r)] < static_cast<int>(s.ranks[U(r)].size())) stuck.push_back(r);
  if (stuck.empty()) return;
  // Follow the wait-for chain from the first stuck rank, then list the others.
  std::string msg = "deadlock: ";
  std::vector<char> named(U(s.pp), 0);
  int r = stuck.front();
  msg += "rank " + std::to_string(r) + " waits at #";
  while (true) {
    named[U(r)] = 1;
    const Instr& in = s.ranks[U(r)][U(pc[U(r)])];
    msg += std::to_string(pc[U(r)]) + " " + to_string(in);
    const int next = in.peer;
    if (named[U(next)]) {
      msg += ": a cycle";
      break;
    }
    if (pc[U(next)] >= static_cast<int>(s.ranks[U(next)].size())) {
      msg += ", which has finished";
      break;
    }
    msg += ", which waits at #";
    r = next;
  }
  std::string others;
  for (int q : stuck)
    if (!named[U(q)])
      others += (others.empty() ? "; also stuck: rank " : ", rank ") + std::to_string(q) + " at #" +
                std::to_string(pc[U(q)]) + " " + to_string(s.ranks[U(q)][U(pc[U(q)])]);
  throw ScheduleError(msg + others + " (sends are buffered, receives block)");
}

}  // namespace

void validate(const Schedule& s, std::int64_t max_inflight) {
  check_shape(s);
  check_matching(s);
  check_complete(s);
  check_order(s, max_inflight);
  check_progress(s);
}

std::vector<std::int64_t> peak_inflight(const Schedule& s) {
  std::vector<std::int64_t> peak(s.ranks.size(), 0);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    std::int64_t now = 0;
    for (const Instr& in : s.ranks[r]) {
      if (in.op == Op::Forward) peak[r] = std::max(peak[r], ++now);
      if (is_input_backward(in.op)) --now;
    }
  }
  return peak;
}

std::vector<std::vector<std::int64_t>> held_activations(const Schedule& s) {
  std::vector<std::vector<std::int64_t>> out(U(s.pp), std::vector<std::int64_t>(U(s.virtual_stages), 0));
  for (int r = 0; r < s.pp; ++r) {
    std::vector<std::set<int>> live(U(s.virtual_stages));
    for (const Instr& in : s.ranks[U(r)]) {
      if (in.chunk < 0) continue;
      auto& l = live[U(in.chunk)];
      if (in.op == Op::RecvAct || in.op == Op::Forward) l.insert(in.microbatch);
      if (in.op == Op::Backward || in.op == Op::BackwardWeight) l.erase(in.microbatch);
      std::int64_t& peak = out[U(r)][U(in.chunk)];
      peak = std::max<std::int64_t>(peak, std::int64_t(l.size()));
    }
  }
  return out;
}

std::int64_t max_held_activations(const Schedule& s) {
  std::int64_t most = 0;
  for (const auto& r : held_activations(s)) {
    std::int64_t n = 0;
    for (std::int64_t h : r) n += h;
    most = std::max(most, n);
  }
  return most;
}

}  // namespace adgt::pp
