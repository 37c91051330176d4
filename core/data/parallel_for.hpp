// The tokenizers' parallel loop (tokenizer.cpp, hf_tokenizer.cpp).
#pragma once
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace adgt {

// Runs body(i) for i in [0, n) on all OpenMP threads; rethrows the first error.
template <class F>
void parallel_for(int64_t n, int64_t chunk, F&& body) {
  std::string first_error;
#pragma omp parallel for schedule(dynamic, chunk)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i);
    } catch (const std::exception& e) {
#pragma omp critical(adgt_tokenizer_error)
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw std::runtime_error(first_error);
}

}  // namespace adgt
