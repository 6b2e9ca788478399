"""The on-disk layout: every folder and file name the stages read and write, decided here.

The CLI, the stages, the campaign and the tests ask this module for paths instead of
spelling them, so they cannot drift apart. A ``Layout`` is rooted where the stages run (the
repository root for the default pipeline, ``campaign/`` for the seeds campaign)::

    data/<task>/{train,validation,<dev splits>}.jsonl, meta.json  prepare
    models/<task>/<method>/                                    finetune (weights, config, tokenizer, dvclive/)
    models/<task>/.<method>.checkpoint/                        finetune, while it runs
    models/<task>/<method>/export/                             export-exits
    models/<task>/<method>/hf/                                 export-hf (transformers or sentence-transformers)
    reports/<task>/<method>/{metrics,curves}.json, curves.csv, predictions.npz   evaluate
    reports/<task>/{tradeoff.md,...}                           tradeoff
    reports/<task>/angles/                                     angles
    reports/stsb/sts_embeddings.json                           sts-eval
    runs/<task>/<run>-s<seed>/                                 campaign run (run.json, scores, predictions, dvclive/)
    models/<task>/<run>-s<seed>/, .<run>-s<seed>.checkpoint/   campaign run: scratch while it trains
    models/<task>/<run>-s<seed>.log                            campaign run: its log, kept
    tune/<task>/<config>-s<seed>/                              campaign tune (scratch and log as above, tune-<config>)
    data/<task>/s<seed>/n<N>/                                  a few-shot study's draws (fewshot/): prepare per seed

The campaign's reports are not under ``campaign/`` but at the repository root
(``campaign_markdown.campaign_reports``), apart from the default pipeline's ``reports/<task>/``::

    reports/README.md                                          campaign report: the overview
    reports/campaign/<task>/{results,tuning}.{md,json}         campaign report (tuning: also campaign tune)
    reports/campaign/<task>/results_{exits,angles}.png         campaign report
    reports/campaign/results_score_vs_time.png                 campaign report: every task
    reports/fewshot/{README.md,results.json,fewshot_*.png}     the few-shot study's report (fewshot/)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the two pipelines: the default one at the repository root, the seeds campaign under campaign/
PARAMS = "params.yaml"
DVC_YAML = "dvc.yaml"
CAMPAIGN = "campaign"  # the campaign's root folder, and its reports' folder under reports/
CAMPAIGN_PARAMS = f"{CAMPAIGN}/{PARAMS}"

# the folders under a root
DATA, MODELS, REPORTS, RUNS, TUNE = "data", "models", "reports", "runs", "tune"

# prepare
META = "meta.json"
VALIDATION = "validation"  # the split held out of train for selection (data.validation_fraction)
SPLIT_SUFFIX = ".jsonl"  # data/<task>/<split>.jsonl

# finetune: the trained model's folder
WEIGHTS = "model.safetensors"
MODEL_CONFIG = "aclpipe_model.json"  # written last: its presence marks a complete model
TOKENIZER = "tokenizer"
TRAINING_LOG = "dvclive"  # the training curves, written through DVCLive (aclpipe.run_log)
TRAINING_LOG_PARAMS = "params.yaml"  # DVCLive's copy of the run's params, inside dvclive/
LEGACY_STEPS = "steps.jsonl"  # campaign runs recorded before DVCLive: the step log
LEGACY_HISTORY = "history.json"  # ... and the per-epoch history

# finetune: the resumable checkpoint (checkpoint_dir), beside the model folder while it trains
CHECKPOINT_STATE = "state.json"
CHECKPOINT_OPTIMIZER = "optimizer.safetensors"
CHECKPOINT_RNG = "rng.safetensors"

# export-exits
EXPORT = "export"
EXPORT_MODEL = "model"  # the self-contained model folder inside export/
TASK_FILE = "aclpipe_task.json"  # task name and label names beside an exported model
DEV_LOGITS = "dev_logits.npz"
EXPORT_JSON = "export.json"
EXPORT_TOKENIZER = "tokenizer.json"  # the fast tokenizer file, beside export.json (and in tokenizer/)
EMBEDDINGS_ONNX = "embeddings.onnx"  # the first ONNX segment; the others are segment_file(end)
INT8_SUFFIX = ".int8.onnx"  # quantize: segment_3.onnx -> segment_3.int8.onnx

# export-hf: a folder transformers (or sentence-transformers) loads
HF_EXPORT = "hf"
HF_MODELING = "modeling_aclpipe.py"  # the model's code inside it, named by config.json's auto_map
HF_CARD = "README.md"  # its model card (the Hub reads the YAML front matter)

# evaluate
METRICS = "metrics.json"
PREDICTIONS = "predictions.npz"  # every exit's logits on every scored split, per example
CURVES_JSON = "curves.json"
CURVES_CSV = "curves.csv"

# tradeoff: reports/<task>/
TRADEOFF_MD = "tradeoff.md"
TRADEOFF_CSV = "tradeoff.csv"
TRADEOFF_CURVES_CSV = "tradeoff_curves.csv"
EXIT_SCORES_CSV = "exit_scores.csv"
TRADEOFF_PNG = "tradeoff_score_vs_time.png"
EXIT_SCORES_PNG = "exit_scores.png"

# angles: reports/<task>/angles/
ANGLES = "angles"
ANGLES_JSON = "angles.json"
ANGLES_PNG = "angles.png"

# sts-eval
STS_REPORT = "sts_embeddings.json"  # under reports/stsb/
# the STS study (sentence embeddings): sts/params.yaml, its report in reports/sts/
STS = "sts"
STS_PARAMS = f"{STS}/{PARAMS}"

# campaign
RUN_RECORD = "run.json"
RESULTS_MD = "results.md"  # reports/campaign/<task>/, with results.json and plots
RESULTS_JSON = "results.json"
TUNING_MD = "tuning.md"  # reports/campaign/<task>/, with tuning.json (campaign tune)
TUNING_JSON = "tuning.json"
REPORTS_README = "README.md"  # reports/ at the repository root, the campaign's overview
RESULTS_EXITS_PNG = "results_exits.png"  # reports/campaign/<task>/: score per exit with 95% bands
RESULTS_ANGLES_PNG = "results_angles.png"  # reports/campaign/<task>/: gradient-angle histograms
RESULTS_COST_PNG = "results_score_vs_time.png"  # reports/campaign/: score against cost, every task
FEWSHOT_REPORTS = "fewshot"  # reports/fewshot/: the few-shot study's README.md, results.json
FEWSHOT_SCORES_PNG = "fewshot_scores.png"  # reports/fewshot/: score against N, band over draws
FEWSHOT_SPREAD_PNG = "fewshot_spread.png"  # reports/fewshot/: sd over draws per method and N
FEWSHOT_PEERS_PNG = "fewshot_peers.png"  # reports/fewshot/: the methods beside SetFit and the probe
STACK_CHECK = "stack_check.json"  # campaign/: one run trained on two stacks, compared
STACK_CHECK_SCRIPT = f"{CAMPAIGN}/stack_check.sh"  # trains that run on both, then stack-compare


@dataclass(frozen=True)
class Layout:
    """Paths under one root (the working directory by default)."""

    root: Path = Path(".")

    def data(self, task: str | None = None) -> Path:
        return self.root / DATA if task is None else self.root / DATA / task

    def split(self, task: str, split: str) -> Path:
        return split_file(self.data(task), split)

    def models(self, task: str | None = None) -> Path:
        return self.root / MODELS if task is None else self.root / MODELS / task

    def model(self, task: str, method: str) -> Path:
        return self.models(task) / method

    def export(self, task: str, method: str) -> Path:
        return self.model(task, method) / EXPORT

    def hf_export(self, task: str, method: str) -> Path:
        return self.model(task, method) / HF_EXPORT

    def reports(self, task: str | None = None) -> Path:
        return self.root / REPORTS if task is None else self.root / REPORTS / task

    def report(self, task: str, method: str) -> Path:
        return self.reports(task) / method

    def angles(self, task: str) -> Path:
        return self.reports(task) / ANGLES

    def sts_report(self) -> Path:
        return self.reports("stsb") / STS_REPORT

    def sts_study_reports(self) -> Path:
        return self.reports(STS)

    # the seeds campaign (rooted at campaign/)
    def run(self, task: str, run: str, seed: int) -> Path:
        return self.runs(task) / f"{run}-s{seed}"

    def runs(self, task: str | None = None) -> Path:
        return self.root / RUNS if task is None else self.root / RUNS / task

    def scratch(self, task: str, run: str, seed: int) -> Path:
        """Where a campaign run trains before its scores are kept (weights are dropped)."""
        return self.model(task, f"{run}-s{seed}")

    def run_log(self, task: str, run: str, seed: int) -> Path:
        return self.models(task) / f"{run}-s{seed}.log"

    def fewshot_data(self, task: str, examples: int, seed: int) -> Path:
        """A few-shot draw of ``examples`` training examples by ``seed`` (``data.fewshot``)."""
        return self.data(task) / f"s{seed}" / f"n{examples}"

    def tune_runs(self, task: str) -> Path:
        return self.root / TUNE / task

    def tune_run(self, task: str, config: str, seed: int) -> Path:
        """A configuration of the base-recipe grid (``aclpipe campaign tune``)."""
        return self.tune_runs(task) / f"{config}-s{seed}"

    def tune_scratch(self, task: str, config: str, seed: int) -> Path:
        return self.model(task, f"tune-{config}-s{seed}")


def checkpoint_dir(model_dir: Path) -> Path:
    """The resumable checkpoint beside a model folder being trained."""
    return model_dir.parent / f".{model_dir.name}.checkpoint"


def split_file(data_dir: Path, split: str) -> Path:
    """One prepared split, one JSON object a line."""
    return data_dir / f"{split}{SPLIT_SUFFIX}"


def segment_file(end: int) -> str:
    """The ONNX segment that runs the layers up to exit ``end`` (export-exits)."""
    return f"segment_{end}.onnx"

