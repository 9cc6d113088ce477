"""``python apps/minimal ...`` and ``monai-triton exec apps/minimal ...`` both run this file.

``run_app`` gives the app a ``--help`` that lists every option, one ``-l`` level for all logs, and
turns any failure into one line on stderr with a documented exit code (docs/quickstart.md). The app
is named as ``"module:Class"`` so that it is imported after the stack limit is raised: Holoscan
checks that limit on import.
"""

import sys

from monai_triton_ops.app_args import run_app

if __name__ == "__main__":
    sys.exit(run_app("app:MinimalSegApp"))
