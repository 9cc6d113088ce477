"""``python -m monai_triton_ops.cli``: the ``monai-triton`` console script."""

import sys

from . import main

sys.exit(main())
