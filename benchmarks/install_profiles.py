"""The two ends of the install, measured: `pip install aclpipe` (the torch-free serving core)
against `pip install 'aclpipe[all]'`, and how long `aclpipe serve` takes to start from each.

1. Two fresh virtual environments under ``--root``, one per profile, each given this source
   tree with ``pip install <tree>`` / ``pip install '<tree>[all]'`` (not editable, so the
   environment holds everything it runs). Recorded: the environment's size on disk, its
   site-packages' size, the install's wall time, and whether torch, DVC and matplotlib
   import there.
2. Start-up: ``aclpipe serve --model EXPORT --port 0`` from each environment's console script,
   interleaved (core, all, core, all, ...), timed from the command to the first 200 from
   ``/readyz`` (the port opens only after the engine's warm-up batches, so this is the whole
   start: interpreter, imports, loading the graphs, warm-up, binding). Then SIGTERM.

The export: ``--export`` (e.g. models/sst2/acl-cl/export), else one made here from the offline
default model (all-MiniLM-L6-v2, 6 exits, untrained heads: start-up does not depend on the
weights' values) with a few tokenized sentences as its dev split.

    python benchmarks/install_profiles.py [--root DIR] [--export PATH] [--repeats 5]
        [--out benchmarks/results/install_profiles.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILES = {"core": "", "all": "[all]"}
PROBES = ("torch", "dvc", "matplotlib", "onnxruntime", "starlette")
SENTENCES = [
    "a gripping , funny film",
    "the plot is thin and the acting is worse",
    "an honest , moving story",
    "it never finds its feet",
] * 4


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def install(venv: Path, extra: str) -> dict:
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    start = time.perf_counter()
    subprocess.run([*pip, f"{ROOT}{extra}"], check=True)
    seconds = time.perf_counter() - start
    site = next((venv / "lib").glob("python3*/site-packages"))
    imports = {}
    for name in PROBES:
        probe = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {name}"],
                               capture_output=True)  # fmt: skip
        imports[name] = probe.returncode == 0
    return {
        "pip_install": f"pip install '.{extra}'" if extra else "pip install .",
        "install_seconds": round(seconds, 1),
        "venv_bytes": folder_bytes(venv),
        "site_packages_bytes": folder_bytes(site),
        "venv_mib": round(folder_bytes(venv) / 2**20, 1),
        "site_packages_mib": round(folder_bytes(site) / 2**20, 1),
        "importable": imports,
    }


def make_export(folder: Path) -> Path:
    """An export of the offline model with untrained heads, for timing start-up only."""
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from aclpipe.data.tasks import TASKS
    from aclpipe.exits.export import export_exits
    from aclpipe.layout import META
    from aclpipe.modeling.backbone import load_encoder, load_tokenizer
    from aclpipe.modeling.config import DEFAULT_MODEL
    from aclpipe.modeling.model import ExitSpec, MultiExitModel

    torch.manual_seed(0)
    model_dir, data_dir = folder / "model", folder / "data"
    encoder = load_encoder(DEFAULT_MODEL)
    layers = encoder.config.num_hidden_layers
    spec = ExitSpec(num_labels=2, exits=list(range(1, layers + 1)), pooling="mean", dropout=0.1)
    MultiExitModel(encoder, spec).eval().save(model_dir)
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    tokenizer.save_pretrained(str(model_dir))
    encoded = tokenizer(SENTENCES, truncation=True, max_length=64)
    data_dir.mkdir(parents=True)
    rows = [
        {"input_ids": ids, "token_type_ids": types, "label": i % 2}
        for i, (ids, types) in enumerate(zip(encoded["input_ids"], encoded["token_type_ids"]))
    ]
    (data_dir / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"task": "sst2", "splits": {"dev": {"examples": len(rows)}}}
    (data_dir / META).write_text(json.dumps(meta))
    out = folder / "export"
    export_exits(TASKS["sst2"], model_dir, data_dir, out, batch_size=8)
    return out


def start_once(aclpipe: Path, export: Path) -> float:
    """Seconds from the command to the first 200 from /readyz."""
    start = time.perf_counter()
    server = subprocess.Popen(
        [str(aclpipe), "serve", "--model", str(export), "--port", "0", "--threads", "1"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        port = None
        for line in server.stderr:  # the start-up line names the port
            if match := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                port = int(match.group(1))
                break
        if port is None:
            raise RuntimeError(f"{aclpipe} serve did not start (exit code {server.wait()})")
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - start
            except OSError:
                time.sleep(0.01)
    finally:
        server.terminate()
        server.wait(timeout=60)


def shown_args(argv: list[str]) -> list[str]:
    """The command line as recorded: folder arguments by role, not by this machine's path."""
    shown, hide = [], False
    for arg in argv:
        shown.append("DIR" if hide else arg)
        hide = arg in ("--root", "--export", "--out")
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="where the two venvs go")
    parser.add_argument("--export", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/install_profiles.json"
    )
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="aclpipe-install-"))
    sys.path.insert(0, str(ROOT / "src"))
    from aclpipe.host import machine

    profiles = {name: install(root / name, extra) for name, extra in PROFILES.items()}
    export = args.export or make_export(root / "startup")
    seconds: dict[str, list[float]] = {name: [] for name in PROFILES}
    for _ in range(args.repeats):
        for name in PROFILES:
            seconds[name].append(round(start_once(root / name / "bin" / "aclpipe", export), 3))
    for name in PROFILES:
        profiles[name]["serve_startup_seconds"] = seconds[name]
        profiles[name]["serve_startup_median_seconds"] = statistics.median(seconds[name])
    record = {
        "benchmark": "install_profiles",
        "command": " ".join(["python benchmarks/install_profiles.py", *shown_args(sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine(),
        "load_average_at_end": os.getloadavg(),
        "python": platform.python_version(),
        "export": "offline MiniLM-L6, 6 exits, untrained heads" if args.export is None
        else str(Path(*args.export.resolve().parts[-4:])),
        "profiles": profiles,
        "ratios": {
            "venv_all/core": round(profiles["all"]["venv_bytes"] / profiles["core"]["venv_bytes"], 2),
            "serve_startup_all/core": round(
                profiles["all"]["serve_startup_median_seconds"]
                / profiles["core"]["serve_startup_median_seconds"], 2),
        },
    }  # fmt: skip
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    for name, p in profiles.items():
        print(f"{name:5} {p['pip_install']:28} venv {p['venv_mib']:8.1f} MiB  "
              f"site-packages {p['site_packages_mib']:8.1f} MiB  serve start-up median "
              f"{p['serve_startup_median_seconds']:.2f} s  torch importable: "
              f"{p['importable']['torch']}")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
