"""Run every benchmark of the course, one after the other, and write their results (`make bench`).

    python benchmarks/run_all.py                          # everything, default sizes for the device
    python benchmarks/run_all.py --quick                  # small sizes: a smoke test in about a minute
    python benchmarks/run_all.py --only kv_cache flash    # a subset: attention, mha, kv_cache, flash, minilm, gpt
    python benchmarks/run_all.py --device cpu --threads 1 --tag quiet

Results go to benchmarks/results/<benchmark>_<cpu|cuda>[_<tag>].json and .md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so that `import bench_*` works from anywhere

import bench_attention  # noqa: E402
import bench_flash  # noqa: E402
import bench_gpt  # noqa: E402
import bench_kv_cache  # noqa: E402
import bench_mha  # noqa: E402
import bench_minilm  # noqa: E402

# bench_flash targets CUDA (lesson 10's Triton kernel); on the CPU it times the PyTorch tiles against SDPA's
# flash kernel at small sizes (seconds) and lists the contestants that need a GPU as skipped.
# bench_threads is not here: it measures the CPU thread policy with an extra busy process (see README.md).
BENCHMARKS = {"attention": bench_attention, "mha": bench_mha, "kv_cache": bench_kv_cache, "flash": bench_flash,
              "minilm": bench_minilm, "gpt": bench_gpt}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=list(BENCHMARKS))
    p.add_argument("--device", help="cpu or cuda (default: the course's get_device())")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats")
    p.add_argument("--threads", type=int, help="torch.set_num_threads on CPU")
    p.add_argument("--tag", default="", help="suffix of the result file names")
    p.add_argument("--no-write", action="store_true", help="print only, write no result files")
    args = p.parse_args(argv)
    shared = (["--device", args.device] if args.device else []) + (["--quick"] if args.quick else []) \
        + (["--threads", str(args.threads)] if args.threads else []) + (["--tag", args.tag] if args.tag else []) \
        + (["--no-write"] if args.no_write else [])
    for name in args.only:
        start = time.perf_counter()
        print(f"=== {name} ===", flush=True)
        BENCHMARKS[name].main(shared)
        print(f"=== {name} done in {time.perf_counter() - start:.0f} s ===\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
