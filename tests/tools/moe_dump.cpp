// adgt-moe-dump: runs the mixture-of-experts block (core/model/moe.hpp, one rank)
// on seeded random inputs and writes, per case, everything an independent
// implementation needs to check it (tests/torch/moe_ref.py): the options,
// inputs, weights, selection bias and output gradient, and adgt's output, aux
// loss, load, dropped count and gradients (dx, gate, w1, w2, w3).
//
// Layout: /<case>/{x (N,C), gate (E,C), w1 (E,F,C), w2 (E,C,F), w3 (E,F,C),
// bias (E), dout (N,C), out, dx, dgate, dw1, dw2, dw3, aux (1), load (E)
// int64, dropped (1) int64} in the run's dtype (bias, aux: f64); the case
// group's attributes hold top_k, aux_loss_coef, aux_grad_scale,
// capacity_factor, capacity_segment and aux_free.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/checkpoint/hdf5_util.hpp"
#include "core/model/moe.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"

using namespace adgt;

namespace {

h5::Id make_group(hid_t parent, const char* name) {
  return h5::Id(ADGT_H5(H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
}

void write(hid_t loc, const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
           const void* data) {
  h5::Id space(ADGT_H5(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose);
  h5::Id ds(
      ADGT_H5(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
      H5Dclose);
  ADGT_H5(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void attr(hid_t loc, const char* name, double v) {
  h5::Id space(ADGT_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id a(ADGT_H5(H5Acreate2(loc, name, H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT)),
           H5Aclose);
  ADGT_H5(H5Awrite(a, H5T_NATIVE_DOUBLE, &v));
}

template <class T>
hid_t h5type() {
  return std::is_same_v<T, double> ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT;
}

template <class T>
std::vector<T> randn(size_t n, uint64_t seed, double scale) {
  Rng r(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = T(scale * r.normal());
  return v;
}

struct Case {
  const char* name;
  MoeOptions opt;
  int64_t N;
  double aux_grad_scale;
  bool bias;
};

template <class T>
void run_case(hid_t file, const Case& cs, DType dt) {
  CpuBackend be;
  const int64_t N = cs.N, C = 12, F = 10, E = cs.opt.n_experts, k = cs.opt.top_k;
  const uint64_t seed = 7000 + uint64_t(E * 10 + k);
  std::vector<T> x = randn<T>(size_t(N * C), seed, 1.0),
                 gate = randn<T>(size_t(E * C), seed + 1, 0.6),
                 w1 = randn<T>(size_t(E * F * C), seed + 2, 0.3),
                 w2 = randn<T>(size_t(E * C * F), seed + 3, 0.3),
                 w3 = randn<T>(size_t(E * F * C), seed + 4, 0.3),
                 dout = randn<T>(size_t(N * C), seed + 5, 1.0);
  std::vector<double> bias(size_t(E), 0.0);
  if (cs.bias)
    for (int64_t e = 0; e < E; ++e) bias[size_t(e)] = 0.08 * double((e * 3) % 5) - 0.12;
  auto t2 = [&](std::vector<T>& v, int64_t off, int64_t r, int64_t c) {
    return Tensor(v.data() + off, dt, {r, c});
  };
  auto params = [&](std::vector<T>& g, std::vector<T>& a, std::vector<T>& b, std::vector<T>& c) {
    MoeParams p;
    p.gate = t2(g, 0, E, C);
    for (int64_t e = 0; e < E; ++e) {
      p.w1.push_back(t2(a, e * F * C, F, C));
      p.w2.push_back(t2(b, e * C * F, C, F));
      p.w3.push_back(t2(c, e * F * C, F, C));
    }
    return p;
  };
  MoeLayer moe(be, dt, N, C, F, cs.opt);
  moe.add_slot();
  if (cs.bias) moe.set_bias(bias);
  std::vector<T> out(size_t(N * C)), dx(size_t(N * C), T(0)), dgate(gate.size(), T(0)),
      dw1(w1.size(), T(0)), dw2(w2.size(), T(0)), dw3(w3.size(), T(0));
  const double aux = moe.forward(0, t2(out, 0, N, C), t2(x, 0, N, C), params(gate, w1, w2, w3));
  moe.backward(0, t2(dx, 0, N, C), params(gate, w1, w2, w3), params(dgate, dw1, dw2, dw3),
               t2(dout, 0, N, C), cs.aux_grad_scale);
  const MoeStats& st = moe.last_stats();

  h5::Id g = make_group(file, cs.name);
  attr(g, "top_k", double(k));
  attr(g, "aux_loss_coef", cs.opt.aux_loss_coef);
  attr(g, "aux_grad_scale", cs.aux_grad_scale);
  attr(g, "capacity_factor", cs.opt.capacity_factor);
  attr(g, "capacity_segment", double(cs.opt.capacity_segment));
  attr(g, "aux_free", cs.opt.aux_free ? 1.0 : 0.0);
  const hid_t ty = h5type<T>();
  const hsize_t n = hsize_t(N), c = hsize_t(C), f = hsize_t(F), e = hsize_t(E);
  write(g, "x", ty, {n, c}, x.data());
  write(g, "gate", ty, {e, c}, gate.data());
  write(g, "w1", ty, {e, f, c}, w1.data());
  write(g, "w2", ty, {e, c, f}, w2.data());
  write(g, "w3", ty, {e, f, c}, w3.data());
  write(g, "bias", H5T_NATIVE_DOUBLE, {e}, bias.data());
  write(g, "dout", ty, {n, c}, dout.data());
  write(g, "out", ty, {n, c}, out.data());
  write(g, "dx", ty, {n, c}, dx.data());
  write(g, "dgate", ty, {e, c}, dgate.data());
  write(g, "dw1", ty, {e, f, c}, dw1.data());
  write(g, "dw2", ty, {e, c, f}, dw2.data());
  write(g, "dw3", ty, {e, f, c}, dw3.data());
  write(g, "aux", H5T_NATIVE_DOUBLE, {1}, &aux);
  write(g, "load", H5T_NATIVE_INT64, {e}, st.load.data());
  write(g, "dropped", H5T_NATIVE_INT64, {1}, &st.dropped);
  std::printf("moe-dump: %s: N=%lld E=%lld top_k=%lld aux=%.6g dropped=%lld\n", cs.name,
              (long long)N, (long long)E, (long long)k, aux, (long long)st.dropped);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"adgt-moe-dump: the MoE block's outputs and gradients for an independent check"};
  std::string out_path, dtype = "f64";
  app.add_option("--out", out_path, "output HDF5 file")->required();
  app.add_option("--dtype", dtype, "f32 or f64")->check(CLI::IsMember({"f32", "f64"}));
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<Case> cases;
    auto opt = [](int64_t E, int64_t k, double coef) {
      MoeOptions o;
      o.n_experts = E, o.top_k = k, o.aux_loss_coef = coef;
      return o;
    };
    cases.push_back({"top2_dropless", opt(8, 2, 0.02), 24, 0.5, false});
    cases.push_back({"top1", opt(4, 1, 0.1), 16, 1.0, false});
    MoeOptions cap = opt(8, 2, 0.05);
    cap.capacity_factor = 0.8;
    cap.capacity_segment = 12;
    cases.push_back({"top2_capacity", cap, 24, 0.25, false});
    MoeOptions af = opt(6, 3, 0.0);
    af.aux_free = true;
    cases.push_back({"top3_aux_free", af, 20, 1.0, true});
    h5::Id file(ADGT_H5(H5Fcreate(out_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)),
                H5Fclose);
    attr(file, "dtype_bits", dtype == "f64" ? 64.0 : 32.0);
    for (const Case& c : cases) {
      if (dtype == "f64")
        run_case<double>(file, c, DType::F64);
      else
        run_case<float>(file, c, DType::F32);
    }
    ADGT_H5(H5Fclose(file.release()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
