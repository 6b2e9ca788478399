"""Zero-shot STS-B evaluation on a tiny random BERT and a tiny STS-B file, offline."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from rich.console import Console
from scipy import stats

from aclpipe.study.sts.embeddings import (
    POOLINGS,
    cosine_spearman,
    layer_embeddings,
    render_sts_table,
    sts_embedding_eval,
    write_sts_report,
)

WORDS = "a man woman is playing guitar piano the cat dog sits runs on mat".split()
PAIRS = [
    ("a man is playing guitar", "a man is playing piano", 3.2),
    ("the cat sits on the mat", "the dog sits on the mat", 2.5),
    ("a woman runs", "a man runs", 1.8),
    ("the dog runs", "the dog runs", 5.0),
    ("a cat", "a man is playing piano", 0.2),
    ("the woman sits", "a woman sits on the mat", 3.9),
]
HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"


def write_stsb(glue_dir) -> None:
    folder = glue_dir / "STS-B"
    folder.mkdir(parents=True)
    rows = [
        f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{s:.3f}"
        for i, (a, b, s) in enumerate(PAIRS)
    ]
    for split in ("train", "dev"):
        (folder / f"{split}.tsv").write_text("\n".join([HEADER, *rows]) + "\n", encoding="utf-8")


@pytest.fixture()
def tiny_bert(tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizer

    torch.manual_seed(0)
    folder = tmp_path / "tiny-bert"
    folder.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(vocab=str(tmp_path / "vocab.txt"))
    assert tokenizer.convert_tokens_to_ids("guitar") == vocab.index("guitar")
    tokenizer.save_pretrained(folder)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(folder)
    return folder


def test_result_structure_and_range(tiny_bert, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    glue_dir = tmp_path / "glue"
    write_stsb(glue_dir)
    result = sts_embedding_eval(str(tiny_bert), glue_dir, batch_size=4)  # two batches
    assert result["model"] == str(tiny_bert)
    assert result["split"] == "dev"
    assert result["examples"] == len(PAIRS)
    assert result["layers"] == [1, 2, 3]
    assert result["layer_attention_query"] == "cls"  # no 1_Pooling config: a [CLS] checkpoint
    assert list(result["spearman"]) == list(POOLINGS)
    for values in result["spearman"].values():
        assert len(values) == 3
        assert all(math.isfinite(v) and -1.0 <= v <= 1.0 for v in values)
    # Batching does not change the result.
    whole = sts_embedding_eval(str(tiny_bert), glue_dir, batch_size=64, poolings=["mean"])
    assert whole["spearman"]["mean"] == pytest.approx(result["spearman"]["mean"], abs=1e-6)

    out = tmp_path / "reports" / "sts.json"
    write_sts_report(result, out)
    assert json.loads(out.read_text(encoding="utf-8")) == result
    console = Console(record=True, width=120)
    console.print(render_sts_table(result))
    assert "layer-attention" in console.export_text()


def test_cls_and_mean_layers_match_the_encoder(tiny_bert) -> None:
    from transformers import AutoModel, AutoTokenizer

    tokenizer, encoder = (
        AutoTokenizer.from_pretrained(tiny_bert),
        AutoModel.from_pretrained(tiny_bert),
    )
    batch = tokenizer(["a man runs", "the cat sits on the mat"], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"]  # [B, T]
    cls = layer_embeddings(hidden, mask, "cls")  # [L, B, H]
    mean = layer_embeddings(hidden, mask, "mean")  # [L, B, H]
    attention = layer_embeddings(hidden, mask, "layer-attention")  # [L, B, H]
    assert cls.shape == mean.shape == attention.shape == (3, 2, 32)
    assert torch.equal(cls[1], hidden[2][:, 0])
    n = int(mask[0].sum())
    assert torch.allclose(mean[2][0], hidden[3][0, :n].mean(0), atol=1e-6)


def test_cosine_spearman_hand_checked() -> None:
    # Unit 2-D vectors at angles 0, 30, 60, 90 and 120 degrees from (1, 0): the cosines are
    # 1, 0.866, 0.5, 0, -0.5, ranks 5, 4, 3, 2, 1. Gold ranks 5, 3, 4, 1, 2 give
    # d = 0, 1, -1, 1, -1, so rho = 1 - 6 * 4 / (5 * 24) = 0.8.
    angles = np.radians([0, 30, 60, 90, 120])
    first = np.tile([1.0, 0.0], (5, 1))  # [N, 2]
    second = 2.0 * np.stack([np.cos(angles), np.sin(angles)], axis=1)  # [N, 2], norm 2
    gold = np.array([4.8, 2.0, 3.1, 0.4, 1.2])
    assert cosine_spearman(first, second, gold) == pytest.approx(0.8)
    cosine = (first * second).sum(1) / (
        np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)
    )
    assert cosine_spearman(first, second, gold) == pytest.approx(stats.spearmanr(cosine, gold)[0])
    # Random vectors against scipy.
    rng = np.random.default_rng(0)
    a, b, g = rng.normal(size=(20, 6)), rng.normal(size=(20, 6)), rng.uniform(0, 5, 20)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cosine_spearman(a, b, g) == pytest.approx(stats.spearmanr(cos, g)[0], abs=1e-12)


def test_unknown_pooling(tiny_bert, tmp_path) -> None:
    from aclpipe.errors import UserError

    with pytest.raises(UserError, match="unknown pooling"):
        sts_embedding_eval(str(tiny_bert), tmp_path, poolings=["max"])
