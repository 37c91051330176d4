#include "parallel/comm/device_comm.hpp"

#include <chrono>
#include <cstring>

#include "kernels/check.hpp"

namespace adgt {

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// A started MPI collective on host copies; the copy back to the device
// happens once, when it completes.
struct StagedWork final : Work::Impl {
  Work inner;
  std::vector<char> in_buf, out_buf;
  Tensor dev_out, host_out;
  Backend* be = nullptr;
  double* staging_seconds = nullptr;
  bool done = false;
  void finish() {
    if (done) return;
    done = true;
    const auto t0 = clock_type::now();
    be->to_device(dev_out.data, host_out.data, dev_out.bytes());
    *staging_seconds += since(t0);
  }
  bool test() override {
    if (!inner.test()) return false;
    finish();
    return true;
  }
  void wait() override {
    inner.wait();
    finish();
  }
};
}  // namespace

DeviceComm::DeviceComm(Comm& host, Backend& be, std::unique_ptr<Comm> device)
    : host_(host), be_(be), device_(std::move(device)) {}

DeviceComm::~DeviceComm() = default;

bool DeviceComm::on_device(std::initializer_list<const Tensor*> ts, const char* op) const {
  int dev = 0, host = 0;
  for (const Tensor* t : ts) {
    if (!t->data || t->numel() == 0) continue;
    (be_.is_device_pointer(t->data) ? dev : host)++;
  }
  ADGT_CHECK(!(dev && host), "DeviceComm(" << host_.name() << ")::" << op
                                           << ": some tensors are device memory and some host "
                                              "memory; a collective takes one kind");
  return dev > 0;
}

Tensor DeviceComm::stage(const Tensor& t, std::vector<char>& buf, bool copy) {
  buf.resize(t.bytes());
  Tensor h = t;
  h.data = buf.data();
  if (copy && t.bytes()) {
    const auto t0 = clock_type::now();
    be_.to_host(h.data, t.data, t.bytes());
    staging_seconds_ += since(t0);
  }
  return h;
}

void DeviceComm::unstage(const Tensor& dev, const Tensor& host) {
  if (!dev.bytes()) return;
  const auto t0 = clock_type::now();
  be_.to_device(dev.data, host.data, dev.bytes());
  staging_seconds_ += since(t0);
}

// A group of one moves nothing: identities stay on the device (no staging).
bool DeviceComm::alone_copy(Tensor out, const Tensor& in) {
  if (host_.size() != 1) return false;
  if (out.data != in.data && out.numel()) be_.copy(out, in);
  return true;
}

void DeviceComm::all_reduce(Tensor t, ReduceOp op) {
  if (!on_device({&t}, "all_reduce")) return host_.all_reduce(t, op);
  if (host_.size() == 1) return;
  if (device_) return device_->all_reduce(t, op);
  std::vector<char> b;
  const Tensor h = stage(t, b, true);
  host_.all_reduce(h, op);
  unstage(t, h);
}

void DeviceComm::reduce_scatter(Tensor out, const Tensor& in) {
  if (!on_device({&out, &in}, "reduce_scatter")) return host_.reduce_scatter(out, in);
  if (alone_copy(out, in)) return;
  if (device_) return device_->reduce_scatter(out, in);
  std::vector<char> bi, bo;
  const Tensor hi = stage(in, bi, true), ho = stage(out, bo, false);
  host_.reduce_scatter(ho, hi);
  unstage(out, ho);
}

void DeviceComm::all_gather(Tensor out, const Tensor& in) {
  if (!on_device({&out, &in}, "all_gather")) return host_.all_gather(out, in);
  if (alone_copy(out, in)) return;
  if (device_) return device_->all_gather(out, in);
  std::vector<char> bi, bo;
  const Tensor hi = stage(in, bi, true), ho = stage(out, bo, false);
  host_.all_gather(ho, hi);
  unstage(out, ho);
}

// Copies out (and in, when given) to host buffers the Work owns, starts the
// host collective on them, and copies out back when the Work completes.
Work DeviceComm::start_staged(Tensor out, const Tensor* in,
                              const std::function<Work(Tensor, const Tensor&)>& start) {
  auto w = std::make_shared<StagedWork>();
  const bool in_place = !in;
  w->host_out = stage(out, w->out_buf, in_place);
  const Tensor hi = in_place ? w->host_out : stage(*in, w->in_buf, true);
  w->dev_out = out;
  w->be = &be_;
  w->staging_seconds = &staging_seconds_;
  w->inner = start(w->host_out, hi);
  return Work(w);
}

Work DeviceComm::start_all_reduce(Tensor t, ReduceOp op) {
  if (!on_device({&t}, "start_all_reduce")) return host_.start_all_reduce(t, op);
  if (host_.size() == 1) return {};
  if (device_) return device_->start_all_reduce(t, op);
  return start_staged(t, nullptr, [&](Tensor h, const Tensor&) { return host_.start_all_reduce(h, op); });
}

Work DeviceComm::start_reduce_scatter(Tensor out, const Tensor& in) {
  if (!on_device({&out, &in}, "start_reduce_scatter")) return host_.start_reduce_scatter(out, in);
  if (alone_copy(out, in)) return {};
  if (device_) return device_->start_reduce_scatter(out, in);
  return start_staged(out, &in, [&](Tensor ho, const Tensor& hi) {
    return host_.start_reduce_scatter(ho, hi);
  });
}

