#!/usr/bin/env bash
# A switch file with a refused line (docs/reliability.md, "In-memory layout
# switch"): the refused line goes to <log.dir>/switch.rejected with its reason,
# the applied one (into a pipeline, pp=2) is switched to, its line names the
# layout running before and after and the stage table follows, and
# switch.done holds only what was applied; both requests and each layout's
# attention kernel are logged as rank 0's decisions in metrics.jsonl.
#   switch_rejected.sh TRAIN MPIRUN MODEL_YAML DATA_DIR WORK
set -u
train=$1 mpirun=$2 model=$3 data=$4 work=$5
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
# Step 2: train.lr cannot change in a running job (refused); step 4: pp=2 x dp=1.
printf '@2 train.lr=1\n@4 parallel.pp=2 parallel.dp=1\n' >"$work/switch"
OMP_NUM_THREADS=1 timeout 300 "$mpirun" 2 "$train" --config "$model" \
  --set "data.train=$data/train.bin" --set "data.val=$data/val.bin" --set "log.dir=$work" \
  --set "checkpoint.dir=$work/ckpt" --set train.steps=6 --set parallel.dp=2 \
  --set checkpoint.interval=0 --set train.device=cpu >"$work/out.txt" 2>"$work/err.txt"
rc=$?
[[ $rc -eq 0 ]] || { cat "$work/err.txt"; fail "the run exited $rc"; }
grep -q 'switch at step 2 refused: .*train[.]lr' "$work/err.txt" || { cat "$work/err.txt"; fail "no refusal on stderr"; }
[[ -f $work/switch.rejected ]] || fail "no switch.rejected"
grep -q '^# refused at the boundary after step 2: .*train[.]lr' "$work/switch.rejected" || fail "switch.rejected has no reason: $(cat "$work/switch.rejected")"
grep -q '^@2 train[.]lr=1$\|^train[.]lr=1$' "$work/switch.rejected" || fail "switch.rejected lacks the refused line: $(cat "$work/switch.rejected")"
[[ -f $work/switch.done ]] || fail "no switch.done after the applied line"
grep -q 'train[.]lr' "$work/switch.done" && fail "switch.done holds the refused line: $(cat "$work/switch.done")"
grep -q 'parallel[.]pp=2' "$work/switch.done" || fail "switch.done lacks the applied line: $(cat "$work/switch.done")"
grep -Eq '^switch at step 4: .*dp=2.* -> .*pp=2.*schedule=1f1b' "$work/out.txt" ||
  { cat "$work/out.txt"; fail "no switch line from the running layout to pp=2 1f1b"; }
awk '/^switch at step 4:/ { s = 1 } s && /^pipeline: pp=2, schedule 1f1b/ { found = 1 } END { exit !found }' "$work/out.txt" ||
  { cat "$work/out.txt"; fail "no stage table after the switch into the pipeline"; }
grep -q '^  stage 1 (pipeline rank 1, chunk 0)' "$work/out.txt" || fail "the stage table lacks stage 1"
[[ -e $work/switch ]] && fail "the switch file is still there"
grep -q '"event":"switch"' "$work/metrics.jsonl" || fail "no switch record in metrics.jsonl"
# Both requests were decisions of rank 0 logged like every controller's
# (decide, broadcast, log); so was the attention kernel of each layout.
/usr/bin/python3 - "$work/metrics.jsonl" <<'PY' || fail "decision records in metrics.jsonl"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ctl = [r for r in recs if r.get("event") == "controller"]
sw = [r for r in ctl if r["controller"] == "switch-file"]
assert [r["step"] for r in sw] == [2, 4], sw
assert "train.lr" in sw[0]["decision"]["error"] and sw[0]["decision"]["request"].endswith("train.lr=1"), sw[0]
assert sw[1]["decision"]["overrides"] == ["parallel.pp=2", "parallel.dp=1"] and "error" not in sw[1]["decision"], sw[1]
att = [r for r in ctl if r["controller"] == "attention"]
assert [r["decision"]["attention"] for r in att] == ["exact", "exact"], att  # start, and after the switch
assert att[0]["inputs"]["backend"].startswith("cpu") and att[1]["step"] == 4, att
print("decisions logged:", len(sw), "switch-file,", len(att), "attention")
PY
echo "ok: the refused line in switch.rejected with its reason, the applied one in switch.done"
