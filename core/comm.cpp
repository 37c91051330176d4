#include "core/comm.hpp"

#include <cstring>
#include <stdexcept>

#include "kernels/check.hpp"

namespace adgt {

namespace {
void copy_same(Tensor out, const Tensor& in, const char* op) {
  ADGT_CHECK(out.numel() == in.numel() && out.dtype == in.dtype,
             "SelfComm::" << op << ": out" << out.shape_str() << " in" << in.shape_str());
  if (out.data != in.data) std::memmove(out.data, in.data, in.bytes());
}
}  // namespace

Work Comm::start_exchange(const std::vector<Message>& out, int to, const std::vector<Message>& in,
                          int from) {
  for (const Message& m : out) isend(m.t, to, m.tag);
  struct Impl : Work::Impl {
    Comm* c;
    std::vector<Message> in;
    int from;
    Impl(Comm* c_, std::vector<Message> in_, int from_) : c(c_), in(std::move(in_)), from(from_) {}
    bool test() override { return false; }  // completes in wait()
    void wait() override {
      for (const Message& m : in) c->recv(m.t, from, m.tag);
      c->wait_sends();
    }
  };
  return Work(std::make_shared<Impl>(this, in, from));
}

void SelfComm::reduce_scatter(Tensor out, const Tensor& in) { copy_same(out, in, "reduce_scatter"); }
void SelfComm::all_gather(Tensor out, const Tensor& in) { copy_same(out, in, "all_gather"); }
void SelfComm::all_to_all(Tensor out, const Tensor& in) { copy_same(out, in, "all_to_all"); }
void SelfComm::all_to_allv(Tensor out, const std::vector<int64_t>& rc,
                           const std::vector<int64_t>& rd, const Tensor& in,
                           const std::vector<int64_t>& sc, const std::vector<int64_t>& sd) {
  ADGT_CHECK(rc.size() == 1 && sc.size() == 1 && rc[0] == sc[0],
             "SelfComm::all_to_allv: a group of one sends to itself only");
  const size_t es = dtype_size(in.dtype);
  std::memmove(static_cast<char*>(out.data) + rd[0] * es,
               static_cast<const char*>(in.data) + sd[0] * es, size_t(sc[0]) * es);
}
void SelfComm::send(const Tensor&, int peer, int) {
  ADGT_CHECK(false, "SelfComm::send to rank " << peer << ": a group of one has no peers");
}
void SelfComm::recv(Tensor, int peer, int) {
  ADGT_CHECK(false, "SelfComm::recv from rank " << peer << ": a group of one has no peers");
}

}  // namespace adgt
