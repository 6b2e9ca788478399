"""``aclpipe params show``: a params file with every value written out, for a reader.

A study's params file (``campaign/params.yaml``, ``fewshot/params.yaml``, ``sts/params.yaml``)
holds only what its runs change from the code's defaults, each knob's one default being its
section's dataclass; its loader fills in the rest (``aclpipe.config.resolved``). This prints
what the loader sees: every section and knob, the methods the study runs, and the study's own
section as written, as YAML that loads back to the same config. Without a study file it prints
the pipeline's params file (``--params``) resolved the same way; without that file, the code's
defaults. It is a face over the studies' loaders, so it stands with the studies' commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from aclpipe.cli_options import ParamsOpt, user_errors
from aclpipe.errors import UserError
from aclpipe.layout import PARAMS

params_app = typer.Typer(
    help="Params files, resolved: every value a run reads.", no_args_is_help=True
)


@params_app.command()
@user_errors
def show(
    params: ParamsOpt = Path(PARAMS),
    campaign: Annotated[
        Path | None,
        typer.Option(
            "--campaign", help="A campaign or few-shot study's params (campaign: section)."
        ),
    ] = None,
    study: Annotated[
        Path | None, typer.Option("--study", help="The STS study's params (sts: section).")
    ] = None,
) -> None:
    """Print a params file with every value filled in (the code's defaults under the file's),
    as YAML that loads back to the same config: the pipeline's --params, or a study's."""
    print(resolved_yaml(params, campaign, study), end="")


def resolved_yaml(params: Path, campaign: Path | None, study: Path | None) -> str:
    """The text ``show`` prints (the module docstring)."""
    import dataclasses

    from aclpipe.config import load_params

    if campaign is not None and study is not None:
        raise UserError("give --campaign or --study, not both: each names one study's file")
    if campaign is not None:
        from aclpipe.study.campaign.plan import load_campaign

        path, section, base = campaign, "campaign", load_campaign(campaign).base
    elif study is not None:
        from aclpipe.study.sts.study import load_study

        path, section, base = study, "sts", load_study(study).raw
    else:
        resolved = dataclasses.asdict(load_params(params))  # no params.yaml here: the defaults
        head = f"# {params}, every value" if params.exists() else "# the code's defaults"
        return _dump(head, resolved)
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))[section]  # checked by the loader
    head = f"# {path}, every value: {section}: as written, then the shared knobs resolved"
    return _dump(head, {section: spec, **base})


def _dump(head: str, mapping: dict[str, Any]) -> str:
    """``head`` as a comment, then each section: a study's own as a block, a params section one
    knob a line (``key: value``, the value in YAML's flow style)."""
    blocks = [f"{head}\n"]
    for name, body in mapping.items():
        if name in ("campaign", "sts"):
            blocks.append(yaml.safe_dump({name: body}, sort_keys=False, default_flow_style=None))
        elif isinstance(body, dict) and body:
            blocks.append(f"{name}:\n" + "".join(f"  {_flow({k: v})}\n" for k, v in body.items()))
        else:
            blocks.append(f"{_flow({name: body})}\n")
    return "\n".join(blocks)


def _flow(pair: dict[str, Any]) -> str:
    """``{key: value}`` as one line of YAML: ``key: value``."""
    return yaml.safe_dump(pair, default_flow_style=True, sort_keys=False, width=10**6)[1:-2]
