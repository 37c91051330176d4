// Checkpoint save/load: round trip, validation errors, atomicity and pruning.
// The independent check (h5py reading what C++ wrote, zlib's crc32) is
// tests/checkpoint_h5py_check.py.
#include <catch2/catch.hpp>

#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/checksum.hpp"
#include "core/checkpoint/hdf5_util.hpp"

using namespace adgt;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path fresh_root(const std::string& name) {
  const fs::path p = fs::path(ADGT_BINARY_DIR) / "test_tmp" / ("checkpoint_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.seq_len = 8;
  return m;
}

// Arbitrary bit patterns (NaN payloads, denormals, -0 included): the round
// trip must preserve every bit, padding gets garbage that load must not copy.
CheckpointState make_state(const std::vector<ParamSpec>& specs, int64_t step, uint64_t salt) {
  CheckpointState st;
  st.step = step;
  st.samples_seen = step * 8 + 3;
  st.seed = 0xFEEDFACECAFEBEEFull ^ salt;
  st.config_yaml = "model:\n  d_model: 16\n# ünïcødé\ntrain:\n  steps: " + std::to_string(step) + "\n";
  st.rng_state = {1, 2, 0xFFFFFFFFFFFFFFFFull, salt};
  st.specs = specs;
  const auto n = static_cast<size_t>(total_numel(specs));
  std::mt19937_64 rng(salt * 7919 + static_cast<uint64_t>(step));
  for (auto* v : {&st.params, &st.exp_avg, &st.exp_avg_sq}) {
    v->resize(n);
    for (float& x : *v) {
      const auto bits = static_cast<uint32_t>(rng());
      std::memcpy(&x, &bits, 4);
    }
  }
  st.params[0] = -0.0f;
  st.params[1] = std::numeric_limits<float>::denorm_min();
  return st;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

void require_tensors_equal(const CheckpointState& saved, const CheckpointState& loaded) {
  for (size_t i = 0; i < saved.specs.size(); ++i) {
    const ParamSpec& s = saved.specs[i];
    const ParamSpec& l = loaded.specs[i];
    INFO(s.name);
    REQUIRE(same_bits(saved.params.data() + s.offset, loaded.params.data() + l.offset, s.numel));
    REQUIRE(same_bits(saved.exp_avg.data() + s.offset, loaded.exp_avg.data() + l.offset, s.numel));
    REQUIRE(same_bits(saved.exp_avg_sq.data() + s.offset, loaded.exp_avg_sq.data() + l.offset, s.numel));
  }
}

// Byte offset of a dataset's contiguous data inside the file.
uint64_t dataset_offset(const fs::path& file, const std::string& path) {
  h5::QuietErrors quiet;
  h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  h5::Id d(ADGT_H5(H5Dopen2(f, path.c_str(), H5P_DEFAULT)), H5Dclose);
  const haddr_t off = H5Dget_offset(d);
  REQUIRE(off != HADDR_UNDEF);
  return off;
}

void flip_bit(const fs::path& file, uint64_t at) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.read(&c, 1);
  c ^= 0x10;
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&c, 1);
}

size_t count_entries(const fs::path& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace

TEST_CASE("checkpoint crc32 matches the zlib definition and combines", "[checkpoint]") {
  REQUIRE(crc32("123456789", 9) == 0xCBF43926u);
  REQUIRE(crc32("", 0) == 0u);
  std::vector<unsigned char> known(1000);
  for (size_t i = 0; i < known.size(); ++i) known[i] = static_cast<unsigned char>(i * 7 % 251);
  REQUIRE(crc32(known.data(), known.size()) == 0x04da8651u);  // python3: zlib.crc32(...)
  // The carry-less-multiply path (>= 64 bytes on x86) against the table path, every length and alignment.
  for (size_t off = 0; off < 17; ++off)
    for (size_t len = 0; len < 300; ++len) {
      INFO("off " << off << " len " << len);
      REQUIRE(crc32_update(0xDEADBEEF, known.data() + off, len) ==
              crc32_update_portable(0xDEADBEEF, known.data() + off, len));
    }
  std::vector<unsigned char> buf((size_t(17) << 20) + 13);
  std::mt19937 rng(5);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint32_t whole = crc32(buf.data(), buf.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(15), size_t(1000), buf.size() / 2})
    REQUIRE(crc32_combine(crc32(buf.data(), cut), crc32(buf.data() + cut, buf.size() - cut), buf.size() - cut) ==
            whole);
  REQUIRE(crc32_update(crc32(buf.data(), 99), buf.data() + 99, buf.size() - 99) == whole);
  const auto many = crc32_many({{buf.data(), buf.size()}, {buf.data(), 0}, {buf.data() + 3, 40}});
  REQUIRE(many == std::vector<uint32_t>{whole, 0u, crc32(buf.data() + 3, 40)});
}

