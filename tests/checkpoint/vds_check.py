#!/usr/bin/env python3
"""h5py, an independent reader, on a format-version-2 checkpoint.

Opens <checkpoint>/checkpoint.h5 (a path that may be relative to the current
directory, which need not be the checkpoint's) and checks that
  * meta/format_version is 2 and meta/layout names the writer's layout;
  * every tensor is a virtual dataset whose sources are relative file names
    (rank_<R>.h5, resolved by HDF5 against checkpoint.h5's directory), and
    reading it whole gives the reference checkpoint's tensor within --tol
    (relative L2 error);
  * every row (block) of meta/pieces names a dataset in its rank file whose
    zlib.crc32 equals the recorded crc32 and the dataset's crc32 attribute, and
    whose data (the whole dataset, or elements [offset, offset + size) of a 1-D
    one: a ZeRO-1 chunk's part) is that block of the virtual dataset.

usage: vds_check.py --checkpoint STEP_DIR --reference STEP_DIR [--tol 1e-5] [--layout TEXT]
"""
import argparse
import os
import sys
import zlib

import h5py
import numpy as np

GROUPS = ("model", "optim/exp_avg", "optim/exp_avg_sq")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--moment-tol", type=float, default=None,
                    help="tolerance of the AdamW moments (optim/*); default --tol")
    ap.add_argument("--layout", default="")
    args = ap.parse_args()
    problems = []
    path = os.path.join(args.checkpoint, "checkpoint.h5")
    with h5py.File(path, "r") as f, h5py.File(os.path.join(args.reference, "checkpoint.h5"), "r") as ref:
        version = int(f["meta/format_version"][()])
        layout = f["meta/layout"][()].decode()
        if version != 2:
            problems.append(f"meta/format_version is {version}, expected 2")
        if args.layout not in layout:
            problems.append(f"meta/layout is '{layout}', expected it to contain '{args.layout}'")
        worst, worst_name, n = 0.0, "", 0
        moment_tol = args.tol if args.moment_tol is None else args.moment_tol
        for g in GROUPS:
            tol = moment_tol if g.startswith("optim/") else args.tol
            if list(f[g]) != list(ref[g]):
                problems.append(f"{g}: tensors {list(f[g])} differ from the reference's {list(ref[g])}")
                continue
            for k in f[g]:
                ds = f[g][k]
                if not ds.is_virtual:
                    problems.append(f"{g}/{k} is not a virtual dataset")
                    continue
                absolute = [m.file_name for m in ds.virtual_sources() if os.path.isabs(m.file_name)]
                if absolute:
                    problems.append(f"{g}/{k} has absolute source paths {absolute}")
                a = ds[...].astype(np.float64)
                b = ref[g][k][...].astype(np.float64)
                if a.shape != b.shape:
                    problems.append(f"{g}/{k}: shape {a.shape}, reference {b.shape}")
                    continue
                e = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
                n += 1
                if e / tol > worst:
                    worst, worst_name, worst_tol = e / tol, f"{g}/{k}", tol
        if worst > 1:
            problems.append(f"{worst_name} differs from the reference by {worst * worst_tol:.3e} "
                            f"(> {worst_tol})")

        p = f["meta/pieces"]
        tensors = [t.decode() for t in p["tensor"][...]]
        ranks, starts, counts, offsets, crcs = (p[x][...] for x in ("rank", "start", "count", "offset", "crc32"))
        files, checked = {}, set()
        for t, r, s, c, off, crc in zip(tensors, ranks, starts, counts, offsets, crcs):
            fn = os.path.join(args.checkpoint, f"rank_{r}.h5")
            if fn not in files:
                files[fn] = h5py.File(fn, "r")
            src = files[fn][t]
            data = src[...]
            vds = f[t]
            block = tuple(slice(int(s[d]), int(s[d] + c[d])) for d in range(vds.ndim))
            shape = tuple(int(x) for x in c[:vds.ndim])
            n_block = int(np.prod(shape))
            # A block is the whole dataset in its shape, or (ZeRO-1 chunk parts, stored
            # 1-D) the elements [offset, offset + size) of it in C order.
            if data.shape != shape and (data.ndim != 1 or int(off) + n_block > data.size):
                problems.append(f"{t} in rank_{r}.h5: shape {data.shape} does not hold block {shape} at {int(off)}")
                continue
            if (t, int(r)) not in checked:
                checked.add((t, int(r)))
                got = zlib.crc32(np.ascontiguousarray(data, dtype="<f4").tobytes())
                if got != int(crc) or got != int(src.attrs["crc32"]):
                    problems.append(f"{t} in rank_{r}.h5: zlib.crc32 {got:#010x}, recorded {int(crc):#010x}, "
                                    f"attribute {int(src.attrs['crc32']):#010x}")
            if not np.array_equal(vds[block].ravel(), data.ravel()[int(off):int(off) + n_block]):
                problems.append(f"{t}{list(block)}: the virtual dataset differs from rank_{r}.h5")
        for h in files.values():
            h.close()
    if problems:
        print("FAIL: " + "\n  ".join(problems))
        sys.exit(1)
    print(f"PASS: h5py from {os.getcwd()} read {path}: {n} whole tensors (layout '{layout}') "
          f"within {worst:.2e} of the reference, {len(checked)} pieces ({len(tensors)} blocks) in {len(files)} rank files match "
          f"their crc32")


if __name__ == "__main__":
    main()
