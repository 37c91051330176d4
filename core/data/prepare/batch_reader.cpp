// The documents of input files, read ahead on a thread (batch_reader.hpp).
#include "core/data/prepare/batch_reader.hpp"

namespace adgt::data {
namespace {
struct Stopped {};  // thrown inside the reading when the reader is dropped
}  // namespace

BatchReader::BatchReader(std::vector<std::string> files, size_t first, SourceOptions o, size_t batch_bytes,
                         size_t batch_docs, size_t depth)
    : files_(std::move(files)),
      first_(first),
      o_(std::move(o)),
      batch_bytes_(batch_bytes),
      batch_docs_(batch_docs),
      depth_(depth),
      thread_([this] { run(); }) {}

BatchReader::~BatchReader() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchReader::push(DocumentBatch&& b) {
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait(lock, [&] { return stop_ || ready_.size() < depth_; });
  if (stop_) throw Stopped{};
  ready_.push_back(std::move(b));
  cv_.notify_all();
}

void BatchReader::run() {
  try {
    for (size_t f = first_; f < files_.size(); ++f) {
      DocumentSource src(o_);
      DocumentBatch b;
      b.file = f;
      size_t bytes = 0;
      src.read(files_[f], [&](std::string_view d) {
        b.docs.emplace_back(d);
        bytes += d.size();
        if (bytes < batch_bytes_ && b.docs.size() < batch_docs_) return;
        b.file_bytes_read = src.file_bytes_read();
        push(std::move(b));
        b = DocumentBatch{};
        b.file = f;
        bytes = 0;
      });
      b.file_end = true;
      b.bad = src.bad();
      b.empty = src.empty();
      push(std::move(b));
    }
  } catch (const Stopped&) {
    return;
  } catch (...) {
    std::lock_guard<std::mutex> lock(m_);
    error_ = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(m_);
  finished_ = true;
  cv_.notify_all();
}

bool BatchReader::next(DocumentBatch& out) {
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait(lock, [&] { return !ready_.empty() || finished_; });
  if (!ready_.empty()) {
    out = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return true;
  }
  if (error_) std::rethrow_exception(error_);
  return false;
}

}  // namespace adgt::data
