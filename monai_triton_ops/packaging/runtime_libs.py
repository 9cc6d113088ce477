"""Make the declared CUDA runtime findable where ``import monai_triton_ops`` comes too late (``cuda_runtime.py``).

python -m monai_triton_ops.packaging.runtime_libs --lib-dir          # the image build: into ld.so.conf.d
python -m monai_triton_ops.packaging.runtime_libs --write-site-hook  # make setup: the venv's .pth hook
"""

from __future__ import annotations

import argparse
import sys

from .. import cuda_runtime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monai_triton_ops.packaging.runtime_libs")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--lib-dir", action="store_true", help=f"print the folder holding {cuda_runtime.SONAME}")
    action.add_argument("--write-site-hook", action="store_true", help="write the .pth hook into site-packages")
    args = parser.parse_args(argv)
    library = cuda_runtime.wheel_library()
    if library is None:
        print(
            f"error: no {cuda_runtime.SONAME} from the nvidia-cuda-runtime wheel in this environment", file=sys.stderr
        )
        return 3
    print(library.parent if args.lib_dir else cuda_runtime.write_site_hook())
    return 0


if __name__ == "__main__":
    sys.exit(main())
