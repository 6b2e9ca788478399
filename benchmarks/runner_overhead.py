"""What the campaign runner's backends cost per run: one tiny run through each.

A one-run study on a random 3-layer BERT (hidden 32; the tests' tiny model) and 48 SST-2-like
rows, so that the run itself takes about a second and the rest is the backend's: spawning a
worker and importing torch (local pool), starting or joining Ray and its worker (ray). The
same run in this process, with everything imported, is the baseline.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/runner_overhead.py [--repeats 2]
        [--out benchmarks/results/runner_overhead.json]

Prints, and writes to ``--out`` with the machine, its load and the software stack, seconds of
wall clock per case and repeat (``run_pending`` from call to return):
- ``in-process``: ``_run_logged`` called here (no backend);
- ``local``: ``--workers 1`` (a spawned process);
- ``ray, cold``: ``--backend ray`` with no Ray running (the runner starts one on this
  machine and stops it);
- ``ray, joined``: a Ray instance already up (2 CPUs), a fresh worker;
- ``ray, warm worker``: the same instance again (Ray reuses the worker, torch imported).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
import yaml  # noqa: E402
from conftest import SPECIAL, WORDS, tiny_params_dict, write_sst2  # noqa: E402
from rich.console import Console  # noqa: E402
from threads import machine  # noqa: E402

from aclpipe.atomic import write_text  # noqa: E402
from aclpipe.study.campaign.plan import load_campaign  # noqa: E402
from aclpipe.study.campaign.runner import _run_logged, run_pending  # noqa: E402
from aclpipe.study.campaign.runs import prepare_task


def tiny_model(folder: Path) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizer

    tokens = SPECIAL + WORDS
    BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}).save_pretrained(str(folder))
    config = BertConfig(
        vocab_size=len(tokens), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    BertModel(config).save_pretrained(str(folder))
    return folder


def project(root: Path) -> Path:
    """``root/base``: the one-run study, its data prepared."""
    glue = root / "glue"
    write_sst2(glue)
    base = tiny_params_dict(tiny_model(root / "model"), glue)
    spec = {"tasks": ["sst2"], "seeds": [1], "runs": ["ce"]}
    path = root / "base" / "campaign" / "params.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({**base, "campaign": spec}), encoding="utf-8")
    prepare_task(load_campaign(path), "sst2", Console(file=io.StringIO()))
    return root / "base"


def timed(root: Path, base: Path, name: str, backend: str | None) -> float:
    folder = root / name
    shutil.copytree(base, folder)
    os.chdir(folder)
    campaign = load_campaign(Path("campaign/params.yaml"))
    start = time.perf_counter()
    if backend is None:
        _run_logged("campaign/params.yaml", "run", "sst2", "ce", 1, 1)
    else:
        done, failed = run_pending(
            campaign, 1, Console(file=io.StringIO()), threads=1, backend=backend
        )
        assert len(done) == 1 and not failed, failed
    return time.perf_counter() - start


def measure(root: Path, base: Path, tag: str) -> dict[str, float]:
    """One sample of every case, in the order the module docstring gives them."""
    import ray

    seconds = {"in-process": timed(root, base, f"inproc{tag}", None)}
    seconds["local"] = timed(root, base, f"local{tag}", "local")
    seconds["ray, cold"] = timed(root, base, f"ray-cold{tag}", "ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    try:
        seconds["ray, joined"] = timed(root, base, f"ray-joined{tag}", "ray")
        seconds["ray, warm worker"] = timed(root, base, f"ray-warm{tag}", "ray")
    finally:
        ray.shutdown()
    return seconds


def main() -> None:
    import platform

    import ray
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=2, help="samples of every case")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/runner_overhead.json"))
    args = parser.parse_args()
    out = args.out.resolve()
    torch.set_num_threads(1)
    load_at_start = os.getloadavg()
    here = os.getcwd()
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = project(root)
        try:
            for repeat in range(args.repeats):
                samples.append(measure(root, base, str(repeat)))
                for name, value in samples[-1].items():
                    extra = value - samples[-1]["local"]
                    print(
                        f"{repeat} {name:18s} {value:6.1f} s   ({extra:+.1f} s against the local pool)"
                    )
        finally:
            os.chdir(here)
    record = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
        "command": "PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/runner_overhead.py "
        f"--repeats {args.repeats}",
        "run": "one ce run of a 3-layer BERT (hidden 32) on 48 SST-2-like rows; "
        "seconds of wall clock from run_pending's call to its return",
        "machine": machine(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "threads": 1,
        "stack": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ray": ray.__version__,
        },
        "seconds": {name: [sample[name] for sample in samples] for name in samples[0]},
    }
    write_text(out, json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
