#include "parallel/pipeline/schedule_json.hpp"

#include "kernels/check.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt {

nlohmann::json schedule_ranks_json(const pp::Schedule& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& list : s.ranks) {
    nlohmann::json l = nlohmann::json::array();
    for (const pp::Instr& x : list) l.push_back({int(x.op), x.microbatch, x.chunk, x.peer});
    ranks.push_back(l);
  }
  return ranks;
}

pp::Schedule schedule_from_json(const pp::Schedule& like, const std::string& name,
                                const std::string& detail, const nlohmann::json& ranks) {
  pp::Schedule s;
  s.pp = like.pp;
  s.microbatches = like.microbatches;
  s.virtual_stages = like.virtual_stages;
  s.placement = like.placement;  // the model's stages stay where they are
  s.name = name;
  s.detail = detail;
  for (const auto& l : ranks) {
    s.ranks.emplace_back();
    for (const auto& x : l) {
      const int op = x[0].get<int>();
      ADGT_CHECK(op >= 0 && op < pp::kNumOps, "schedule from a controller: instruction op " << op);
      s.ranks.back().push_back({pp::Op(op), x[1].get<int>(), x[2].get<int>(), x[3].get<int>()});
    }
  }
  pp::validate(s);  // the same check on every rank before any rank runs it
  return s;
}

}  // namespace adgt
