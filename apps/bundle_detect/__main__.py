"""``python apps/bundle_detect ...`` and ``monai-triton exec apps/bundle_detect ...`` both run this file.

``run_app`` lists every option on ``--help`` and ends every failure in one line and an exit code;
the app is imported by name so that the stack limit is raised before Holoscan is.
"""

import sys

from monai_triton_ops.app_args import run_app

if __name__ == "__main__":
    sys.exit(run_app("app:BundleDetectApp"))
