#!/usr/bin/env bash
# The README's adgt-train journeys as a new user takes them on the CPU (the
# tiny model, byte-level data so it is quick), each checked for what the docs
# promise about its output, exit status and files (what a new user hits first):
#   walkthrough.sh BIN_DIR DATA_DIR WORK
# BIN_DIR holds adgt-train, adgt-ckpt, adgt-sim, adgt-data, adgt-schedule;
# DATA_DIR a byte-level shard pair (train.bin, val.bin); WORK a scratch folder
# (it is the working directory of every command: nothing may appear there
# that the command does not promise).
set -u
bin=$(cd "$1" && pwd) data=$(cd "$2" && pwd) work=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
cfg=$root/configs/tiny.yaml
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
# run NAME CMD...: stdout in NAME.out, stderr in NAME.err, status in $rc
run() {
  local name=$1
  shift
  timeout 300 "$@" >"$name.out" 2>"$name.err"
  rc=$?
}
expect_status() {  # NAME WANT
  if [[ $rc -ne $2 ]]; then
    fail "$1: exit status $rc, want $2"
    sed 's/^/  | /' "$1.err" | tail -5
    return 1
  fi
}
data_sets=(--set "data.train=$data/train.bin" --set "data.val=$data/val.bin" --set data.tokenizer=byte)

# 1. A short training run: exit 0, a summary, a checkpoint, and no warning on a
#    machine without a GPU (train.device=auto is silent where no NVIDIA driver is installed).
run train "$bin/adgt-train" --config "$cfg" "${data_sets[@]}" --set train.steps=4 \
  --set train.warmup_steps=1 --set train.eval_interval=0 --set log.dir=run \
  --set checkpoint.dir=run/ckpt --set checkpoint.interval=4 --set log.interval=1
if expect_status train 0; then
  grep -q '^== summary ==' train.out || fail "train: no summary on stdout"
  grep -Eq '^steps: +4$' train.out || fail "train: the summary does not say 4 steps"
  if grep -q '^warning:' train.err; then
    if ls /dev/nvidiactl >/dev/null 2>&1; then ok "train: a warning, but this machine has an NVIDIA driver"
    else fail "train: a warning on a machine with no NVIDIA driver: $(grep '^warning:' train.err | head -1)"; fi
  fi
  ok "train: 4 steps, summary, no false device warning"
fi

# 1b. A tokenizer path that is not a file is said at the start (training
#     reads token ids; the checkpoints record the path for the HF export).
run tokenizer "$bin/adgt-train" --config "$cfg" "${data_sets[@]}" --set data.tokenizer=no/such.model \
  --set train.steps=1 --set train.warmup_steps=1 --set train.eval_interval=0 --set log.dir=tok \
  --set checkpoint.dir=tok/ckpt --set checkpoint.interval=0 --set checkpoint.at_end=false
if expect_status tokenizer 0; then
  [[ $(grep -c "^warning: data[.]tokenizer: 'no/such[.]model' is not a file" tokenizer.err) -eq 1 ]] ||
    fail "tokenizer: no single warning about the missing tokenizer: $(cat tokenizer.err)"
  ok "a missing data.tokenizer is said once"
fi

# 2. adgt-ckpt info names the layout that saved the checkpoint.
run info "$bin/adgt-ckpt" info run/ckpt/step_4
if expect_status info 0; then
  grep -Eq '^saved by: +tp=1 dp=1 zero=0 sequence_parallel=0 pp=1 ep=1 [(]1 rank[)]; loads into any layout$' info.out ||
    fail "info: no 'saved by' line with the saving layout: $(cat info.out)"
  ok "adgt-ckpt info: the saving layout"
fi

# 2b. Training longer from the checkpoint (train.steps raised on resume) says
#     how the learning-rate schedule changes.
run resume "$bin/adgt-train" --config "$cfg" "${data_sets[@]}" --set train.steps=6 \
  --set train.warmup_steps=1 --set train.eval_interval=0 --set log.dir=run \
  --set checkpoint.dir=run/ckpt --set checkpoint.interval=0 --resume auto
