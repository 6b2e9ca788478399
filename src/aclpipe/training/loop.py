"""The training loop, written out, on accelerate (the finetune stage, ``aclpipe.stages.finetune``,
reads params.yaml's sections and calls :func:`train`).

Methods change *what* is computed (``aclpipe.training.methods``), never the loop's shape: for each
stage of the method, for each epoch, for each batch: forward (all exits), main and auxiliary
objectives, gradients combined by the stage's rule, clip, step, schedule, log; then a dev
evaluation and a checkpoint. A method with a head refit (``method.refit``) has its exits'
classifiers refit on the trained encoder's frozen features after its last stage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from aclpipe import atomic
from aclpipe.data.prepared import load_meta, load_split
from aclpipe.data.tasks import Task
from aclpipe.errors import UserError
from aclpipe.evaluation.scoring import all_exit_logits, exit_scores, split_labels
from aclpipe.evaluation.sentence_scores import exit_pair_cosines, exit_spearman
from aclpipe.layout import MODEL_CONFIG, TOKENIZER, checkpoint_dir
from aclpipe.modeling.backbone import default_pooling, load_encoder, resolve_model
from aclpipe.modeling.batching import collate, collate_sentences
from aclpipe.modeling.config import ModelConfig
from aclpipe.modeling.device import pick_device
from aclpipe.modeling.model import ExitSpec, MultiExitModel
from aclpipe.modeling.padding_free import use_padding_free
from aclpipe.run_log import write_run_log
from aclpipe.training.batch_order import epoch_order
from aclpipe.training.checkpoint import (
    Position,
    TrainingState,
    fingerprint,
    load_checkpoint,
    save_checkpoint,
)
from aclpipe.training.config import TrainConfig
from aclpipe.training.distributed import (
    all_reduce_mean,
    gather_labels,
    gather_with_grad,
    local_weight,
    mean_over_processes,
    shard,
)
from aclpipe.training.grad_rules import combine_gradients, scope_mask
from aclpipe.training.head_refit import refit_heads
from aclpipe.training.methods import LossInputs, Method, Stage
from aclpipe.training.progress import TrainProgress


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_spec(
    method: Method,
    model_cfg: ModelConfig,
    num_layers: int,
    num_labels: int,
    resolved_model: str,
    backbone_dropout: float,
) -> ExitSpec:
    """Exit layers, pooling and dropout for this method and model."""
    exits = model_cfg.exits or list(range(1, num_layers + 1))
    if any(not 1 <= k <= num_layers for k in exits):
        raise UserError(
            f"model.exits {exits} must be layers in 1..{num_layers} "
            f"(this encoder has {num_layers} layers)"
        )
    if not method.multi_exit:
        exits = [num_layers]  # single-exit methods: E = {L}
    elif len(set(exits)) < 2:
        raise UserError(
            f"method {method.name} needs at least two exits but model.exits is {exits}: "
            "list two or more layers, or set model.exits to null for every layer"
        )
    checkpoint_pooling = default_pooling(resolved_model)
    pooling = model_cfg.pooling
    if pooling == "auto":
        pooling = checkpoint_pooling
    dropout = model_cfg.dropout if model_cfg.dropout is not None else backbone_dropout
    return ExitSpec(
        num_labels=num_labels,
        exits=sorted(set(exits)),
        pooling=pooling,
        dropout=dropout,
        label_embedding=model_cfg.label_embedding,
        cls_from_mean=checkpoint_pooling == "mean",
    )


def build_optimizer(model: MultiExitModel, trains: tuple[str, ...], t: TrainConfig):
    """AdamW over the stage's parameter groups; no decay on bias and LayerNorm; new parts at
    ``head_lr``. Parameters outside the stage are frozen (``requires_grad=False``)."""
    groups = model.parameter_groups()
    trained = {name for group in trains for name in groups[group]}
    buckets: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        p.requires_grad_(name in trained)
        if name in trained:
            no_decay = p.dim() < 2 or "LayerNorm" in name or "layer_norm" in name
            buckets.setdefault((name.startswith("encoder."), no_decay), []).append(p)
    param_groups = [
        {
            "params": ps,
            "lr": t.lr if is_encoder else t.head_lr,
            "weight_decay": 0.0 if no_decay else t.weight_decay,
        }
        for (is_encoder, no_decay), ps in buckets.items()
    ]
    # The fused kernel (CPU and CUDA, torch >= 2.4) is what the HF Trainer uses by default; the
    # per-parameter loop costs ~10% of a MiniLM step on CPU (benchmarks/train_throughput.py).
    fused = all(p.device.type in ("cpu", "cuda") for g in param_groups for p in g["params"])
    return torch.optim.AdamW(param_groups, fused=fused)


def linear_schedule(optimizer, total_steps: int, warmup_ratio: float):
    warmup = int(total_steps * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def backward(
    stage: Stage, x: LossInputs, accelerator, model, named_trainable, record_angles: bool
) -> dict:
    """Gradients of the stage's objectives into ``p.grad``; returns what to log."""
    main = stage.main(x)
    aux = stage.aux(x) if stage.aux is not None else None
    log = {"main": main.item()}
    log["loss"] = log["main"]
    if aux is not None:
        log["aux"] = aux.item()
        log["loss"] += log["aux"]
    if not stage.separate_gradients(record_angles):
        accelerator.backward(main if aux is None else main + aux)
        return log
    params = [p for _, p in named_trainable]
    g_main = torch.autograd.grad(main, params, retain_graph=True, allow_unused=True)
    g_aux = torch.autograd.grad(aux, params, allow_unused=True)
    # decide on the gradients averaged over processes, as one process at the global batch would
    g_main, g_aux = all_reduce_mean(g_main, params), all_reduce_mean(g_aux, params)
    scoped = scope_mask(named_trainable, stage.rule.scope)
    grads, outcome = combine_gradients(  # in place: g_main is this step's own fresh tensors
        stage.rule, list(g_main), list(g_aux), scoped, in_place=True
    )
    for p, g in zip(params, grads):
        p.grad = None if g is None else g.detach()
    log.update(
        cosine=outcome.cosine, altered=outcome.altered, grad_norm_ratio=outcome.grad_norm_ratio
    )
    return log


