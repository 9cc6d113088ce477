"""``monai-triton exec`` mirrors ``monai-deploy exec``: the app gets the argv it would get from python."""

from __future__ import annotations

import json
from pathlib import Path

from monai_triton_ops.cli import main

RECORDER = """\
import json, sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("-o") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "argv.json").write_text(json.dumps(sys.argv[1:]))
"""


def test_exec_runs_a_folder_app_with_the_sdk_arguments_and_backend(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text(RECORDER)
    out = tmp_path / "out"
    code = main(["exec", str(app), "-i", "in", "-o", str(out), "-m", "models", "--backend", "torch", "-l", "debug"])
    assert code == 0
    assert json.loads((out / "argv.json").read_text()) == [
        "-i",
        "in",
        "-o",
        str(out),
        "-m",
        "models",
        "--backend",
        "torch",
        "-l",
        "DEBUG",
    ]


def test_exec_runs_a_script_and_refuses_a_non_app(tmp_path: Path, capsys) -> None:
    script = tmp_path / "app.py"
    script.write_text(RECORDER)
    assert main(["exec", str(script), "-i", "in", "-o", str(tmp_path / "o"), "-m", "m"]) == 0
    assert json.loads((tmp_path / "o" / "argv.json").read_text())[-2:] == ["-m", "m"]
    assert main(["exec", str(tmp_path), "-i", "in", "-o", "o", "-m", "m"]) == 2
    assert "neither a .py file nor a folder with __main__.py" in capsys.readouterr().err
