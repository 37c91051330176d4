#include "parallel/pipeline/instruction.hpp"

#include <algorithm>
#include <utility>

namespace adgt::pp {

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::BackwardInput || op == Op::BackwardWeight ||
         op == Op::Backward;
}
bool is_send(Op op) { return op == Op::SendAct || op == Op::SendGrad; }
bool is_recv(Op op) { return op == Op::RecvAct || op == Op::RecvGrad; }
bool is_input_backward(Op op) { return op == Op::BackwardInput || op == Op::Backward; }

const char* op_name(Op op) {
  switch (op) {
    case Op::Forward: return "Forward";
    case Op::BackwardInput: return "BackwardInput";
    case Op::BackwardWeight: return "BackwardWeight";
    case Op::Backward: return "Backward";
    case Op::SendAct: return "SendAct";
    case Op::RecvAct: return "RecvAct";
    case Op::SendGrad: return "SendGrad";
    case Op::RecvGrad: return "RecvGrad";
    case Op::ReduceGrads: return "ReduceGrads";
    case Op::WaitSends: return "WaitSends";
  }
  return "?";
}

std::string to_string(const Instr& in) {
  std::string s = op_name(in.op);
  if (in.op == Op::WaitSends) return s;
  if (in.op == Op::ReduceGrads) return s + "(chunk " + std::to_string(in.chunk) + ")";
  s += "(mb " + std::to_string(in.microbatch) + ", chunk " + std::to_string(in.chunk) + ")";
  if (is_send(in.op)) s += " to rank " + std::to_string(in.peer);
  if (is_recv(in.op)) s += " from rank " + std::to_string(in.peer);
  return s;
}

Schedule from_compute_order(std::string name, int pp, int microbatches, int virtual_stages,
                            const std::vector<std::vector<ComputeStep>>& order, StagePlacement placement) {
  Schedule s;
  s.placement = placement;
  s.pp = pp;
  s.microbatches = microbatches;
  s.virtual_stages = virtual_stages;
  s.name = std::move(name);
  s.ranks.resize(static_cast<size_t>(pp));
  const int last = s.num_stages() - 1;
  for (int r = 0; r < pp; ++r) {
    std::vector<Instr>& out = s.ranks[static_cast<size_t>(r)];
    for (const ComputeStep& c : order.at(static_cast<size_t>(r))) {
      const int st = s.stage(r, c.chunk);
      const Instr self{c.op, c.microbatch, c.chunk, -1};
      if (c.op == Op::Forward) {
        if (st > 0) out.push_back({Op::RecvAct, c.microbatch, c.chunk, s.rank_of_stage(st - 1)});
        out.push_back(self);
        if (st < last) out.push_back({Op::SendAct, c.microbatch, c.chunk, s.rank_of_stage(st + 1)});
      } else if (is_input_backward(c.op)) {
        if (st < last) out.push_back({Op::RecvGrad, c.microbatch, c.chunk, s.rank_of_stage(st + 1)});
        out.push_back(self);
        if (st > 0) out.push_back({Op::SendGrad, c.microbatch, c.chunk, s.rank_of_stage(st - 1)});
      } else {
        out.push_back(self);
      }
    }
    out.push_back({Op::WaitSends, -1, -1, -1});
  }
  return s;
}

Schedule with_grad_reductions(Schedule s) {
  for (auto& list : s.ranks) {
    std::erase_if(list, [](const Instr& in) { return in.op == Op::ReduceGrads; });
    std::vector<int> last(static_cast<size_t>(s.virtual_stages), -1);
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Instr& in = list[static_cast<size_t>(i)];
      if ((in.op == Op::Backward || in.op == Op::BackwardWeight) && in.chunk >= 0 &&
          in.chunk < s.virtual_stages)
        last[static_cast<size_t>(in.chunk)] = i;
    }
    // Insert from the back so earlier positions stay valid.
    std::vector<std::pair<int, int>> at;  // (position, chunk)
    for (int c = 0; c < s.virtual_stages; ++c)
      if (last[static_cast<size_t>(c)] >= 0) at.push_back({last[static_cast<size_t>(c)], c});
    std::sort(at.rbegin(), at.rend());
    for (auto [i, c] : at)
      list.insert(list.begin() + i + 1, Instr{Op::ReduceGrads, -1, c, -1});
  }
  return s;
}

Message message_of(const Schedule& s, int rank, const Instr& in) {
  const int st = s.stage(rank, in.chunk);
  switch (in.op) {
    case Op::SendAct: return {false, in.microbatch, st};
    case Op::RecvAct: return {false, in.microbatch, st - 1};
    case Op::SendGrad: return {true, in.microbatch, st};
    default: return {true, in.microbatch, st + 1};  // RecvGrad
  }
}

std::size_t message_slot(const Schedule& s, const Message& m) {
  return (std::size_t(m.grad) * std::size_t(s.num_stages()) + std::size_t(m.src_stage)) *
             std::size_t(s.microbatches) +
         std::size_t(m.mb);
}

}  // namespace adgt::pp
