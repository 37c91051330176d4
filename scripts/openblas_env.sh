# Sourced by scripts/test.sh and scripts/demo.sh (and usable by hand).
# Debian 12's OpenBLAS picks its kernels from the CPU model; on a CPU it does
# not recognise (virtual CPUs that hide their model: "Intel(R) Xeon(R)
# Processor", for one) it falls back to its Prescott (SSE3) kernels, 3-4x
# slower GEMMs, and adgt warns. Where OPENBLAS_CORETYPE is unset and the CPU
# has AVX2 and FMA, Haswell's kernels are used, as on the machines that set it.
# A value already set is left as it is.
if [[ -z "${OPENBLAS_CORETYPE:-}" && -r /proc/cpuinfo ]] &&
  grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=Haswell
  echo "OPENBLAS_CORETYPE was unset: Haswell (this CPU has AVX2 and FMA; scripts/openblas_env.sh)"
fi
