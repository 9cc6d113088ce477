"""``EnsembleInferenceOperator``: one App SDK operator over N models, their probabilities combined in memory.

The members are checkpoints, folds, or different models with the same output channels, each found by
``model_name`` in the app's models folder (``-m``) and each on its own backend if it says so (a member's
``backend=``, or a deploy-time choice, over the operator's). The image is pre-processed once, every window
goes to every member (and, with ``mirror_axes``, every mirrored copy) in flight together, the predictions
are averaged as they arrive (``pipeline/ensemble.py``), and the post-processing runs once on the mean.

A separate class, not a keyword of ``InferenceOperator``: its members, their backends and their checks are
what it is about, and a one-member ensemble with ``mirror_axes`` is test-time augmentation for one model.
Everything else (ports, settings, transforms, dictionary mode, the run line) is ``InferenceOperator``'s.
With the App SDK bundle operator's keywords (``input_mapping``, ``output_mapping``, ``bundle_config_names``)
each member is a MONAI Bundle of the models folder, and the first member's pre-processing, inferer and
post-processing run once for all, which requires them to be the same (``ensemble_bundles.py``).

What is checked before anything runs: each member's model is in the folder, and a bundle member's configs are
the first's (when the graph is composed); no member is in ``mode=volume``, and each member's output channels and
input rank equal the first member's (at ``start()``, from the signatures, before any image is read).

``mode=volume`` is refused, not run: a whole-volume model runs one network's sliding window on the server and
answers with the blended volume (or only its labels), while an ensemble and test-time mirroring combine every
member's prediction of each window here; sending each member the whole image would need its own path through the
pipeline, and with ``volume_output=labels`` (the default) there would be no probabilities to average at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from monai.deploy.core import AppContext, Fragment

from .. import interrupts
from ..app_settings import backend_keywords
from ..backends.base import BaseBackend
from ..backends.registry import create_backend
from ..errors import ConfigError
from ..pipeline.ensemble import Combine, EnsemblePredictor, check_members, mirror_flips
from ..pipeline.settings import InferenceSettings
from ..preflight import check_model_entry, is_remote
from .arguments import deployed_options, repository_of, spec_from
from .bundle import BUNDLE_KEYWORDS, BundleRun
from .ensemble_bundles import check_in_folder, member_runs
from .inference import CLOSE_TIMEOUT_S, InferenceOperator

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """One model of an ensemble: its folder name, and optionally its own backend, options and version."""

    model_name: str
    backend: str | None = None
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    version: int | None = None


@dataclass(frozen=True)
class Ensemble:
    """What an ``EnsembleInferenceOperator`` runs.

    ``members``: model names or ``Member``s. ``weights``: a weighted mean (default: the plain mean).
    ``combine``: a function of the members' predictions instead (per window, ``pipeline/ensemble.py``).
    ``mirror_axes``: test-time mirroring along these spatial axes (0-based, every subset, nnU-Net's way).
    """

    members: Sequence[str | Member]
    weights: Sequence[float] | None = None
    combine: Combine | None = None
    mirror_axes: Sequence[int] = ()

    def member_list(self) -> tuple[Member, ...]:
        members = tuple(m if isinstance(m, Member) else Member(str(m)) for m in self.members)
        if not members:
            raise ConfigError("an ensemble needs at least one member")
        for member in members:
            if not member.model_name:
                raise ConfigError("every ensemble member needs a model_name (its folder name in the models folder)")
        return members


class EnsembleInferenceOperator(InferenceOperator):
    """``InferenceOperator`` whose prediction is the combination of several models' (``ensemble=``).

    Takes every ``InferenceOperator`` keyword but ``model_name`` (the members name theirs) and ``bundle_path``
    (the bundles are the members' folders); ``backend=`` and ``backend_options=`` are the default of every member.
    """

    def __init__(self, fragment: Fragment, *args: Any, ensemble: Ensemble, **kwargs: Any) -> None:
        members = ensemble.member_list()
        if "model_name" in kwargs:
            raise ConfigError("EnsembleInferenceOperator takes its models from ensemble= members, not model_name=")
        mirror_flips(ensemble.mirror_axes)  # checked now, not at the first image
        self.ensemble = ensemble
        self.members = members
        app_context: AppContext | None = kwargs.get("app_context")
        bundles = {key: kwargs[key] for key in BUNDLE_KEYWORDS if key in kwargs}
        folder = models_folder_of(app_context, kwargs)
        self._member_backends = [
            _member_backend(m, kwargs.get("backend"), kwargs.get("backend_options") or {}, app_context, folder, bundles)
            for m in members
        ]
        names = [m.model_name for m in members]
        self._runs = (
            member_runs(bundles, names, self._member_backends, app_context=app_context, models_folder=folder)
            if bundles
            else []
        )
        self._opened: list[BaseBackend] = []
        self._ensemble_predictor: EnsemblePredictor | None = None
        super().__init__(
            fragment, *args, model_name=members[0].model_name, **_first_member_keywords(members[0], kwargs)
        )

    def start(self) -> None:
        """Create and open every member's backend (loads in parallel), then check they fit together."""
        names = [m.model_name for m in self.members]
        for name, (spec, options) in zip(names, self._member_backends, strict=True):
            logger.info("ensemble member %r: backend %r, options %s", name, spec, options)
        if self._runs:
            self._opened = [run.create_backend() for run in self._runs]
        else:
            self._opened = [create_backend(s, n, **o) for n, (s, o) in zip(names, self._member_backends, strict=True)]
        self._interrupt_key = interrupts.register(self._close_now)
        try:
            for name, backend in zip(names, self._opened, strict=True):
                check_window_mode(backend, name)
            with ThreadPoolExecutor(max_workers=len(self._opened), thread_name_prefix="ensemble-open") as pool:
                for future in [pool.submit(b.open) for b in self._opened]:
                    future.result()
            check_members(self._opened, names)
            self._backend = self._opened[0]
            if not self._runs:
                self._settings = self._given_settings or InferenceSettings.from_metadata(
                    self._opened[0].signature.metadata, **self.settings_overrides
                )
            self._ensemble_predictor = EnsemblePredictor(
                self._opened,
                weights=self.ensemble.weights,
                combine=self.ensemble.combine,
                flips=mirror_flips(self.ensemble.mirror_axes),
                request_batch_size=self._settings.request_batch_size if self._settings else None,
            )
            if self._runs:  # the first member's pre-processing, inferer and post-processing, over every member
                self._runs[0].use(self._opened[0], self._ensemble_predictor)
            logger.info("ensemble of %d members %s: %s", len(names), names, self._settings or "the bundle's inferer")
        except BaseException:  # no member left open, loaded or connected
            self.stop()
            raise

    def stop(self) -> None:
        """Release every member's backend; safe when ``start()`` never ran or failed half-way."""
        opened, self._opened = self._opened, []
        self._backend, self._ensemble_predictor = None, None
        if self._runs:
            self._runs[0].close()
        if self._interrupt_key is not None:
            interrupts.unregister(self._interrupt_key)
            self._interrupt_key = None
        for backend in opened:
            backend.close(timeout_s=CLOSE_TIMEOUT_S)

    def _close_now(self) -> None:
        for backend in list(self._opened):
            backend.close(timeout_s=0.5)

    def _predictor(self) -> EnsemblePredictor | None:
        return self._ensemble_predictor

    def _bundle_run(self, *args: Any, **kwargs: Any) -> BundleRun:
        """The first member's run (read with the others, checked against them): its ports and data flow."""
        return self._runs[0]


def models_folder_of(app_context: AppContext | None, kwargs: Mapping[str, Any]) -> str | None:
    """Where the members are: the app's ``-m`` over the code's ``model_path``."""
    folder = app_context.model_path if app_context is not None and app_context.model_path else None
    folder = folder or kwargs.get("model_path")
    return str(folder) if folder else None


def check_window_mode(backend: BaseBackend, name: str) -> None:
    """Refuse a member in ``mode=volume`` (module docstring: why), before it connects."""
    if str(getattr(backend.options, "mode", "window")) == "volume":
        raise ConfigError(
            f"ensemble member {name!r}: mode=volume sends the whole image to the server's sliding window over one "
            "model, and an ensemble (or test-time mirroring) combines every member's prediction of each window in "
            "the app; use mode=window (the default) for this member"
        )


def _first_member_keywords(first: Member, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords ``InferenceOperator`` gets: the first member's backend and options over the operator's."""
    keywords = dict(kwargs)
    if first.backend is not None:
        keywords["backend"] = first.backend
    options = {**(kwargs.get("backend_options") or {}), **first.backend_options}
    if first.version is not None:
        options["version"] = first.version
    keywords["backend_options"] = options
    return keywords


def _member_backend(
    member: Member,
    backend: str | None,
    code_options: Mapping[str, Any],
    app_context: AppContext | None,
    folder: str | None,
    bundles: Mapping[str, Any],
) -> tuple[str, dict[str, Any]]:
    """A member's spec and options by the operator's rule (its deploy-time ``NAME=SPEC`` first); its model
    checked in the folder now (a bundle member's by ``ensemble_bundles.py``, which reads it)."""
    if callable(backend):
        raise ConfigError("EnsembleInferenceOperator takes backend specs (strings), not a factory")
    spec, source = spec_from(member.backend or backend, app_context, member.model_name)
    code = {**code_options, **member.backend_options}
    if member.version is not None:
        code["version"] = member.version
    options = backend_keywords(spec, source, deployed_options(app_context, member.model_name), code)
    if bundles:
        return spec, options
    if folder:
        options.setdefault("model_repository", repository_of(folder, member.model_name))
    if not is_remote(spec):
        check_in_folder(member.model_name, options.get("model_repository"))
    check_model_entry(spec, options.get("model_repository"), member.model_name, options.get("version"))
    return spec, options
