// __host__ __device__ marker so per-element math is shared by both backends.
#pragma once
#if defined(__CUDACC__)
#define ADGT_HD __host__ __device__ __forceinline__
#else
#define ADGT_HD inline
#endif
