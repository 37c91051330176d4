#!/usr/bin/env bash
# Checkpoint I/O benchmark: save and load throughput of a ~134M-parameter model
# state (fp32 weights + AdamW's two moments, 1.6 GB) through the format-version-2
# writer and reader, next to the raw sequential bandwidth of the same disk
# measured in the same run (dd with conv=fsync; dd reading back with a cold
# page cache). Then the SIGKILL-during-save trials (tests/checkpoint/kill_check.py).
#
#   scripts/bench_checkpoint.sh [BUILD_DIR] [WORK_DIR]
#   env: REPS=3 (medians of), TRIALS=20 (kill trials; 0 skips), BENCH_MODEL="--layers 12 ...",
#        PYTHON (with h5py and numpy; default /usr/bin/python3)
#
# BUILD_DIR (default build) needs tests/adgt_checkpoint_bench and apps/adgt-train
# (cmake --build BUILD --target adgt_checkpoint_bench adgt-train), and for the
# kill trials the byte-level corpus BUILD/data/kjv-byte (ctest -R layouts_prepare_bytes).
# WORK_DIR (default BUILD/bench_checkpoint) must be on the disk to measure; it
# needs ~4 GB. Reads are cold when /proc/sys/vm/drop_caches is writable (root);
# otherwise each file's cache is dropped with dd iflag=nocache (fadvise), and
# the table says so.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
work=${2:-$build/bench_checkpoint}
reps=${REPS:-3}
trials=${TRIALS:-20}
model=${BENCH_MODEL:-}
bench=$build/tests/adgt_checkpoint_bench
mpirun=$here/tests/parallel/mpirun.sh
py=${PYTHON:-$( [[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)}  # with h5py, numpy
[[ -x $bench ]] || { echo "missing $bench: cmake --build $build --target adgt_checkpoint_bench" >&2; exit 2; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}

cache_note="cold (drop_caches)"
drop() {  # drop the page cache for the files under $1 (or everything, where permitted)
  sync
  if ! { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then
    cache_note="cold (dd iflag=nocache per file)"
    find "$1" -type f -exec dd if={} iflag=nocache count=0 status=none \;
  fi
}
now() { date +%s.%N; }
gbps() { "$py" -c "import sys; print(f'{float(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])) / 1e9:.3f}')" "$@"; }
field() { sed -n 's/.* = \([0-9.]*\) GB\/s.*/\1/p'; }

declare -A res
add() { res[$1]="${res[$1]:-} $2"; }
bytes=0
for ((r = 1; r <= reps; r++)); do
  echo "== repetition $r of $reps"
  for lay in "1 1 1" "2 2 1" "2 1 2"; do  # ranks tp dp
    read -r n tp dp <<<"$lay"
    zero=(); [[ $dp -gt 1 ]] && zero=(--zero)
    key="${n}r_tp${tp}_dp${dp}"
    rm -rf "$work/ckpt"
    run=("$bench"); [[ $n -gt 1 ]] && run=("$mpirun" "$n" "$bench")
    out=$("${run[@]}" save --root "$work/ckpt" --tp "$tp" --dp "$dp" "${zero[@]}" $model)
    echo "  $out"
    bytes=$(sed -n 's/^save: \([0-9]*\) bytes.*/\1/p' <<<"$out")
    add "save_$key" "$(field <<<"$out")"
    drop "$work/ckpt"
    # Loaded as written, except the dp2 ZeRO checkpoint, which reshards to tp2.
    ltp=$tp; ldp=$dp; [[ $dp -gt 1 ]] && { ltp=2; ldp=1; }
    out=$("${run[@]}" load --root "$work/ckpt" --tp "$ltp" --dp "$ldp" $model)
    echo "  $out"
    add "load_$key" "$(field <<<"$out")"
  done
  rm -rf "$work/ckpt"
  count=$(( (bytes + (16 << 20) - 1) / (16 << 20) ))
  t0=$(now); dd if=/dev/zero of="$work/dd.bin" bs=16M count="$count" conv=fsync status=none; t1=$(now)
  add dd_write "$(gbps $((count << 24)) "$t0" "$t1")"
  drop "$work/dd.bin"
  t0=$(now); dd if="$work/dd.bin" of=/dev/null bs=16M status=none; t1=$(now)
  add dd_read "$(gbps $((count << 24)) "$t0" "$t1")"
  rm -f "$work/dd.bin"
  echo "  dd: write ${res[dd_write]##* } GB/s, read ${res[dd_read]##* } GB/s"
done

"$py" - "$bytes" "$reps" "$cache_note" <<EOF
import statistics, sys
bytes_, reps, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3]
res = {$(for k in "${!res[@]}"; do printf '"%s": [%s], ' "$k" "$(sed 's/^ //; s/ /, /g' <<<"${res[$k]}")"; done)}
med = {k: statistics.median(v) for k, v in res.items()}
rows = [("raw sequential write: dd bs=16M conv=fsync", "dd_write", "dd_write"),
        ("save, 1 rank", "save_1r_tp1_dp1", "dd_write"),
        ("save, 2 ranks tp=2", "save_2r_tp2_dp1", "dd_write"),
        ("save, 2 ranks dp=2 ZeRO-1 (each writes its chunk of the state)", "save_2r_tp1_dp2", "dd_write"),
        (f"raw sequential read: dd bs=16M, {cache}", "dd_read", "dd_read"),
        ("load, 1 rank", "load_1r_tp1_dp1", "dd_read"),
        ("load, 2 ranks tp=2", "load_2r_tp2_dp1", "dd_read"),
        ("load, 2 ranks tp=2 from the dp=2 checkpoint (resharded)", "load_2r_tp1_dp2", "dd_read")]
print(f"\ncheckpoint I/O: {bytes_ / 1e9:.2f} GB of state (weights + exp_avg + exp_avg_sq), median of {reps}")
print(f"| {'operation':<62} | {'GB/s':>6} | {'of raw':>6} | target 70% |")
print(f"|{'-' * 64}|{'-' * 8}|{'-' * 8}|{'-' * 12}|")
below = 0
for name, key, ref in rows:
    if key not in med:
        continue
    frac = med[key] / med[ref]
    ok = key == ref or frac >= 0.7
    below += not ok
    print(f"| {name:<62} | {med[key]:>6.3f} | {frac:>6.0%} | {'-' if key == ref else ('met' if ok else 'BELOW'):>10} |")
print("all runs (GB/s): " + "; ".join(f"{k} {v}" for k, v in sorted(res.items())))
EOF

if [[ $trials -gt 0 ]]; then
  if [[ -f $build/data/kjv-byte/train.bin && -x $build/apps/adgt-train ]]; then
    echo
    "$py" "$here/tests/checkpoint/kill_check.py" --train "$build/apps/adgt-train" --mpirun "$mpirun" \
      --data "$build/data/kjv-byte" --work "$work/kill" --trials "$trials"
  else
    echo "kill trials skipped: need $build/apps/adgt-train and $build/data/kjv-byte (ctest -R layouts_prepare_bytes)"
  fi
fi