def global_batches(n: int, batch_size: int, processes: int, min_rows: int = 1) -> int:
    """Global batches per epoch (each process takes ``batch_size``); a last batch too small to
    give every process a sample, or with fewer than ``min_rows`` rows, is dropped."""
    full, rest = divmod(n, batch_size * processes)
    return full + (rest >= max(processes, min_rows))


def run_fingerprint(
    task: Task,
    method: Method,
    knobs: Any,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    meta: dict,
    processes: int,
) -> str:
    """What a checkpoint must match to be resumed: everything that changes the arithmetic."""
    train = {k: v for k, v in dataclasses.asdict(train_cfg).items() if k not in _NOT_ARITHMETIC}
    return fingerprint(
        {
            "task": task.name,
            "method": method.name,
            "knobs": dataclasses.asdict(knobs),
            "model": dataclasses.asdict(model_cfg),
            "train": train,
            "data": meta,
            "processes": processes,
        }
    )


_NOT_ARITHMETIC = ("log_every", "save_every", "device", "score_each_epoch")


def train(
    task: Task,
    method: Method,
    knobs: Any,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    eval_batch_size: int,
    data_dir: Path,
    out_dir: Path,
    console: Console | None = None,
    *,
    progress: TrainProgress | None = None,
    collate: Callable[[list[dict], int, bool], dict[str, torch.Tensor]] = collate,
) -> dict:
    """Train ``method`` (built from its ``knobs`` record) on ``task``; write the model and its
    logs into ``out_dir``. ``model_cfg`` and ``train_cfg`` are params.yaml's ``model:`` and
    ``train:`` sections; ``eval_batch_size`` batches the dev scores at each epoch's end.

    Resumes from ``<out_dir>/../.<method>.checkpoint`` when a run with the same params was
    interrupted; the checkpoint is written every ``train.save_every`` steps and at each epoch's
    end, and removed once the final model is written. ``progress`` (default: a
    ``TrainProgress`` on ``console``, shown by the main process) hears of every step;
    ``collate`` pads a list of rows into a batch (``aclpipe.modeling.batching.collate``).
    """
    console = console or Console()
    run = _load_run(task, method, knobs, model_cfg, train_cfg, data_dir, out_dir, collate)
    start = _resume(run, method, task, train_cfg.epochs, console)  # where training starts
    model, accelerator, t = run.model, run.accelerator, train_cfg
    model.to(accelerator.device)
    rank, processes = accelerator.process_index, accelerator.num_processes
    if progress is None:
        progress = TrainProgress(console, t.log_every, enabled=accelerator.is_main_process)
    at, history, step_log = start.position, start.history, start.step_log
    global_step, global_size = at.global_step, t.batch_size * processes
    optimizer = scheduler = None

    def checkpoint(position: Position) -> None:  # with the current stage's optimizer and schedule
        _save(
            run,
            TrainingState(
                position, optimizer.state_dict(), scheduler.state_dict(), history, step_log
            ),
        )

    for stage_index, stage in enumerate(method.stages[at.stage :], start=at.stage):
        resuming = stage_index == at.stage  # this stage was under way at the checkpoint
        optimizer, scheduler = _stage_optimizer(
            model, stage, t, run.per_epoch, start if resuming else None
        )
        wrapped = accelerator.prepare_model(model)  # DDP over several processes
        named_trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        two_grads = stage.separate_gradients(t.record_angles)
        progress.start(
            f"{method.name} stage {stage_index + 1}/{len(method.stages)}", t.epochs * run.per_epoch
        )
        progress.skip(global_step - sum(1 for r in step_log if r["stage"] < stage_index + 1))
        for epoch in range(at.epoch if resuming else 0, t.epochs):
            first = at.batch if resuming and epoch == at.epoch else 0
            order = epoch_order(
                run.train_lengths, global_size, t.seed, stage_index, epoch, t.group_by_length
            )
            wrapped.train()
            for index in range(first, run.per_epoch):
                started = time.perf_counter()
                global_ids = order[index * global_size : (index + 1) * global_size]
                local_ids = shard(global_ids, rank, processes)
                batch = run.collate([run.train_rows[i] for i in local_ids], stage.views)
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                labels = batch.pop("labels")
                with accelerator.no_sync(wrapped) if two_grads else contextlib.nullcontext():
                    out = wrapped(**batch, padding_free=run.padding_free)
                    x = LossInputs(
                        out.logits,
                        gather_with_grad(out.features, dim=1),
                        out.label_embeddings,  # read inside forward: DDP sees its use
                        labels,
                        task.is_regression,
                        feature_labels=gather_labels(labels),
                        local_weight=local_weight(len(local_ids), len(global_ids), processes),
                        exit_layers=run.spec.exits,
                    )
                    log = backward(stage, x, accelerator, wrapped, named_trainable, t.record_angles)
                if processes > 1:  # log the global batch's losses, not process 0's shard
                    log.update(mean_over_processes(log, ("loss", "main", "aux")))
                _check_finite(log["loss"], global_step, stage_index, epoch)
                if t.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_([p for _, p in named_trainable], t.max_grad_norm)
                _optimizer_step(optimizer, global_step)
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                global_step += 1
                log.update(
                    step=global_step,
                    stage=stage_index + 1,
                    epoch=epoch + 1,
                    lr=scheduler.get_last_lr()[0],
                )
                step_log.append(log)
                progress.step(log, len(global_ids), time.perf_counter() - started)
                if t.save_every and global_step % t.save_every == 0 and index + 1 < run.per_epoch:
                    checkpoint(Position(stage_index, epoch, index + 1, global_step))
            if not t.score_each_epoch:  # few-shot: no per-epoch dev score nor checkpoint
                continue
            if accelerator.is_main_process:
                scores = _dev_scores(run, task, eval_batch_size)
                history.append(
                    {
                        "stage": stage_index + 1,
                        "epoch": epoch + 1,
                        "step": global_step,
                        "dev_scores": scores,
                    }
                )
                progress.epoch_done(stage_index + 1, epoch + 1, run.spec.exits, scores)
            checkpoint(Position(stage_index, epoch + 1, 0, global_step))
        progress.stop()
    if method.refit is not None:  # every process alike: the same weights, the same rows
        refit_heads(model, method.refit, run.train_rows, run.pad_id, eval_batch_size,
                    accelerator.device)  # fmt: skip
    if accelerator.is_main_process:
        _write_model(run, task, method, model_cfg, out_dir, history, step_log)
    accelerator.wait_for_everyone()
    return {"exits": run.spec.exits, "history": history}


