"""The members of an ensemble that are MONAI Bundles: each found in the models folder, all checked to share one flow.

``EnsembleInferenceOperator`` given the App SDK bundle operator's keywords (``input_mapping``, ``output_mapping``,
``bundle_config_names``) runs one bundle per member, each ``MODELS/<name>/`` in the model zoo's layout (a bundle
folder, a bundle ``.ts``, or what ``repo build`` made of one), as the App SDK's nnU-Net app keeps its folds. The
members' pre-processing, inferer and post-processing must be the same configs (``bundles/compare.py``): then the
first member's run once for the whole ensemble, and the network its inferer calls is the ensemble's predictor,
every window going to every member (``pipeline/ensemble.py``). What each member adds is its network.

Refused when the operator is made, before anything runs, each naming the member: a member that is not in the
models folder, one whose configs differ from the first's (the item, the first's value and the member's), one whose
network has several outputs or is a detector's (the ensemble combines one image output). Output channels and input
rank are compared at ``start()`` from the served signatures, as for any ensemble.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monai.deploy.core import AppContext

from ..bundles import config_difference
from ..deployment import model_folders
from ..errors import BundleError, ConfigError, ModelNotFoundError
from .bundle import BundleRun

#: The bundle keyword an ensemble does not take: it names one bundle, and the members are found by name.
ONE_BUNDLE = "bundle_path"


def check_in_folder(name: str, folder: str | Path | None) -> None:
    """Refuse a member that is no folder of the models folder ``folder`` (when it is one), naming what is there."""
    names = model_folders(folder)
    if names is not None and name not in names:
        raise ModelNotFoundError(
            f"ensemble member {name!r} is not in the models folder {str(folder)!r} (models there: "
            f"{', '.join(names) or 'none'}); each member must be a model's folder name"
        )


def member_runs(
    keywords: Mapping[str, Any],
    names: Sequence[str],
    backends: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    app_context: AppContext | None,
    models_folder: str | Path | None,
) -> list[BundleRun]:
    """One ``BundleRun`` per member (its spec and options from ``backends``), checked to run as one ensemble."""
    if keywords.get(ONE_BUNDLE) is not None:
        raise ConfigError(
            "EnsembleInferenceOperator finds each member's bundle in the models folder (-m, or model_path=) by its "
            "name; bundle_path= names one bundle: leave it out"
        )
    if model_folders(models_folder) is None:  # not given, or one model: every member would be that one
        raise ConfigError(
            f"an ensemble of bundles {list(names)} needs the models folder that holds them, one folder each "
            f"(MODELS/<name>/); got {str(models_folder) if models_folder else 'none'}: run the app with -m MODELS, "
            "or pass model_path="
        )
    runs = []
    for name, (spec, options) in zip(names, backends, strict=True):
        check_in_folder(name, models_folder)
        run = BundleRun(
            keywords,
            model_name=name,
            app_context=app_context,
            backend_spec=spec,
            backend_options=options,
            models_folder=models_folder,
        )
        check_one_image_output(run, name)
        runs.append(run)
    check_same_flow(runs, names)
    return runs


def check_one_image_output(run: BundleRun, name: str) -> None:
    """The ensemble adds up one image output per window: a network with several, or a detector, is refused."""
    bundle = run.bundle
    if bundle.detector is not None or len(bundle.output_names) != 1:
        what = "is a detector's" if bundle.detector is not None else f"has {len(bundle.output_names)} outputs"
        raise BundleError(
            f"ensemble member {name!r}: its network {what} ({bundle.output_names}); an ensemble averages one image "
            "output (the inferer's prediction) over its members: run this bundle in an InferenceOperator of its own",
            file=bundle.config.metadata_file.label,
            item="network_data_format#outputs",
        )


def check_same_flow(runs: Sequence[BundleRun], names: Sequence[str]) -> None:
    """Every member's pre-processing, inferer and post-processing are the first member's, or the first difference
    is refused with the config item, the first member's value and this member's."""
    first = runs[0].bundle
    for name, run in zip(names[1:], runs[1:], strict=True):
        found = config_difference(first, run.bundle)
        if found is not None:
            raise BundleError(
                f"ensemble member {name!r} has {found.actual}, member {names[0]!r} has {found.expected}: the members "
                "of a bundle ensemble share one pre-processing, inferer and post-processing (the first member's); "
                "make the item the same, or run the bundles in operators of their own",
                file=found.file,
                item=found.item,
            )
