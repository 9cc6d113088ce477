import sys

from monai_triton_ops.app_args import run_app

if __name__ == "__main__":
    sys.exit(run_app("app:InterruptApp"))
