"""SetFit on one few-shot draw, run by ``aclpipe.study.campaign.peers`` inside SetFit's own environment.

Usage: ``<setfit env>/bin/python setfit_child.py FOLDER``. Reads ``FOLDER/request.json`` (the
checkpoint's local folder, the drawn training texts and labels, the dev texts, the seed, the
maximum length and SetFit's training arguments over the library's defaults), trains SetFit
(contrastive pairs through its sentence-transformers body, then the logistic-regression
head), and writes ``FOLDER/dev.npz`` (``log_probs [N, C]``) and ``FOLDER/reply.json`` (the
package versions, every training argument, the steps taken).

This file imports nothing from aclpipe: SetFit's environment does not have it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def joined(a: str, b: str | None, sep: str) -> str:
    """One text: a pair's two sentences joined by the separator token (SetFit embeds one text)."""
    return a if b is None else f"{a} {sep} {b}"


def main(folder: Path) -> None:
    import numpy as np
    import torch

    request = json.loads((folder / "request.json").read_text(encoding="utf-8"))
    torch.set_num_threads(int(request["threads"]))
    import datasets
    import sentence_transformers
    import setfit
    import transformers
    from setfit import SetFitModel, Trainer, TrainingArguments

    datasets.disable_progress_bars()
    model = SetFitModel.from_pretrained(request["model"], local_files_only=True)
    sep = model.model_body.tokenizer.sep_token or " "
    train = datasets.Dataset.from_dict(
        {
            "text": [joined(a, b, sep) for a, b, _ in request["train"]],
            "label": [int(y) for _, _, y in request["train"]],
        }
    )
    args = TrainingArguments(
        **request["arguments"],
        seed=int(request["seed"]),
        max_length=int(request["max_length"]),
        report_to="none",
        output_dir=str(folder / "checkpoints"),  # scratch: no checkpoint is kept
        logging_dir=str(folder / "logs"),
        save_strategy="no",
        show_progress_bar=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.train()
    dev = [joined(a, b, sep) for a, b in request["dev"]]
    probs = np.asarray(model.predict_proba(dev, as_numpy=True, show_progress_bar=False))
    classes = [int(c) for c in model.model_head.classes_]
    if classes != list(range(int(request["num_labels"]))):
        raise SystemExit(f"the head learned classes {classes}: the draw lacks a class")
    log_probs = np.log(np.clip(probs, 1e-12, 1.0)).astype(np.float32)  # [N, C]
    np.savez_compressed(folder / "dev.npz", log_probs=log_probs)
    body = getattr(trainer, "st_trainer", None)  # the sentence-transformers trainer of the pairs
    reply = {
        "versions": {
            "setfit": setfit.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "datasets": datasets.__version__,
        },
        # the scratch folder's own path is this machine's, not the recipe's
        "arguments": json.loads(json.dumps(args.to_dict(), default=str).replace(str(folder), "<scratch>")),
        "head": type(model.model_head).__name__
        + json.dumps(model.model_head.get_params(), default=str),
        "steps": body.state.global_step if body is not None else None,
        "pairs": len(body.train_dataset) if body is not None else None,
        "pair_separator": sep,
    }
    (folder / "reply.json").write_text(json.dumps(reply, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
