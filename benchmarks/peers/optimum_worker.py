"""Optimum's side of benchmarks/peers.py, run inside its own virtual environment (optimum.txt).

Three commands, as Optimum's documentation shows its use (export through
``ORTModelForSequenceClassification.from_pretrained(..., export=True)``, dynamic int8 through
``ORTQuantizer`` with an ``AutoQuantizationConfig``):

- ``prepare HF_FOLDER OUT``: export the model to ONNX (OUT/fp32) and quantize it (OUT/int8);
- ``serve OUT``: load both on ``--threads`` intra-op threads, then answer JSON lines on stdin,
  ``{"variant": "int8", "batch": 32, "texts": [...]}``, with ``{"seconds": s, "labels": [...]}``
  (the time of tokenizing, padding and running the batches; the caller interleaves rounds);
- ``once OUT VARIANT INPUT BATCH``: load one and label every line of INPUT (a whole process).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def session_options(threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


def prepare(hf_folder: str, out: str) -> None:
    from optimum.onnxruntime import ORTModelForSequenceClassification, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig
    from transformers import AutoTokenizer

    fp32, int8 = Path(out) / "fp32", Path(out) / "int8"
    model = ORTModelForSequenceClassification.from_pretrained(hf_folder, export=True)
    model.save_pretrained(fp32)
    AutoTokenizer.from_pretrained(hf_folder).save_pretrained(fp32)
    quantizer = ORTQuantizer.from_pretrained(model)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    qconfig = (AutoQuantizationConfig.avx512_vnni if "avx512_vnni" in flags
               else AutoQuantizationConfig.avx2)(is_static=False, per_channel=False)  # fmt: skip
    quantizer.quantize(save_dir=int8, quantization_config=qconfig)
    AutoTokenizer.from_pretrained(hf_folder).save_pretrained(int8)
    print(json.dumps({"quantization": "avx512_vnni" if "avx512_vnni" in flags else "avx2"}))


def load(out: str, variant: str, threads: int):
    from optimum.onnxruntime import ORTModelForSequenceClassification
    from transformers import AutoTokenizer

    folder = Path(out) / variant
    name = "model_quantized.onnx" if variant == "int8" else "model.onnx"
    model = ORTModelForSequenceClassification.from_pretrained(
        folder, file_name=name, session_options=session_options(threads)
    )
    return model, AutoTokenizer.from_pretrained(folder)


def label(model, tokenizer, texts: list[str], batch: int, max_length: int = 128) -> list[int]:
    labels = []
    for start in range(0, len(texts), batch):
        inputs = tokenizer(texts[start : start + batch], padding=True, truncation=True,
                           max_length=max_length, return_tensors="np")  # fmt: skip
        logits = model(**inputs).logits
        labels += [int(i) for i in logits.argmax(-1)]
    return labels


def serve(out: str, threads: int) -> None:
    models = {v: load(out, v, threads) for v in ("fp32", "int8")}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        model, tokenizer = models[ask["variant"]]
        began = time.perf_counter()
        labels = label(model, tokenizer, ask["texts"], ask["batch"])
        seconds = time.perf_counter() - began
        print(json.dumps({"seconds": seconds, "labels": labels}), flush=True)


def once(out: str, variant: str, source: str, batch: int, threads: int) -> None:
    model, tokenizer = load(out, variant, threads)
    texts = Path(source).read_text(encoding="utf-8").splitlines()
    labels = label(model, tokenizer, texts, batch)
    sys.stdout.write("".join(json.dumps({"label": i}) + "\n" for i in labels))


def versions() -> dict:
    from importlib.metadata import version

    names = ("optimum-onnx", "optimum", "onnxruntime", "transformers", "torch")
    return {name: version(name) for name in names}


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    threads = 1
    if "--threads" in args:
        at = args.index("--threads")
        threads = int(args[at + 1])
        del args[at : at + 2]
    if command == "prepare":
        prepare(*args)
    elif command == "serve":
        serve(args[0], threads)
    elif command == "once":
        once(args[0], args[1], args[2], int(args[3]), threads)
    elif command == "versions":
        print(json.dumps(versions()))
    else:
        sys.exit(f"unknown command {command!r}: use prepare, serve, once or versions")
