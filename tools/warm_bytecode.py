"""Write the bytecode of what the apps, servers and tests import, not of all of site-packages.

``make setup`` installs with ``pip --no-compile``: pip would byte-compile each of the ~14,000 files it installs, one
after another (about 30 s here), most of them never imported (sympy, pandas, torch's test helpers). This imports what
every app, CLI, server stub and test worker imports, with bytecode writing on whatever ``PYTHONDONTWRITEBYTECODE``
says (an image that sets it would otherwise compile those modules again in every process). A module left out is
compiled when first imported, as for any package installed without bytecode.

    .venv/bin/python tools/warm_bytecode.py
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = False  # before any import below: this script exists to write bytecode

import importlib  # noqa: E402
import pkgutil  # noqa: E402
import warnings  # noqa: E402

#: What processes import besides this package: the app stack, the clients, the test tools, the sample data's reader.
MODULES = (
    "torch",
    "monai",
    "monai.deploy.core",
    "monai.deploy.operators",
    "holoscan",
    "tritonclient.grpc",
    "tritonclient.http",
    "tritonclient.utils.shared_memory",
    "nibabel",
    "pydicom",
    "highdicom",
    "nilearn.datasets",
    "pytest",
    "xdist",
    "pytest_cov",
    "coverage",
)


def main() -> int:
    warnings.simplefilter("ignore")  # import-time warnings (Holoscan's stack size) are not this step's to show
    for name in MODULES:
        importlib.import_module(name)
    package = importlib.import_module("monai_triton_ops")
    for module in pkgutil.walk_packages(package.__path__, "monai_triton_ops."):
        if not module.name.endswith(".__main__"):  # a command: importing it runs it
            importlib.import_module(module.name)
    print(f"bytecode written for {len(sys.modules)} modules", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
