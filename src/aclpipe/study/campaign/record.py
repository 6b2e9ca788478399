"""Record a campaign's finished stages in its dvc.lock in one pass: ``aclpipe campaign record``.

``dvc commit -f <stage> <stage> ...`` parses the whole dvc.yaml and rewrites the whole lock once
per stage named; with a few hundred stages in a lock of tens of thousands of lines that is
seconds a stage (8.5 s on this machine with the few-shot study's 272). Here DVC's own commit
steps run for every stage chosen, from one parse of the dvc.yaml, and the lock is written once:
the same lock ``dvc commit -f`` writes, in seconds for the lot.

Chosen: the campaign's prepare, tune and run stages (``run``, ``ablation``, ``experiment``,
and a few-shot study's cells and their ``prepare-<cell>``)
whose outputs are all present, either those the lock lacks (runs finished since the last
record) or, with ``everything``, all of them, to re-record after a change shown to be
behaviour-neutral. Never the report: it is rebuilt, not recorded (``dvc repro -s
<study>/dvc.yaml:report``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from aclpipe.errors import UserError
from aclpipe.layout import DVC_YAML
from aclpipe.study.campaign.plan import Campaign

KINDS = ("prepare", "tune", "run", "ablation", "experiment")  # the stages a run leaves behind
LOCK = "dvc.lock"


def recorded(lock: Path) -> set[str]:
    """The stage names a dvc.lock records."""
    if not lock.exists():
        return set()
    return set((yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages", {}))


def record(campaign: Campaign, everything: bool = False) -> tuple[list[str], int]:
    """Record the chosen stages (the module docstring); returns their names and how many
    recordable stages wait for outputs (runs not finished)."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    dvc_yaml = campaign.root / DVC_YAML
    if not dvc_yaml.exists():
        raise UserError(f"{campaign.path} has no {DVC_YAML} beside it: record a study that has one")
    before = recorded(campaign.root / LOCK)
    try:
        repo = Repo()
    except NotDvcRepoError:
        raise UserError("not inside a DVC repository: run this from the project's root") from None
    chosen, waiting = [], 0
    # a few-shot study's blocks beside its grid are stages of their own (aclpipe.study.campaign.cells)
    kinds = set(KINDS) | set(campaign.cells) | {f"prepare-{name}" for name in campaign.cells}
    with repo, repo.lock:
        for info in repo.stage.collect_granular(str(dvc_yaml.resolve())):
            stage = info.stage
            if stage.name.split("@", 1)[0] not in kinds:
                continue
            if not all(out.exists for out in stage.outs):
                waiting += 1
                continue
            if everything or stage.name not in before:
                stage.save()
                stage.commit(filter_info=info.filter_info)
                chosen.append(stage)
        if chosen:
            chosen[0].dvcfile.dump_stages(chosen, update_pipeline=False)
    return [stage.name for stage in chosen], waiting