# Set-up and resume: everything train does once, before its first batch ---------------------


@dataclass
class _Run:
    """What ``train`` sets up once: processes, data, model and where checkpoints go."""

    accelerator: Any  # accelerate.Accelerator: device, processes, DDP
    model: MultiExitModel
    spec: ExitSpec
    train_rows: list[dict]
    train_lengths: list[int]  # tokens per training row: what length grouping sorts by
    dev_rows: list[dict]
    dev_labels: Any  # the dev split's labels, as ``exit_scores`` takes them
    pad_id: int
    per_epoch: int  # global batches per epoch
    padding_free: bool  # train.padding_free resolved for this encoder
    checkpoint_folder: Path
    fingerprint: str  # what a checkpoint must match to be resumed
    # rows -> a padded batch, each row's sentences encoded ``views`` times (sentence tasks)
    collate: Callable[[list[dict], int], dict[str, torch.Tensor]]


def _load_run(
    task: Task,
    method: Method,
    knobs: Any,
    model_cfg: ModelConfig,
    t: TrainConfig,
    data_dir: Path,
    out_dir: Path,
    collate_rows: Callable = collate,
) -> _Run:
    """Read the prepared data, start the processes and build the model (seeded as a single
    process would be: the same heads everywhere, process 0's dropout as one process's)."""
    from accelerate import Accelerator, DistributedDataParallelKwargs

    meta = load_meta(data_dir)
    if meta.get("task", task.name) != task.name:
        raise UserError(
            f"{data_dir} holds task {meta['task']!r}, not {task.name}: run "
            f"`aclpipe prepare --task {task.name}`"
        )
    if meta["model"] != model_cfg.name:
        raise UserError(
            f"{data_dir} was tokenized for {meta['model']!r} but model.name is "
            f"{model_cfg.name!r}: run `aclpipe prepare --task {task.name}` again"
        )
    train_rows, dev_rows = load_split(data_dir, "train"), load_split(data_dir, _dev(task))
    accelerator = Accelerator(
        cpu=pick_device(t.device) == "cpu",
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
    )
    rank, processes = accelerator.process_index, accelerator.num_processes
    min_rows = _check_fit(task, method, t.batch_size, processes)
    per_epoch = global_batches(len(train_rows), t.batch_size, processes, min_rows)
    if per_epoch == 0:
        raise UserError(
            f"{data_dir}/train.jsonl has {len(train_rows)} examples, fewer than the "
            f"{max(processes, min_rows)} a batch needs ({processes} processes, {method.name} "
            f"{min_rows} rows): prepare more examples or run fewer processes"
        )
    set_seed(t.seed)  # the same initial heads in every process
    encoder = load_encoder(model_cfg.name, model_cfg.trust_remote_code)
    spec = make_spec(
        method,
        model_cfg,
        encoder.config.num_hidden_layers,
        task.num_labels,
        resolve_model(model_cfg.name),
        getattr(encoder.config, "hidden_dropout_prob", 0.1),
    )
    model = MultiExitModel(encoder, spec)
    pad_id = encoder.config.pad_token_id or 0
    set_seed(t.seed + rank)  # dropout: process 0 draws what a single process would
    return _Run(
        accelerator,
        model,
        spec,
        train_rows,
        [_tokens(row) for row in train_rows],
        dev_rows,
        split_labels(dev_rows, task),
        pad_id,
        per_epoch,
        use_padding_free(t.padding_free, encoder),
        checkpoint_dir(out_dir),
        run_fingerprint(task, method, knobs, model_cfg, t, meta, processes),
        _collate_for(task, pad_id, collate_rows),
    )


