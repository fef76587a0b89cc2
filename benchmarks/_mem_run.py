"""One generate run in a fresh process, reporting its peak resident memory (helper of
``bench_vs_hf.py``; prints one JSON line).

Method (Linux): build the model(s), reset the kernel's peak-RSS counter (``echo 5 >
/proc/self/clear_refs`` resets ``VmHWM``), note the current RSS, run one generate (cold: the
first run, as a fresh server would) and read ``VmHWM``. ``peak_mib`` is the peak resident set of
the whole process during the run (interpreter, torch, transformers, weights);
``run_mib`` = peak - RSS before the run: what the run itself needed (KV cache, activations,
allocator growth). Both processes do the same setup (import transformers, build our model with
the same seed, map it into HF) and then drop the model they do not run, so the two peaks
differ only by what the runs themselves do. ``bench_vs_hf.py`` starts it with
``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the OS at once and RSS follows
the live tensors rather than glibc's history of freed chunks. RSS counts what torch's CPU
allocator got from the OS, which ``tracemalloc`` would not see.

Usage: python benchmarks/_mem_run.py {ours,hf} PRESET BATCH NEW_TOKENS
"""
from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import THREADS, build_pair  # noqa: E402

from tokenflow import generate  # noqa: E402


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])          # kB
    raise RuntimeError(f"{key} not in /proc/self/status")


def main() -> None:
    impl, name, batch, new = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(THREADS)
    ours, hf = build_pair(name)                      # same setup on both sides
    if impl == "hf":
        del ours
    else:
        del hf
    gc.collect()
    ids = torch.randint(3, 512, (batch, 16), generator=torch.Generator().manual_seed(0))

    def run():
        if impl == "ours":
            return generate(ours, ids, max_new_tokens=new, stop_at_eos=False)
        with torch.inference_mode():
            return hf.generate(ids, max_new_tokens=new, do_sample=False)

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status("VmRSS")
    out = run()
    peak = _status("VmHWM")
    print(json.dumps({"impl": impl, "preset": name, "batch": batch, "new": new,
                      "tokens": int(out.shape[1]), "peak_mib": peak / 1024,
                      "run_mib": (peak - before) / 1024}))


if __name__ == "__main__":
    main()