TEST_CASE("checkpoint ADGT_H5 names the call, file and line", "[checkpoint]") {
  h5::QuietErrors quiet;
  const std::string msg =
      error_of([] { (void)ADGT_H5(H5Fopen("/nonexistent/adgt.h5", H5F_ACC_RDONLY, H5P_DEFAULT)); });
  REQUIRE_THAT(msg, Contains("H5Fopen(\"/nonexistent/adgt.h5\""));
  REQUIRE_THAT(msg, Contains("checkpoint_test.cpp:"));
  REQUIRE_THAT(msg, Contains("on host"));
}

TEST_CASE("checkpoint round trip is bitwise", "[checkpoint]") {
  const fs::path root = fresh_root("roundtrip");
  const auto specs = build_param_table(tiny_model());
  const CheckpointState st = make_state(specs, 100, 1);
  const std::string dir = save_checkpoint(root.string(), st, 3);
  REQUIRE(dir == (root / "step_100").string());
  REQUIRE(fs::is_regular_file(root / "step_100" / "checkpoint.h5"));
  REQUIRE(fs::is_regular_file(root / "step_100" / "COMPLETE"));
  REQUIRE(count_entries(root) == 1);  // no temporary directory left behind

  for (const std::string& path : {dir, dir + "/checkpoint.h5"}) {
    const CheckpointState ld = load_checkpoint(path, specs);
    REQUIRE(ld.step == 100);
    REQUIRE(ld.samples_seen == st.samples_seen);
    REQUIRE(ld.seed == st.seed);
    REQUIRE(ld.config_yaml == st.config_yaml);
    REQUIRE(ld.rng_state == st.rng_state);
    REQUIRE(ld.specs.size() == specs.size());
    REQUIRE(ld.params.size() == st.params.size());
    require_tensors_equal(st, ld);
    // Padding between tensors is zero, not whatever the writer had there.
    const ParamSpec& first = specs[0];
    for (int64_t i = first.numel; i < specs[1].offset; ++i) REQUIRE(ld.params[static_cast<size_t>(i)] == 0.0f);
  }

  SECTION("empty rng_state and config round-trip") {
    CheckpointState e = make_state(specs, 7, 2);
    e.rng_state.clear();
    e.config_yaml.clear();
    const CheckpointState ld = load_checkpoint(save_checkpoint(root.string(), e, 0), specs);
    REQUIRE(ld.rng_state.empty());
    REQUIRE(ld.config_yaml.empty());
    require_tensors_equal(e, ld);
  }
}

TEST_CASE("checkpoint loads into another flat layout", "[checkpoint]") {
  const fs::path root = fresh_root("layout");
  const auto specs = build_param_table(tiny_model());
  const CheckpointState st = make_state(specs, 3, 3);
  const std::string dir = save_checkpoint(root.string(), st, 0);
  // Reverse order, odd gaps: offsets come from `expected`, not from the file.
  std::vector<ParamSpec> other(specs.rbegin(), specs.rend());
  int64_t off = 5;
  for (ParamSpec& p : other) {
    p.offset = off;
    off += p.numel + 3;
  }
  // total_numel() uses the last entry: make sure it covers everything.
  const CheckpointState ld = load_checkpoint(dir, other);
  REQUIRE(static_cast<int64_t>(ld.params.size()) == total_numel(other));
  for (const ParamSpec& p : other) {
    const auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == p.name; });
    INFO(p.name);
    REQUIRE(same_bits(st.params.data() + it->offset, ld.params.data() + p.offset, p.numel));
    REQUIRE(same_bits(st.exp_avg_sq.data() + it->offset, ld.exp_avg_sq.data() + p.offset, p.numel));
  }
}

