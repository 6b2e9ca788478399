"""What the campaign runner's backends cost per run: one tiny run through each.

A one-run study on a random 3-layer BERT (hidden 32; the tests' tiny model) and 48 SST-2-like
rows, so that the run itself takes about a second and the rest is the backend's: spawning a
worker and importing torch (local pool), starting or joining Ray and its worker (ray). The
same run in this process, with everything imported, is the baseline.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/runner_overhead.py

Prints seconds of wall clock per case (``run_pending`` from call to return):
- ``in-process``: ``_run_logged`` called here (no backend);
- ``local``: ``--workers 1`` (a spawned process);
- ``ray, cold``: ``--backend ray`` with no Ray running (the runner starts one on this
  machine and stops it);
- ``ray, joined``: a Ray instance already up (2 CPUs), a fresh worker;
- ``ray, warm worker``: the same instance again (Ray reuses the worker, torch imported).
"""

from __future__ import annotations

import io
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

from aclpipe.study.campaign import load_campaign, prepare_task  # noqa: E402
from aclpipe.study.campaign_runner import _run_logged, run_pending  # noqa: E402


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


def main() -> None:
    import ray

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = project(root)
        seconds = {"in-process": timed(root, base, "inproc", None)}
        seconds["local"] = timed(root, base, "local", "local")
        seconds["ray, cold"] = timed(root, base, "ray-cold", "ray")
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
        try:
            seconds["ray, joined"] = timed(root, base, "ray-joined", "ray")
            seconds["ray, warm worker"] = timed(root, base, "ray-warm", "ray")
        finally:
            ray.shutdown()
    for name, value in seconds.items():
        extra = value - seconds["local"]
        print(f"{name:18s} {value:6.1f} s   ({extra:+.1f} s against the local pool)")


if __name__ == "__main__":
    main()
