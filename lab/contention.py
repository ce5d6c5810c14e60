"""Seconds per record with and without another busy process on the machine: how a shared CPU slows structspec.

    python -m lab.contention --model qwen2.5-coder-0.5b --records 4

Each setting runs in a process of its own (libgomp reads how its threads wait once, when torch loads): load the
model, calibrate on the idle machine, decode the records alone, then the same records with one competing process
spinning on a core, and report seconds per record for both. The settings: structspec's default (a short spin
before a waiting thread sleeps, `structspec.openmp`), no spin at all, and libgomp's own default (a long spin),
which is what structspec ran before. Run it alone on the machine: the competitor is the only load meant.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

SETTINGS = {  # label → the environment a child process starts with
    "structspec default (GOMP_SPINCOUNT=1000)": {"GOMP_SPINCOUNT": "1000"},
    "no spin (OMP_WAIT_POLICY=PASSIVE)": {"OMP_WAIT_POLICY": "PASSIVE"},
    "libgomp default (spin 300000, as before)": {"GOMP_SPINCOUNT": "300000"},
}
BUSY = "while True: pass"  # one competing process: a core's worth of work that never sleeps


def main(argv: list[str] | None = None) -> int:
    """Run every setting in a child process and print seconds per record side by side. Runs models; prints."""
    args = _parser().parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    rows = []
    for label, env in SETTINGS.items():
        clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        command = [sys.executable, "-m", "lab.contention", "--child", *_forwarded(args)]
        out = subprocess.run(command, env={**clean, **env}, capture_output=True, text=True, check=True)
        rows.append((label, json.loads(out.stdout.strip().splitlines()[-1])))
    first = rows[0][1]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {first['model']}, {first['dtype']}, "
          f"{first['threads']} threads, {first['records']} records, {platform.processor() or platform.machine()} "
          f"({os.cpu_count()} CPUs); load average before: {first['load_before']}")
    print("| setting | s / record alone | s / record, one busy process | slowdown |")
    print("|---|---|---|---|")
    for label, r in rows:
        print(f"| {label} | {r['alone']:.2f} | {r['busy']:.2f} | {r['busy'] / r['alone']:.2f}× |")
    return 0


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """One setting: the records alone, then beside one busy process. Loads a model and runs it."""
    import torch

    import structspec
    from structspec.tools.command import drafting_curve
    from structspec.tools.tasks import extraction_prompt, load_tasks

    load_before = os.getloadavg()[0]
    lm = structspec.load(args.model, threads=args.threads)
    tasks = load_tasks()[: args.records]
    prompts = [(task.schema, extraction_prompt(task.text, task.schema)) for task in tasks]
    structspec.generate_result(lm, *prompts[0], max_new_tokens=4)  # compile and first-call overheads
    drafting_curve(lm, calibrate=True)  # on the idle machine, as a user's earlier `structspec calibrate` would have

    def per_record() -> float:
        start = time.perf_counter()
        for schema, prompt in prompts:
            structspec.generate_result(lm, schema, prompt, max_new_tokens=args.max_new_tokens)
        return (time.perf_counter() - start) / len(prompts)

    alone = per_record()
    competitor = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        busy = per_record()
    finally:
        competitor.kill()
    return {"model": lm.name, "dtype": str(lm.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "records": len(prompts), "alone": alone, "busy": busy, "load_before": round(load_before, 2)}


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The options a child process runs with."""
    out = ["--model", args.model, "--records", str(args.records), "--max-new-tokens", str(args.max_new_tokens)]
    return out + ([] if args.threads is None else ["--threads", str(args.threads)])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab.contention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a shipped model name or model directory")
    parser.add_argument("--records", type=int, default=4, help="extraction tasks (examples/tasks.jsonl) to time")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: load's)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    sys.exit(main())