Work DeviceComm::start_all_gather(Tensor out, const Tensor& in) {
  if (!on_device({&out, &in}, "start_all_gather")) return host_.start_all_gather(out, in);
  if (alone_copy(out, in)) return {};
  if (device_) return device_->start_all_gather(out, in);
  return start_staged(out, &in, [&](Tensor ho, const Tensor& hi) {
    return host_.start_all_gather(ho, hi);
  });
}

void DeviceComm::broadcast(Tensor t, int root) {
  if (!on_device({&t}, "broadcast")) return host_.broadcast(t, root);
  if (host_.size() == 1) return;
  if (device_) return device_->broadcast(t, root);
  std::vector<char> b;
  const Tensor h = stage(t, b, host_.rank() == root);
  host_.broadcast(h, root);
  unstage(t, h);
}

void DeviceComm::send(const Tensor& t, int peer, int tag) {
  if (!on_device({&t}, "send")) return host_.send(t, peer, tag);
  if (device_) return device_->send(t, peer, tag);
  std::vector<char> b;
  host_.send(stage(t, b, true), peer, tag);
}

void DeviceComm::recv(Tensor t, int peer, int tag) {
  if (!on_device({&t}, "recv")) return host_.recv(t, peer, tag);
  if (device_) return device_->recv(t, peer, tag);
  std::vector<char> b;
  const Tensor h = stage(t, b, false);
  host_.recv(h, peer, tag);
  unstage(t, h);
}

int64_t DeviceComm::isend(const Tensor& t, int peer, int tag) {
  PendingSend s;
  if (!on_device({&t}, "isend")) {
    s.inner_id = host_.isend(t, peer, tag);
  } else if (device_) {
    s.on_device_transport = true;
    s.inner_id = device_->isend(t, peer, tag);
  } else {
    // The host copy is taken now, so t may change as soon as isend returns
    // (stricter than the contract asks).
    const Tensor h = stage(t, s.buf, true);
    s.inner_id = host_.isend(h, peer, tag);
  }
  const int64_t id = next_send_++;
  sends_.emplace(id, std::move(s));
  return id;
}

bool DeviceComm::send_done(int64_t id) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return true;
  Comm& c = it->second.on_device_transport ? *device_ : host_;
  if (!c.send_done(it->second.inner_id)) return false;
  sends_.erase(it);
  return true;
}

Work DeviceComm::start_exchange(const std::vector<Message>& out, int to,
                               const std::vector<Message>& in, int from) {
  bool dev = false;
  for (const auto* list : {&out, &in})
    for (const Message& m : *list) dev = on_device({&m.t}, "start_exchange") || dev;
  if (dev && device_) {
    for (const auto* list : {&out, &in})
      for (const Message& m : *list)
        ADGT_CHECK(on_device({&m.t}, "start_exchange") || !m.t.data || m.t.numel() == 0,
                   "DeviceComm(" << host_.name() << ")::start_exchange: some tensors are device "
                                 "memory and some host memory; an exchange takes one kind");
    return device_->start_exchange(out, to, in, from);
  }
  return Comm::start_exchange(out, to, in, from);  // isend / recv, staged when on the device
}

void DeviceComm::wait_sends() {
  host_.wait_sends();
  if (device_) device_->wait_sends();
  sends_.clear();
}

void DeviceComm::set_wait_hook(std::function<void()> hook) {
  if (device_) device_->set_wait_hook(hook);
  host_.set_wait_hook(std::move(hook));
}

void DeviceComm::all_to_all(Tensor out, const Tensor& in) {
  if (!on_device({&out, &in}, "all_to_all")) return host_.all_to_all(out, in);
  if (alone_copy(out, in)) return;
  if (device_) return device_->all_to_all(out, in);
  std::vector<char> bi, bo;
  const Tensor hi = stage(in, bi, true), ho = stage(out, bo, false);
  host_.all_to_all(ho, hi);
  unstage(out, ho);
}

void DeviceComm::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                             const std::vector<int64_t>& recv_displs, const Tensor& in,
                             const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& send_displs) {
  if (!on_device({&out, &in}, "all_to_allv"))
    return host_.all_to_allv(out, recv_counts, recv_displs, in, send_counts, send_displs);
  if (device_)
    return device_->all_to_allv(out, recv_counts, recv_displs, in, send_counts, send_displs);
  std::vector<char> bi, bo;
  const Tensor hi = stage(in, bi, true), ho = stage(out, bo, false);
  host_.all_to_allv(ho, recv_counts, recv_displs, hi, send_counts, send_displs);
  unstage(out, ho);
}

const CommStats& DeviceComm::stats() const {
  merged_ = host_.stats();
  if (device_) {
    merged_.bytes += device_->stats().bytes;
    merged_.calls += device_->stats().calls;
    merged_.seconds += device_->stats().seconds;
  }
  merged_.seconds += staging_seconds_;
  return merged_;
}

void DeviceComm::reset_stats() {
  host_.reset_stats();
  if (device_) device_->reset_stats();
  staging_seconds_ = 0;
}

#ifndef ADGT_HAVE_NCCL
std::unique_ptr<Comm> make_nccl_comm(Comm&, Backend&) { return nullptr; }
#endif

}  // namespace adgt
