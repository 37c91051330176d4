// train.attention: parsing, applying it to a backend, and auto's choice
// (contracts in attention_choice.hpp).
#include "kernels/attention_choice.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"
#ifdef ADGT_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace adgt {

AttentionSetting parse_attention_setting(const std::string& value, const char* source) {
  if (value == "auto") return AttentionSetting::Auto;
  if (value == "flash") return AttentionSetting::Flash;
  if (value == "cudnn") return AttentionSetting::Cudnn;
  if (value == "exact") return AttentionSetting::Exact;
  ADGT_CHECK(false, source << "=" << value << " not understood; use " << source << "=auto, flash, "
                           << "cudnn or exact");
}

const char* attention_setting_name(AttentionSetting s) {
  switch (s) {
    case AttentionSetting::Auto: return "auto";
    case AttentionSetting::Flash: return "flash";
    case AttentionSetting::Cudnn: return "cudnn";
    case AttentionSetting::Exact: return "exact";
  }
  return "?";
}

void configure_attention(Backend& be, const std::string& value) {
  const AttentionSetting s = parse_attention_setting(value, "train.attention");
#ifdef ADGT_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) {
    cuda->set_attention(value);
    return;
  }
#endif
  // The CPU backend (and the emulated device, which runs it) has one kernel.
  ADGT_CHECK(s == AttentionSetting::Auto || s == AttentionSetting::Exact,
             "train.attention=" << value << ": the " << be.name()
                                << " backend has one attention kernel (exact); flash and cudnn "
                                << "are CUDA kernels (train.device=cuda). Use train.attention="
                                << "auto or exact");
}

std::string probe_attention(Backend& be, const AttentionShape& s, DType dt) {
#ifdef ADGT_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) {
    if (dt != DType::BF16) return "exact";
    std::string k = cuda->attention_kernel(s);
    if (!k.empty()) return k;
    // Random bf16 q, k, v (an all-zero probe would make every candidate agree).
    const int64_t nq = s.B * s.T * s.n_heads * s.head_dim, nkv = s.B * s.T * s.n_kv_heads * s.head_dim;
    std::vector<bf16_bits> host(size_t(std::max(nq, nkv) + 1));
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (auto& h : host) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      h = float_to_bf16(float(double(x >> 11) * 0x1.0p-53 * 2 - 1));
    }
    Buffer q(be, size_t(nq) * 2), kk(be, size_t(nkv) * 2), v(be, size_t(nkv) * 2),
        out(be, size_t(nq) * 2), saved(be, size_t(be.attention_saved_elems(s)) * 4);
    be.to_device(q.data(), host.data(), q.bytes());
    be.to_device(kk.data(), host.data(), kk.bytes());
    be.to_device(v.data(), host.data() + 1, v.bytes());  // v unlike k
    // Document-masked shapes are decided apart (the mask is part of the
    // backend's key) on a layout of the probe's own: three documents per
    // sequence, so the candidates' masks are compared too.
    AttentionShape ps = s;
    Buffer docs;
    if (s.doc_start) {
      const int64_t len = std::max<int64_t>(1, (s.T + 2) / 3);
      std::vector<int32_t> ds(size_t(s.B * s.T));
      for (size_t i = 0; i < ds.size(); ++i) {
        const int64_t t = int64_t(i) % s.T;
        ds[i] = int32_t(t - t % len);
      }
      docs = Buffer(be, ds.size() * sizeof(int32_t));
      be.to_device(docs.data(), ds.data(), docs.bytes());
      ps.doc_start = static_cast<const int32_t*>(docs.data());
    }
    const Tensor tq(q.data(), DType::BF16, {nq}), tk(kk.data(), DType::BF16, {nkv}),
        tv(v.data(), DType::BF16, {nkv}), to(out.data(), DType::BF16, {nq}),
        ts(saved.data(), DType::F32, {be.attention_saved_elems(s)});
    be.attention_forward(to, ts, tq, tk, tv, ps);
    be.synchronize();
    k = cuda->attention_kernel(s);
    ADGT_CHECK(!k.empty(), "train.attention=auto: the probe call decided no kernel for B="
                               << s.B << " T=" << s.T << " H=" << s.n_heads);
    return k;
  }
#else
  (void)s;
  (void)dt;
#endif
  (void)be;
  return "exact";
}

double attention_rel_bound(DType dt) {
  switch (dt) {
    case DType::BF16: return 1e-2;
    case DType::F32: return 1e-4;
    case DType::F64: return 1e-10;
    default: return 1e-2;
  }
}

double attention_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.size() != b.size()) return kInf;
  double d2 = 0, a2 = 0, b2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(x) || !std::isfinite(y)) return kInf;
    d2 += (x - y) * (x - y);
    a2 += x * x;
    b2 += y * y;
  }
  const double den = std::sqrt(std::max(a2, b2));
  return den == 0 ? 0 : std::sqrt(d2) / den;
}

namespace {

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", x);
  return buf;
}

}  // namespace