TEST_CASE("checkpoint shape and name mismatches name the tensor", "[checkpoint]") {
  const fs::path root = fresh_root("mismatch");
  const auto specs = build_param_table(tiny_model());
  const std::string dir = save_checkpoint(root.string(), make_state(specs, 10, 4), 0);
  const std::string file = dir + "/checkpoint.h5";

  SECTION("shape") {
    ModelConfig m = tiny_model();
    m.ffn_hidden = 48;
    const std::string msg = error_of([&] { load_checkpoint(dir, build_param_table(m)); });
    REQUIRE_THAT(msg, Contains("checkpoint " + file + ": tensor model/model.layers.0.mlp.gate_proj.weight has "
                                                      "shape (40,16), the model expects (48,16)"));
  }
  SECTION("missing tensor") {
    ModelConfig m = tiny_model();
    m.n_layers = 3;
    const std::string msg = error_of([&] { load_checkpoint(dir, build_param_table(m)); });
    REQUIRE_THAT(msg, Contains(file));
    REQUIRE_THAT(msg, Contains("tensor model/model.layers.2.input_layernorm.weight is missing"));
  }
  SECTION("extra tensor") {
    ModelConfig m = tiny_model();
    m.tie_embeddings = true;
    const std::string msg = error_of([&] { load_checkpoint(dir, build_param_table(m)); });
    REQUIRE_THAT(msg, Contains("tensor model/lm_head.weight is in the checkpoint but not in the model"));
  }
  SECTION("save rejects a buffer of the wrong size") {
    CheckpointState st = make_state(specs, 11, 4);
    st.exp_avg.pop_back();
    const std::string msg = error_of([&] { save_checkpoint(root.string(), st, 0); });
    REQUIRE_THAT(msg, Contains("exp_avg has"));
    REQUIRE(!fs::exists(root / "step_11"));
  }
}

TEST_CASE("checkpoint without COMPLETE marker is rejected and skipped", "[checkpoint]") {
  const fs::path root = fresh_root("marker");
  const auto specs = build_param_table(tiny_model());
  const std::string d1 = save_checkpoint(root.string(), make_state(specs, 1, 5), 0);
  const std::string d2 = save_checkpoint(root.string(), make_state(specs, 2, 5), 0);
  REQUIRE(resolve_resume("auto", root.string()) == d2);
  fs::remove(fs::path(d2) / "COMPLETE");

  const std::string msg = error_of([&] { load_checkpoint(d2, specs); });
  REQUIRE_THAT(msg, Contains("checkpoint " + d2 + "/checkpoint.h5"));
  REQUIRE_THAT(msg, Contains("no COMPLETE marker"));
  REQUIRE_THAT(msg, Contains("step_1"));  // points at what is available
  REQUIRE(resolve_resume("auto", root.string()) == d1);
  REQUIRE(list_checkpoints(root.string()) == std::vector<std::pair<int64_t, std::string>>{{1, d1}});
}

TEST_CASE("checkpoint bit flip fails the checksum naming the tensor", "[checkpoint]") {
  const fs::path root = fresh_root("bitflip");
  const auto specs = build_param_table(tiny_model());
  const std::string dir = save_checkpoint(root.string(), make_state(specs, 5, 6), 0);
  const fs::path file = fs::path(dir) / "checkpoint.h5";
  REQUIRE_NOTHROW(load_checkpoint(dir, specs));

  for (const std::string name : {"model/model.layers.1.mlp.up_proj.weight", "optim/exp_avg_sq/model.norm.weight"}) {
    DYNAMIC_SECTION(name) {
      flip_bit(file, dataset_offset(file, name) + 37);
      const std::string msg = error_of([&] { load_checkpoint(dir, specs); });
      REQUIRE_THAT(msg, Contains("checkpoint " + file.string() + ": tensor " + name + " fails its checksum"));
    }
  }
}

