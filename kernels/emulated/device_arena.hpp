// The memory of the emulated device (train.device: emulated): one reserved
// range of the address space, mapped PROT_NONE except while a backend call is
// running, so host code that reads or writes it outside the backend faults.
//
//   DeviceArena arena(64 << 30);      // reserves address space, commits nothing
//   void* p = arena.alloc(4096);      // PROT_NONE: *p from host code faults
//   { DeviceArena::Open o(arena, {{p, 4096}}); ... }  // inside: p's pages are read/write
//   arena.release(p);
//
// A backend call opens the pages of the tensors it was given, not the whole
// arena: the cost is two mprotect calls per argument over its own pages, not
// over every page the run has written.
//
// A fault inside the arena is reported (the address, the buffer it falls in,
// a backtrace) by a SIGSEGV handler installed with the first arena; faults
// elsewhere go to the handler that was there before (Open MPI's, or the
// default). One thread calls the backend (the trainer's); other threads never
// touch device memory (the pipeline's progress thread moves host staging
// buffers only).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace adgt {

class DeviceArena {
 public:
  // Reserves `reserve_bytes` of address space (MAP_NORESERVE: no memory is
  // committed until pages are written). Throws when the reservation fails.
  explicit DeviceArena(size_t reserve_bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // 256-byte aligned; first fit over freed blocks, else the top grows.
  // Throws std::bad_alloc-like std::runtime_error when the reservation is used up.
  void* alloc(size_t bytes);
  // Never throws. Unknown pointers are counted (bad_releases()).
  void release(void* p) noexcept;

  // Installs the fault handler again, in front of whatever SIGSEGV action is
  // set now (a forked test child that reset it; the first arena installs it).
  static void install_fault_handler();

  // Whether [p, p + bytes) lies inside one live allocation.
  bool contains(const void* p, size_t bytes = 1) const;
  // Whether p lies anywhere in the reserved range.
  bool in_range(const void* p) const;
  // Bytes in live allocations, and the most ever.
  size_t used() const { return used_; }
  size_t reserved() const { return reserve_; }  // the device's memory: alloc's limit
  size_t peak() const { return peak_; }
  size_t bad_releases() const { return bad_releases_; }
  // "byte 12 of a 4096-byte buffer at 0x..." or "outside every live buffer".
  std::string describe(const void* p) const;

  // Read/write access to the pages of up to kMaxRanges (pointer, bytes)
  // ranges for the current scope; protected again on exit. Scopes do not
  // nest (a backend call never makes another through the emulated device).
  static constexpr int kMaxRanges = 12;
  struct Range {
    const void* p = nullptr;
    size_t bytes = 0;
  };
  class Open {
   public:
    Open(DeviceArena& a, std::initializer_list<Range> ranges);
    Open(DeviceArena& a, const Range* ranges, int n);
    ~Open();
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    DeviceArena& a_;
    size_t lo_[kMaxRanges], hi_[kMaxRanges];  // page offsets
    int n_ = 0;
  };
  bool is_open() const { return depth_ > 0; }

 private:
  void protect(size_t lo, size_t hi, bool rw) const;

  char* base_ = nullptr;
  size_t reserve_ = 0;
  size_t top_ = 0;                    // bytes of the range ever handed out (bump pointer)
  int depth_ = 0;                     // open scopes: 0 or 1
  std::map<size_t, size_t> free_;     // offset -> size of freed blocks, coalesced
  struct Block {
    size_t size = 0;   // rounded to the alignment: what the block takes
    size_t asked = 0;  // what alloc() was asked for: the end that contains() checks
  };
  std::map<size_t, Block> live_;      // offset -> live allocation
  size_t used_ = 0, peak_ = 0, bad_releases_ = 0;
};

}  // namespace adgt