AttentionChoice choose_attention(const std::vector<AttentionCandidate>& all,
                                 const AttentionTimer& timer, const AttentionChoiceOptions& opt) {
  // 1. Warm-up run of each (graphs built, pages touched); one that throws is
  // left out (named in the table), then the check.
  AttentionChoice r;
  std::vector<AttentionCandidate> c;
  for (const AttentionCandidate& k : all) {
    try {
      k.run();
      c.push_back(k);
    } catch (const std::exception& e) {
      r.failed.push_back(k.name + ": " + e.what());
    }
  }
  const size_t n = c.size();
  std::vector<size_t> timed;
  for (size_t i = 0; i < n; ++i)
    if (!c[i].reference) timed.push_back(i);
  if (timed.empty()) {
    std::ostringstream os;
    os << opt.setting << ": no attention kernel takes " << opt.what;
    for (const std::string& f : r.failed) os << "; " << f;
    throw std::runtime_error(os.str());
  }

  // err[i][j]: the largest relative error over the outputs, and which output.
  std::vector<std::vector<double>> err(n, std::vector<double>(n, 0.0));
  std::vector<std::vector<int>> worst(n, std::vector<int>(n, 0));
  for (int o = 0; o < int(opt.outputs.size()); ++o) {
    std::vector<std::vector<float>> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = c[i].output(o);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        const double e = attention_rel_err(out[i], out[j]);
        if (e > err[i][j] || std::isnan(e)) err[i][j] = e, worst[i][j] = o;
      }
  }
  std::vector<std::string> bad;
  std::vector<bool> off_reference(n, false);  // disagrees with a reference
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const std::string line = c[i].name + " vs " + c[j].name + ": " +
                               opt.outputs[size_t(worst[i][j])] + " relative error " +
                               sci(err[i][j]);
      r.agreement.push_back(line);
      if (!(err[i][j] <= opt.rel_bound)) {
        bad.push_back(line);
        if (c[i].reference && !c[j].reference) off_reference[j] = true;
        if (c[j].reference && !c[i].reference) off_reference[i] = true;
      }
    }
  if (!bad.empty()) {
    std::ostringstream os;
    os << opt.setting << ": attention kernels disagree on " << opt.what << ":";
    for (const std::string& b : bad) os << " " << b << " > " << sci(opt.rel_bound) << ";";
    os << " (bound " << sci(opt.rel_bound) << ", ||a-b|| / max(||a||, ||b||)).";
    std::vector<std::string> wrong, right;
    for (size_t i : timed) (off_reference[i] ? wrong : right).push_back(c[i].name);
    if (!wrong.empty()) {
      os << " Refused:";
      for (const std::string& w : wrong) os << " " << w;
      os << " (disagrees with the reference kernel).";
      if (!right.empty()) os << " train.attention=" << right.front() << " agrees with it.";
    } else {
      os << " Choose one explicitly (train.attention=" << c[timed.front()].name
         << " or another) after finding which is wrong.";
    }
    throw std::runtime_error(os.str());
  }

  // 2. Timing, round-robin so drift (clocks, other work) hits every candidate alike.
  std::vector<std::vector<double>> t(n);
  if (timed.size() > 1) {
    double total = 0;
    for (int it = 0; it < opt.max_iters; ++it) {
      if (it >= opt.min_iters && total >= opt.budget_s) break;
      for (size_t i : timed) {
        const double s = timer(c[i].run);
        t[i].push_back(s);
        total += s;
      }
    }
  }
  size_t best = timed.front();
  for (size_t i = 0; i < n; ++i) {
    AttentionTiming tm;
    tm.name = c[i].name;
    tm.reference = c[i].reference;
    tm.iters = int(t[i].size());
    if (!t[i].empty()) {
      std::vector<double> s = t[i];
      std::sort(s.begin(), s.end());
      tm.best_s = s.front();
      tm.median_s = s[s.size() / 2];
    }
    r.timings.push_back(tm);
  }
  for (size_t i : timed)
    if (r.timings[i].best_s < r.timings[best].best_s) best = i;  // strict: ties keep the earlier
  r.chosen = c[best].name;
  return r;
}

std::string AttentionChoice::table() const {
  std::ostringstream os;
  char buf[160];
  os << "| kernel | role | runs | best ms | median ms | chosen |\n|---|---|---|---|---|---|\n";
  for (const AttentionTiming& t : timings) {
    if (t.iters > 0)
      std::snprintf(buf, sizeof buf, "| %s | %s | %d | %.3f | %.3f | %s |\n", t.name.c_str(),
                    t.reference ? "reference" : "candidate", t.iters, 1e3 * t.best_s,
                    1e3 * t.median_s, t.name == chosen ? "yes" : "");
    else
      std::snprintf(buf, sizeof buf, "| %s | %s | 0 | - | - | %s |\n", t.name.c_str(),
                    t.reference ? "reference (checked, not timed)" : "candidate (the only one)",
                    t.name == chosen ? "yes" : "");
    os << buf;
  }
  for (const std::string& a : agreement) os << "agreement: " << a << "\n";
  for (const std::string& f : failed) os << "left out (its first run failed): " << f << "\n";
  return os.str();
}

}  // namespace adgt
