// The documents of a list of input files, read on a thread of their own a
// batch at a time, ahead of the encoder (adgt-data prepare's streamed path,
// docs/data-format.md "Streaming and --resume"): while one batch is
// encoded, the next is read. At most `depth` batches wait, so memory is a
// few batches whatever the corpus size.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/data/text_sources.hpp"

namespace adgt::data {

struct DocumentBatch {
  size_t file = 0;                 // index into the file list
  std::vector<std::string> docs;   // in file order
  int64_t file_bytes_read = 0;     // of that file, when the batch was cut
  bool file_end = false;           // the file's last batch (perhaps without documents):
  std::vector<BadRecord> bad;      //   its bad records
  int64_t empty = 0;               //   and its empty texts
};

class BatchReader {
 public:
  // Reads files[first..] with DocumentSource(o); a batch holds documents
  // until it has batch_bytes of text or batch_docs documents.
  BatchReader(std::vector<std::string> files, size_t first, SourceOptions o, size_t batch_bytes,
              size_t batch_docs, size_t depth = 2);
  ~BatchReader();  // stops the reading and waits for it
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  // The next batch, in order; false after the last one. An error of the
  // reading (a bad record with fail_on_bad, a file that cannot be opened)
  // is thrown here, after the batches read before it.
  bool next(DocumentBatch& out);

 private:
  void run();
  void push(DocumentBatch&& b);

  std::vector<std::string> files_;
  size_t first_;
  SourceOptions o_;
  size_t batch_bytes_, batch_docs_, depth_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<DocumentBatch> ready_;
  bool finished_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the rest is set up
};

}  // namespace adgt::data
