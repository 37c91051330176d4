// Denormal floats on the CPU backend (train.flush_denormals, docs/config.md).
//
// A trained model's attention probabilities and gradients underflow into
// denormal range, and x86 and Arm cores take a microcode assist of 100+
// cycles for each operation that reads or writes one: on this project's
// validation model the CPU step slowed 2.5-3.5x between step 50 and step
// 1000 of a clean run (docs/precision.md, "Denormals on the CPU"). GPUs do not pay
// for denormals, and their bf16 tensor cores flush them anyway.
//
// FlushDenormals sets flush-to-zero and denormals-are-zero (x86 MXCSR FTZ +
// DAZ; Arm FPCR.FZ) on the calling thread and on every thread of the OpenMP
// pool (OpenBLAS's OpenMP flavour runs its GEMMs on them; threads created
// later copy the creating thread's mode), and restores what each had when it
// goes out of scope.
#pragma once

namespace adgt::cpu {

// Whether this build can flush denormals (x86-64 and AArch64).
bool flush_denormals_supported();
// Whether the calling thread flushes denormals now.
bool flushing_denormals();

class FlushDenormals {
 public:
  explicit FlushDenormals(bool on = true);
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  bool active_ = false;
  bool was_on_ = false;  // the calling thread's mode before
};

}  // namespace adgt::cpu