TEST_CASE("truncated or damaged checkpoint file is an error, not a crash", "[checkpoint]") {
  const fs::path root = fresh_root("truncated");
  const auto specs = build_param_table(tiny_model());
  const std::string dir = save_checkpoint(root.string(), make_state(specs, 9, 7), 0);
  const fs::path file = fs::path(dir) / "checkpoint.h5";
  const auto size = fs::file_size(file);

  SECTION("size recorded in COMPLETE") {
    fs::resize_file(file, size / 2);
    const std::string msg = error_of([&] { load_checkpoint(dir, specs); });
    REQUIRE_THAT(msg, Contains("checkpoint " + file.string() + ": "));
    REQUIRE_THAT(msg, Contains("truncated"));
  }
  SECTION("HDF5's own check") {
    // A marker without the size line: the HDF5 library must catch it.
    std::ofstream(fs::path(dir) / "COMPLETE") << "adgt checkpoint\nstep=9\n";
    for (uintmax_t keep : {size / 2, uintmax_t(3000), uintmax_t(100), uintmax_t(0)}) {
      fs::resize_file(file, keep);
      const std::string msg = error_of([&] { load_checkpoint(dir, specs); });
      INFO(keep);
      REQUIRE_THAT(msg, Contains("checkpoint " + file.string() + ": "));
    }
  }
  SECTION("not HDF5 at all") {
    std::ofstream(file, std::ios::trunc) << "this is not an HDF5 file\n";
    std::ofstream(fs::path(dir) / "COMPLETE") << "adgt checkpoint\nstep=9\n";
    const std::string msg = error_of([&] { load_checkpoint(dir, specs); });
    REQUIRE_THAT(msg, Contains("checkpoint " + file.string() + ": not an HDF5 file"));
  }
}

TEST_CASE("checkpoint keep prunes to the newest complete ones", "[checkpoint]") {
  const fs::path root = fresh_root("prune");
  const auto specs = build_param_table(tiny_model());
  for (int64_t s = 1; s <= 5; ++s) save_checkpoint(root.string(), make_state(specs, s * 10, 8), 2);
  const auto all = list_checkpoints(root.string());
  REQUIRE(all.size() == 2);
  REQUIRE(all[0].first == 40);
  REQUIRE(all[1].first == 50);
  REQUIRE(count_entries(root) == 2);  // pruned directories are gone, no temporaries
  REQUIRE(resolve_resume("auto", root.string()) == (root / "step_50").string());

  SECTION("keep = 0 keeps all") {
    for (int64_t s = 6; s <= 8; ++s) save_checkpoint(root.string(), make_state(specs, s * 10, 8), 0);
    REQUIRE(list_checkpoints(root.string()).size() == 5);
  }
  SECTION("an incomplete step directory is neither counted nor deleted") {
    fs::create_directories(root / "step_45");
    save_checkpoint(root.string(), make_state(specs, 60, 8), 2);
    REQUIRE(list_checkpoints(root.string()).size() == 2);
    REQUIRE(fs::exists(root / "step_45"));
  }
  SECTION("steps sort numerically, not as text") {
    save_checkpoint(root.string(), make_state(specs, 100, 8), 2);
    const auto now = list_checkpoints(root.string());
    REQUIRE(now.size() == 2);
    REQUIRE(now[0].first == 50);
    REQUIRE(now[1].first == 100);
  }
  SECTION("saving an existing step replaces it") {
    const CheckpointState again = make_state(specs, 50, 99);
    save_checkpoint(root.string(), again, 2);
    REQUIRE(list_checkpoints(root.string()).size() == 2);
    REQUIRE(count_entries(root) == 2);
    require_tensors_equal(again, load_checkpoint((root / "step_50").string(), specs));
  }
}

TEST_CASE("checkpoint resolve_resume", "[checkpoint]") {
  const fs::path root = fresh_root("resolve");
  REQUIRE(resolve_resume("", root.string()).empty());
  REQUIRE(resolve_resume("auto", root.string()).empty());
  REQUIRE(resolve_resume("auto", (root / "does_not_exist").string()).empty());
  const auto specs = build_param_table(tiny_model());
  const std::string d = save_checkpoint(root.string(), make_state(specs, 4, 9), 0);
  REQUIRE(resolve_resume(d, root.string()) == d);
  const std::string msg = error_of([&] { resolve_resume((root / "step_999").string(), root.string()); });
  REQUIRE_THAT(msg, Contains("step_999' does not exist"));
  REQUIRE_THAT(msg, Contains("step_4"));
}
