// A token shard written a document at a time (adgt-data prepare's streaming
// path, docs/data-format.md "Streaming and --resume"): the tokens go to
// PATH.tmp after a header left blank, the document starts to PATH.starts.tmp;
// finish() writes the header, appends the starts and renames PATH.tmp over
// PATH. The bytes are those write_token_shard (token_shard.hpp) writes for
// the same tokens and starts, and memory does not grow with the shard.
//
// sync() makes everything appended so far durable (fsync); a later run can
// reopen at that point (the token and document counts it had) and go on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace adgt::data {

class ShardAppender {
 public:
  // A new shard: PATH.tmp and PATH.starts.tmp created empty.
  ShardAppender(std::string path, int64_t vocab_size);
  // Reopens the files of an earlier run cut back to `tokens` tokens and
  // `documents` starts (a point that was sync()ed); throws naming the file
  // when it is shorter than that.
  ShardAppender(std::string path, int64_t vocab_size, int64_t tokens, int64_t documents);
  ~ShardAppender();
  ShardAppender(const ShardAppender&) = delete;
  ShardAppender& operator=(const ShardAppender&) = delete;

  // A document starts at the current token count (after at least one token
  // since the previous start; throws naming the shard otherwise).
  void begin_document();
  // Appends ids, each in [0, vocab_size) (throws naming the shard and the id).
  void append(const std::vector<int32_t>& ids);
  int64_t tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }

  // Takes the last document off: its tokens (from its start to the end)
  // are returned, and the shard loses them, the `separator` tokens before
  // its start, and its start.
  std::vector<int32_t> take_last_document(int64_t separator);

  void sync();    // flushes and fsyncs both files
  void finish();  // header + starts into PATH.tmp, fsync, rename over PATH; removes PATH.starts.tmp

 private:
  void flush();
  void write_at(int fd, int64_t offset, const void* p, size_t n, const std::string& what);
  void truncate_to(int64_t tokens, int64_t documents);

  std::string path_, tmp_, starts_tmp_;
  int64_t vocab_ = 0;
  int elem_bytes_ = 2;
  int fd_ = -1, starts_fd_ = -1;
  int64_t tokens_ = 0, documents_ = 0, last_start_ = -1;
  std::vector<char> buf_;           // tokens not yet written, in the file's dtype
  std::vector<int64_t> start_buf_;  // starts not yet written
  int64_t flushed_tokens_ = 0, flushed_documents_ = 0;
};

}  // namespace adgt::data
