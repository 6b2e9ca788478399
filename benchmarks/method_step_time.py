"""Time per training step of each method relative to ``ce``, on the same batches, in one run.

MiniLM-L6 (the offline default), batch 32 x 64 tokens of real SST-2 text (sentences packed
into pairs so that every row really has 64 tokens), the training loop's own pieces
(``build_method``, ``build_optimizer``, ``backward``, clip, step). Methods are interleaved
(ce, scl, ..., ce, scl, ...) so that machine noise hits all of them alike; each figure is the
median over repeats of the mean step time over a few steps, after a warm-up.

Targets: scl, acl with acl_grad false, joint, deebert-sd at most 1.10x ce;
acl with ACL-Grad, romebert with GR, acl-cl at most 1.75x (a second backward costs ~1.67x).
Two variants without a target, romebert with gr false and acl-cl with acl_grad false, run the
same objectives with one backward pass: the ratio of the two-pass figure to them is what the
gradient rule itself costs. "ce, two backward passes" takes the CE gradient twice
(``autograd.grad`` with a retained graph, then the sum), the floor of any rule that needs two
gradients on this machine.

    python benchmarks/method_step_time.py [--steps 3] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from threads import add_threads_option, apply_threads  # noqa: E402

from aclpipe.config import DEFAULT_MODEL, Params, params_from_dict  # noqa: E402
from aclpipe.data.glue_sources import read_local  # noqa: E402
from aclpipe.data.tasks import get_task  # noqa: E402
from aclpipe.modeling.backbone import load_encoder, load_tokenizer, resolve_model  # noqa: E402
from aclpipe.modeling.model import MultiExitModel  # noqa: E402
from aclpipe.training.loop import backward, build_optimizer, make_spec  # noqa: E402
from aclpipe.training.methods import LossInputs, build_method  # noqa: E402

VARIANTS = {  # name: (method, knob overrides, target ratio)
    "ce": ("ce", {}, 1.0),
    "scl": ("scl", {}, 1.10),
    "acl (acl_grad false)": ("acl", {"acl_grad": False}, 1.10),
    "joint": ("joint", {}, 1.10),
    "deebert-sd (stage 2)": ("deebert-sd", {}, 1.10),
    "acl (ACL-Grad)": ("acl", {"acl_grad": True}, 1.75),
    "romebert (GR)": ("romebert", {"gr": True}, 1.75),
    "acl-cl": ("acl-cl", {}, 1.75),
    # No target: the same objectives with one backward pass, to split a two-backward method's
    # cost into its objective's own cost and the second pass's.
    "ce, two backward passes": ("ce", {"two_passes": True}, None),  # the floor of the rules
    "romebert (gr false)": ("romebert", {"gr": False}, None),
    "acl-cl (acl_grad false)": ("acl-cl", {"acl_grad": False}, None),
}


def make_batches(steps: int, batch_size: int, length: int) -> list[dict]:
    glue = Path(os.environ.get("GLUE_DIR", Path(__file__).resolve().parents[2] / "shared/glue"))
    examples = read_local(get_task("sst2"), glue, "train")
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    batches, cursor = [], 0
    for _ in range(steps):
        texts = []
        for _ in range(batch_size):  # concatenate sentences until the row is full
            parts = []
            while len(tokenizer(" ".join(parts))["input_ids"]) < length:
                parts.append(examples[cursor % len(examples)].text_a)
                cursor += 1
            texts.append(" ".join(parts))
        enc = tokenizer(
            texts, truncation=True, max_length=length, padding="max_length", return_tensors="pt"
        )
        labels = torch.tensor(
            [examples[(cursor + i) % len(examples)].label for i in range(batch_size)]
        )
        batches.append({**enc, "labels": labels})
    return batches


class Runner:
    """One method's model, optimizer and stage, ready to take steps."""

    def __init__(self, name: str, knobs: dict, params: Params) -> None:
        from accelerate import Accelerator

        knobs = dict(knobs)
        self.two_passes = knobs.pop("two_passes", False)
        cfg = dataclasses.replace(params.method(name), **knobs)
        self.method = build_method(name, cfg)
        self.stage = self.method.stages[-1]  # deebert-sd: the distillation stage
        torch.manual_seed(0)
        encoder = load_encoder(DEFAULT_MODEL)
        spec = make_spec(
            self.method,
            params.model,
            encoder.config.num_hidden_layers,
            2,
            resolve_model(DEFAULT_MODEL),
            0.1,
        )
        self.model = MultiExitModel(encoder, spec)
        self.optimizer = build_optimizer(self.model, self.stage.trains, params.train)
        self.trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.accelerator = Accelerator(cpu=True)

    def step(self, batch: dict) -> None:
        batch = dict(batch)
        labels = batch.pop("labels")
        out = self.model(**batch)
        x = LossInputs(
            out.logits,
            out.features,
            self.model.label_embeddings(),
            labels,
            False,
            exit_layers=self.model.spec.exits,
        )
        if self.two_passes:
            loss, params = self.stage.main(x), [p for _, p in self.trainable]
            first = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            second = torch.autograd.grad(loss, params, allow_unused=True)
            for p, a, b in zip(params, first, second):
                p.grad = None if a is None else a.add_(b)
        else:
            backward(self.stage, x, self.accelerator, self.model, self.trainable, False)
        torch.nn.utils.clip_grad_norm_([p for _, p in self.trainable], 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    add_threads_option(parser)
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/method_step_time.json")
    )
    args = parser.parse_args()
    apply_threads(args.threads)
    params = params_from_dict({})
    batches = make_batches(args.steps, args.batch_size, args.length)
    runners = {v: Runner(m, knobs, params) for v, (m, knobs, _) in VARIANTS.items()}
    for runner in runners.values():  # warm-up
        runner.step(batches[0])
    times: dict[str, list[float]] = {v: [] for v in runners}
    for _ in range(args.repeats):
        for variant, runner in runners.items():
            started = time.perf_counter()
            for batch in batches:
                runner.step(batch)
            times[variant].append((time.perf_counter() - started) / len(batches))
    base = statistics.median(times["ce"])
    rows = []
    print(f"{'method':24} {'s/step':>8} {'x ce':>6} {'target':>7}  ok")
    for variant, (_, _, target) in VARIANTS.items():
        median = statistics.median(times[variant])
        ratio = median / base
        ok = None if target is None else ratio <= target + 1e-9
        rows.append(
            {
                "variant": variant,
                "seconds_per_step": round(median, 4),
                "ratio_to_ce": round(ratio, 3),
                "target": target,
                "meets_target": ok,
            }
        )
        shown = "-" if target is None else f"{target:.2f}"
        verdict = "-" if ok is None else "yes" if ok else "NO"
        print(f"{variant:24} {median:8.3f} {ratio:6.2f} {shown:>7}  {verdict}")
    record = {
        "command": "python benchmarks/method_step_time.py "
        f"--steps {args.steps} --repeats {args.repeats} --threads {args.threads}",
        "threads": torch.get_num_threads(),
        "date": date.today().isoformat(),
        "batch": [args.batch_size, args.length],
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