def _tokens(row: dict) -> int:
    """Tokens in a prepared row: its input_ids, or a sentence task's sentences together."""
    return len(row["input_ids"]) if "input_ids" in row else sum(map(len, row["sentences"]))


def _collate_for(task: Task, pad_id: int, collate_rows: Callable) -> Callable:
    """Rows -> a batch: a sentence task's rows encode each sentence alone, ``views`` times;
    a GLUE task's rows are one example each (``views`` is 1 for its methods)."""
    if task.embeds:
        return lambda rows, views: collate_sentences(rows, pad_id, views)
    return lambda rows, views: collate_rows(rows, pad_id, task.is_regression)


def _check_fit(task: Task, method: Method, batch_size: int, processes: int) -> int:
    """The method suits the task and its batch; returns the rows a batch needs."""
    if method.embeds and not task.embeds:
        raise UserError(
            f"{method.name} trains sentence embeddings, not a classifier for {task.name}: "
            "use --task sentences (simcse-unsup) or --task sentence-pairs (simcse-sup)"
        )
    if task.embeds and not method.embeds:
        raise UserError(
            f"{task.name} is a sentence-embedding task: train it with simcse-unsup or "
            f"simcse-sup, not {method.name}"
        )
    min_rows = max(stage.min_rows for stage in method.stages)
    if batch_size * processes < min_rows:
        raise UserError(
            f"{method.name} needs at least {min_rows} rows per batch (the batch's other rows "
            f"are the negatives), got train.batch_size {batch_size}: set "
            f"train.batch_size to {min_rows} or more"
        )
    return min_rows


