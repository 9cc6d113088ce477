"""The app's Job: its backend set by environment alone, with names the app reads and a spec the app accepts.

The names are taken from the code that reads them (``app_args`` and the App SDK's ``RuntimeEnv``), the spec is
parsed by the project's own registry and options, and the Job's resources, image and exit-code policy are
compared with ``app.yaml`` and ``exits.py``: a rename on either side fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from monai_triton_ops import app_args, create_backend, exits
from monai_triton_ops.backends.registry import parse_backend_spec

from .manifests import REPO, container, container_port, env_values, flags, one

APP_YAML = REPO / "apps" / "brain_tissue_seg" / "app.yaml"
MODEL = "brain_tissue_seg"


def names_the_app_reads() -> set[str]:
    """Every environment variable the sample app (ours and the App SDK's parts) reads."""
    from monai.deploy.core.runtime_env import RuntimeEnv

    ours = {app_args.ENV_BACKEND, app_args.ENV_NETLOC, app_args.ENV_ALLOW_NON_FINITE}
    return ours | {env for env, *_ in RuntimeEnv.ENV_DEFAULT.values()}


def job() -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = one("Job", "brain-tissue-seg-", "monai-apps")
    return manifest.doc, container(manifest, "app")


def test_job_sets_only_variables_the_app_reads() -> None:
    _, app = job()
    names = {e["name"] for e in app["env"]}
    assert app_args.ENV_BACKEND in names
    assert names <= names_the_app_reads(), names - names_the_app_reads()


def test_backend_spec_is_one_the_app_accepts_and_names_the_headless_service() -> None:
    _, app = job()
    env = env_values(app)
    spec = app_args.resolve_backend(None, environ=env)  # what the app does at start: a typo fails here
    assert spec == env[app_args.ENV_BACKEND]
    parsed = parse_backend_spec(spec)
    headless = one("Service", "triton-headless")
    grpc = next(p for p in headless.doc["spec"]["ports"] if p["name"] == "grpc")
    # Today's client takes one URL: the headless Service's full name, since the app runs in another namespace.
    assert parsed.scheme == "grpc"
    assert parsed.urls == (f"grpc://{headless.name}.{headless.namespace}.svc.cluster.local:{grpc['port']}",)
    backend = create_backend(spec, MODEL)  # every query option known and typed (no I/O before open())
    assert backend.options.shared_memory in ("none", "auto")  # another pod has another /dev/shm


def test_the_specs_options_win_over_the_apps_yaml_defaults() -> None:
    """The sample app's app.yaml sets ``MONAI_TRITON_READY_TIMEOUT_S: "30"`` (a batch run gives up within a
    minute); the Job's ``?ready_timeout_s=300`` (a fleet rolling out) must still be what the backend gets."""
    from monai_triton_ops.app_settings import backend_keywords, read_app_environment, resolve_backend_options

    _, app = job()
    env = env_values(app)
    defaults = read_app_environment(APP_YAML)
    assert "MONAI_TRITON_READY_TIMEOUT_S" in defaults
    applied = {k: v for k, v in defaults.items() if k not in env}  # what the app sets at start
    spec = app_args.resolve_backend(None, environ={**applied, **env})
    options = resolve_backend_options(spec, {}, environ={**applied, **env}, from_yaml=applied)
    backend = create_backend(spec, MODEL, **backend_keywords(spec, "environment", options, {}))
    assert backend.options.ready_timeout_s == float(parse_backend_spec(spec).options["ready_timeout_s"]) == 300


def test_server_accepts_the_clients_keepalive_pings() -> None:
    """A client pinging more often than the server allows gets GOAWAY (too_many_pings) on idle connections."""
    _, app = job()
    backend = create_backend(env_values(app)[app_args.ENV_BACKEND], MODEL)
    keepalive_s = backend.options.keepalive_s
    if keepalive_s is None:
        pytest.skip("the Job's spec sets no keepalive")
    args = flags(container(one("Deployment", "triton"), "tritonserver")["args"])
    assert args["grpc-keepalive-permit-without-calls"] == "true"  # our client pings without calls
    assert int(args["grpc-http2-min-recv-ping-interval-without-data"]) <= keepalive_s * 1000


def test_input_and_output_are_mounted_where_the_environment_says() -> None:
    doc, app = job()
    env = env_values(app)
    mounts = {m["mountPath"]: m for m in app["volumeMounts"]}
    assert mounts[env["HOLOSCAN_INPUT_PATH"]].get("readOnly") is True  # the study is never changed
    assert not mounts[env["HOLOSCAN_OUTPUT_PATH"]].get("readOnly", False)
    volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
    for path in (env["HOLOSCAN_INPUT_PATH"], env["HOLOSCAN_OUTPUT_PATH"]):
        assert "persistentVolumeClaim" in volumes[mounts[path]["name"]]
    # The model folder is the MAP's own (its config.pbtxt is compared with the fleet's): nothing mounted over it.
    assert env["HOLOSCAN_MODEL_PATH"] not in mounts


def test_resources_and_image_version_match_app_yaml() -> None:
    _, app = job()
    app_yaml = yaml.safe_load(APP_YAML.read_text())
    resources = app_yaml["resources"]
    assert str(resources["cpu"]) == app["resources"]["requests"]["cpu"]
    assert str(resources["memory"]) == app["resources"]["requests"]["memory"] == app["resources"]["limits"]["memory"]
    assert resources.get("gpu", 0) == 0
    assert "nvidia.com/gpu" not in app["resources"].get("limits", {})
    # The MAP's OCI version label equals app.json's version (MAP spec), which comes from app.yaml.
    assert app["image"].rsplit(":", 1)[1] == str(app_yaml["application"]["version"])


def test_exit_codes_decide_what_is_retried() -> None:
    """Bad input and bugs end the Job at once; an unavailable fleet is retried (within backoffLimit)."""
    doc, app = job()
    rules = doc["spec"]["podFailurePolicy"]["rules"]
    fail_fast = {
        code for r in rules if r["action"] == "FailJob" and "onExitCodes" in r for code in r["onExitCodes"]["values"]
    }
    assert fail_fast == {exits.BUG, exits.USAGE}
    assert all(r["onExitCodes"].get("containerName") == app["name"] for r in rules if "onExitCodes" in r)
    assert doc["spec"]["backoffLimit"] >= 1  # exits.UNAVAILABLE gets another try
    assert doc["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it


def test_the_fleet_serves_the_port_the_job_dials() -> None:
    _, app = job()
    url = parse_backend_spec(env_values(app)[app_args.ENV_BACKEND]).urls[0]
    port = int(url.rsplit(":", 1)[1])
    server = container(one("Deployment", "triton"), "tritonserver")
    assert container_port(server, "grpc") == port == int(flags(server["args"])["grpc-port"])
