"""The model card (README.md) of an ``export-hf`` folder: the Hub's YAML metadata, then prose.

The front matter holds what the Hugging Face Hub reads: ``base_model``, ``datasets``,
``license``, ``library_name``, ``pipeline_tag``, ``tags``, ``metrics`` and, when the
evaluate stage's ``metrics.json`` is there, a ``model-index`` entry with the dev scores of the
deepest exit. The body gives the use in a few lines, the recipe (the method's knobs and the
training settings of the params file) and one row per exit (layer, dev score).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from aclpipe.data.tasks import Task

GLUE_HUB = "nyu-mll/glue"  # the dataset id the prepare stage reads GLUE from
CARD_TAG = "aclpipe"  # every card's first tag: export-hf knows its own folders by it


@dataclass
class CardFacts:
    """What a card says, gathered by the export stage."""

    task: Task
    method: str
    base_model: str | None
    license: str
    exits: list[int]
    pooling: str
    library: str  # transformers | sentence-transformers
    plain: bool = False  # a stock BertForSequenceClassification (no remote code)
    setting: dict = field(default_factory=dict)  # exit policy and threshold, with its source
    recipe: dict = field(default_factory=dict)  # section -> {knob: value}
    metrics: dict | None = None  # reports/<task>/<method>/metrics.json, when present


def dev_split(facts: CardFacts) -> dict | None:
    if not facts.metrics:
        return None
    return facts.metrics.get("splits", {}).get(facts.task.dev_splits[0][0])


def front_matter(facts: CardFacts) -> dict:
    task = facts.task
    embeds = facts.library == "sentence-transformers"
    meta: dict = {}
    if facts.base_model:
        meta["base_model"] = facts.base_model
    meta.update(
        datasets=[GLUE_HUB],
        language=["en"],
        library_name=facts.library,
        license=facts.license,
        pipeline_tag="sentence-similarity" if embeds else "text-classification",
        tags=[CARD_TAG, facts.method]
        + (["sentence-transformers", "feature-extraction"] if embeds else ["early-exit"]),
        metrics=list(task.metrics),
    )
    dev = dev_split(facts)
    if dev:
        final = dev["per_exit"][-1]["metrics"]
        meta["model-index"] = [{
            "name": f"{task.name}-{facts.method}",
            "results": [{
                "task": {"type": "sentence-similarity" if embeds else "text-classification"},
                "dataset": {"name": f"GLUE {task.folder}", "type": GLUE_HUB,
                            "config": task.hub_config, "split": task.dev_splits[0][2]},
                "metrics": [{"type": name, "value": round(float(value), 4),
                             "name": f"dev {name}"} for name, value in final.items()],
            }],
        }]  # fmt: skip
    return meta


def usage(facts: CardFacts) -> str:
    if facts.library == "sentence-transformers":
        return ("```python\nfrom sentence_transformers import SentenceTransformer\n\n"
                'model = SentenceTransformer("path/to/this/folder")\n'
                'embeddings = model.encode(["a gripping film", "a dull film"])\n```\n')  # fmt: skip
    remote = "" if facts.plain else ", trust_remote_code=True"
    text = ("```python\nfrom transformers import pipeline\n\n"
            f'classify = pipeline("text-classification", model="path/to/this/folder"{remote})\n'
            'print(classify("a gripping film"))\n```\n')  # fmt: skip
    if not facts.plain and len(facts.exits) > 1:
        text += (
            "\nEvery exit at once: `outputs = model(**batch)` gives `outputs.logits` (the deepest "
            "exit, the full model) and `outputs.exit_logits` `[exits, batch, classes]`; "
            "`model.exit_decisions(outputs.exit_logits)` applies the exit policy of config.json "
            "per sample and returns each sample's logits and exit layer. These are the answers "
            "of aclpipe's early-exit runtime; only that runtime also skips the layers.\n"
        )
    return text


def render(facts: CardFacts) -> str:
    """The card's text: YAML front matter, then Markdown."""
    task, dev = facts.task, dev_split(facts)
    head = yaml.safe_dump(front_matter(facts), sort_keys=False, allow_unicode=True)
    kind = "sentence embeddings" if facts.library == "sentence-transformers" else "a classifier"
    lines = [
        f"---\n{head}---\n",
        f"# {task.name} {facts.method}\n",
        f"{kind.capitalize()} trained with aclpipe's `{facts.method}` method on GLUE "
        f"{task.folder}, from `{facts.base_model or 'its encoder'}`: {len(facts.exits)} exit"
        f"{'s' if len(facts.exits) > 1 else ''} at layer{'s' if len(facts.exits) > 1 else ''} "
        f"{', '.join(map(str, facts.exits))}, {facts.pooling} pooling.\n",
        "## Use\n",
        usage(facts),
    ]
    if facts.setting and len(facts.exits) > 1:
        policy, threshold = facts.setting.get("policy"), facts.setting.get("threshold")
        source = facts.setting.get("source", "given")
        lines.append(
            f"Exit policy (config.json `exit_policy`, `exit_threshold`): {policy} {threshold} "
            f"({source}).\n"
        )
    if facts.recipe:
        lines += ["## Recipe\n", "| section | knob | value |", "| --- | --- | --- |"]
        for section, knobs in facts.recipe.items():
            lines += [f"| {section} | {k} | {v} |" for k, v in knobs.items()]
        lines.append("")
    lines += ["## Exits\n", f"| exit layer | dev {', '.join(task.metrics)} |", "| --- | --- |"]
    scores = {e["layer"]: e["metrics"] for e in dev["per_exit"]} if dev else {}
    for layer in facts.exits:
        shown = scores.get(layer)
        cell = ", ".join(f"{v * 100:.2f}" for v in shown.values()) if shown else "not evaluated"
        lines.append(f"| {layer} | {cell} |")
    if dev:
        lines.append(f"\nDev: {dev['examples']} examples of the {task.dev_splits[0][0]} split.")
    else:
        lines.append("\nNo dev scores: `aclpipe evaluate` had not run for this model.")
    return "\n".join(lines) + "\n"