def _resume(run: _Run, method: Method, task: Task, epochs: int, console: Console) -> TrainingState:
    """Where training starts: from the beginning, or from the checkpoint of an interrupted run
    with the same params (restoring the model's weights and every RNG from it)."""
    resumed = load_checkpoint(
        run.checkpoint_folder, run.model, run.fingerprint, run.accelerator.process_index
    )
    if resumed is None:
        return TrainingState(Position())
    at = resumed.position
    if at.epoch >= epochs:  # the checkpoint closed a stage: the next starts afresh
        resumed.position = at = Position(at.stage + 1, 0, 0, at.global_step)
        resumed.optimizer_state = resumed.scheduler_state = None
    if run.accelerator.is_main_process:
        where = (
            f"stage {at.stage + 1}, epoch {at.epoch + 1}, batch {at.batch}"
            if at.stage < len(method.stages)
            else "training had finished; writing the final model"
        )
        console.print(
            f"resuming {method.name} on {task.name} from {run.checkpoint_folder}: {where} "
            f"(step {at.global_step})",
            highlight=False,
        )
    return resumed


def _stage_optimizer(
    model: MultiExitModel,
    stage: Stage,
    t: TrainConfig,
    per_epoch: int,
    resumed: TrainingState | None,
):
    """The stage's optimizer and schedule, with their state if the stage is being resumed."""
    optimizer = build_optimizer(model, stage.trains, t)
    scheduler = linear_schedule(optimizer, t.epochs * per_epoch, t.warmup_ratio)
    if resumed is not None and resumed.optimizer_state:
        optimizer.load_state_dict(resumed.optimizer_state)
        scheduler.load_state_dict(resumed.scheduler_state)
    return optimizer, scheduler


# Steps of the loop that are more words than arithmetic ----------------------------------------


def _check_finite(loss: float, global_step: int, stage_index: int, epoch: int) -> None:
    if not math.isfinite(loss):
        raise UserError(
            f"loss is {loss} at step {global_step + 1} (stage {stage_index + 1}, epoch "
            f"{epoch + 1}): the learning rate is likely too high or the data has bad labels; "
            "lower train.lr and run again"
        )


def _optimizer_step(optimizer, global_step: int) -> None:
    try:
        optimizer.step()
    except RuntimeError as err:  # e.g. a step size that overflows float32
        raise UserError(
            f"the optimizer step failed at step {global_step + 1} ({err}): "
            "train.lr or train.head_lr is likely far too high; lower it and run again"
        ) from err


def _dev_scores(run: _Run, task: Task, batch_size: int) -> list[float]:
    """The task score of every exit on the dev split (a sentence task's: the Spearman
    correlation of each pair's cosine similarity with the gold scores)."""
    if task.embeds:
        cosines = exit_pair_cosines(
            run.model, run.dev_rows, batch_size, run.pad_id, run.accelerator.device
        )
        return exit_spearman(cosines, run.dev_labels)
    dev_logits = all_exit_logits(
        run.model, run.dev_rows, batch_size, run.pad_id, task.is_regression, run.accelerator.device
    )
    return [s["score"] for s in exit_scores(task, dev_logits, run.dev_labels)]


def _save(run: _Run, training: TrainingState) -> None:
    """Checkpoint from the main process, with every process's RNG state."""
    accelerator, per_rank = run.accelerator, None
    if accelerator.num_processes > 1:
        per_rank = [None] * accelerator.num_processes
        torch.distributed.all_gather_object(per_rank, torch.get_rng_state())
    if accelerator.is_main_process:
        save_checkpoint(run.checkpoint_folder, run.model, training, run.fingerprint, per_rank)
    accelerator.wait_for_everyone()


def _write_model(
    run: _Run,
    task: Task,
    method: Method,
    model_cfg: ModelConfig,
    out_dir: Path,
    history: list,
    step_log: list,
) -> None:
    """The trained model, its tokenizer and logs, written atomically; then the checkpoint goes."""
    with atomic.atomic_files(out_dir, last=MODEL_CONFIG) as tmp:
        run.model.save(tmp, base_model=model_cfg.name)
        _save_tokenizer(model_cfg, tmp / TOKENIZER)
        record = {
            "task": task.name,
            "method": method.name,
            "exits": run.spec.exits,
            "processes": run.accelerator.num_processes,
            "padding_free": run.padding_free,
        }
        write_run_log(tmp, record, history, step_log)  # dvclive/: `dvc exp show`, `dvc plots`
    shutil.rmtree(run.checkpoint_folder, ignore_errors=True)


def _dev(task: Task) -> str:
    return task.dev_splits[0][0]


def _save_tokenizer(model_cfg: ModelConfig, folder: Path) -> None:
    from aclpipe.modeling.backbone import load_tokenizer

    load_tokenizer(model_cfg.name, model_cfg.trust_remote_code).save_pretrained(str(folder))


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the `aclpipe finetune` command")