if expect_status resume 0; then
  grep -Eq '^note: resuming at step 4 with train[.]steps=6 [(]the saved run.s: 4[)]: .* recomputed over 6 steps; step 5 gets lr [0-9.e+-]+ instead of [0-9.e+-]+$' resume.out ||
    fail "resume: no note on the changed schedule: $(grep -i note resume.out resume.err)"
  ok "resume with train.steps raised: the schedule change is named"
fi

# 3. Usage errors exit 2 in every tool (CLI11's own codes are 105-115).
for tool in adgt-train adgt-ckpt adgt-sim adgt-data adgt-schedule; do
  run "usage_$tool" "$bin/$tool" --no-such-flag
  expect_status "usage_$tool" 2 && ok "$tool --no-such-flag: exit 2"
done

# 4. Input errors: exit 2, one message, attributed to its source, no internal check text.
input_error() {  # NAME REGEX ARGS...
  local name=$1 regex=$2
  shift 2
  run "$name" "$bin/adgt-train" --config "$cfg" "$@"
  expect_status "$name" 2 || return
  local n
  n=$(grep -c '^error:' "$name.err")
  [[ $n -eq 1 ]] || fail "$name: $n error lines, want 1"
  grep -Eq -- "$regex" "$name.err" || fail "$name: no line matches $regex: $(cat "$name.err")"
  ! grep -q '\[check `' "$name.err" || fail "$name: internal check text: $(cat "$name.err")"
  ok "$name: exit 2, one message: $(grep '^error:' "$name.err" | cut -c1-160)"
}
input_error bad_value '^error: .*--set train[.]lr=abc: train[.]lr: expected a number > 0, got "abc"$' \
  "${data_sets[@]}" --set train.lr=abc
input_error cross_field_from_set \
  '^error: .*tiny[.]yaml, --set train[.]steps=1: train[.]warmup_steps=20 exceeds train[.]steps=1' \
  "${data_sets[@]}" --set train.steps=1
input_error missing_shard "^error: .*tiny[.]yaml, --set data[.]train=/nonexistent/train[.]bin: data[.]train: token shard '/nonexistent/train[.]bin' does not exist; prepare it with" \
  --set data.train=/nonexistent/train.bin --set "data.val=$data/val.bin"
input_error vocab_too_small "^error: .*--set model[.]vocab_size=100: data[.]train: shard '.*' was tokenized with vocabulary 256 but model[.]vocab_size=100; set model[.]vocab_size >= 256$" \
  "${data_sets[@]}" --set model.vocab_size=100

# 5. A dry run allocates nothing and writes nothing (with parallel.auto too,
#    whose op profile a launch caches in log.dir).
mkdir dry && cd dry || exit 1
run ../dry "$bin/adgt-train" --config "$cfg" --set parallel.auto=true --dry-run
cd .. || exit 1
if expect_status dry 0; then
  grep -q '^predicted step:' dry.out || fail "dry run: no predicted step line"
  left=$(find dry -mindepth 1 | head -5)
  [[ -z $left ]] && ok "dry run with parallel.auto: nothing written" || fail "dry run wrote into the working directory: $left"
fi

# 6. --print-schedule names pipeline ranks and their world ranks.
run schedule "$bin/adgt-train" --config "$cfg" --print-schedule --set parallel.pp=2 \
  --set parallel.dp=2 --set train.global_batch=32
if expect_status schedule 0; then
  grep -Eq '^  stage 1 [(]pipeline rank 1, chunk 0[)]' schedule.out || fail "schedule: stage lines do not say pipeline rank"
  grep -Eq '^  pipeline rank 1 = world ranks 2,3 [(]tp=1 x dp=2[)]$' schedule.out || fail "schedule: no world ranks of pipeline rank 1"
  ok "--print-schedule: pipeline ranks and their world ranks"
fi

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "walkthrough: every check passed"
