"""A plan's layout string as the planner prints it (describe_layout,
parallel/sim/sweep.cpp) turned back into --set overrides:

  'tp=1 pp=4 dp=2 zero=0 sp=0 zb-h1 layers=3/3/1/1 mb=2 rc=none'
    -> ['parallel.tp=1', 'parallel.pp=4', ..., 'parallel.stage_layers=[3,3,1,1]', ...]
"""

KEYS = {"tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "ep": "parallel.ep",
        "zero": "parallel.zero", "v": "parallel.virtual_stages", "mb": "train.micro_batch",
        "rc": "train.recompute"}


def layout_sets(layout):
    sets = []
    for tok in layout.split():
        if "=" not in tok:
            sets.append(f"parallel.schedule={tok}")
            continue
        k, v = tok.split("=", 1)
        if k == "sp":
            sets.append("parallel.sequence_parallel=" + ("true" if v == "1" else "false"))
        elif k == "layers":
            sets.append("parallel.stage_layers=[" + v.replace("/", ",") + "]")
        elif k in KEYS:
            sets.append(f"{KEYS[k]}={v}")
    return sets
